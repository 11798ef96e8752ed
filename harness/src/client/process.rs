//! A spawned process in the agent, and the captured result of a run.

use std::time::Duration;

use provium_protocol::op::{Op, OpKind, StreamId, WorkerId};
use provium_protocol::result::{ExitInfo, ExitStatus, OpValue, ProcessState};
use provium_protocol::wire::Channel;

use super::connection::{millis, take_chunks, take_done, AgentClient};
use super::error::ClientError;
use super::stream::StreamReader;

const OUTPUT: [Channel; 2] = [Channel::Stdout, Channel::Stderr];

/// How a command ended and everything it wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunOutput {
    pub exit: ExitInfo,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
}

impl RunOutput {
    /// Exited with code 0.
    pub fn success(&self) -> bool {
        self.exit.status == ExitStatus::Exited && self.exit.exit_code == 0
    }

    /// stdout as text (lossy).
    pub fn stdout_str(&self) -> String {
        String::from_utf8_lossy(&self.stdout).into_owned()
    }

    /// stderr as text (lossy).
    pub fn stderr_str(&self) -> String {
        String::from_utf8_lossy(&self.stderr).into_owned()
    }
}

/// A process started with `spawn`. Its output is buffered on the host up to
/// the stream window and returned by [`Process::wait`], except what a
/// [`StreamReader`] from [`Process::stdout`]/[`Process::stderr`] consumed.
///
/// Dropping the handle does not kill the process (the agent never
/// auto-kills); it stops reading its output. Call [`Process::release`] to
/// end it.
#[derive(Debug)]
pub struct Process {
    client: AgentClient,
    worker: Option<WorkerId>,
    id: StreamId,
    spawn_pid: u32,
    done: bool,
}

impl Process {
    pub(crate) fn new(
        client: AgentClient,
        worker: Option<WorkerId>,
        id: StreamId,
        spawn_pid: u32,
    ) -> Self {
        Process {
            client,
            worker,
            id,
            spawn_pid,
            done: false,
        }
    }

    /// The agent-side handle (the spawn request's id); stable.
    pub fn handle(&self) -> StreamId {
        self.id
    }

    /// The pid the agent reported when it started the process.
    pub fn spawn_pid(&self) -> u32 {
        self.spawn_pid
    }

    fn call(&self, op: Op) -> Result<OpValue, ClientError> {
        self.client.call_with(self.worker, op, None)
    }

    /// The live kernel pid inside the guest (asks the agent each time).
    pub fn pid(&self) -> Result<u32, ClientError> {
        match self.call(Op::Pid { process: self.id })? {
            OpValue::Pid { pid } => Ok(pid),
            v => Err(ClientError::unexpected(OpKind::Pid, &v)),
        }
    }

    /// Write to the process's stdin, blocking while the agent has not yet
    /// acknowledged a window's worth (at most the op timeout).
    pub fn stdin_write(&self, data: &[u8]) -> Result<(), ClientError> {
        self.client
            .stdin_write(self.id, data, self.client.deadline_after(None))
    }

    /// Close the process's stdin pipe.
    pub fn close_stdin(&self) -> Result<(), ClientError> {
        self.call(Op::StdinClose { process: self.id }).map(drop)
    }

    /// Send a Linux signal number to the process's group.
    pub fn signal(&self, signal: i32) -> Result<(), ClientError> {
        self.call(Op::Signal {
            process: self.id,
            signal,
        })
        .map(drop)
    }

    /// Non-blocking status.
    pub fn status(&self) -> Result<ProcessState, ClientError> {
        match self.call(Op::ProcessStatus { process: self.id })? {
            OpValue::ProcessStatus(s) => Ok(s),
            v => Err(ClientError::unexpected(OpKind::ProcessStatus, &v)),
        }
    }

    /// A reader over stdout. Chunks it consumes are not in `wait`'s result.
    pub fn stdout(&self) -> StreamReader {
        StreamReader::process(self.client.clone(), self.id, Channel::Stdout)
    }

    /// A reader over stderr. Chunks it consumes are not in `wait`'s result.
    pub fn stderr(&self) -> StreamReader {
        StreamReader::process(self.client.clone(), self.id, Channel::Stderr)
    }

    /// Wait for the process to end and collect its remaining output.
    /// `None` waits without limit (a lost connection still wakes it); on
    /// `Some(t)` expiry the agent kills the process group and the exit
    /// status is `timed_out`. A zero timeout is refused: use [`Self::status`].
    pub fn wait(&mut self, timeout: Option<Duration>) -> Result<RunOutput, ClientError> {
        if timeout == Some(Duration::ZERO) {
            return Err(ClientError::InvalidArgument {
                op: OpKind::Wait,
                reason: "a zero timeout would kill the process at once; poll with status() instead"
                    .into(),
            });
        }
        if self.done {
            return Err(ClientError::InvalidArgument {
                op: OpKind::Wait,
                reason: format!("process {} was already waited for or released", self.id),
            });
        }
        let deadline = timeout.and_then(|t| self.client.deadline_after(Some(t)));
        let wait_id = self.client.begin(
            self.worker,
            Op::Wait {
                process: self.id,
                timeout_ms: timeout.map(millis),
            },
            &[],
            false,
        )?;
        let mut out: [Vec<u8>; 2] = [Vec::new(), Vec::new()];
        let mut ended = [false, false];
        let mut exit = None;
        let mut deadline = deadline;
        let id = self.id;
        loop {
            let res = self.client.wait_for(deadline.map(|d| d.at), |st| {
                let mut got = Vec::new();
                for (i, ch) in OUTPUT.iter().enumerate() {
                    if !ended[i] {
                        let t = take_chunks(st, id, *ch, None);
                        if !t.is_empty() {
                            got.push((i, t));
                        }
                    }
                }
                let answer = if exit.is_none() {
                    take_done(st, wait_id)
                } else {
                    None
                };
                (!got.is_empty() || answer.is_some()).then_some((got, answer))
            });
            let (got, answer) = match res {
                Ok(v) => v,
                Err(e) => {
                    self.client.abandon(wait_id);
                    let what = if exit.is_none() {
                        "wait"
                    } else {
                        "wait (end of the process's output)"
                    };
                    return Err(self.client.wait_error(e, what, deadline));
                }
            };
            for (i, taken) in got {
                for chunk in &taken.data {
                    out[i].extend_from_slice(chunk);
                }
                if taken.ended.is_some() || taken.missing {
                    ended[i] = true;
                } else {
                    self.client.ack(id, OUTPUT[i], taken.bytes);
                }
            }
            if let Some(answer) = answer {
                let value = answer.into_result().map_err(|error| ClientError::Op {
                    op: OpKind::Wait,
                    error,
                })?;
                match value {
                    OpValue::Exit(info) => exit = Some(info),
                    v => return Err(ClientError::unexpected(OpKind::Wait, &v)),
                }
                // The process is gone; its output ends shortly after.
                deadline = self.client.deadline_after(None);
            }
            if let (Some(info), [true, true]) = (exit, ended) {
                self.finish();
                self.client.drop_streams(id, &OUTPUT);
                let [stdout, stderr] = out;
                return Ok(RunOutput {
                    exit: info,
                    stdout,
                    stderr,
                });
            }
        }
    }

    /// Forget the process: the agent sends SIGTERM, then SIGKILL after a
    /// grace period. Its remaining output is discarded.
    pub fn release(&mut self) -> Result<(), ClientError> {
        if self.done {
            return Ok(());
        }
        let res = self.call(Op::Release { process: self.id });
        self.finish();
        self.client.discard_streams(self.id, &OUTPUT);
        res.map(drop)
    }

    fn finish(&mut self) {
        self.done = true;
        self.client.forget_stdin(self.id);
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        if !self.done {
            self.client.forget_stdin(self.id);
            self.client.discard_streams(self.id, &OUTPUT);
        }
    }
}
