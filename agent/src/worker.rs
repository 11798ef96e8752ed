//! Workers: extra handle namespaces on a connection, each with its own serial
//! queue of requests (one thread), running concurrently with the connection's
//! own requests and with other workers.
//!
//! Worker ids are per connection. `worker_join` waits until every request
//! queued before it on that worker has finished (from inside the worker
//! itself it answers at once: its earlier requests are done by definition).
//! `worker_kill` signals the process group of every process and running exec
//! the worker started. `worker_close` closes its namespace (see
//! [`Namespace::close`]); requests still queued are answered
//! `unknown_worker`.

use std::sync::mpsc;
use std::sync::Arc;

use provium_protocol::op::{Op, WorkerId};
use provium_protocol::result::{ErrorCode, OpError};
use provium_protocol::OpValue;

use crate::conn::Conn;
use crate::dispatch;
use crate::locks::lock;
use crate::namespace::Namespace;
use crate::op_error;

enum Job {
    Request { id: u64, op: Op },
    Barrier(mpsc::Sender<()>),
}

pub struct Worker {
    pub ns: Arc<Namespace>,
    queue: mpsc::Sender<Job>,
}

impl Worker {
    /// Close the namespace and let the thread finish what is queued.
    pub fn close(self) {
        self.ns.close();
    }
}

pub fn spawn(conn: &Arc<Conn>) -> Result<OpValue, OpError> {
    let worker = conn.next_worker_id();
    let ns = Namespace::new();
    let (tx, rx) = mpsc::channel::<Job>();
    let c = Arc::clone(conn);
    let n = Arc::clone(&ns);
    std::thread::Builder::new()
        .name(format!("provium-worker-{worker}"))
        .spawn(move || {
            for job in rx {
                match job {
                    Job::Request { id, op } => {
                        if n.is_closed() {
                            c.outbox().respond(
                                id,
                                Err(OpError::new(
                                    ErrorCode::UnknownWorker,
                                    format!("worker {worker} was closed before this request ran"),
                                )),
                            );
                        } else {
                            dispatch::handle(&c, &n, Some(worker), id, op);
                        }
                    }
                    Job::Barrier(done) => drop(done.send(())),
                }
            }
        })
        .map_err(|e| op_error::io(&e, "starting a worker thread"))?;
    lock(&conn.workers).insert(worker, Worker { ns, queue: tx });
    Ok(OpValue::Worker { worker })
}

/// Queue a request on worker `w`.
pub fn submit(conn: &Conn, w: WorkerId, id: u64, op: Op) -> Result<(), OpError> {
    let workers = lock(&conn.workers);
    let worker = workers.get(&w).ok_or_else(|| op_error::unknown_worker(w))?;
    worker
        .queue
        .send(Job::Request { id, op })
        .map_err(|_| op_error::unknown_worker(w))
}

pub fn join(conn: &Conn, w: WorkerId, current: Option<WorkerId>) -> Result<OpValue, OpError> {
    let (tx, rx) = mpsc::channel();
    {
        let workers = lock(&conn.workers);
        let worker = workers.get(&w).ok_or_else(|| op_error::unknown_worker(w))?;
        if current == Some(w) {
            return Ok(OpValue::Unit);
        }
        worker
            .queue
            .send(Job::Barrier(tx))
            .map_err(|_| op_error::unknown_worker(w))?;
    }
    // An error means the worker was closed meanwhile: nothing left to wait for.
    let _ = rx.recv();
    Ok(OpValue::Unit)
}

pub fn kill(conn: &Conn, w: WorkerId, signal: i32) -> Result<OpValue, OpError> {
    if !(0..=64).contains(&signal) {
        return Err(op_error::invalid(format!(
            "signal {signal} is out of range 0..=64"
        )));
    }
    let ns = lock(&conn.workers)
        .get(&w)
        .map(|wk| Arc::clone(&wk.ns))
        .ok_or_else(|| op_error::unknown_worker(w))?;
    ns.signal_all(signal);
    Ok(OpValue::Unit)
}

pub fn close(conn: &Conn, w: WorkerId) -> Result<OpValue, OpError> {
    let worker = lock(&conn.workers)
        .remove(&w)
        .ok_or_else(|| op_error::unknown_worker(w))?;
    worker.close();
    Ok(OpValue::Unit)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jobs_are_plain_data() {
        // A barrier's sender dropped unanswered reads as "worker gone".
        let (tx, rx) = mpsc::channel::<()>();
        drop(Job::Barrier(tx));
        assert!(rx.recv().is_err());
    }
}
