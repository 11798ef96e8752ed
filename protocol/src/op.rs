//! Operations the host asks the agent to perform, one per Lua API need.
//!
//! An [`Op`] travels inside a [`crate::wire::Request`] and is answered by
//! exactly one [`crate::wire::Response`] with the same id. Ops that stream
//! (exec output, spawned processes, tails) send `StreamChunk` frames tagged
//! with that id before (exec) or after (spawn, tail) their response.
//!
//! Wire shape: `{"op": "<kind>", "args": {…}}`; unit ops have no `args`.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::ProtocolError;

/// Identifies a process slot, a tail stream or an exec: the id of the request
/// that created it.
pub type StreamId = u64;
/// Agent-side file handle id (per worker namespace).
pub type HandleId = u64;
/// Agent-side worker id.
pub type WorkerId = u64;

/// Most integer arguments a syscall takes on Linux.
pub const MAX_SYSCALL_ARGS: usize = 6;

/// One request's operation, sent by the host inside a
/// [`Request`](crate::wire::Request) and carried out by the agent in the
/// guest. Each variant's doc names its ok value ([`OpValue`](crate::OpValue));
/// failures are [`OpError`](crate::OpError)s.
///
/// Wire shape: `{"op": "<kind>", "args": {…}}`; unit variants carry no `args`.
#[cfg_attr(test, derive(proptest_derive::Arbitrary))]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", content = "args", deny_unknown_fields)]
pub enum Op {
    /// Does nothing; measures a round trip.
    #[serde(rename = "ping")]
    Ping,
    /// Run a command to completion. Output streams as chunks on the request's
    /// id; the response (always sent, the terminal frame) is `OpValue::Exit`.
    #[serde(rename = "exec")]
    Exec(ExecSpec),
    /// Start a command and return at once (`OpValue::Spawned`). Its output
    /// streams as chunks on the request's id; it lives until waited or released.
    #[serde(rename = "spawn")]
    Spawn(SpawnSpec),
    /// Close a spawned process's stdin pipe (the process then reads end of
    /// file). `OpValue::Unit`.
    #[serde(rename = "stdin_close")]
    StdinClose {
        /// The spawned process: its spawn request's id.
        process: StreamId,
    },
    /// Wait for a spawned process. On timeout the agent kills its process
    /// group and answers `Exit` with status `timed_out`. Frees the slot.
    #[serde(rename = "wait")]
    Wait {
        /// The spawned process: its spawn request's id.
        process: StreamId,
        /// Milliseconds to wait before killing the group; `None` waits as
        /// long as the process runs.
        timeout_ms: Option<u64>,
    },
    /// Send a signal to a spawned process's group. `OpValue::Unit`.
    #[serde(rename = "signal")]
    Signal {
        /// The spawned process: its spawn request's id.
        process: StreamId,
        /// A Linux signal number (the host translates names with
        /// [`parse_signal`](crate::signal::parse_signal)).
        signal: i32,
    },
    /// Non-blocking status of a spawned process (`OpValue::ProcessStatus`).
    #[serde(rename = "process_status")]
    ProcessStatus {
        /// The spawned process: its spawn request's id.
        process: StreamId,
    },
    /// The kernel pid of a spawned process (`OpValue::Pid`).
    #[serde(rename = "pid")]
    Pid {
        /// The spawned process: its spawn request's id.
        process: StreamId,
    },
    /// Forget a spawned process: SIGTERM, then SIGKILL after a grace period
    /// if it is still running. Frees the slot; `OpValue::Unit`.
    #[serde(rename = "release")]
    Release {
        /// The spawned process: its spawn request's id.
        process: StreamId,
    },
    /// A whole file's contents (`OpValue::Bytes`). The answer must fit in one
    /// frame: a larger file is refused with `too_large` (read it in pieces
    /// through `open` and `read`).
    #[serde(rename = "read_file")]
    ReadFile {
        /// Guest path, absolute or relative to the agent's directory.
        path: String,
    },
    /// Create or replace a file with `data` (`OpValue::Unit`).
    #[serde(rename = "write_file")]
    WriteFile {
        /// Guest path of the file.
        path: String,
        /// The whole new contents (msgpack `bin`); bounded only by the frame
        /// limit.
        #[serde(with = "serde_bytes")]
        data: Vec<u8>,
    },
    /// A path's metadata (`OpValue::Stat`). The entry type is the link's own
    /// (lstat); size, mtime and perm describe what the path resolves to.
    #[serde(rename = "stat")]
    Stat {
        /// Guest path to describe.
        path: String,
    },
    /// A directory's entries, sorted by name, without `.` and `..`
    /// (`OpValue::Entries`).
    #[serde(rename = "listdir")]
    ListDir {
        /// Guest path of the directory.
        path: String,
    },
    /// Create a directory (`OpValue::Unit`).
    #[serde(rename = "mkdir")]
    Mkdir {
        /// Guest path of the new directory.
        path: String,
        /// Create missing parents too, and accept an existing directory
        /// (`mkdir -p`).
        parents: bool,
        /// Permission bits (masked to 0o7777), applied exactly, not through
        /// the agent's umask; `None`: 0o777 less the umask.
        perm: Option<u32>,
    },
    /// Remove a file or an empty directory.
    #[serde(rename = "unlink")]
    Unlink {
        /// Guest path to remove (a symlink is removed, not its target).
        path: String,
    },
    /// Rename a path, replacing `to` if it exists (rename(2)).
    /// `OpValue::Unit`.
    #[serde(rename = "rename")]
    Rename {
        /// The existing guest path.
        from: String,
        /// Its new guest path.
        to: String,
    },
    /// Open a file handle (`OpValue::Handle`).
    #[serde(rename = "open")]
    Open {
        /// Guest path of the file.
        path: String,
        /// Access and creation flags; [`OpenMode::check`] must pass.
        mode: OpenMode,
        /// Permission bits of a file this open creates (masked to 0o7777,
        /// applied exactly); `None`: 0o666 less the umask. Ignored when the
        /// file exists.
        perm: Option<u32>,
    },
    /// Read up to `len` bytes; empty at end of file.
    #[serde(rename = "read")]
    Read {
        /// The handle, from `open`.
        handle: HandleId,
        /// Most bytes to read; the agent caps one answer well under the frame
        /// limit, and one read(2) may return fewer.
        len: u64,
    },
    /// Write bytes; the answer says how many were written (may be partial).
    #[serde(rename = "write")]
    Write {
        /// The handle, from `open`.
        handle: HandleId,
        /// Bytes to write at the handle's offset (at the end of file under
        /// `append`), in one write(2).
        #[serde(with = "serde_bytes")]
        data: Vec<u8>,
    },
    /// Move a handle's offset (`OpValue::Offset`: the new absolute offset).
    #[serde(rename = "seek")]
    Seek {
        /// The handle, from `open`.
        handle: HandleId,
        /// Bytes relative to `whence`; must be non-negative from `set`.
        offset: i64,
        /// What `offset` counts from.
        whence: Whence,
    },
    /// A handle's current offset (`OpValue::Offset`).
    #[serde(rename = "tell")]
    Tell {
        /// The handle, from `open`.
        handle: HandleId,
    },
    /// Close a handle; a tail of it ends with `eof`. `OpValue::Unit`.
    #[serde(rename = "close")]
    Close {
        /// The handle, from `open`.
        handle: HandleId,
    },
    /// Follow a file or handle; data streams as chunks on the request's id
    /// until `close_stream`.
    #[serde(rename = "tail")]
    Tail {
        /// What to follow.
        source: TailSource,
        /// Where the stream's first byte is.
        start: TailStart,
    },
    /// Stop a tail (or a spawned process's output stream).
    #[serde(rename = "close_stream")]
    CloseStream {
        /// The stream: the id of the request that opened it.
        stream: StreamId,
    },
    /// A raw Linux system call in the agent's process (`OpValue::Syscall`).
    #[serde(rename = "syscall")]
    Syscall(SyscallSpec),
    /// A raw ioctl(2) in the agent's process (`OpValue::Ioctl`).
    #[serde(rename = "ioctl")]
    Ioctl(IoctlSpec),
    /// `OpValue::Clock`: CLOCK_REALTIME and CLOCK_MONOTONIC.
    #[serde(rename = "clock_get")]
    ClockGet,
    /// Set CLOCK_REALTIME (may be negative: before the epoch).
    /// `unsupported` from an agent that shares the host's clock (local
    /// backend).
    #[serde(rename = "clock_set")]
    ClockSet {
        /// The new time, nanoseconds since the Unix epoch.
        realtime_ns: i64,
    },
    /// Move CLOCK_REALTIME by a signed amount.
    #[serde(rename = "clock_advance")]
    ClockAdvance {
        /// Nanoseconds to add (negative moves it back).
        delta_ns: i64,
    },
    /// Create a worker: its own handle namespace and its own serial queue of
    /// requests, concurrent with other workers (`OpValue::Worker`).
    #[serde(rename = "worker_spawn")]
    WorkerSpawn,
    /// Wait until the worker's queued requests have finished.
    #[serde(rename = "worker_join")]
    WorkerJoin {
        /// The worker, from `worker_spawn`.
        worker: WorkerId,
    },
    /// Signal every process the worker started.
    #[serde(rename = "worker_kill")]
    WorkerKill {
        /// The worker, from `worker_spawn`.
        worker: WorkerId,
        /// A Linux signal number, sent to each process group.
        signal: i32,
    },
    /// Close the worker: its handles and processes are cleaned up.
    #[serde(rename = "worker_close")]
    WorkerClose {
        /// The worker, from `worker_spawn`.
        worker: WorkerId,
    },
    /// Several ops in one round trip; one result each, no short-circuit.
    /// Streaming ops and nested batches are refused per op.
    #[serde(rename = "batch")]
    Batch {
        /// Run in order; see [`Op::allowed_in_batch`].
        #[cfg_attr(test, proptest(strategy = "crate::proptests::leaf_ops()"))]
        ops: Vec<Op>,
    },
}

closed_enum! {
    /// The wire tag of every [`Op`]: the `"op"` key of its map.
    pub enum OpKind {
        /// [`Op::Ping`].
        Ping => "ping",
        /// [`Op::Exec`].
        Exec => "exec",
        /// [`Op::Spawn`].
        Spawn => "spawn",
        /// [`Op::StdinClose`].
        StdinClose => "stdin_close",
        /// [`Op::Wait`].
        Wait => "wait",
        /// [`Op::Signal`].
        Signal => "signal",
        /// [`Op::ProcessStatus`].
        ProcessStatus => "process_status",
        /// [`Op::Pid`].
        Pid => "pid",
        /// [`Op::Release`].
        Release => "release",
        /// [`Op::ReadFile`].
        ReadFile => "read_file",
        /// [`Op::WriteFile`].
        WriteFile => "write_file",
        /// [`Op::Stat`].
        Stat => "stat",
        /// [`Op::ListDir`].
        ListDir => "listdir",
        /// [`Op::Mkdir`].
        Mkdir => "mkdir",
        /// [`Op::Unlink`].
        Unlink => "unlink",
        /// [`Op::Rename`].
        Rename => "rename",
        /// [`Op::Open`].
        Open => "open",
        /// [`Op::Read`].
        Read => "read",
        /// [`Op::Write`].
        Write => "write",
        /// [`Op::Seek`].
        Seek => "seek",
        /// [`Op::Tell`].
        Tell => "tell",
        /// [`Op::Close`].
        Close => "close",
        /// [`Op::Tail`].
        Tail => "tail",
        /// [`Op::CloseStream`].
        CloseStream => "close_stream",
        /// [`Op::Syscall`].
        Syscall => "syscall",
        /// [`Op::Ioctl`].
        Ioctl => "ioctl",
        /// [`Op::ClockGet`].
        ClockGet => "clock_get",
        /// [`Op::ClockSet`].
        ClockSet => "clock_set",
        /// [`Op::ClockAdvance`].
        ClockAdvance => "clock_advance",
        /// [`Op::WorkerSpawn`].
        WorkerSpawn => "worker_spawn",
        /// [`Op::WorkerJoin`].
        WorkerJoin => "worker_join",
        /// [`Op::WorkerKill`].
        WorkerKill => "worker_kill",
        /// [`Op::WorkerClose`].
        WorkerClose => "worker_close",
        /// [`Op::Batch`].
        Batch => "batch",
    }
}

impl Op {
    /// This op's wire tag (for messages and per-kind handling).
    pub fn kind(&self) -> OpKind {
        match self {
            Op::Ping => OpKind::Ping,
            Op::Exec(_) => OpKind::Exec,
            Op::Spawn(_) => OpKind::Spawn,
            Op::StdinClose { .. } => OpKind::StdinClose,
            Op::Wait { .. } => OpKind::Wait,
            Op::Signal { .. } => OpKind::Signal,
            Op::ProcessStatus { .. } => OpKind::ProcessStatus,
            Op::Pid { .. } => OpKind::Pid,
            Op::Release { .. } => OpKind::Release,
            Op::ReadFile { .. } => OpKind::ReadFile,
            Op::WriteFile { .. } => OpKind::WriteFile,
            Op::Stat { .. } => OpKind::Stat,
            Op::ListDir { .. } => OpKind::ListDir,
            Op::Mkdir { .. } => OpKind::Mkdir,
            Op::Unlink { .. } => OpKind::Unlink,
            Op::Rename { .. } => OpKind::Rename,
            Op::Open { .. } => OpKind::Open,
            Op::Read { .. } => OpKind::Read,
            Op::Write { .. } => OpKind::Write,
            Op::Seek { .. } => OpKind::Seek,
            Op::Tell { .. } => OpKind::Tell,
            Op::Close { .. } => OpKind::Close,
            Op::Tail { .. } => OpKind::Tail,
            Op::CloseStream { .. } => OpKind::CloseStream,
            Op::Syscall(_) => OpKind::Syscall,
            Op::Ioctl(_) => OpKind::Ioctl,
            Op::ClockGet => OpKind::ClockGet,
            Op::ClockSet { .. } => OpKind::ClockSet,
            Op::ClockAdvance { .. } => OpKind::ClockAdvance,
            Op::WorkerSpawn => OpKind::WorkerSpawn,
            Op::WorkerJoin { .. } => OpKind::WorkerJoin,
            Op::WorkerKill { .. } => OpKind::WorkerKill,
            Op::WorkerClose { .. } => OpKind::WorkerClose,
            Op::Batch { .. } => OpKind::Batch,
        }
    }

    /// Whether a batch may carry this op. Ops that open a stream or a
    /// namespace are refused (per op, not for the whole batch); an exec inside
    /// a batch answers `OpValue::Ran` with its output captured in the result.
    pub fn allowed_in_batch(&self) -> bool {
        !matches!(
            self,
            Op::Spawn(_) | Op::Tail { .. } | Op::Batch { .. } | Op::WorkerSpawn
        )
    }
}

/// What to run: through `/bin/sh -c`, or a program with its argv.
#[cfg_attr(test, derive(proptest_derive::Arbitrary))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "form", deny_unknown_fields)]
pub enum Command {
    /// `/bin/sh -c <script>` in the guest.
    #[serde(rename = "shell")]
    Shell {
        /// The shell script, as one string.
        script: String,
    },
    /// `program` run directly (looked up in the guest's `PATH` when it has
    /// no `/`), with `args` as argv\[1..\]; no shell parses anything.
    #[serde(rename = "argv")]
    Argv {
        /// The program; must not be empty.
        program: String,
        /// Its arguments, without argv\[0\].
        args: Vec<String>,
    },
}

/// The process an `exec` or a `spawn` starts: the arguments both ops share.
///
/// A spawn's args are exactly this ([`SpawnSpec`] names it); an exec's are
/// this plus a timeout ([`ExecSpec`]), flattened into one map, so both ops
/// keep their wire shape: `{command, env, env_clear, cwd, stdin}` and
/// `{command, env, env_clear, cwd, stdin, timeout_ms}`. The process runs in
/// its own process group, which is what `signal`, timeouts and `release`
/// address.
#[cfg_attr(test, derive(proptest_derive::Arbitrary))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CommandSpec {
    /// The program and its arguments.
    pub command: Command,
    /// Merged over the agent's environment, or the whole environment when
    /// `env_clear` is set.
    pub env: BTreeMap<String, String>,
    /// Start from an empty environment: the process sees only `env` (for the
    /// shell form the agent also unsets what `/bin/sh` exports itself).
    pub env_clear: bool,
    /// Working directory (a guest path that must be a directory); `None`:
    /// the agent's own.
    pub cwd: Option<String>,
    /// Bytes written to the process's stdin. For an exec they are all of
    /// its stdin (the pipe then closes; `None` gives it `/dev/null`); for a
    /// spawn they are the first bytes, more come as `StdinData` frames until
    /// `stdin_close`.
    #[serde(with = "serde_bytes")]
    pub stdin: Option<Vec<u8>>,
}

impl CommandSpec {
    /// `/bin/sh -c script` with the agent's environment and directory and no
    /// stdin: the common case, which callers adjust with struct update syntax.
    pub fn shell(script: impl Into<String>) -> Self {
        Self::of(Command::Shell {
            script: script.into(),
        })
    }

    /// `program` with `args`, run without a shell; otherwise as [`Self::shell`].
    pub fn argv<A: Into<String>>(
        program: impl Into<String>,
        args: impl IntoIterator<Item = A>,
    ) -> Self {
        Self::of(Command::Argv {
            program: program.into(),
            args: args.into_iter().map(Into::into).collect(),
        })
    }

    fn of(command: Command) -> Self {
        CommandSpec {
            command,
            env: BTreeMap::new(),
            env_clear: false,
            cwd: None,
            stdin: None,
        }
    }
}

/// The args of [`Op::Exec`]: a [`CommandSpec`] and a timeout, one flat map on
/// the wire. serde buffers a flattened struct (rmp-serde counts the map's
/// entries before writing them; the decoder reads the map into serde's
/// generic value first), so an exec's stdin is copied once more each way;
/// unknown keys are still refused and the strict re-encode check still holds.
#[cfg_attr(test, derive(proptest_derive::Arbitrary))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExecSpec {
    /// What to run; its fields sit beside `timeout_ms` in the args map.
    #[serde(flatten)]
    pub run: CommandSpec,
    /// Milliseconds the command may run; on expiry the whole process group
    /// is killed and the result is `timed_out`. `None`: no limit.
    pub timeout_ms: Option<u64>,
}

impl From<CommandSpec> for ExecSpec {
    /// An exec of `run` with no timeout.
    fn from(run: CommandSpec) -> Self {
        ExecSpec {
            run,
            timeout_ms: None,
        }
    }
}

/// The args of [`Op::Spawn`]: a [`CommandSpec`] as it is (a spawned process
/// is bounded by `wait`'s timeout, not its own).
pub type SpawnSpec = CommandSpec;

/// The six open flags, each its own named field (not a bitfield).
#[cfg_attr(test, derive(proptest_derive::Arbitrary))]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OpenMode {
    /// Open for reading.
    pub read: bool,
    /// Open for writing (with `read`: read-write).
    pub write: bool,
    /// Create the file if it does not exist (`O_CREAT`).
    pub create: bool,
    /// Cut an existing file to 0 bytes (`O_TRUNC`).
    pub truncate: bool,
    /// Every write goes to the end of file (`O_APPEND`); implies writing.
    pub append: bool,
    /// Fail if the file exists (`O_EXCL`); needs `create`.
    pub exclusive: bool,
}

impl OpenMode {
    /// An open needs something to do: read, write or append.
    pub fn check(&self) -> Result<(), ProtocolError> {
        if !(self.read || self.write || self.append) {
            return Err(ProtocolError::Invalid {
                what: "open mode",
                reason: "at least one of read, write or append must be true (e.g. {read = true})"
                    .into(),
            });
        }
        if self.exclusive && !self.create {
            return Err(ProtocolError::Invalid {
                what: "open mode",
                reason: "exclusive needs create = true".into(),
            });
        }
        Ok(())
    }
}

closed_enum! {
    /// What a `seek` offset counts from (lseek(2)'s `whence`).
    pub enum Whence {
        /// The start of the file (`SEEK_SET`).
        Set => "set",
        /// The handle's current offset (`SEEK_CUR`).
        Cur => "cur",
        /// The end of the file (`SEEK_END`).
        End => "end",
    }
}

/// What a `tail` follows. Wire shape: `{"kind": "path", …}` or
/// `{"kind": "handle", …}`.
#[cfg_attr(test, derive(proptest_derive::Arbitrary))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", deny_unknown_fields)]
pub enum TailSource {
    /// A file opened once by the agent and followed by descriptor
    /// (`tail -f`, not `tail -F`).
    #[serde(rename = "path")]
    Path {
        /// Guest path of the file.
        path: String,
    },
    /// An open handle, read with pread so its own offset never moves; the
    /// tail ends with `eof` when the handle is closed.
    #[serde(rename = "handle")]
    Handle {
        /// The handle, from `open`.
        handle: HandleId,
    },
}

/// Where a tail starts. Offsets past the end clamp to the end.
#[cfg_attr(test, derive(proptest_derive::Arbitrary))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "at", deny_unknown_fields)]
pub enum TailStart {
    /// Byte 0: everything already in the file, then what is appended.
    #[serde(rename = "beginning")]
    Beginning,
    /// The end of file when the tail opens: only what is appended.
    #[serde(rename = "end")]
    End,
    /// Absolute byte offset.
    #[serde(rename = "offset")]
    Offset {
        /// Bytes from the start of the file.
        offset: u64,
    },
    /// `bytes` before the end of file at the time the tail opens (clamped to 0).
    #[serde(rename = "from_end")]
    FromEnd {
        /// How many bytes before the end.
        bytes: u64,
    },
}

/// A nested pointer: before the call, the address of `bufs[child]` is written
/// into `bufs[parent]` at byte `offset` (8 bytes, native endian). Indices are
/// 0-based on the wire (the Lua API's are 1-based).
#[cfg_attr(test, derive(proptest_derive::Arbitrary))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NestedPtr {
    /// Index of the buffer that receives the address.
    pub parent: u32,
    /// Index of the buffer whose address is written.
    pub child: u32,
    /// Byte offset in the parent; the 8 bytes must fit in it.
    pub offset: u32,
}

/// The args of [`Op::Syscall`]: `syscall(nr, args…)` with host-supplied
/// buffers passed by address. [`SyscallSpec::check`] holds the limits.
#[cfg_attr(test, derive(proptest_derive::Arbitrary))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SyscallSpec {
    /// The Linux system call number, in the guest architecture's numbering.
    pub nr: i64,
    /// Up to six integer arguments; missing ones are 0.
    pub args: Vec<i64>,
    /// Buffers the agent allocates for the call and returns afterwards
    /// (`out_bufs`); each is msgpack `bin`.
    #[serde(with = "crate::wire::byte_vecs")]
    pub bufs: Vec<Vec<u8>>,
    /// `ptrs[i]` is the argument slot (0-based) that receives `bufs[i]`'s address.
    pub ptrs: Vec<u32>,
    /// Pointers written into buffers before the call (structs that point
    /// at other buffers).
    pub nested: Vec<NestedPtr>,
}

impl SyscallSpec {
    /// The argument and pointer rules of the VM page, checked before the call.
    pub fn check(&self) -> Result<(), ProtocolError> {
        let bad = |reason: String| {
            Err(ProtocolError::Invalid {
                what: "syscall arguments",
                reason,
            })
        };
        if self.args.len() > MAX_SYSCALL_ARGS {
            return bad(format!(
                "{} arguments given, at most {MAX_SYSCALL_ARGS}",
                self.args.len()
            ));
        }
        if self.ptrs.len() > self.bufs.len() {
            return bad(format!(
                "{} ptrs but only {} bufs",
                self.ptrs.len(),
                self.bufs.len()
            ));
        }
        for (i, slot) in self.ptrs.iter().enumerate() {
            if *slot as usize >= MAX_SYSCALL_ARGS {
                return bad(format!("ptrs[{i}] = {slot} is not an argument slot (0..5)"));
            }
        }
        check_nested(&self.nested, &self.bufs).or_else(bad)
    }
}

/// The args of [`Op::Ioctl`]: `ioctl(fd, cmd, data)` with host-supplied
/// buffers whose addresses are written into `data`.
#[cfg_attr(test, derive(proptest_derive::Arbitrary))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IoctlSpec {
    /// A file descriptor of the agent's process (a handle id is one).
    pub fd: i32,
    /// The ioctl request number.
    pub cmd: u64,
    /// Passed by pointer as the third argument; returned as `out_data`.
    /// `None`: the third argument is a null pointer.
    #[serde(with = "serde_bytes")]
    pub data: Option<Vec<u8>>,
    /// Buffers the agent allocates for the call and returns afterwards
    /// (`out_bufs`).
    #[serde(with = "crate::wire::byte_vecs")]
    pub bufs: Vec<Vec<u8>>,
    /// `ptr_offsets[i]`: byte offset in `data` that receives `bufs[i]`'s address.
    pub ptr_offsets: Vec<u32>,
}

impl IoctlSpec {
    /// Every pointer offset has a buffer and 8 bytes of room in `data`,
    /// checked before the call.
    pub fn check(&self) -> Result<(), ProtocolError> {
        let data_len = self.data.as_ref().map_or(0, Vec::len);
        if self.ptr_offsets.len() > self.bufs.len() {
            return Err(ProtocolError::Invalid {
                what: "ioctl arguments",
                reason: format!(
                    "{} ptr_offsets but only {} bufs",
                    self.ptr_offsets.len(),
                    self.bufs.len()
                ),
            });
        }
        for (i, off) in self.ptr_offsets.iter().enumerate() {
            if *off as usize + 8 > data_len {
                return Err(ProtocolError::Invalid {
                    what: "ioctl arguments",
                    reason: format!("ptr_offsets[{i}] = {off}: an 8-byte pointer does not fit in {data_len} bytes of data"),
                });
            }
        }
        Ok(())
    }
}

fn check_nested(nested: &[NestedPtr], bufs: &[Vec<u8>]) -> Result<(), String> {
    for (i, n) in nested.iter().enumerate() {
        let parent = bufs.get(n.parent as usize).ok_or_else(|| {
            format!(
                "nested[{i}].parent = {} but there are {} bufs",
                n.parent,
                bufs.len()
            )
        })?;
        if n.child as usize >= bufs.len() {
            return Err(format!(
                "nested[{i}].child = {} but there are {} bufs",
                n.child,
                bufs.len()
            ));
        }
        if n.offset as usize + 8 > parent.len() {
            return Err(format!(
                "nested[{i}].offset = {}: an 8-byte pointer does not fit in parent buffer of {} bytes",
                n.offset,
                parent.len()
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(
        args: Vec<i64>,
        bufs: Vec<Vec<u8>>,
        ptrs: Vec<u32>,
        nested: Vec<NestedPtr>,
    ) -> SyscallSpec {
        SyscallSpec {
            nr: 0,
            args,
            bufs,
            ptrs,
            nested,
        }
    }

    #[test]
    fn syscall_checks_name_the_bad_part() {
        assert!(spec(vec![1; 6], vec![vec![0; 8]], vec![5], vec![])
            .check()
            .is_ok());
        let msg = |s: SyscallSpec| s.check().unwrap_err().to_string();
        assert!(
            msg(spec(vec![0; 7], vec![], vec![], vec![])).contains("7 arguments given, at most 6")
        );
        assert!(msg(spec(vec![], vec![], vec![0], vec![])).contains("1 ptrs but only 0 bufs"));
        assert!(msg(spec(vec![], vec![vec![]], vec![6], vec![])).contains("ptrs[0] = 6"));
        let nested = |parent, child, offset| {
            vec![NestedPtr {
                parent,
                child,
                offset,
            }]
        };
        assert!(msg(spec(vec![], vec![vec![0; 8]], vec![], nested(1, 0, 0)))
            .contains("nested[0].parent = 1"));
        assert!(msg(spec(vec![], vec![vec![0; 8]], vec![], nested(0, 2, 0)))
            .contains("nested[0].child = 2"));
        assert!(
            msg(spec(vec![], vec![vec![0; 8]], vec![], nested(0, 0, 1))).contains("does not fit")
        );
        assert!(
            spec(vec![], vec![vec![0; 16], vec![1]], vec![], nested(0, 1, 8))
                .check()
                .is_ok()
        );
    }

    #[test]
    fn ioctl_pointer_offsets_must_fit_in_data() {
        let s = |data: Option<Vec<u8>>, offs: Vec<u32>| IoctlSpec {
            fd: 0,
            cmd: 0,
            data,
            bufs: vec![vec![1]],
            ptr_offsets: offs,
        };
        assert!(s(Some(vec![0; 8]), vec![0]).check().is_ok());
        assert!(s(Some(vec![0; 8]), vec![1])
            .check()
            .unwrap_err()
            .to_string()
            .contains("does not fit in 8 bytes"));
        assert!(s(None, vec![0]).check().is_err());
    }

    #[test]
    fn open_mode_needs_an_access_flag() {
        let err = OpenMode::default().check().unwrap_err().to_string();
        assert!(
            err.contains("at least one of read, write or append"),
            "{err}"
        );
        let excl = OpenMode {
            write: true,
            exclusive: true,
            ..Default::default()
        };
        assert!(excl
            .check()
            .unwrap_err()
            .to_string()
            .contains("exclusive needs create"));
        assert!(OpenMode {
            append: true,
            ..Default::default()
        }
        .check()
        .is_ok());
    }

    #[test]
    fn batch_refuses_streaming_ops_only() {
        assert!(Op::Ping.allowed_in_batch());
        assert!(Op::Stat { path: "/".into() }.allowed_in_batch());
        assert!(!Op::Batch { ops: vec![] }.allowed_in_batch());
        assert!(!Op::WorkerSpawn.allowed_in_batch());
    }
}
