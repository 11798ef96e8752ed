//! Results: every request is answered by one [`OpResult`], `{outcome, value}`.

use serde::{Deserialize, Serialize};

use crate::op::{HandleId, StreamId, WorkerId};

/// `{"outcome": "ok", "value": OpValue}` or `{"outcome": "err", "value": OpError}`.
#[cfg_attr(test, derive(proptest_derive::Arbitrary))]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "outcome", content = "value", deny_unknown_fields)]
pub enum OpResult {
    #[serde(rename = "ok")]
    Ok(OpValue),
    #[serde(rename = "err")]
    Err(OpError),
}

impl OpResult {
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
        exit: ExitInfo,
        #[serde(with = "serde_bytes")]
        stdout: Vec<u8>,
        #[serde(with = "serde_bytes")]
        stderr: Vec<u8>,
    },
    /// A spawned process; its slot id is the spawn request's id.
    #[serde(rename = "spawned")]
    Spawned { pid: u32 },
    #[serde(rename = "process_status")]
    ProcessStatus(ProcessState),
    #[serde(rename = "pid")]
    Pid { pid: u32 },
    /// File contents (read_file) or a read's bytes (empty at end of file).
    #[serde(rename = "bytes")]
    Bytes(#[serde(with = "serde_bytes")] Vec<u8>),
    #[serde(rename = "stat")]
    Stat(StatInfo),
    #[serde(rename = "entries")]
    Entries(Vec<DirEntry>),
    #[serde(rename = "handle")]
    Handle { handle: HandleId },
    /// Bytes a write actually wrote (may be fewer than given).
    #[serde(rename = "written")]
    Written { bytes: u64 },
    /// A seek's or tell's resulting offset.
    #[serde(rename = "offset")]
    Offset { offset: u64 },
    /// A tail opened: data follows as chunks on `stream`, starting at `offset`.
    #[serde(rename = "tail")]
    Tail { stream: StreamId, offset: u64 },
    #[serde(rename = "syscall")]
    Syscall(SyscallResult),
    #[serde(rename = "ioctl")]
    Ioctl(IoctlResult),
    #[serde(rename = "clock")]
    Clock { realtime_ns: i64, monotonic_ns: i64 },
    #[serde(rename = "worker")]
    Worker { worker: WorkerId },
    /// One result per batched op, in order.
    #[serde(rename = "batch")]
    Batch(#[cfg_attr(test, proptest(strategy = "crate::proptests::leaf_results()"))] Vec<OpResult>),
}

closed_enum! {
    /// How a process ended.
    pub enum ExitStatus {
        Exited => "exited",
        Signalled => "signalled",
        TimedOut => "timed_out",
    }
}

/// The terminal status of a process. `exit_code` is -1 when signalled and -2
/// when timed out; `signal` is set only when signalled.
#[cfg_attr(test, derive(proptest_derive::Arbitrary))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExitInfo {
    pub status: ExitStatus,
    pub exit_code: i32,
    pub signal: Option<i32>,
}

impl ExitInfo {
    pub const SIGNALLED_EXIT_CODE: i32 = -1;
    pub const TIMED_OUT_EXIT_CODE: i32 = -2;

    pub fn exited(code: i32) -> Self {
        ExitInfo {
            status: ExitStatus::Exited,
            exit_code: code,
            signal: None,
        }
    }
    pub fn signalled(signal: i32) -> Self {
        ExitInfo {
            status: ExitStatus::Signalled,
            exit_code: Self::SIGNALLED_EXIT_CODE,
            signal: Some(signal),
        }
    }
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
    pub running: bool,
    pub pid: u32,
    pub exit: Option<ExitInfo>,
}

closed_enum! {
    pub enum EntryType {
        File => "file",
        Directory => "directory",
        Symlink => "symlink",
        Fifo => "fifo",
        Socket => "socket",
        BlockDevice => "block_device",
        CharDevice => "char_device",
        Other => "other",
    }
}

#[cfg_attr(test, derive(proptest_derive::Arbitrary))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StatInfo {
    pub size: u64,
    pub mtime_ns: i64,
    /// POSIX permission bits, at most 0o7777.
    pub perm: u32,
    pub entry_type: EntryType,
}

#[cfg_attr(test, derive(proptest_derive::Arbitrary))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DirEntry {
    pub name: String,
    pub entry_type: EntryType,
}

/// A syscall's outcome. `errno` is 0 unless `ret` is negative; `out_bufs` (the
/// buffers after the call, nested targets included) is omitted when empty.
#[cfg_attr(test, derive(proptest_derive::Arbitrary))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SyscallResult {
    pub ret: i64,
    pub errno: i32,
    #[serde(
        default,
        skip_serializing_if = "Vec::is_empty",
        with = "crate::wire::byte_vecs"
    )]
    pub out_bufs: Vec<Vec<u8>>,
}

#[cfg_attr(test, derive(proptest_derive::Arbitrary))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IoctlResult {
    pub ret: i64,
    pub errno: i32,
    #[serde(with = "serde_bytes")]
    pub out_data: Option<Vec<u8>>,
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
        UnknownHandle => "unknown_handle",
        UnknownProcess => "unknown_process",
        UnknownStream => "unknown_stream",
        UnknownWorker => "unknown_worker",
        /// This agent or backend cannot do it (e.g. clock_set in a sandbox).
        Unsupported => "unsupported",
        /// The answer would not fit in a frame; use a streaming op.
        TooLarge => "too_large",
        /// Refused inside a batch, or the slot is busy.
        NotAllowed => "not_allowed",
        Internal => "internal",
    }
}

#[cfg_attr(test, derive(proptest_derive::Arbitrary))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OpError {
    pub code: ErrorCode,
    pub errno: Option<i32>,
    pub message: String,
}

impl OpError {
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
