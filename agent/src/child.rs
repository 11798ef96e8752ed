//! Running commands: building the child, the output pump shared by `exec`
//! and `spawn`, and [`Process`], a spawned child's slot in a namespace.
//! Nothing here knows the request context, so the namespace can own
//! children without depending on the op handlers (`exec.rs`, `process.rs`).
//!
//! Every child runs in its own process group (`setpgid(0, 0)`), so a timeout,
//! a kill or a namespace close reaches everything it forked. The pump is one
//! thread that polls the stdout and stderr pipes, a pidfd for the exit and a
//! [`Waker`] for acks. It reads a pipe only while that channel's window has
//! room, so a host that stops acknowledging stops the child (it blocks on its
//! full pipe) instead of growing the agent's memory.
//!
//! When the child exits, whatever is already in its pipes is still sent; the
//! pump then stops without waiting for end of file, so a background grandchild
//! that inherited the pipes (`daemon &`) cannot hold an exec open forever.

use std::collections::BTreeMap;
use std::io::{self, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{self, Child, ChildStdin};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Instant;

use provium_protocol::op::{Command, CommandSpec, StreamId};
use provium_protocol::result::{ExitInfo, OpError};
use provium_protocol::signal::SIGKILL;
use provium_protocol::wire::StreamEndReason;
use provium_protocol::MAX_CHUNK_BYTES;

use crate::locks::{lock, wait, wait_timeout};
use crate::op_error::{self, MAX_ANSWER_BYTES};
use crate::stdin::StdinPipe;
use crate::stream::{Room, StreamOut};
use crate::waker::Waker;

/// Send `signal` to the process group `pgid`.
pub fn kill_group(pgid: u32, signal: i32) -> io::Result<()> {
    let pgid = i32::try_from(pgid).map_err(|_| io::Error::from_raw_os_error(libc::ESRCH))?;
    if pgid <= 1 {
        // Never signal our own group (0) or everything (-1).
        return Err(io::Error::from_raw_os_error(libc::ESRCH));
    }
    // SAFETY: kill(2) on a negative pid signals that process group; no memory involved.
    if unsafe { libc::kill(-pgid, signal) } == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// The child for `spec` (an exec's or a spawn's): environment merged over
/// the agent's (or alone with `env_clear`), `cwd` checked up front so its
/// error names it. Stdio is the caller's to set.
pub fn build(spec: &CommandSpec) -> Result<process::Command, OpError> {
    let CommandSpec {
        command,
        env,
        env_clear,
        cwd,
        stdin: _,
    } = spec;
    let env_clear = *env_clear;
    let mut cmd = match command {
        Command::Shell { script } => {
            let mut c = process::Command::new("/bin/sh");
            if env_clear {
                c.arg("-c").arg(shell_env_clear_script(script, env));
            } else {
                c.arg("-c").arg(script);
            }
            c
        }
        Command::Argv { program, args } => {
            if program.is_empty() {
                return Err(op_error::invalid("argv command has an empty program name"));
            }
            let mut c = process::Command::new(program);
            c.args(args);
            c
        }
    };
    if env_clear {
        cmd.env_clear();
    }
    cmd.envs(env);
    if let Some(dir) = cwd {
        match std::fs::metadata(dir) {
            Ok(m) if m.is_dir() => {}
            Ok(_) => {
                return Err(op_error::io(
                    &io::Error::from_raw_os_error(libc::ENOTDIR),
                    format!("working directory {dir}"),
                ))
            }
            Err(e) => return Err(op_error::io(&e, format!("working directory {dir}"))),
        }
        cmd.current_dir(dir);
    }
    cmd.process_group(0);
    Ok(cmd)
}

/// Variables a POSIX shell exports on its own at startup (dash and busybox
/// ash add `PWD`; bash adds `PWD`, `SHLVL` and `_`).
const SHELL_ADDED_VARS: &[&str] = &["PWD", "OLDPWD", "SHLVL", "_"];

/// The shell form under `env_clear`: the guest must see only the supplied
/// keys, so the variables the shell itself exported are unset first, on the
/// script's own first line (error line numbers stay the script's). A key
/// the caller supplied is kept. Bash re-creates `_` for every command it
/// runs, so under a bash `/bin/sh` that one variable stays visible.
fn shell_env_clear_script(script: &str, env: &BTreeMap<String, String>) -> String {
    let added: Vec<&str> = SHELL_ADDED_VARS
        .iter()
        .copied()
        .filter(|v| !env.contains_key(*v))
        .collect();
    if added.is_empty() {
        return script.to_string();
    }
    format!("unset {}; {script}", added.join(" "))
}

/// Why a child did not start, naming what was run.
pub fn spawn_error(err: &io::Error, command: &Command) -> OpError {
    match command {
        Command::Shell { .. } => op_error::io(err, "cannot run /bin/sh"),
        Command::Argv { program, .. } => op_error::io(err, format!("cannot run `{program}`")),
    }
}

fn exit_info(status: process::ExitStatus, timed_out: bool) -> ExitInfo {
    if timed_out {
        ExitInfo::timed_out()
    } else if let Some(code) = status.code() {
        ExitInfo::exited(code)
    } else if let Some(sig) = status.signal() {
        ExitInfo::signalled(sig)
    } else {
        ExitInfo::exited(status.into_raw())
    }
}

/// Write `data` to the child's stdin on a helper thread, then close it.
pub fn feed_stdin(mut stdin: ChildStdin, data: Vec<u8>) {
    // If the thread cannot start, `stdin` is dropped: the child sees EOF.
    let _ = std::thread::Builder::new()
        .name("provium-stdin".into())
        .spawn(move || {
            // EPIPE: the child exited without reading it all; nothing to do.
            let _ = stdin.write_all(&data);
        });
}

/// Where a channel's output goes.
pub enum Sink {
    Stream(Arc<StreamOut>),
    /// Inside a batch: kept for the `Ran` answer.
    Capture(Vec<u8>),
}

/// Hooks for `spawn`, which reports progress to waiters.
pub trait PumpEvents {
    /// The child was reaped.
    fn exited(&self, _exit: ExitInfo) {}
    /// The child exited and its output was sent, or is waiting on host acks.
    fn settled(&self) {}
    /// Channel `i` (0 stdout, 1 stderr) reached end of file (or failed): no
    /// more output can come on it, though the child may still be running.
    fn output_ended(&self, _i: usize) {}
}

pub struct NoEvents;
impl PumpEvents for NoEvents {}

struct PumpChan {
    pipe: Option<OwnedFd>,
    sink: Sink,
}

pub struct Pump {
    child: Child,
    pidfd: Option<OwnedFd>,
    waker: Arc<Waker>,
    chans: Vec<PumpChan>,
    deadline: Option<Instant>,
    capture_left: usize,
    overflow: bool,
}

pub struct PumpOutcome {
    pub exit: ExitInfo,
    /// Captured stdout and stderr (batch only).
    pub captured: Vec<Vec<u8>>,
    /// The capture limit was exceeded and the child was killed.
    pub overflow: bool,
}

fn pidfd_open(pid: u32) -> Option<OwnedFd> {
    // SAFETY: pidfd_open(2) takes a pid and flags; no memory involved.
    let raw = unsafe { libc::syscall(libc::SYS_pidfd_open, libc::c_long::from(pid), 0) };
    let raw = RawFd::try_from(raw).ok().filter(|fd| *fd >= 0)?;
    // SAFETY: the kernel returned a fresh fd that we now own.
    Some(unsafe { OwnedFd::from_raw_fd(raw) })
}

fn pollfd(fd: RawFd) -> libc::pollfd {
    libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    }
}

fn ms_until(deadline: Instant) -> i32 {
    let left = deadline.saturating_duration_since(Instant::now());
    // Round up so we never wake just before the deadline and spin.
    i32::try_from(left.as_millis().saturating_add(1)).unwrap_or(i32::MAX)
}

impl Pump {
    /// Take the child's stdout and stderr; `sinks` is [stdout, stderr].
    pub fn new(
        mut child: Child,
        sinks: [Sink; 2],
        waker: Arc<Waker>,
        deadline: Option<Instant>,
    ) -> Pump {
        let pidfd = pidfd_open(child.id());
        let pipes = [
            child.stdout.take().map(OwnedFd::from),
            child.stderr.take().map(OwnedFd::from),
        ];
        let chans = pipes
            .into_iter()
            .zip(sinks)
            .map(|(pipe, sink)| PumpChan { pipe, sink })
            .collect();
        Pump {
            child,
            pidfd,
            waker,
            chans,
            deadline,
            capture_left: MAX_ANSWER_BYTES,
            overflow: false,
        }
    }

    /// How much may be read from channel `i` now; `None`: wait for an ack.
    fn room(&self, i: usize) -> Option<usize> {
        match &self.chans[i].sink {
            Sink::Stream(s) => match s.room() {
                Room::Send(0) => None,
                Room::Send(n) => Some(n),
                Room::Discard => Some(MAX_CHUNK_BYTES),
            },
            Sink::Capture(_) => Some(MAX_CHUNK_BYTES),
        }
    }

    fn read_chan(&mut self, i: usize, buf: &mut [u8]) {
        let Some(fd) = &self.chans[i].pipe else {
            return;
        };
        // SAFETY: `buf` is valid for writes of `buf.len()` bytes for the call.
        let n = unsafe { libc::read(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
        if n < 0 {
            let err = io::Error::last_os_error();
            if matches!(
                err.kind(),
                io::ErrorKind::Interrupted | io::ErrorKind::WouldBlock
            ) {
                return;
            }
            self.chans[i].pipe = None;
            return;
        }
        if n == 0 {
            self.chans[i].pipe = None;
            return;
        }
        let data = &buf[..n.unsigned_abs()];
        let pid = self.child.id();
        match &mut self.chans[i].sink {
            Sink::Stream(s) => {
                // False: the stream was closed; the bytes are dropped.
                s.send(data);
            }
            Sink::Capture(v) => {
                if self.overflow {
                    return;
                }
                if data.len() > self.capture_left {
                    self.overflow = true;
                    let _ = kill_group(pid, SIGKILL);
                    return;
                }
                self.capture_left -= data.len();
                v.extend_from_slice(data);
            }
        }
    }

    /// Run until the child has exited and its pipes are drained.
    pub fn run(mut self, events: &dyn PumpEvents) -> PumpOutcome {
        let mut buf = vec![0u8; MAX_CHUNK_BYTES];
        let mut exit: Option<ExitInfo> = None;
        let mut timed_out = false;
        loop {
            let mut pfds = Vec::with_capacity(4);
            let mut polled = Vec::with_capacity(2);
            let mut open = 0;
            for i in 0..self.chans.len() {
                if let Some(fd) = &self.chans[i].pipe {
                    open += 1;
                    let fd = fd.as_raw_fd();
                    if let Some(room) = self.room(i) {
                        pfds.push(pollfd(fd));
                        polled.push((i, room));
                    }
                }
            }
            if exit.is_some() && open == 0 {
                break;
            }
            // A channel waiting for acks may still hold data in its pipe.
            let all_polled = polled.len() == open;
            let waker_at = pfds.len();
            pfds.push(pollfd(self.waker.raw_fd()));
            let pid_at = match (&self.pidfd, exit) {
                (Some(fd), None) => {
                    pfds.push(pollfd(fd.as_raw_fd()));
                    Some(pfds.len() - 1)
                }
                _ => None,
            };
            let timeout = if exit.is_some() {
                if all_polled {
                    0
                } else {
                    // Exited, output waiting on host acks.
                    events.settled();
                    -1
                }
            } else {
                let base = if self.pidfd.is_none() { 10 } else { -1 };
                match (self.deadline, timed_out) {
                    (Some(d), false) => {
                        let ms = ms_until(d);
                        if base < 0 {
                            ms
                        } else {
                            ms.min(base)
                        }
                    }
                    _ => base,
                }
            };
            let nfds = libc::nfds_t::try_from(pfds.len()).expect("at most 4 fds");
            // SAFETY: `pfds` is a live array of `nfds` pollfds for the call.
            let n = unsafe { libc::poll(pfds.as_mut_ptr(), nfds, timeout) };
            if n < 0 {
                let err = io::Error::last_os_error();
                if err.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                eprintln!(
                    "provium-agent: poll failed while running pid {}: {err}",
                    self.child.id()
                );
                let _ = kill_group(self.child.id(), SIGKILL);
                let status = self.child.wait();
                exit =
                    Some(status.map_or(ExitInfo::signalled(SIGKILL), |s| exit_info(s, timed_out)));
                break;
            }
            if pfds[waker_at].revents != 0 {
                self.waker.drain();
            }
            let check_exit = match pid_at {
                Some(k) => pfds[k].revents != 0,
                None => exit.is_none(),
            };
            if check_exit {
                match self.child.try_wait() {
                    Ok(Some(status)) => {
                        let info = exit_info(status, timed_out);
                        exit = Some(info);
                        events.exited(info);
                    }
                    Ok(None) => {}
                    Err(e) => {
                        eprintln!("provium-agent: cannot reap pid {}: {e}", self.child.id());
                        let info = ExitInfo::signalled(SIGKILL);
                        exit = Some(info);
                        events.exited(info);
                    }
                }
            }
            for (k, (i, room)) in polled.iter().copied().enumerate() {
                if pfds[k].revents != 0 {
                    self.read_chan(i, &mut buf[..room]);
                    if self.chans[i].pipe.is_none() {
                        events.output_ended(i);
                    }
                }
            }
            if exit.is_some() && n == 0 {
                // Exited, and every open pipe was polled and is empty (a zero
                // count needs the zero timeout, which needs all_polled).
                break;
            }
            if exit.is_none() && !timed_out && self.deadline.is_some_and(|d| Instant::now() >= d) {
                timed_out = true;
                let _ = kill_group(self.child.id(), SIGKILL);
            }
        }
        events.settled();
        let captured = self
            .chans
            .into_iter()
            .map(|c| match c.sink {
                Sink::Capture(v) => v,
                Sink::Stream(_) => Vec::new(),
            })
            .collect();
        PumpOutcome {
            exit: exit.unwrap_or(ExitInfo::signalled(SIGKILL)),
            captured,
            overflow: self.overflow,
        }
    }
}

/// A spawned process's slot: its pid, output streams and stdin, and its
/// exit once reaped.
pub struct Process {
    pub id: StreamId,
    pub pid: u32,
    state: Mutex<ProcState>,
    cv: Condvar,
    pub outs: [Arc<StreamOut>; 2],
    pub stdin: Arc<StdinPipe>,
}

#[derive(Default)]
struct ProcState {
    exit: Option<ExitInfo>,
    settled: bool,
}

impl PumpEvents for Process {
    fn exited(&self, exit: ExitInfo) {
        lock(&self.state).exit = Some(exit);
        self.cv.notify_all();
    }
    fn settled(&self) {
        lock(&self.state).settled = true;
        self.cv.notify_all();
    }
    /// A process that closes stdout (or stderr) and keeps running: that
    /// stream ends now, not at exit (idempotent with `finish`).
    fn output_ended(&self, i: usize) {
        if let Some(o) = self.outs.get(i) {
            o.end(StreamEndReason::Eof, None);
        }
    }
}

impl Process {
    /// The slot of spawn request `id`, child `pid`, streaming on `outs`.
    pub fn new(id: StreamId, pid: u32, outs: [Arc<StreamOut>; 2]) -> Process {
        Process {
            id,
            pid,
            state: Mutex::new(ProcState::default()),
            cv: Condvar::new(),
            outs,
            stdin: StdinPipe::new(),
        }
    }

    /// How it exited; None while it runs.
    pub fn exit(&self) -> Option<ExitInfo> {
        lock(&self.state).exit
    }

    pub fn is_running(&self) -> bool {
        lock(&self.state).exit.is_none()
    }

    /// Stop forwarding output: both channels end with `closed` and further
    /// output is drained and dropped.
    pub fn close_output(&self) {
        for o in &self.outs {
            o.end(StreamEndReason::Closed, None);
        }
    }

    /// Close the output and stdin, then signal the group (if still running).
    /// The output ends first, so the host always sees `closed` for a stream it
    /// released, never the `eof` of a pipe the signal closed a moment later.
    pub fn forget(&self, signal: i32) {
        self.close_output();
        self.stdin.close();
        if self.is_running() {
            let _ = kill_group(self.pid, signal);
        }
    }

    /// Wait until reaped and settled, or `deadline`. None on timeout.
    pub fn wait_exit(&self, deadline: Option<Instant>) -> Option<ExitInfo> {
        let mut st = lock(&self.state);
        loop {
            if let (Some(exit), true) = (st.exit, st.settled) {
                return Some(exit);
            }
            match deadline {
                None => st = wait(&self.cv, st),
                Some(d) => {
                    let now = Instant::now();
                    if now >= d {
                        return None;
                    }
                    st = wait_timeout(&self.cv, st, d - now);
                }
            }
        }
    }

    pub fn finish(&self) {
        for o in &self.outs {
            o.end(StreamEndReason::Eof, None);
        }
        self.stdin.close();
    }
}

#[cfg(test)]
mod tests {
    use std::process::Stdio;
    use std::time::Duration;

    use super::*;

    /// The shell form of `script`, built as `build` builds it.
    fn shell(
        script: &str,
        env: &BTreeMap<String, String>,
        env_clear: bool,
        cwd: Option<&str>,
    ) -> process::Command {
        build(&CommandSpec {
            env: env.clone(),
            env_clear,
            cwd: cwd.map(Into::into),
            ..CommandSpec::shell(script)
        })
        .unwrap()
    }

    fn run_captured(cmd: &mut process::Command, deadline: Option<Instant>) -> PumpOutcome {
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let child = cmd.spawn().unwrap();
        let waker = Arc::new(Waker::new().unwrap());
        Pump::new(
            child,
            [Sink::Capture(Vec::new()), Sink::Capture(Vec::new())],
            waker,
            deadline,
        )
        .run(&NoEvents)
    }

    #[test]
    fn captures_both_channels_and_exit_code() {
        let mut cmd = shell(
            "echo out; echo err >&2; exit 3",
            &BTreeMap::new(),
            false,
            None,
        );
        let o = run_captured(&mut cmd, None);
        assert_eq!(o.exit, ExitInfo::exited(3));
        assert_eq!(o.captured, vec![b"out\n".to_vec(), b"err\n".to_vec()]);
    }

    #[test]
    fn env_clear_shell_form_sees_only_the_supplied_keys() {
        let env = BTreeMap::from([("FOO".to_string(), "bar".to_string())]);
        let mut cmd = shell("/usr/bin/env", &env, true, Some("/tmp"));
        let o = run_captured(&mut cmd, None);
        assert_eq!(o.exit, ExitInfo::exited(0));
        assert_eq!(o.captured, vec![b"FOO=bar\n".to_vec(), Vec::new()]);
        // A supplied PWD is the caller's, not unset.
        let env = BTreeMap::from([("PWD".to_string(), "/tmp".to_string())]);
        let mut cmd = shell("/usr/bin/env", &env, true, Some("/tmp"));
        let o = run_captured(&mut cmd, None);
        assert_eq!(o.captured, vec![b"PWD=/tmp\n".to_vec(), Vec::new()]);
    }

    #[test]
    fn background_holder_of_the_pipe_does_not_block_the_exit() {
        let mut cmd = shell("sleep 30 & echo $!", &BTreeMap::new(), false, None);
        let o = run_captured(&mut cmd, None);
        assert_eq!(o.exit, ExitInfo::exited(0));
        let bg: i32 = String::from_utf8_lossy(&o.captured[0])
            .trim()
            .parse()
            .unwrap();
        // SAFETY: kill(2) on the background sleep this test started.
        unsafe { libc::kill(bg, libc::SIGKILL) };
    }

    #[test]
    fn deadline_kills_and_reports_timed_out() {
        let mut cmd = build(&CommandSpec::argv("sleep", ["30"])).unwrap();
        let o = run_captured(&mut cmd, Some(Instant::now() + Duration::from_millis(50)));
        assert_eq!(o.exit, ExitInfo::timed_out());
    }

    #[test]
    fn bad_cwd_and_program_are_named() {
        let err = build(&CommandSpec {
            cwd: Some("/nonexistent-dir".into()),
            ..CommandSpec::shell("true")
        })
        .unwrap_err();
        assert!(
            err.message.contains("working directory /nonexistent-dir"),
            "{}",
            err.message
        );
        let e = io::Error::from_raw_os_error(libc::ENOENT);
        let err = spawn_error(
            &e,
            &Command::Argv {
                program: "nope".into(),
                args: vec![],
            },
        );
        assert_eq!(err.errno, Some(libc::ENOENT));
        assert!(err.message.contains("cannot run `nope`"));
        assert!(kill_group(0, 0).is_err());
        assert!(kill_group(1, 0).is_err());
    }
}
