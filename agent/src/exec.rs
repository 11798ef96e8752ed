//! The `exec` op: run a command to completion, streaming its output (or
//! capturing it inside a batch). The child machinery is `child.rs`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use provium_protocol::op::ExecSpec;
use provium_protocol::result::OpError;
use provium_protocol::signal::SIGKILL;
use provium_protocol::wire::Channel;
use provium_protocol::OpValue;
use std::process::Stdio;

use crate::child::{build, feed_stdin, kill_group, spawn_error, NoEvents, Pump, Sink};
use crate::ctx::Ctx;
use crate::op_error::{self, MAX_ANSWER_BYTES};
use crate::stream::StreamOut;
use crate::waker::Waker;

/// `exec`: run to completion, streaming output (or capturing it in a batch).
pub fn exec(ctx: &Ctx<'_>, id: u64, spec: ExecSpec) -> Result<OpValue, OpError> {
    let ExecSpec { run, timeout_ms } = spec;
    let mut cmd = build(&run)?;
    cmd.stdin(if run.stdin.is_some() {
        Stdio::piped()
    } else {
        Stdio::null()
    });
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    let waker = Arc::new(Waker::new().map_err(|e| op_error::io(&e, "eventfd for exec"))?);
    let mut child = cmd.spawn().map_err(|e| spawn_error(&e, &run.command))?;
    let pid = child.id();
    if let Err(e) = ctx.ns.insert_exec(id, pid) {
        let _ = kill_group(pid, SIGKILL);
        let _ = child.wait();
        return Err(e);
    }
    if let (Some(data), Some(stdin)) = (run.stdin, child.stdin.take()) {
        feed_stdin(stdin, data);
    }
    let streams: Option<[Arc<StreamOut>; 2]> = (!ctx.in_batch).then(|| {
        [Channel::Stdout, Channel::Stderr].map(|ch| {
            let s = StreamOut::new(ctx.conn.outbox(), id, ch, Some(Arc::clone(&waker)));
            ctx.conn.register_stream(&s);
            s
        })
    });
    let sinks = match &streams {
        Some([out, err]) => [Sink::Stream(Arc::clone(out)), Sink::Stream(Arc::clone(err))],
        None => [Sink::Capture(Vec::new()), Sink::Capture(Vec::new())],
    };
    let deadline = timeout_ms.and_then(|ms| Instant::now().checked_add(Duration::from_millis(ms)));
    let outcome = Pump::new(child, sinks, waker, deadline).run(&NoEvents);
    ctx.ns.remove_exec(id);
    if let Some(streams) = streams {
        for s in streams {
            ctx.conn.unregister_stream(&s);
            s.close();
        }
        return Ok(OpValue::Exit(outcome.exit));
    }
    if outcome.overflow {
        return Err(op_error::too_large(format!(
            "the command's output exceeded {MAX_ANSWER_BYTES} bytes, which a batch cannot carry, \
             so it was killed; run it outside a batch to stream its output"
        )));
    }
    let mut captured = outcome.captured.into_iter();
    Ok(OpValue::Ran {
        exit: outcome.exit,
        stdout: captured.next().unwrap_or_default(),
        stderr: captured.next().unwrap_or_default(),
    })
}

#[cfg(test)]
mod tests {
    use provium_protocol::op::CommandSpec;

    use super::*;
    use crate::conn::Conn;
    use crate::namespace::Namespace;

    /// In a batch, exec captures both channels into its answer.
    #[test]
    fn a_batched_exec_captures_its_output() {
        let conn = Conn::for_tests();
        let ns = Namespace::new();
        let ctx = Ctx {
            conn: &conn,
            ns: &ns,
            worker: None,
            in_batch: true,
        };
        let spec = CommandSpec::shell("echo out; echo err >&2; exit 3").into();
        match exec(&ctx, 1, spec).unwrap() {
            OpValue::Ran {
                exit,
                stdout,
                stderr,
            } => {
                assert_eq!(exit.exit_code, 3);
                assert_eq!(stdout, b"out\n");
                assert_eq!(stderr, b"err\n");
            }
            other => panic!("a captured run expected, got {other:?}"),
        }
    }
}
