//! The agent client's frame and stream handling as a state machine: a
//! hostile agent sends any sequence of frames (well-formed ones about live
//! or unknown requests and streams, and arbitrary bytes) interleaved with
//! what the host does (requests, stream reads, dropped handles, stdin
//! writes). Nothing may panic, the host never buffers more than the stream
//! window, and every frame the client writes is a well-formed host frame
//! (`provium::client::fuzzing::Driver::check`, after every step).
//!
//! Input: a sequence of steps; each starts with an opcode byte (mod 12),
//! then its arguments (see `step`). Stream and request ids are picked from
//! those the host allocated (or one unknown id), so frames reach live state.

#![no_main]

use libfuzzer_sys::fuzz_target;
use provium::client::fuzzing::Driver;
use provium_protocol::handshake::{HelloErr, HelloOk};
use provium_protocol::result::{OpResult, OpValue};
use provium_protocol::wire::{
    AgentFrame, Channel, Response, StdinAck, StreamChunk, StreamEnd, StreamEndReason,
};
use provium_protocol::{encode, MAX_CHUNK_BYTES};

/// Fuzzer bytes, consumed front to back; zero once spent.
struct Input<'a>(&'a [u8]);

impl Input<'_> {
    fn u8(&mut self) -> u8 {
        match self.0.split_first() {
            Some((&b, rest)) => {
                self.0 = rest;
                b
            }
            None => 0,
        }
    }

    fn u16(&mut self) -> u16 {
        u16::from_le_bytes([self.u8(), self.u8()])
    }

    fn bytes(&mut self, n: usize) -> &[u8] {
        let n = n.min(self.0.len());
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        a
    }
}

fn channel(b: u8) -> Channel {
    match b % 3 {
        0 => Channel::Stdout,
        1 => Channel::Stderr,
        _ => Channel::Data,
    }
}

fn channels(mask: u8) -> Vec<Channel> {
    [Channel::Stdout, Channel::Stderr, Channel::Data]
        .into_iter()
        .enumerate()
        .filter(|(i, _)| mask & (1 << i) != 0)
        .map(|(_, c)| c)
        .collect()
}

struct Machine {
    driver: Driver,
    ids: Vec<u64>,
}

impl Machine {
    /// An id the host allocated, or (index past the end) one it never did.
    fn pick(&self, b: u8) -> u64 {
        self.ids
            .get(usize::from(b) % (self.ids.len() + 1))
            .copied()
            .unwrap_or(u64::from(b) + 1000)
    }

    fn send(&self, frame: &AgentFrame) {
        let body = encode(frame).expect("a constructed frame encodes");
        self.driver.agent_frame(&body);
    }

    fn step(&mut self, inp: &mut Input) {
        match inp.u8() % 12 {
            0 => {
                let n = usize::from(inp.u8());
                let body = inp.bytes(n).to_vec();
                self.driver.agent_frame(&body);
            }
            1 => {
                let id = self.pick(inp.u8());
                self.send(&AgentFrame::Response(Response {
                    id,
                    result: OpResult::Ok(OpValue::Unit),
                }));
            }
            2 => {
                let stream = self.pick(inp.u8());
                let channel = channel(inp.u8());
                let len = (usize::from(inp.u16()) * 2).clamp(1, MAX_CHUNK_BYTES);
                self.send(&AgentFrame::StreamChunk(StreamChunk {
                    stream,
                    channel,
                    data: vec![0x61; len],
                }));
            }
            3 => {
                let stream = self.pick(inp.u8());
                let channel = channel(inp.u8());
                let reason = match inp.u8() % 3 {
                    0 => StreamEndReason::Eof,
                    1 => StreamEndReason::Closed,
                    _ => StreamEndReason::Error,
                };
                self.send(&AgentFrame::StreamEnd(StreamEnd {
                    stream,
                    channel,
                    reason,
                    message: None,
                }));
            }
            4 => {
                let process = self.pick(inp.u8());
                let bytes = u64::from(inp.u16()) * 8 + 1;
                self.send(&AgentFrame::StdinAck(StdinAck { process, bytes }));
            }
            5 => {
                if inp.u8() % 2 == 0 {
                    self.send(&AgentFrame::HelloOk(HelloOk {
                        agent_version: "fuzz".into(),
                        guest_os: "fuzz".into(),
                        agent_features: vec![],
                    }));
                } else {
                    self.send(&AgentFrame::HelloErr(HelloErr {
                        agent_protocol_version: 0,
                        host_protocol_version: 1,
                        message: "no".into(),
                    }));
                }
            }
            6 => {
                let flags = inp.u8();
                if let Some(id) = self.driver.begin(&channels(flags), flags & 8 != 0) {
                    if self.ids.len() < 16 {
                        self.ids.push(id);
                    }
                }
            }
            7 => {
                let stream = self.pick(inp.u8());
                let channel = channel(inp.u8());
                let max = usize::from(inp.u8() % 4) + 1;
                self.driver.read(stream, channel, max);
            }
            8 => {
                let stream = self.pick(inp.u8());
                self.driver.discard(stream, &channels(inp.u8()));
            }
            9 => {
                let stream = self.pick(inp.u8());
                self.driver.drop_streams(stream, &channels(inp.u8()));
            }
            10 => {
                let process = self.pick(inp.u8());
                let len = usize::from(inp.u16()) * 4;
                self.driver.stdin_write(process, len);
            }
            _ => {
                let id = self.pick(inp.u8());
                match inp.u8() % 3 {
                    0 => self.driver.finish(id),
                    1 => self.driver.abandon(id),
                    _ => self.driver.forget_stdin(id),
                }
            }
        }
        self.driver.check();
    }
}

fuzz_target!(|data: &[u8]| {
    let mut inp = Input(data);
    let handshaking = inp.u8() % 2 == 1;
    let mut m = Machine {
        driver: Driver::new(handshaking),
        ids: Vec::new(),
    };
    let mut steps = 0;
    while !inp.0.is_empty() && steps < 256 {
        m.step(&mut inp);
        steps += 1;
    }
    let _ = m.driver.is_lost();
});
