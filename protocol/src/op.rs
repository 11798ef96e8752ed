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
    /// Close a spawned process's stdin pipe.
    #[serde(rename = "stdin_close")]
    StdinClose { process: StreamId },
    /// Wait for a spawned process. On timeout the agent kills its process
    /// group and answers `Exit` with status `timed_out`. Frees the slot.
    #[serde(rename = "wait")]
    Wait {
        process: StreamId,
        timeout_ms: Option<u64>,
    },
    /// Send a signal (a Linux signal number) to a spawned process's group.
    #[serde(rename = "signal")]
    Signal { process: StreamId, signal: i32 },
    /// Non-blocking status of a spawned process (`OpValue::ProcessStatus`).
    #[serde(rename = "process_status")]
    ProcessStatus { process: StreamId },
    /// The kernel pid of a spawned process (`OpValue::Pid`).
    #[serde(rename = "pid")]
    Pid { process: StreamId },
    /// Forget a spawned process: SIGTERM, then SIGKILL after a grace period
    /// if it is still running.
    #[serde(rename = "release")]
    Release { process: StreamId },
    #[serde(rename = "read_file")]
    ReadFile { path: String },
    #[serde(rename = "write_file")]
    WriteFile {
        path: String,
        #[serde(with = "serde_bytes")]
        data: Vec<u8>,
    },
    #[serde(rename = "stat")]
    Stat { path: String },
    #[serde(rename = "listdir")]
    ListDir { path: String },
    #[serde(rename = "mkdir")]
    Mkdir {
        path: String,
        parents: bool,
        perm: Option<u32>,
    },
    /// Remove a file or an empty directory.
    #[serde(rename = "unlink")]
    Unlink { path: String },
    #[serde(rename = "rename")]
    Rename { from: String, to: String },
    /// Open a file handle (`OpValue::Handle`).
    #[serde(rename = "open")]
    Open {
        path: String,
        mode: OpenMode,
        perm: Option<u32>,
    },
    /// Read up to `len` bytes; empty at end of file.
    #[serde(rename = "read")]
    Read { handle: HandleId, len: u64 },
    /// Write bytes; the answer says how many were written (may be partial).
    #[serde(rename = "write")]
    Write {
        handle: HandleId,
        #[serde(with = "serde_bytes")]
        data: Vec<u8>,
    },
    #[serde(rename = "seek")]
    Seek {
        handle: HandleId,
        offset: i64,
        whence: Whence,
    },
    #[serde(rename = "tell")]
    Tell { handle: HandleId },
    #[serde(rename = "close")]
    Close { handle: HandleId },
    /// Follow a file or handle; data streams as chunks on the request's id
    /// until `close_stream`.
    #[serde(rename = "tail")]
    Tail {
        source: TailSource,
        start: TailStart,
    },
    /// Stop a tail (or a spawned process's output stream).
    #[serde(rename = "close_stream")]
    CloseStream { stream: StreamId },
    #[serde(rename = "syscall")]
    Syscall(SyscallSpec),
    #[serde(rename = "ioctl")]
    Ioctl(IoctlSpec),
    /// `OpValue::Clock`: CLOCK_REALTIME and CLOCK_MONOTONIC.
    #[serde(rename = "clock_get")]
    ClockGet,
    /// Set CLOCK_REALTIME (may be negative: before the epoch).
    #[serde(rename = "clock_set")]
    ClockSet { realtime_ns: i64 },
    /// Move CLOCK_REALTIME by a signed amount.
    #[serde(rename = "clock_advance")]
    ClockAdvance { delta_ns: i64 },
    /// Create a worker: its own handle namespace and its own serial queue of
    /// requests, concurrent with other workers (`OpValue::Worker`).
    #[serde(rename = "worker_spawn")]
    WorkerSpawn,
    /// Wait until the worker's queued requests have finished.
    #[serde(rename = "worker_join")]
    WorkerJoin { worker: WorkerId },
    /// Signal every process the worker started.
    #[serde(rename = "worker_kill")]
    WorkerKill { worker: WorkerId, signal: i32 },
    /// Close the worker: its handles and processes are cleaned up.
    #[serde(rename = "worker_close")]
    WorkerClose { worker: WorkerId },
    /// Several ops in one round trip; one result each, no short-circuit.
    /// Streaming ops and nested batches are refused per op.
    #[serde(rename = "batch")]
    Batch {
        #[cfg_attr(test, proptest(strategy = "crate::proptests::leaf_ops()"))]
        ops: Vec<Op>,
    },
}

closed_enum! {
    /// The wire tag of every [`Op`].
    pub enum OpKind {
        Ping => "ping",
        Exec => "exec",
        Spawn => "spawn",
        StdinClose => "stdin_close",
        Wait => "wait",
        Signal => "signal",
        ProcessStatus => "process_status",
        Pid => "pid",
        Release => "release",
        ReadFile => "read_file",
        WriteFile => "write_file",
        Stat => "stat",
        ListDir => "listdir",
        Mkdir => "mkdir",
        Unlink => "unlink",
        Rename => "rename",
        Open => "open",
        Read => "read",
        Write => "write",
        Seek => "seek",
        Tell => "tell",
        Close => "close",
        Tail => "tail",
        CloseStream => "close_stream",
        Syscall => "syscall",
        Ioctl => "ioctl",
        ClockGet => "clock_get",
        ClockSet => "clock_set",
        ClockAdvance => "clock_advance",
        WorkerSpawn => "worker_spawn",
        WorkerJoin => "worker_join",
        WorkerKill => "worker_kill",
        WorkerClose => "worker_close",
        Batch => "batch",
    }
}

impl Op {
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
    #[serde(rename = "shell")]
    Shell { script: String },
    #[serde(rename = "argv")]
    Argv { program: String, args: Vec<String> },
}

#[cfg_attr(test, derive(proptest_derive::Arbitrary))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExecSpec {
    pub command: Command,
    /// Merged over the agent's environment, or the whole environment when
    /// `env_clear` is set.
    pub env: BTreeMap<String, String>,
    pub env_clear: bool,
    pub cwd: Option<String>,
    #[serde(with = "serde_bytes")]
    pub stdin: Option<Vec<u8>>,
    /// On expiry the whole process group is killed; the result is `timed_out`.
    pub timeout_ms: Option<u64>,
}

#[cfg_attr(test, derive(proptest_derive::Arbitrary))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SpawnSpec {
    pub command: Command,
    pub env: BTreeMap<String, String>,
    pub env_clear: bool,
    pub cwd: Option<String>,
    /// Initial stdin bytes; more go through `StdinData` frames.
    #[serde(with = "serde_bytes")]
    pub stdin: Option<Vec<u8>>,
}

/// The six open flags, each its own named field (not a bitfield).
#[cfg_attr(test, derive(proptest_derive::Arbitrary))]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OpenMode {
    pub read: bool,
    pub write: bool,
    pub create: bool,
    pub truncate: bool,
    pub append: bool,
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
    pub enum Whence {
        Set => "set",
        Cur => "cur",
        End => "end",
    }
}

#[cfg_attr(test, derive(proptest_derive::Arbitrary))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", deny_unknown_fields)]
pub enum TailSource {
    #[serde(rename = "path")]
    Path { path: String },
    #[serde(rename = "handle")]
    Handle { handle: HandleId },
}

/// Where a tail starts. Offsets past the end clamp to the end.
#[cfg_attr(test, derive(proptest_derive::Arbitrary))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "at", deny_unknown_fields)]
pub enum TailStart {
    #[serde(rename = "beginning")]
    Beginning,
    #[serde(rename = "end")]
    End,
    /// Absolute byte offset.
    #[serde(rename = "offset")]
    Offset { offset: u64 },
    /// `bytes` before the end of file at the time the tail opens (clamped to 0).
    #[serde(rename = "from_end")]
    FromEnd { bytes: u64 },
}

/// A nested pointer: before the call, the address of `bufs[child]` is written
/// into `bufs[parent]` at byte `offset` (8 bytes, native endian). Indices are
/// 0-based on the wire (the Lua API's are 1-based).
#[cfg_attr(test, derive(proptest_derive::Arbitrary))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NestedPtr {
    pub parent: u32,
    pub child: u32,
    pub offset: u32,
}

#[cfg_attr(test, derive(proptest_derive::Arbitrary))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SyscallSpec {
    pub nr: i64,
    /// Up to six integer arguments; missing ones are 0.
    pub args: Vec<i64>,
    #[serde(with = "crate::wire::byte_vecs")]
    pub bufs: Vec<Vec<u8>>,
    /// `ptrs[i]` is the argument slot (0-based) that receives `bufs[i]`'s address.
    pub ptrs: Vec<u32>,
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

#[cfg_attr(test, derive(proptest_derive::Arbitrary))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IoctlSpec {
    pub fd: i32,
    pub cmd: u64,
    /// Passed by pointer as the third argument; returned as `out_data`.
    #[serde(with = "serde_bytes")]
    pub data: Option<Vec<u8>>,
    #[serde(with = "crate::wire::byte_vecs")]
    pub bufs: Vec<Vec<u8>>,
    /// `ptr_offsets[i]`: byte offset in `data` that receives `bufs[i]`'s address.
    pub ptr_offsets: Vec<u32>,
}

impl IoctlSpec {
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
