//! Spawned processes (`spawn`) and the ops on their slots: stdin_close, wait,
//! signal, process_status, pid, release, close_stream.
//!
//! A slot's id is the spawn request's id; its stdout and stderr stream on that
//! id after the `Spawned` answer, each ending with `StreamEnd` (`eof` when the
//! process closes that pipe, even if it keeps running, or is done; `closed`
//! after close_stream/release/namespace close).
//! `wait` answers once the process was reaped and the output already in its
//! pipes was sent (or is held up only by host acks), so in the usual case all
//! chunks precede the wait's answer. `wait` and `release` free the slot.
//! The slot itself is [`Process`] (`child.rs`), which the namespace owns.

use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use provium_protocol::op::{SpawnSpec, StreamId};
use provium_protocol::result::{ExitInfo, OpError, ProcessState};
use provium_protocol::signal::{SIGKILL, SIGTERM};
use provium_protocol::wire::Channel;
use provium_protocol::OpValue;

use crate::child::{build, kill_group, spawn_error, Process, Pump, Sink};
use crate::ctx::{Ctx, Then};
use crate::op_error;
use crate::stream::StreamOut;
use crate::waker::Waker;

/// How long `release` lets a process handle SIGTERM before SIGKILL.
const RELEASE_GRACE: Duration = Duration::from_secs(2);

/// `spawn`: start the process; the output pump starts after the answer.
pub fn spawn(ctx: &Ctx<'_>, id: u64, spec: SpawnSpec) -> (Result<OpValue, OpError>, Then) {
    match start(ctx, id, spec) {
        Ok((pid, go)) => (
            Ok(OpValue::Spawned { pid }),
            Some(Box::new(move || drop(go))),
        ),
        Err(e) => (Err(e), None),
    }
}

fn start(ctx: &Ctx<'_>, id: u64, spec: SpawnSpec) -> Result<(u32, mpsc::Sender<()>), OpError> {
    let mut cmd = build(&spec)?;
    cmd.stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let waker = Arc::new(Waker::new().map_err(|e| op_error::io(&e, "eventfd for spawn"))?);
    let mut child = cmd.spawn().map_err(|e| spawn_error(&e, &spec.command))?;
    let pid = child.id();
    let outs = [Channel::Stdout, Channel::Stderr]
        .map(|ch| StreamOut::new(ctx.conn.outbox(), id, ch, Some(Arc::clone(&waker))));
    let proc = Arc::new(Process::new(id, pid, outs.clone()));
    let abandon = |child: &mut std::process::Child, e: OpError| {
        let _ = kill_group(pid, SIGKILL);
        let _ = child.wait();
        Err(e)
    };
    if let Err(e) = ctx.ns.insert_process(Arc::clone(&proc)) {
        return abandon(&mut child, e);
    }
    if let Some(pipe) = child.stdin.take() {
        if let Err(e) = proc
            .stdin
            .start_writer(pipe, spec.stdin, ctx.conn.outbox(), id)
        {
            ctx.ns.remove_process(id);
            return abandon(&mut child, op_error::io(&e, "stdin writer thread"));
        }
    }
    for o in &outs {
        ctx.conn.register_stream(o);
    }
    ctx.conn.register_stdin(id, Arc::clone(&proc.stdin));
    let (go_tx, go_rx) = mpsc::channel::<()>();
    let sinks = outs.map(Sink::Stream);
    let pump = Pump::new(child, sinks, waker, None);
    let conn = Arc::clone(ctx.conn);
    let p = Arc::clone(&proc);
    let started = std::thread::Builder::new()
        .name("provium-proc".into())
        .spawn(move || {
            // Wait until the Spawned answer is out: chunks follow it.
            let _ = go_rx.recv();
            pump.run(&*p);
            p.finish();
            for o in &p.outs {
                conn.unregister_stream(o);
            }
            conn.unregister_stdin(p.id);
        });
    if let Err(e) = started {
        // The pump (and the child it owns) was dropped with the closure.
        let _ = kill_group(pid, SIGKILL);
        ctx.ns.remove_process(id);
        proc.stdin.close();
        for o in &proc.outs {
            ctx.conn.unregister_stream(o);
        }
        ctx.conn.unregister_stdin(id);
        return Err(op_error::io(&e, "process thread"));
    }
    Ok((pid, go_tx))
}

pub fn stdin_close(ctx: &Ctx<'_>, process: StreamId) -> Result<OpValue, OpError> {
    ctx.ns.process(process)?.stdin.close();
    Ok(OpValue::Unit)
}

/// `wait`: see the module docs. On timeout the group is killed and the
/// answer is `timed_out`.
pub fn wait_op(
    ctx: &Ctx<'_>,
    process: StreamId,
    timeout_ms: Option<u64>,
) -> Result<OpValue, OpError> {
    let p = ctx.ns.process(process)?;
    let deadline = timeout_ms.and_then(|ms| Instant::now().checked_add(Duration::from_millis(ms)));
    let exit = match p.wait_exit(deadline) {
        Some(exit) => exit,
        None => {
            let _ = kill_group(p.pid, SIGKILL);
            p.wait_exit(None);
            ExitInfo::timed_out()
        }
    };
    ctx.ns.remove_process(process);
    Ok(OpValue::Exit(exit))
}

pub fn signal(ctx: &Ctx<'_>, process: StreamId, signal: i32) -> Result<OpValue, OpError> {
    let p = ctx.ns.process(process)?;
    if !(0..=64).contains(&signal) {
        return Err(op_error::invalid(format!(
            "signal {signal} is out of range 0..=64"
        )));
    }
    match kill_group(p.pid, signal) {
        Ok(()) => Ok(OpValue::Unit),
        // The process already exited and its group is gone: nothing to signal.
        Err(_) if !p.is_running() => Ok(OpValue::Unit),
        Err(e) => Err(op_error::io(
            &e,
            format!("signal {signal} to process group {}", p.pid),
        )),
    }
}

pub fn status(ctx: &Ctx<'_>, process: StreamId) -> Result<OpValue, OpError> {
    let p = ctx.ns.process(process)?;
    let exit = p.exit();
    Ok(OpValue::ProcessStatus(ProcessState {
        running: exit.is_none(),
        pid: p.pid,
        exit,
    }))
}

pub fn pid(ctx: &Ctx<'_>, process: StreamId) -> Result<OpValue, OpError> {
    Ok(OpValue::Pid {
        pid: ctx.ns.process(process)?.pid,
    })
}

/// `release`: SIGTERM now, SIGKILL after [`RELEASE_GRACE`] if still running
/// (in the background); the slot is freed at once.
pub fn release(ctx: &Ctx<'_>, process: StreamId) -> Result<OpValue, OpError> {
    let p = ctx
        .ns
        .remove_process(process)
        .ok_or_else(|| op_error::unknown_process(process))?;
    let running = p.is_running();
    p.forget(SIGTERM);
    if !running {
        return Ok(OpValue::Unit);
    }
    let spawned = std::thread::Builder::new()
        .name("provium-release".into())
        .spawn(move || {
            if p.wait_exit(Some(Instant::now() + RELEASE_GRACE)).is_none() && p.is_running() {
                let _ = kill_group(p.pid, SIGKILL);
            }
        });
    if let Err(e) = spawned {
        eprintln!("provium-agent: cannot start the release timer for process {process}: {e}");
    }
    Ok(OpValue::Unit)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn release_grace_is_two_seconds() {
        // The Process page promises SIGTERM, then SIGKILL after 2 s.
        assert_eq!(RELEASE_GRACE, Duration::from_secs(2));
    }
}
