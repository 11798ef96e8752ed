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
//!
//! This module knows nothing of the connection or of the dispatcher: a
//! connection holds its [`Workers`], and the dispatcher hands [`spawn`] the
//! function that runs a request, so the dependencies point one way.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::sync::{mpsc, Mutex};

use provium_protocol::op::{Op, WorkerId};
use provium_protocol::result::{ErrorCode, OpError};
use provium_protocol::OpValue;

use crate::locks::lock;
use crate::namespace::Namespace;
use crate::op_error;
use crate::outbox::Outbox;

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

/// One connection's workers, by id; ids start at 1.
pub struct Workers {
    by_id: Mutex<HashMap<WorkerId, Worker>>,
    next_id: AtomicU64,
}

impl Default for Workers {
    fn default() -> Self {
        Workers {
            by_id: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(1),
        }
    }
}

impl Workers {
    /// Close every worker (the connection is closing).
    pub fn close_all(&self) {
        let workers: Vec<Worker> = lock(&self.by_id).drain().map(|(_, w)| w).collect();
        for w in workers {
            w.close();
        }
    }
}

/// Start a worker in `workers`. Its thread runs each queued request with
/// `run(namespace, worker, id, op)`, which answers it; a request queued
/// after `worker_close` is answered on `outbox` instead.
pub fn spawn(
    workers: &Workers,
    outbox: Arc<Outbox>,
    run: impl Fn(&Arc<Namespace>, WorkerId, u64, Op) + Send + 'static,
) -> Result<OpValue, OpError> {
    let worker = workers.next_id.fetch_add(1, Ordering::Relaxed);
    let ns = Namespace::new();
    let (tx, rx) = mpsc::channel::<Job>();
    let n = Arc::clone(&ns);
    std::thread::Builder::new()
        .name(format!("provium-worker-{worker}"))
        .spawn(move || {
            for job in rx {
                match job {
                    Job::Request { id, op } => {
                        if n.is_closed() {
                            outbox.respond(
                                id,
                                Err(OpError::new(
                                    ErrorCode::UnknownWorker,
                                    format!("worker {worker} was closed before this request ran"),
                                )),
                            );
                        } else {
                            run(&n, worker, id, op);
                        }
                    }
                    Job::Barrier(done) => drop(done.send(())),
                }
            }
        })
        .map_err(|e| op_error::io(&e, "starting a worker thread"))?;
    lock(&workers.by_id).insert(worker, Worker { ns, queue: tx });
    Ok(OpValue::Worker { worker })
}

/// Queue a request on worker `w`.
pub fn submit(workers: &Workers, w: WorkerId, id: u64, op: Op) -> Result<(), OpError> {
    let by_id = lock(&workers.by_id);
    let worker = by_id.get(&w).ok_or_else(|| op_error::unknown_worker(w))?;
    worker
        .queue
        .send(Job::Request { id, op })
        .map_err(|_| op_error::unknown_worker(w))
}

pub fn join(workers: &Workers, w: WorkerId, current: Option<WorkerId>) -> Result<OpValue, OpError> {
    let (tx, rx) = mpsc::channel();
    {
        let by_id = lock(&workers.by_id);
        let worker = by_id.get(&w).ok_or_else(|| op_error::unknown_worker(w))?;
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

pub fn kill(workers: &Workers, w: WorkerId, signal: i32) -> Result<OpValue, OpError> {
    if !(0..=64).contains(&signal) {
        return Err(op_error::invalid(format!(
            "signal {signal} is out of range 0..=64"
        )));
    }
    let ns = lock(&workers.by_id)
        .get(&w)
        .map(|wk| Arc::clone(&wk.ns))
        .ok_or_else(|| op_error::unknown_worker(w))?;
    ns.signal_all(signal);
    Ok(OpValue::Unit)
}

pub fn close(workers: &Workers, w: WorkerId) -> Result<OpValue, OpError> {
    let worker = lock(&workers.by_id)
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

    /// A worker runs its queue in order through the function it was given;
    /// join waits for what was queued before it; close ends it.
    #[test]
    fn a_worker_runs_its_queue_through_the_given_function() {
        use std::os::unix::net::UnixStream;

        use crate::socket::Socket;

        let (a, _b) = UnixStream::pair().unwrap();
        let outbox = Arc::new(Outbox::new(Socket::from_fd(a.into())));
        let workers = Workers::default();
        let (ran_tx, ran_rx) = mpsc::channel();
        let ran_tx = Mutex::new(ran_tx);
        let spawned = spawn(&workers, outbox, move |_ns, w, id, _op| {
            lock(&ran_tx).send((w, id)).unwrap();
        })
        .unwrap();
        let OpValue::Worker { worker } = spawned else {
            panic!("a worker id expected, got {spawned:?}");
        };
        assert_eq!(worker, 1, "ids start at 1");
        submit(&workers, worker, 7, Op::Ping).unwrap();
        submit(&workers, worker, 8, Op::Ping).unwrap();
        join(&workers, worker, None).unwrap();
        assert_eq!(ran_rx.try_iter().collect::<Vec<_>>(), [(1, 7), (1, 8)]);
        close(&workers, worker).unwrap();
        assert!(submit(&workers, worker, 9, Op::Ping).is_err());
        assert!(kill(&workers, worker, 9).is_err());
        assert!(kill(&workers, worker, 65).is_err(), "out of range");
        workers.close_all();
    }
}
