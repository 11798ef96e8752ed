//! The connection's single writer: every frame the agent sends goes through
//! [`Outbox::send`], which encodes outside the lock and writes one whole frame
//! under it, so frames from many threads never interleave.
//!
//! Once a write fails the outbox is dead: later sends are dropped quietly (the
//! reader notices the closed socket and cleans the connection up).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use provium_protocol::frame::{write_frame, DEFAULT_MAX_FRAME_BYTES};
use provium_protocol::result::OpError;
use provium_protocol::wire::{AgentFrame, Response};
use provium_protocol::{encode, OpValue};

use crate::locks::lock;
use crate::op_error;
use crate::socket::Socket;

pub struct Outbox {
    sock: Mutex<Socket>,
    dead: AtomicBool,
}

impl Outbox {
    pub fn new(sock: Socket) -> Self {
        Outbox {
            sock: Mutex::new(sock),
            dead: AtomicBool::new(false),
        }
    }

    /// Send one frame; false when the connection is gone (or the frame could
    /// not be encoded, which is logged).
    pub fn send(&self, frame: &AgentFrame) -> bool {
        if self.dead.load(Ordering::Acquire) {
            return false;
        }
        let body = match encode(frame) {
            Ok(b) => b,
            Err(e) => {
                eprintln!("provium-agent: cannot encode a frame: {e}");
                return false;
            }
        };
        self.send_body(&body)
    }

    fn send_body(&self, body: &[u8]) -> bool {
        let mut sock = lock(&self.sock);
        if self.dead.load(Ordering::Acquire) {
            return false;
        }
        if write_frame(&mut *sock, body, DEFAULT_MAX_FRAME_BYTES).is_err() {
            self.dead.store(true, Ordering::Release);
            sock.shutdown();
            return false;
        }
        true
    }

    /// Answer request `id`. An answer too big for one frame is replaced by a
    /// `too_large` error, so every request still gets exactly one response.
    pub fn respond(&self, id: u64, result: Result<OpValue, OpError>) {
        let frame = AgentFrame::Response(Response {
            id,
            result: result.into(),
        });
        let body = match encode(&frame) {
            Ok(b) if b.len() <= DEFAULT_MAX_FRAME_BYTES => b,
            Ok(b) => {
                let err = op_error::too_large(format!(
                    "the answer is {} bytes, over the {DEFAULT_MAX_FRAME_BYTES}-byte frame limit; \
                     split the request (smaller reads, fewer ops per batch)",
                    b.len()
                ));
                self.send(&AgentFrame::Response(Response {
                    id,
                    result: Err(err).into(),
                }));
                return;
            }
            Err(e) => {
                let err = op_error::internal(format!("cannot encode the answer: {e}"));
                self.send(&AgentFrame::Response(Response {
                    id,
                    result: Err(err).into(),
                }));
                return;
            }
        };
        self.send_body(&body);
    }

    /// Whether a write has failed or the connection was closed.
    pub fn is_dead(&self) -> bool {
        self.dead.load(Ordering::Acquire)
    }

    /// Close the connection from our side (protocol violation, teardown).
    pub fn close(&self) {
        self.dead.store(true, Ordering::Release);
        lock(&self.sock).shutdown();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use provium_protocol::frame::read_message;
    use std::os::unix::net::UnixStream;

    #[test]
    fn oversize_answer_becomes_too_large() {
        let (a, b) = UnixStream::pair().unwrap();
        let out = Outbox::new(Socket::from_fd(a.into()));
        let reader = std::thread::spawn(move || {
            let mut b = b;
            read_message::<AgentFrame, _>(&mut b, 64 * 1024 * 1024)
                .unwrap()
                .unwrap()
        });
        out.respond(3, Ok(OpValue::Bytes(vec![0; DEFAULT_MAX_FRAME_BYTES + 1])));
        let AgentFrame::Response(r) = reader.join().unwrap() else {
            panic!("not a response")
        };
        assert_eq!(r.id, 3);
        let err = r.result.into_result().unwrap_err();
        assert_eq!(err.code, provium_protocol::result::ErrorCode::TooLarge);
        out.close();
        assert!(out.is_dead());
        assert!(!out.send(&AgentFrame::Response(Response {
            id: 1,
            result: Ok(OpValue::Unit).into()
        })));
    }
}
