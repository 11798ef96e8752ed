//! A synchronous driver over the connection's frame handling, for the fuzz
//! target `harness/fuzz/fuzz_targets/client_frames.rs` (not an API).
//!
//! The real client has a reader thread and blocking callers; a fuzzer needs
//! the same state machine stepped deterministically. [`Driver`] builds an
//! [`AgentClient`] whose writer is an in-memory sink and that has no reader
//! thread: [`Driver::agent_frame`] handles one frame body exactly as the
//! reader loop does after reading it (decode, then `dispatch` under the
//! state lock, a violation marks the connection broken), and the host-side
//! steps call the client's own methods with deadlines that have already
//! passed, so nothing blocks. [`Driver::check`] asserts the invariants the
//! module doc promises after every step.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use provium_protocol::frame::FrameDecoder;
use provium_protocol::op::{Op, StreamId};
use provium_protocol::wire::{AgentFrame, Channel, HostFrame};
use provium_protocol::{decode, STREAM_WINDOW_BYTES};

use super::{AgentClient, ClientOptions, Deadline, Guard, Handshake, Lost, Shared, State};
use crate::lock::Locked;

/// A deadline that has already passed: the fuzzer's calls never wait.
fn now() -> Deadline {
    Deadline {
        at: Instant::now(),
        budget: Duration::ZERO,
    }
}

/// What the client wrote, kept for [`Driver::check`].
struct Sink(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Sink {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.locked().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// One client connection, stepped by hand.
pub struct Driver {
    client: AgentClient,
    sent: Arc<Mutex<Vec<u8>>>,
    decoder: FrameDecoder,
}

impl Driver {
    /// A client that is still waiting for the agent's handshake answer
    /// (`handshaking`), or one past it.
    pub fn new(handshaking: bool) -> Driver {
        let sent = Arc::new(Mutex::new(Vec::new()));
        let max_frame_bytes = provium_protocol::frame::DEFAULT_MAX_FRAME_BYTES;
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                handshake: Some(if handshaking {
                    Handshake::Waiting
                } else {
                    Handshake::Done
                }),
                ..State::default()
            }),
            cond: std::sync::Condvar::new(),
            writer: Mutex::new(Box::new(Sink(Arc::clone(&sent)))),
            shutdown: Box::new(|| {}),
            next_id: std::sync::atomic::AtomicU64::new(1),
            max_frame_bytes,
            frame_stall_timeout: ClientOptions::default().frame_stall_timeout,
            read_poll: false,
            max_collected_output_bytes: ClientOptions::default().max_collected_output_bytes,
        });
        let guard = Arc::new(Guard {
            shared: Arc::clone(&shared),
        });
        Driver {
            client: AgentClient {
                shared,
                _guard: guard,
                op_timeout: Duration::ZERO,
                hello: Arc::new(provium_protocol::handshake::HelloOk {
                    agent_version: "fuzz".into(),
                    guest_os: "fuzz".into(),
                    agent_features: vec![],
                }),
            },
            sent,
            decoder: FrameDecoder::new(max_frame_bytes),
        }
    }

    /// One frame body from the agent, handled as `Shared::read_loop` handles
    /// a body it has read.
    pub fn agent_frame(&self, body: &[u8]) {
        let shared = &self.client.shared;
        let frame: AgentFrame = match decode(body) {
            Ok(f) => f,
            Err(e) => {
                shared.mark_lost(Lost::Broken(format!(
                    "undecodable frame from the agent: {e}"
                )));
                return;
            }
        };
        let verdict = {
            let mut st = shared.lock();
            if st.lost.is_some() {
                return;
            }
            let sent_below = shared.next_id.load(std::sync::atomic::Ordering::Relaxed);
            super::dispatch(&mut st, frame, sent_below)
        };
        if let Err(reason) = verdict {
            shared.mark_lost(Lost::Broken(reason.to_string()));
        }
    }

    /// A request (a ping) with output streams on `channels` and, with
    /// `stdin`, a stdin window; its id, or None once the connection is lost.
    pub fn begin(&self, channels: &[Channel], stdin: bool) -> Option<StreamId> {
        self.client.begin(None, Op::Ping, channels, stdin).ok()
    }

    /// Collect the answer to `id` if it is there (never waits).
    pub fn finish(&self, id: u64) {
        let _ = self
            .client
            .finish(id, provium_protocol::op::OpKind::Ping, Some(now()));
    }

    /// Read up to `max_chunks` chunks of a stream and acknowledge them, as
    /// a `StreamReader` does.
    pub fn read(&self, stream: StreamId, channel: Channel, max_chunks: usize) {
        let res = self.client.wait_for(Some(Instant::now()), |st| {
            let taken = super::take_chunks(st, stream, channel, Some(max_chunks));
            (!taken.is_empty()).then_some(taken)
        });
        if let Ok(taken) = res {
            self.client.ack(stream, channel, taken.bytes);
        }
    }

    /// Nobody will read these streams any more (a dropped process handle).
    pub fn discard(&self, stream: StreamId, channels: &[Channel]) {
        self.client.discard_streams(stream, channels);
    }

    /// The streams are finished with (a reader that saw their end).
    pub fn drop_streams(&self, stream: StreamId, channels: &[Channel]) {
        self.client.drop_streams(stream, channels);
    }

    /// Write `len` bytes of stdin to `process` if the window allows now.
    pub fn stdin_write(&self, process: StreamId, len: usize) {
        let data = vec![b'x'; len];
        let _ = self.client.stdin_write(process, &data, Some(now()));
    }

    /// The process was waited for: its stdin window goes.
    pub fn forget_stdin(&self, process: StreamId) {
        self.client.forget_stdin(process);
    }

    /// The caller gave up on request `id`.
    pub fn abandon(&self, id: u64) {
        self.client.abandon(id);
    }

    /// Whether the connection is lost.
    pub fn is_lost(&self) -> bool {
        self.client.is_lost()
    }

    /// Panics if an invariant is broken: per (stream, channel) at most the
    /// window is held unacknowledged and it is exactly the bytes buffered;
    /// a discarded stream buffers nothing; the ack backlog never owes more
    /// than a window; stdin never has more than a window in flight; and
    /// everything the client wrote is well-formed host frames.
    pub fn check(&mut self) {
        {
            let st = self.client.shared.lock();
            for (key, buf) in &st.streams {
                let held: u64 = buf.chunks.iter().map(|c| c.len() as u64).sum();
                assert!(
                    buf.unacked_bytes <= STREAM_WINDOW_BYTES,
                    "{key:?} holds {} unacknowledged bytes",
                    buf.unacked_bytes
                );
                assert_eq!(
                    held, buf.unacked_bytes,
                    "{key:?}: buffered != unacknowledged"
                );
                if buf.discard {
                    assert!(
                        buf.chunks.is_empty(),
                        "{key:?} is discarded but buffers data"
                    );
                }
            }
            for (key, owed) in &st.ack_backlog {
                assert!(*owed <= STREAM_WINDOW_BYTES, "{key:?} owes {owed} bytes");
            }
            for (p, unacked) in &st.stdin_unacked {
                assert!(*unacked <= STREAM_WINDOW_BYTES, "stdin of {p}: {unacked}");
            }
        }
        let sent = std::mem::take(&mut *self.sent.locked());
        self.decoder.push(&sent);
        loop {
            match self.decoder.next_frame() {
                Ok(Some(body)) => {
                    let frame: HostFrame = decode(&body).expect("the client sends valid frames");
                    if let HostFrame::StreamAck(a) = frame {
                        assert!(
                            a.bytes > 0 && a.bytes <= STREAM_WINDOW_BYTES,
                            "ack of {} bytes",
                            a.bytes
                        );
                    }
                }
                Ok(None) => break,
                Err(e) => panic!("the client wrote a bad frame: {e}"),
            }
        }
    }
}
