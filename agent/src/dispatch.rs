//! From an [`Op`] to its handler, and batches.
//!
//! [`handle`] answers exactly one `Response` per request, even if a handler
//! panics (a bug): the panic becomes an `internal` error. Ops that stream after
//! their answer (spawn, tail) return a [`Then`] that starts the stream once
//! the answer is out. What a handler gets is [`Ctx`], in its own module so
//! that handlers do not depend on this dispatcher.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

use provium_protocol::op::{Op, StreamId, WorkerId};
use provium_protocol::result::{OpError, OpResult};
use provium_protocol::OpValue;

use crate::conn::Conn;
use crate::ctx::{Ctx, Then};
use crate::namespace::Namespace;
use crate::{clock, exec, files, op_error, process, syscall, tail, worker};

/// Run request `id` in `ns` and answer it.
pub fn handle(conn: &Arc<Conn>, ns: &Arc<Namespace>, worker: Option<WorkerId>, id: u64, op: Op) {
    let kind = op.kind();
    let ctx = Ctx {
        conn,
        ns,
        worker,
        in_batch: false,
    };
    let (result, then) = match catch_unwind(AssertUnwindSafe(|| run_op(&ctx, id, op))) {
        Ok(r) => r,
        Err(_) => (
            Err(op_error::internal(format!(
                "the agent failed internally while running `{kind}` (a bug: please report it with the agent's stderr)"
            ))),
            None,
        ),
    };
    conn.outbox().respond(id, result);
    if let Some(then) = then {
        then();
    }
}

pub fn run_op(ctx: &Ctx<'_>, id: u64, op: Op) -> (Result<OpValue, OpError>, Then) {
    let no_clock = ctx.conn.config.no_clock;
    let result = match op {
        Op::Spawn(spec) => return process::spawn(ctx, id, spec),
        Op::Tail { source, start } => return tail::open(ctx, id, source, start),
        Op::Ping => Ok(OpValue::Unit),
        Op::Exec(spec) => exec::exec(ctx, id, spec),
        Op::StdinClose { process } => process::stdin_close(ctx, process),
        Op::Wait {
            process,
            timeout_ms,
        } => process::wait_op(ctx, process, timeout_ms),
        Op::Signal { process, signal } => process::signal(ctx, process, signal),
        Op::ProcessStatus { process } => process::status(ctx, process),
        Op::Pid { process } => process::pid(ctx, process),
        Op::Release { process } => process::release(ctx, process),
        Op::ReadFile { path } => files::read_file(&path),
        Op::WriteFile { path, data } => files::write_file(&path, &data),
        Op::Stat { path } => files::stat(&path),
        Op::ListDir { path } => files::listdir(&path),
        Op::Mkdir {
            path,
            parents,
            perm,
        } => files::mkdir(&path, parents, perm),
        Op::Unlink { path } => files::unlink(&path),
        Op::Rename { from, to } => files::rename(&from, &to),
        Op::Open { path, mode, perm } => files::open(ctx, &path, mode, perm),
        Op::Read { handle, len } => files::read(ctx, handle, len),
        Op::Write { handle, data } => files::write(ctx, handle, &data),
        Op::Seek {
            handle,
            offset,
            whence,
        } => files::seek(ctx, handle, offset, whence),
        Op::Tell { handle } => files::tell(ctx, handle),
        Op::Close { handle } => files::close(ctx, handle),
        Op::CloseStream { stream } => close_stream(ctx, stream),
        Op::Syscall(spec) => syscall::syscall(spec),
        Op::Ioctl(spec) => syscall::ioctl(spec),
        Op::ClockGet => clock::get(),
        Op::ClockSet { realtime_ns } => clock::set(no_clock, realtime_ns),
        Op::ClockAdvance { delta_ns } => clock::advance(no_clock, delta_ns),
        Op::WorkerSpawn => spawn_worker(ctx),
        Op::WorkerJoin { worker } => worker::join(&ctx.conn.workers, worker, ctx.worker),
        Op::WorkerKill { worker, signal } => worker::kill(&ctx.conn.workers, worker, signal),
        Op::WorkerClose { worker } => worker::close(&ctx.conn.workers, worker),
        Op::Batch { ops } => batch(ctx, id, ops),
    };
    (result, None)
}

/// `worker_spawn`: a worker whose requests run through [`handle`].
fn spawn_worker(ctx: &Ctx<'_>) -> Result<OpValue, OpError> {
    let conn = Arc::clone(ctx.conn);
    worker::spawn(
        &ctx.conn.workers,
        ctx.conn.outbox(),
        move |ns, w, id, op| {
            handle(&conn, ns, Some(w), id, op);
        },
    )
}

/// `close_stream`: a tail ends; a spawned process's output stops (the
/// process keeps running).
fn close_stream(ctx: &Ctx<'_>, stream: StreamId) -> Result<OpValue, OpError> {
    if let Some(t) = ctx.ns.remove_tail(stream) {
        t.stop_stream();
        return Ok(OpValue::Unit);
    }
    if let Ok(p) = ctx.ns.process(stream) {
        p.close_output();
        return Ok(OpValue::Unit);
    }
    Err(op_error::unknown_stream(stream))
}

fn batch(ctx: &Ctx<'_>, id: u64, ops: Vec<Op>) -> Result<OpValue, OpError> {
    let sub = ctx.for_batch();
    let results = ops
        .into_iter()
        .map(|op| {
            if !op.allowed_in_batch() {
                return OpResult::Err(op_error::not_allowed(format!(
                    "`{}` is not allowed in a batch (it opens a stream or a namespace, or nests a batch); send it on its own",
                    op.kind()
                )));
            }
            run_op(&sub, id, op).0.into()
        })
        .collect();
    Ok(OpValue::Batch(results))
}

#[cfg(test)]
mod tests {
    use provium_protocol::op::{Op, SpawnSpec};

    #[test]
    fn streaming_ops_are_the_ones_refused_in_batches() {
        // run_op returns a Then only for these; batch drops Thens, so it must
        // never run them.
        assert!(!Op::Spawn(SpawnSpec::shell("")).allowed_in_batch());
        assert!(!Op::WorkerSpawn.allowed_in_batch());
    }
}
