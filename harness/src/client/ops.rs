//! Typed methods for every agent op, shared by the connection's own
//! namespace ([`AgentClient`]) and workers ([`super::Worker`]).

use std::time::Duration;

use provium_protocol::op::{
    CommandSpec, ExecSpec, HandleId, IoctlSpec, Op, OpKind, OpenMode, SpawnSpec, SyscallSpec,
    TailSource, TailStart, Whence, WorkerId,
};
use provium_protocol::result::{DirEntry, IoctlResult, OpError, OpValue, StatInfo, SyscallResult};
use provium_protocol::wire::Channel;

use super::connection::{take_chunks, take_done, AgentClient};
use super::error::ClientError;
use super::process::{Process, RunOutput};
use super::stream::StreamReader;

/// The guest's clocks, in nanoseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClockReading {
    pub realtime_ns: i64,
    pub monotonic_ns: i64,
}

fn unit(op: OpKind, v: OpValue) -> Result<(), ClientError> {
    match v {
        OpValue::Unit => Ok(()),
        v => Err(ClientError::unexpected(op, &v)),
    }
}

fn invalid(op: OpKind, r: Result<(), provium_protocol::ProtocolError>) -> Result<(), ClientError> {
    r.map_err(|source| ClientError::InvalidRequest { op, source })
}

/// Every op, typed. Implemented by [`AgentClient`] (the connection's own
/// namespace) and [`super::Worker`] (requests carry the worker's id).
pub trait AgentOps {
    /// The connection requests go over.
    fn client(&self) -> &AgentClient;
    /// The worker requests run in; `None` for the connection's own.
    fn worker_id(&self) -> Option<WorkerId>;

    /// Send any op and return its raw value (within the op timeout).
    fn call(&self, op: Op) -> Result<OpValue, ClientError> {
        self.client().call_with(self.worker_id(), op, None)
    }

    /// One round trip that does nothing.
    fn ping(&self) -> Result<(), ClientError> {
        unit(OpKind::Ping, self.call(Op::Ping)?)
    }

    /// Run a command to completion, collecting all of its output, at most
    /// [`AgentClient::max_collected_output_bytes`] of it (more fails the
    /// call with [`ClientError::OutputTooLarge`]). The call waits the spec's
    /// `timeout_ms` plus the op timeout.
    fn exec(&self, spec: ExecSpec) -> Result<RunOutput, ClientError> {
        let client = self.client();
        let deadline = client.deadline_after(spec.timeout_ms.map(Duration::from_millis));
        let id = client.begin(
            self.worker_id(),
            Op::Exec(spec),
            &[Channel::Stdout, Channel::Stderr],
            false,
        )?;
        let channels = [Channel::Stdout, Channel::Stderr];
        let mut out: [Vec<u8>; 2] = [Vec::new(), Vec::new()];
        loop {
            let res = client.wait_for(deadline.map(|d| d.at), |st| {
                let taken = channels.map(|ch| take_chunks(st, id, ch, None));
                // The response is the terminal frame: every chunk precedes it.
                let answer = take_done(st, id);
                let any = taken.iter().any(|t| !t.data.is_empty());
                (any || answer.is_some()).then_some((taken, answer))
            });
            let (taken, answer) = match res {
                Ok(v) => v,
                Err(e) => {
                    client.abandon(id);
                    client.discard_streams(id, &channels);
                    return Err(client.wait_error(e, "exec", deadline));
                }
            };
            for (i, t) in taken.iter().enumerate() {
                for chunk in &t.data {
                    out[i].extend_from_slice(chunk);
                }
            }
            let limit = client.max_collected_output_bytes();
            if (out[0].len() + out[1].len()) as u64 > limit {
                client.abandon(id);
                client.discard_streams(id, &channels);
                return Err(ClientError::OutputTooLarge {
                    op: OpKind::Exec,
                    limit,
                });
            }
            let Some(answer) = answer else {
                for (i, t) in taken.iter().enumerate() {
                    client.ack(id, channels[i], t.bytes);
                }
                continue;
            };
            client.drop_streams(id, &channels);
            let value = answer.into_result().map_err(|error| ClientError::Op {
                op: OpKind::Exec,
                error,
            })?;
            let [stdout, stderr] = out;
            return match value {
                OpValue::Exit(exit) => Ok(RunOutput {
                    exit,
                    stdout,
                    stderr,
                }),
                v => Err(ClientError::unexpected(OpKind::Exec, &v)),
            };
        }
    }

    /// `exec` of a `/bin/sh -c` script with no stdin, env or timeout.
    fn run(&self, script: &str) -> Result<RunOutput, ClientError> {
        self.exec(CommandSpec::shell(script).into())
    }

    /// Start a command and return its handle at once.
    fn spawn(&self, spec: SpawnSpec) -> Result<Process, ClientError> {
        let client = self.client();
        let channels = [Channel::Stdout, Channel::Stderr];
        let deadline = client.deadline_after(None);
        let id = client.begin(self.worker_id(), Op::Spawn(spec), &channels, true)?;
        let value = client.finish(id, OpKind::Spawn, deadline);
        match value {
            Ok(OpValue::Spawned { pid }) => {
                Ok(Process::new(client.clone(), self.worker_id(), id, pid))
            }
            other => {
                client.forget_stdin(id);
                client.drop_streams(id, &channels);
                Err(match other {
                    Ok(v) => ClientError::unexpected(OpKind::Spawn, &v),
                    Err(e) => e,
                })
            }
        }
    }

    /// A whole file's contents.
    fn read_file(&self, path: &str) -> Result<Vec<u8>, ClientError> {
        match self.call(Op::ReadFile { path: path.into() })? {
            OpValue::Bytes(b) => Ok(b),
            v => Err(ClientError::unexpected(OpKind::ReadFile, &v)),
        }
    }

    /// Create or replace a file.
    fn write_file(&self, path: &str, data: &[u8]) -> Result<(), ClientError> {
        let v = self.call(Op::WriteFile {
            path: path.into(),
            data: data.to_vec(),
        })?;
        unit(OpKind::WriteFile, v)
    }

    fn stat(&self, path: &str) -> Result<StatInfo, ClientError> {
        match self.call(Op::Stat { path: path.into() })? {
            OpValue::Stat(s) => Ok(s),
            v => Err(ClientError::unexpected(OpKind::Stat, &v)),
        }
    }

    fn listdir(&self, path: &str) -> Result<Vec<DirEntry>, ClientError> {
        match self.call(Op::ListDir { path: path.into() })? {
            OpValue::Entries(e) => Ok(e),
            v => Err(ClientError::unexpected(OpKind::ListDir, &v)),
        }
    }

    fn mkdir(&self, path: &str, parents: bool, perm: Option<u32>) -> Result<(), ClientError> {
        let v = self.call(Op::Mkdir {
            path: path.into(),
            parents,
            perm,
        })?;
        unit(OpKind::Mkdir, v)
    }

    /// Remove a file or an empty directory.
    fn unlink(&self, path: &str) -> Result<(), ClientError> {
        unit(OpKind::Unlink, self.call(Op::Unlink { path: path.into() })?)
    }

    fn rename(&self, from: &str, to: &str) -> Result<(), ClientError> {
        let v = self.call(Op::Rename {
            from: from.into(),
            to: to.into(),
        })?;
        unit(OpKind::Rename, v)
    }

    /// Open a handle; the mode is checked here before it is sent.
    fn open(&self, path: &str, mode: OpenMode, perm: Option<u32>) -> Result<HandleId, ClientError> {
        invalid(OpKind::Open, mode.check())?;
        match self.call(Op::Open {
            path: path.into(),
            mode,
            perm,
        })? {
            OpValue::Handle { handle } => Ok(handle),
            v => Err(ClientError::unexpected(OpKind::Open, &v)),
        }
    }

    /// Up to `len` bytes; empty at end of file.
    fn read(&self, handle: HandleId, len: u64) -> Result<Vec<u8>, ClientError> {
        match self.call(Op::Read { handle, len })? {
            OpValue::Bytes(b) => Ok(b),
            v => Err(ClientError::unexpected(OpKind::Read, &v)),
        }
    }

    /// Bytes actually written (may be fewer than given).
    fn write(&self, handle: HandleId, data: &[u8]) -> Result<u64, ClientError> {
        match self.call(Op::Write {
            handle,
            data: data.to_vec(),
        })? {
            OpValue::Written { bytes } => Ok(bytes),
            v => Err(ClientError::unexpected(OpKind::Write, &v)),
        }
    }

    /// The resulting offset.
    fn seek(&self, handle: HandleId, offset: i64, whence: Whence) -> Result<u64, ClientError> {
        match self.call(Op::Seek {
            handle,
            offset,
            whence,
        })? {
            OpValue::Offset { offset } => Ok(offset),
            v => Err(ClientError::unexpected(OpKind::Seek, &v)),
        }
    }

    fn tell(&self, handle: HandleId) -> Result<u64, ClientError> {
        match self.call(Op::Tell { handle })? {
            OpValue::Offset { offset } => Ok(offset),
            v => Err(ClientError::unexpected(OpKind::Tell, &v)),
        }
    }

    fn close(&self, handle: HandleId) -> Result<(), ClientError> {
        unit(OpKind::Close, self.call(Op::Close { handle })?)
    }

    /// Follow a file or handle; read it with [`StreamReader::next`].
    fn tail(&self, source: TailSource, start: TailStart) -> Result<StreamReader, ClientError> {
        let client = self.client();
        let deadline = client.deadline_after(None);
        let id = client.begin(
            self.worker_id(),
            Op::Tail { source, start },
            &[Channel::Data],
            false,
        )?;
        match client.finish(id, OpKind::Tail, deadline) {
            Ok(OpValue::Tail { stream, offset }) if stream == id => Ok(StreamReader::tail(
                client.clone(),
                self.worker_id(),
                id,
                offset,
            )),
            other => {
                client.drop_streams(id, &[Channel::Data]);
                Err(match other {
                    Ok(v @ OpValue::Tail { .. }) => {
                        // Streams are keyed by the request id; a tail opened
                        // under another id is one we cannot read: close it.
                        if let OpValue::Tail { stream, .. } = v {
                            client.send_detached(self.worker_id(), Op::CloseStream { stream });
                        }
                        ClientError::UnexpectedValue {
                            op: OpKind::Tail,
                            got: "tail on a stream other than the request's id".into(),
                        }
                    }
                    Ok(v) => ClientError::unexpected(OpKind::Tail, &v),
                    Err(e) => e,
                })
            }
        }
    }

    /// A raw syscall; the spec is checked here before it is sent.
    fn syscall(&self, spec: SyscallSpec) -> Result<SyscallResult, ClientError> {
        invalid(OpKind::Syscall, spec.check())?;
        match self.call(Op::Syscall(spec))? {
            OpValue::Syscall(r) => Ok(r),
            v => Err(ClientError::unexpected(OpKind::Syscall, &v)),
        }
    }

    /// An ioctl; the spec is checked here before it is sent.
    fn ioctl(&self, spec: IoctlSpec) -> Result<IoctlResult, ClientError> {
        invalid(OpKind::Ioctl, spec.check())?;
        match self.call(Op::Ioctl(spec))? {
            OpValue::Ioctl(r) => Ok(r),
            v => Err(ClientError::unexpected(OpKind::Ioctl, &v)),
        }
    }

    fn clock_get(&self) -> Result<ClockReading, ClientError> {
        match self.call(Op::ClockGet)? {
            OpValue::Clock {
                realtime_ns,
                monotonic_ns,
            } => Ok(ClockReading {
                realtime_ns,
                monotonic_ns,
            }),
            v => Err(ClientError::unexpected(OpKind::ClockGet, &v)),
        }
    }

    fn clock_set(&self, realtime_ns: i64) -> Result<(), ClientError> {
        unit(OpKind::ClockSet, self.call(Op::ClockSet { realtime_ns })?)
    }

    fn clock_advance(&self, delta_ns: i64) -> Result<(), ClientError> {
        unit(
            OpKind::ClockAdvance,
            self.call(Op::ClockAdvance { delta_ns })?,
        )
    }

    /// Several ops in one round trip: one result per op, in order.
    fn batch(&self, ops: Vec<Op>) -> Result<Vec<Result<OpValue, OpError>>, ClientError> {
        let n = ops.len();
        match self.call(Op::Batch { ops })? {
            OpValue::Batch(results) if results.len() == n => {
                Ok(results.into_iter().map(|r| r.into_result()).collect())
            }
            OpValue::Batch(results) => Err(ClientError::UnexpectedValue {
                op: OpKind::Batch,
                got: format!("batch of {} results for {n} ops", results.len()),
            }),
            v => Err(ClientError::unexpected(OpKind::Batch, &v)),
        }
    }
}

impl AgentOps for AgentClient {
    fn client(&self) -> &AgentClient {
        self
    }
    fn worker_id(&self) -> Option<WorkerId> {
        None
    }
}
