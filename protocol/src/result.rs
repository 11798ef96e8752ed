//! Results: every request is answered by one [`OpResult`], `{outcome, value}`.

use serde::{Deserialize, Serialize};

use crate::op::{HandleId, StreamId, WorkerId};

/// `{"outcome": "ok", "value": OpValue}` or `{"outcome": "err", "value": OpError}`.
#[cfg_attr(test, derive(proptest_derive::Arbitrary))]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "outcome", content = "value", deny_unknown_fields)]
pub enum OpResult {
    /// The op succeeded; its value.
    #[serde(rename = "ok")]
    Ok(OpValue),
    /// The op failed; nothing else on the connection is affected.
    #[serde(rename = "err")]
    Err(OpError),
}

impl OpResult {
    /// As a Rust `Result`, for `?` on the host.
    pub fn into_result(self) -> Result<OpValue, OpError> {
        match self {
            OpResult::Ok(v) => Ok(v),
            OpResult::Err(e) => Err(e),
        }
    }
}

impl From<Result<OpValue, OpError>> for OpResult {
    fn from(r: Result<OpValue, OpError>) -> Self {
        match r {
            Ok(v) => OpResult::Ok(v),
            Err(e) => OpResult::Err(e),
        }
    }
}

/// The value of a successful op. Wire shape: `{"type": "<kind>", "data": …}`.
#[cfg_attr(test, derive(proptest_derive::Arbitrary))]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", content = "data", deny_unknown_fields)]
pub enum OpValue {
    /// Ops with nothing to return (write_file, mkdir, close, clock_set, …).
    #[serde(rename = "unit")]
    Unit,
    /// Exec's terminal value and wait's answer.
    #[serde(rename = "exit")]
    Exit(ExitInfo),
    /// An exec inside a batch: the exit and the captured output.
    #[serde(rename = "ran")]
    Ran {
        /// How the command ended.
        exit: ExitInfo,
        /// Everything it wrote to stdout; a batch answer must fit in a frame,
        /// so the agent kills a command whose output would not (`too_large`).
        #[serde(with = "serde_bytes")]
        stdout: Vec<u8>,
        /// Everything it wrote to stderr; bounded as `stdout`.
        #[serde(with = "serde_bytes")]
        stderr: Vec<u8>,
    },
    /// A spawned process; its slot id is the spawn request's id.
    #[serde(rename = "spawned")]
    Spawned {
        /// The process's pid in the guest (also its process group id).
        pid: u32,
    },
    /// `process_status`'s answer.
    #[serde(rename = "process_status")]
    ProcessStatus(ProcessState),
    /// `pid`'s answer.
    #[serde(rename = "pid")]
    Pid {
        /// The process's pid in the guest.
        pid: u32,
    },
    /// File contents (read_file) or a read's bytes (empty at end of file).
    #[serde(rename = "bytes")]
    Bytes(#[serde(with = "serde_bytes")] Vec<u8>),
    /// `stat`'s answer.
    #[serde(rename = "stat")]
    Stat(StatInfo),
    /// `listdir`'s answer, sorted by name.
    #[serde(rename = "entries")]
    Entries(Vec<DirEntry>),
    /// `open`'s answer.
    #[serde(rename = "handle")]
    Handle {
        /// The new handle, usable from the namespace (connection or worker)
        /// that opened it; it is also the agent's fd for the file.
        handle: HandleId,
    },
    /// Bytes a write actually wrote (may be fewer than given).
    #[serde(rename = "written")]
    Written {
        /// Count of bytes written.
        bytes: u64,
    },
    /// A seek's or tell's resulting offset.
    #[serde(rename = "offset")]
    Offset {
        /// Bytes from the start of the file.
        offset: u64,
    },
    /// A tail opened: data follows as chunks on `stream`, starting at `offset`.
    #[serde(rename = "tail")]
    Tail {
        /// The stream id (the tail request's id), for `close_stream`.
        stream: StreamId,
        /// Absolute file offset of the first byte that will stream.
        offset: u64,
    },
    /// `syscall`'s answer.
    #[serde(rename = "syscall")]
    Syscall(SyscallResult),
    /// `ioctl`'s answer.
    #[serde(rename = "ioctl")]
    Ioctl(IoctlResult),
    /// `clock_get`'s answer: the guest's two clocks, read one after the other.
    #[serde(rename = "clock")]
    Clock {
        /// CLOCK_REALTIME, nanoseconds since the Unix epoch.
        realtime_ns: i64,
        /// CLOCK_MONOTONIC, nanoseconds since an arbitrary start (boot).
        monotonic_ns: i64,
    },
    /// `worker_spawn`'s answer.
    #[serde(rename = "worker")]
    Worker {
        /// The new worker's id, per connection; goes in `Request::worker`.
        worker: WorkerId,
    },
    /// One result per batched op, in order.
    #[serde(rename = "batch")]
    Batch(#[cfg_attr(test, proptest(strategy = "crate::proptests::leaf_results()"))] Vec<OpResult>),
}

closed_enum! {
    /// How a process ended.
    pub enum ExitStatus {
        /// It called exit (or returned from main); `exit_code` is its code.
        Exited => "exited",
        /// A signal ended it; `signal` says which.
        Signalled => "signalled",
        /// The exec's or wait's timeout expired and the agent killed its
        /// process group.
        TimedOut => "timed_out",
    }
}

/// The terminal status of a process. `exit_code` is -1 when signalled and -2
/// when timed out; `signal` is set only when signalled.
#[cfg_attr(test, derive(proptest_derive::Arbitrary))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExitInfo {
    /// How it ended.
    pub status: ExitStatus,
    /// The exit code (0..=255) when exited, else one of the two negative
    /// constants below.
    pub exit_code: i32,
    /// The Linux signal number when signalled, else `None`.
    pub signal: Option<i32>,
}

impl ExitInfo {
    /// `exit_code` of a process a signal ended.
    pub const SIGNALLED_EXIT_CODE: i32 = -1;
    /// `exit_code` of a process killed at its timeout.
    pub const TIMED_OUT_EXIT_CODE: i32 = -2;

    /// Exited with `code`.
    pub fn exited(code: i32) -> Self {
        ExitInfo {
            status: ExitStatus::Exited,
            exit_code: code,
            signal: None,
        }
    }
    /// Ended by `signal`.
    pub fn signalled(signal: i32) -> Self {
        ExitInfo {
            status: ExitStatus::Signalled,
            exit_code: Self::SIGNALLED_EXIT_CODE,
            signal: Some(signal),
        }
    }
    /// Killed at its timeout.
    pub fn timed_out() -> Self {
        ExitInfo {
            status: ExitStatus::TimedOut,
            exit_code: Self::TIMED_OUT_EXIT_CODE,
            signal: None,
        }
    }
}

/// A spawned process's state: still running, or how it ended.
#[cfg_attr(test, derive(proptest_derive::Arbitrary))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProcessState {
    /// Not reaped yet.
    pub running: bool,
    /// Its pid in the guest.
    pub pid: u32,
    /// How it ended, once it has (`None` while running).
    pub exit: Option<ExitInfo>,
}

closed_enum! {
    /// The file type of a directory entry or a stat (`S_IFMT`).
    pub enum EntryType {
        /// A regular file.
        File => "file",
        /// A directory.
        Directory => "directory",
        /// A symbolic link (stat and listdir do not follow it for the type).
        Symlink => "symlink",
        /// A named pipe.
        Fifo => "fifo",
        /// A Unix socket.
        Socket => "socket",
        /// A block device node.
        BlockDevice => "block_device",
        /// A character device node.
        CharDevice => "char_device",
        /// None of the above.
        Other => "other",
    }
}

/// `stat`'s answer. `entry_type` is the path's own (lstat); the other fields
/// describe what it resolves to, or the link itself when it dangles.
#[cfg_attr(test, derive(proptest_derive::Arbitrary))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StatInfo {
    /// Size in bytes.
    pub size: u64,
    /// Last modification, nanoseconds since the Unix epoch (guest clock).
    pub mtime_ns: i64,
    /// POSIX permission bits, at most 0o7777.
    pub perm: u32,
    /// The path's file type.
    pub entry_type: EntryType,
}

/// One entry of `listdir`'s answer.
#[cfg_attr(test, derive(proptest_derive::Arbitrary))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DirEntry {
    /// The entry's name within the directory (not a path); lossy UTF-8.
    pub name: String,
    /// Its file type (a symlink is `symlink`).
    pub entry_type: EntryType,
}

/// A syscall's outcome. `errno` is 0 unless `ret` is negative; `out_bufs` (the
/// buffers after the call, nested targets included) is omitted when empty.
#[cfg_attr(test, derive(proptest_derive::Arbitrary))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SyscallResult {
    /// The raw return value.
    pub ret: i64,
    /// errno after a failed call, else 0.
    pub errno: i32,
    /// Every buffer of the spec, in order, as it is after the call.
    #[serde(
        default,
        skip_serializing_if = "Vec::is_empty",
        with = "crate::wire::byte_vecs"
    )]
    pub out_bufs: Vec<Vec<u8>>,
}

/// An ioctl's outcome: as [`SyscallResult`], plus `data` after the call.
#[cfg_attr(test, derive(proptest_derive::Arbitrary))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IoctlResult {
    /// The raw return value.
    pub ret: i64,
    /// errno after a failed call, else 0.
    pub errno: i32,
    /// The spec's `data` after the call (pointer slots hold agent
    /// addresses); `None` when the spec had none.
    #[serde(with = "serde_bytes")]
    pub out_data: Option<Vec<u8>>,
    /// Every buffer of the spec, in order, as it is after the call;
    /// omitted on the wire when empty.
    #[serde(
        default,
        skip_serializing_if = "Vec::is_empty",
        with = "crate::wire::byte_vecs"
    )]
    pub out_bufs: Vec<Vec<u8>>,
}

closed_enum! {
    /// What kind of failure an [`OpError`] is.
    pub enum ErrorCode {
        /// The guest's kernel said no; `errno` is set.
        Io => "io",
        /// The request itself is wrong (bad mode, bad syscall spec, …).
        InvalidArgument => "invalid_argument",
        /// No such handle in this namespace (never opened, closed, or
        /// another worker's).
        UnknownHandle => "unknown_handle",
        /// No spawned process with that id (never spawned, or already
        /// waited or released).
        UnknownProcess => "unknown_process",
        /// No open stream with that id.
        UnknownStream => "unknown_stream",
        /// No worker with that id (never spawned, or closed).
        UnknownWorker => "unknown_worker",
        /// This agent or backend cannot do it (e.g. clock_set in a sandbox).
        Unsupported => "unsupported",
        /// The answer would not fit in a frame; use a streaming op.
        TooLarge => "too_large",
        /// Refused inside a batch, or the slot is busy.
        NotAllowed => "not_allowed",
        /// A bug in the agent (e.g. a handler panicked); the message names
        /// the op.
        Internal => "internal",
    }
}

/// Why an op failed, as the agent reports it. Its Display is `message`.
#[cfg_attr(test, derive(proptest_derive::Arbitrary))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OpError {
    /// The kind of failure, for callers that branch on it.
    pub code: ErrorCode,
    /// The guest kernel's errno when `code` is `io`, else usually `None`.
    pub errno: Option<i32>,
    /// Human text naming what failed (path, handle, program) and why.
    pub message: String,
}

impl OpError {
    /// An error with no errno.
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        OpError {
            code,
            errno: None,
            message: message.into(),
        }
    }
}

impl std::fmt::Display for OpError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for OpError {}
