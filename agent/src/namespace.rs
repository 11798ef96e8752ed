//! A handle namespace: the files, processes, tails and running execs that one
//! worker (or the connection itself) owns, and their cleanup.
//!
//! Handle ids are the agent's own file descriptor numbers, so a handle can be
//! passed straight to `syscall`/`ioctl` as an fd (`file:fd()` in Lua). A handle
//! is only usable from the namespace that opened it; another worker's handle
//! answers `unknown_handle`, even though the fd exists in the agent.
//!
//! Closing a namespace kills (SIGKILL, whole process group) every process and
//! running exec it started, ends its streams with `closed`, and closes its
//! handles. Anything inserted after the close is refused, so a request racing
//! the close cannot leak a process.

use std::collections::HashMap;
use std::fs::File;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use provium_protocol::op::{HandleId, StreamId};
use provium_protocol::result::OpError;
use provium_protocol::signal::SIGKILL;

use crate::child::{kill_group, Process};
use crate::locks::lock;
use crate::op_error;

/// A stream the namespace ends when it closes: a tail (`tail.rs`). The
/// namespace only needs its id and a way to stop it, so it does not depend
/// on the tail module, which depends on it.
pub trait StoppableStream: Send + Sync {
    fn stream_id(&self) -> StreamId;
    /// End the stream (with `closed`).
    fn stop_stream(&self);
}

#[derive(Default)]
pub struct Namespace {
    closed: AtomicBool,
    handles: Mutex<HashMap<HandleId, Arc<File>>>,
    processes: Mutex<HashMap<StreamId, Arc<Process>>>,
    tails: Mutex<HashMap<StreamId, Arc<dyn StoppableStream>>>,
    /// Running execs: request id -> process group id.
    execs: Mutex<HashMap<u64, u32>>,
}

fn closed_error() -> OpError {
    op_error::not_allowed("this worker is closing; nothing new can be opened in it")
}

impl Namespace {
    pub fn new() -> Arc<Self> {
        Arc::new(Namespace::default())
    }

    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    pub fn insert_handle(&self, file: File) -> Result<HandleId, OpError> {
        let mut handles = lock(&self.handles);
        if self.is_closed() {
            return Err(closed_error());
        }
        let id = HandleId::from(file.as_raw_fd().unsigned_abs());
        handles.insert(id, Arc::new(file));
        Ok(id)
    }

    pub fn handle(&self, id: HandleId) -> Result<Arc<File>, OpError> {
        lock(&self.handles)
            .get(&id)
            .cloned()
            .ok_or_else(|| op_error::unknown_handle(id))
    }

    /// Forget a handle; the fd closes once no in-flight op still uses it.
    pub fn remove_handle(&self, id: HandleId) -> Result<(), OpError> {
        lock(&self.handles)
            .remove(&id)
            .map(drop)
            .ok_or_else(|| op_error::unknown_handle(id))
    }

    pub fn insert_process(&self, p: Arc<Process>) -> Result<(), OpError> {
        let mut procs = lock(&self.processes);
        if self.is_closed() {
            return Err(closed_error());
        }
        procs.insert(p.id, p);
        Ok(())
    }

    pub fn process(&self, id: StreamId) -> Result<Arc<Process>, OpError> {
        lock(&self.processes)
            .get(&id)
            .cloned()
            .ok_or_else(|| op_error::unknown_process(id))
    }

    pub fn remove_process(&self, id: StreamId) -> Option<Arc<Process>> {
        lock(&self.processes).remove(&id)
    }

    pub fn insert_tail(&self, t: Arc<dyn StoppableStream>) -> Result<(), OpError> {
        let mut tails = lock(&self.tails);
        if self.is_closed() {
            return Err(closed_error());
        }
        tails.insert(t.stream_id(), t);
        Ok(())
    }

    pub fn remove_tail(&self, id: StreamId) -> Option<Arc<dyn StoppableStream>> {
        lock(&self.tails).remove(&id)
    }

    pub fn insert_exec(&self, id: u64, pgid: u32) -> Result<(), OpError> {
        let mut execs = lock(&self.execs);
        if self.is_closed() {
            return Err(closed_error());
        }
        execs.insert(id, pgid);
        Ok(())
    }

    pub fn remove_exec(&self, id: u64) {
        lock(&self.execs).remove(&id);
    }

    /// Send `signal` to the process group of every process and running exec
    /// of this namespace; how many groups were signalled.
    pub fn signal_all(&self, signal: i32) -> usize {
        let mut groups: Vec<u32> = lock(&self.processes)
            .values()
            .filter(|p| p.is_running())
            .map(|p| p.pid)
            .collect();
        groups.extend(lock(&self.execs).values().copied());
        groups
            .into_iter()
            .filter(|pgid| kill_group(*pgid, signal).is_ok())
            .count()
    }

    /// Kill and forget everything (see the module docs).
    pub fn close(&self) {
        self.closed.store(true, Ordering::Release);
        let procs: Vec<_> = lock(&self.processes).drain().map(|(_, p)| p).collect();
        for p in procs {
            p.forget(SIGKILL);
        }
        let execs: Vec<_> = lock(&self.execs).drain().map(|(_, g)| g).collect();
        for pgid in execs {
            // ESRCH: it just exited on its own.
            let _ = kill_group(pgid, SIGKILL);
        }
        let tails: Vec<_> = lock(&self.tails).drain().map(|(_, t)| t).collect();
        for t in tails {
            t.stop_stream();
        }
        lock(&self.handles).clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use provium_protocol::result::ErrorCode;

    #[test]
    fn handles_are_fds_and_closing_refuses_new_ones() {
        let ns = Namespace::new();
        let f = File::open("/dev/null").unwrap();
        let fd = f.as_raw_fd();
        let id = ns.insert_handle(f).unwrap();
        assert_eq!(id, HandleId::from(fd.unsigned_abs()));
        assert!(ns.handle(id).is_ok());
        ns.close();
        assert_eq!(ns.handle(id).unwrap_err().code, ErrorCode::UnknownHandle);
        let err = ns
            .insert_handle(File::open("/dev/null").unwrap())
            .unwrap_err();
        assert_eq!(err.code, ErrorCode::NotAllowed);
        assert_eq!(
            ns.remove_handle(id).unwrap_err().code,
            ErrorCode::UnknownHandle
        );
    }

    struct FakeTail {
        id: StreamId,
        stopped: AtomicBool,
    }

    impl StoppableStream for FakeTail {
        fn stream_id(&self) -> StreamId {
            self.id
        }
        fn stop_stream(&self) {
            self.stopped.store(true, Ordering::Release);
        }
    }

    #[test]
    fn closing_stops_the_tails_and_refuses_new_ones() {
        let ns = Namespace::new();
        let t = Arc::new(FakeTail {
            id: 4,
            stopped: AtomicBool::new(false),
        });
        ns.insert_tail(t.clone()).unwrap();
        assert!(ns.remove_tail(4).is_some());
        assert!(ns.remove_tail(4).is_none());
        ns.insert_tail(t.clone()).unwrap();
        ns.close();
        assert!(t.stopped.load(Ordering::Acquire));
        assert_eq!(ns.insert_tail(t).unwrap_err().code, ErrorCode::NotAllowed);
    }
}
