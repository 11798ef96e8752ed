//! A spawned process's stdin: bytes from `StdinData` frames are queued here by
//! the connection reader and written to the pipe by a writer thread, which
//! acknowledges each chunk once written (`StdinAck`).
//!
//! The reader never blocks on the child: a child that does not read only
//! delays the acks. The host may have at most [`STREAM_WINDOW_BYTES`]
//! unacknowledged; more is a protocol violation ([`StdinPipe::push`] says so),
//! so the queue is bounded whatever the host sends.

use std::collections::VecDeque;
use std::io::{self, Write};
use std::process::ChildStdin;
use std::sync::{Arc, Condvar, Mutex};

use provium_protocol::op::StreamId;
use provium_protocol::wire::{AgentFrame, StdinAck};
use provium_protocol::STREAM_WINDOW_BYTES;

use crate::locks::{lock, wait};
use crate::outbox::Outbox;

#[derive(Default)]
pub struct StdinPipe {
    state: Mutex<StdinState>,
    cv: Condvar,
}

#[derive(Default)]
struct StdinState {
    queue: VecDeque<Vec<u8>>,
    /// Received and not yet acknowledged.
    outstanding: u64,
    closed: bool,
}

/// What became of pushed bytes.
#[derive(Debug, PartialEq, Eq)]
pub enum Pushed {
    Queued,
    /// stdin was already closed; the bytes were dropped.
    Dropped,
}

impl StdinPipe {
    pub fn new() -> Arc<Self> {
        Arc::new(StdinPipe::default())
    }

    /// Queue bytes for the child. `Err` names the window overrun.
    pub fn push(&self, process: StreamId, data: Vec<u8>) -> Result<Pushed, String> {
        let mut s = lock(&self.state);
        if s.closed {
            return Ok(Pushed::Dropped);
        }
        let total = s.outstanding.saturating_add(data.len() as u64);
        if total > STREAM_WINDOW_BYTES {
            return Err(format!(
                "stdin for process {process}: the host has {total} bytes unacknowledged, \
                 over the {STREAM_WINDOW_BYTES}-byte window"
            ));
        }
        s.outstanding = total;
        s.queue.push_back(data);
        drop(s);
        self.cv.notify_all();
        Ok(Pushed::Queued)
    }

    /// No more input: the writer finishes the queue, then closes the pipe.
    pub fn close(&self) {
        lock(&self.state).closed = true;
        self.cv.notify_all();
    }

    /// Start the writer thread: `initial` first (the spawn request's bytes,
    /// not acknowledged), then queued chunks, each acknowledged once written.
    pub fn start_writer(
        self: &Arc<Self>,
        pipe: ChildStdin,
        initial: Option<Vec<u8>>,
        outbox: Arc<Outbox>,
        process: StreamId,
    ) -> io::Result<()> {
        let me = Arc::clone(self);
        std::thread::Builder::new()
            .name("provium-stdin".into())
            .spawn(move || me.write_loop(pipe, initial, &outbox, process))
            .map(drop)
    }

    fn next_chunk(&self) -> Option<Vec<u8>> {
        let mut s = lock(&self.state);
        loop {
            if let Some(d) = s.queue.pop_front() {
                return Some(d);
            }
            if s.closed {
                return None;
            }
            s = wait(&self.cv, s);
        }
    }

    fn write_loop(
        &self,
        mut pipe: ChildStdin,
        initial: Option<Vec<u8>>,
        outbox: &Outbox,
        process: StreamId,
    ) {
        // Once the child stops reading (EPIPE), later bytes are dropped but
        // still acknowledged, so the host never stalls on a dead process.
        let mut broken = initial.is_some_and(|b| pipe.write_all(&b).is_err());
        while let Some(chunk) = self.next_chunk() {
            if !broken {
                broken = pipe.write_all(&chunk).is_err();
            }
            let n = chunk.len() as u64;
            {
                let mut s = lock(&self.state);
                s.outstanding = s.outstanding.saturating_sub(n);
            }
            if n > 0 {
                outbox.send(&AgentFrame::StdinAck(StdinAck { process, bytes: n }));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn window_overrun_is_refused_and_closed_drops() {
        let p = StdinPipe::new();
        let half = usize::try_from(STREAM_WINDOW_BYTES / 2).unwrap();
        assert_eq!(p.push(1, vec![0; half]), Ok(Pushed::Queued));
        assert_eq!(p.push(1, vec![0; half]), Ok(Pushed::Queued));
        let err = p.push(1, vec![0; 1]).unwrap_err();
        assert!(err.contains("over the"), "{err}");
        p.close();
        assert_eq!(p.push(1, vec![0; 1]), Ok(Pushed::Dropped));
        assert!(p.next_chunk().is_some());
    }
}
