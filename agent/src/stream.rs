//! One outgoing data stream (an exec's or process's stdout/stderr, a tail's
//! data) and its flow-control window.
//!
//! The agent may have at most [`STREAM_WINDOW_BYTES`] sent and not yet
//! acknowledged on a (stream, channel); producers ask [`StreamOut::room`]
//! before reading their source and read no more than that, so a host that
//! stops acknowledging stops the source (a process blocks on its pipe) and the
//! agent never buffers more than one chunk per stream.
//!
//! A stream that was closed (close_stream, release, worker or connection
//! close) turns into a sink: unlimited room, chunks dropped, so producers keep
//! draining their pipes and processes never wedge on a full pipe.

use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use provium_protocol::op::StreamId;
use provium_protocol::wire::{AgentFrame, Channel, StreamChunk, StreamEnd, StreamEndReason};
use provium_protocol::{MAX_CHUNK_BYTES, STREAM_WINDOW_BYTES};

use crate::locks::{lock, wait_timeout};
use crate::outbox::Outbox;
use crate::waker::Waker;

pub struct StreamOut {
    outbox: Arc<Outbox>,
    pub stream: StreamId,
    pub channel: Channel,
    window: Mutex<Window>,
    cv: Condvar,
    waker: Option<Arc<Waker>>,
    /// Held while sending a chunk or the end frame, so no chunk can follow the
    /// `StreamEnd`; true once the end was sent.
    ended: Mutex<bool>,
}

struct Window {
    unacked: u64,
    closed: bool,
}

/// What a producer may do now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Room {
    /// Send at most this many bytes (0: wait for an ack).
    Send(usize),
    /// The stream is closed: read and drop.
    Discard,
}

impl StreamOut {
    pub fn new(
        outbox: Arc<Outbox>,
        stream: StreamId,
        channel: Channel,
        waker: Option<Arc<Waker>>,
    ) -> Arc<Self> {
        Arc::new(StreamOut {
            outbox,
            stream,
            channel,
            window: Mutex::new(Window {
                unacked: 0,
                closed: false,
            }),
            cv: Condvar::new(),
            waker,
            ended: Mutex::new(false),
        })
    }

    pub fn room(&self) -> Room {
        let w = lock(&self.window);
        room_of(&w)
    }

    /// Like [`room`](Self::room), but wait up to `timeout` for an ack when the
    /// window is full.
    pub fn wait_room(&self, timeout: Duration) -> Room {
        let mut w = lock(&self.window);
        if room_of(&w) == Room::Send(0) {
            w = wait_timeout(&self.cv, w, timeout);
        }
        room_of(&w)
    }

    /// The host acknowledged `bytes`. Acks beyond what is outstanding are
    /// clamped (a confused host cannot widen the window).
    pub fn ack(&self, bytes: u64) {
        let mut w = lock(&self.window);
        w.unacked = w.unacked.saturating_sub(bytes);
        drop(w);
        self.notify();
    }

    /// Send one chunk (non-empty, within [`room`](Self::room) and
    /// [`MAX_CHUNK_BYTES`]). False once the stream has ended or was closed:
    /// the data is dropped.
    pub fn send(&self, data: &[u8]) -> bool {
        debug_assert!(!data.is_empty() && data.len() <= MAX_CHUNK_BYTES);
        let ended = lock(&self.ended);
        if *ended {
            return false;
        }
        {
            let mut w = lock(&self.window);
            if w.closed {
                return false;
            }
            w.unacked = w.unacked.saturating_add(data.len() as u64);
        }
        self.outbox.send(&AgentFrame::StreamChunk(StreamChunk {
            stream: self.stream,
            channel: self.channel,
            data: data.to_vec(),
        }))
    }

    /// Send the end frame (once) and close the window.
    pub fn end(&self, reason: StreamEndReason, message: Option<String>) {
        let mut ended = lock(&self.ended);
        if !*ended {
            *ended = true;
            self.outbox.send(&AgentFrame::StreamEnd(StreamEnd {
                stream: self.stream,
                channel: self.channel,
                reason,
                message,
            }));
        }
        drop(ended);
        self.close();
    }

    /// Stop sending without an end frame (an exec's streams, whose terminal
    /// frame is the response; a connection that is gone).
    pub fn close(&self) {
        lock(&self.window).closed = true;
        self.notify();
    }

    fn notify(&self) {
        self.cv.notify_all();
        if let Some(w) = &self.waker {
            w.wake();
        }
    }
}

fn room_of(w: &Window) -> Room {
    if w.closed {
        return Room::Discard;
    }
    let left = STREAM_WINDOW_BYTES.saturating_sub(w.unacked);
    Room::Send(
        usize::try_from(left)
            .unwrap_or(usize::MAX)
            .min(MAX_CHUNK_BYTES),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::socket::Socket;
    use std::os::unix::net::UnixStream;

    #[test]
    fn window_fills_acks_and_closes() {
        let (a, b) = UnixStream::pair().unwrap();
        // Drain the peer so sends never block.
        let drain = std::thread::spawn(move || {
            let mut b = b;
            std::io::copy(&mut b, &mut std::io::sink()).unwrap()
        });
        let outbox = Arc::new(Outbox::new(Socket::from_fd(a.into())));
        let s = StreamOut::new(Arc::clone(&outbox), 1, Channel::Stdout, None);
        let chunk = vec![7u8; MAX_CHUNK_BYTES];
        let mut sent = 0u64;
        while let Room::Send(n) = s.room() {
            if n == 0 {
                break;
            }
            assert!(s.send(&chunk[..n]));
            sent += n as u64;
        }
        assert_eq!(sent, STREAM_WINDOW_BYTES);
        assert_eq!(s.wait_room(Duration::from_millis(1)), Room::Send(0));
        s.ack(100);
        assert_eq!(s.room(), Room::Send(100));
        s.ack(u64::MAX);
        assert_eq!(s.room(), Room::Send(MAX_CHUNK_BYTES));
        s.end(StreamEndReason::Closed, None);
        assert_eq!(s.room(), Room::Discard);
        assert!(!s.send(b"x"));
        outbox.close();
        drain.join().unwrap();
    }
}
