//! An in-process fake agent for client tests: the test plays the agent's
//! side of a socketpair frame by frame, so it can misbehave on purpose.

use std::io::Write;
use std::os::unix::net::UnixStream;
use std::thread;
use std::time::Duration;

use provium_protocol::frame::{read_message, write_frame, write_message, DEFAULT_MAX_FRAME_BYTES};
use provium_protocol::handshake::HelloOk;
use provium_protocol::result::{OpResult, OpValue};
use provium_protocol::wire::{AgentFrame, HostFrame, Request, Response};
use provium_protocol::ProtocolError;

use super::{AgentClient, ClientError, ClientOptions};

/// The agent's end of a connection under test.
pub(crate) struct FakeAgent {
    pub stream: UnixStream,
}

impl FakeAgent {
    /// The next host frame; panics if none arrives within 10 s.
    pub fn recv(&mut self) -> HostFrame {
        self.try_recv(Duration::from_secs(10))
            .expect("the client sent nothing within 10 s")
    }

    /// The next host frame within `timeout`, or None.
    pub fn try_recv(&mut self, timeout: Duration) -> Option<HostFrame> {
        self.stream
            .set_read_timeout(Some(timeout))
            .expect("set a read timeout on the fake agent's socket");
        match read_message::<HostFrame, _>(&mut self.stream, DEFAULT_MAX_FRAME_BYTES) {
            Ok(f) => f,
            Err(ProtocolError::Io(e))
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                None
            }
            Err(e) => panic!("the client sent a bad frame: {e}"),
        }
    }

    /// Reads and drops whatever the client sends until it hangs up or
    /// `timeout` passes. Unlike [`FakeAgent::try_recv`] a frame cut off
    /// mid-way is fine: a client that breaks the connection may shut the
    /// transport down between a frame's length and its body.
    pub fn drain(&mut self, timeout: Duration) {
        use std::io::Read;
        self.stream
            .set_read_timeout(Some(timeout))
            .expect("set a read timeout on the fake agent's socket");
        let mut buf = [0u8; 4096];
        while matches!(self.stream.read(&mut buf), Ok(n) if n > 0) {}
    }

    /// The next frame, which must be a request.
    pub fn recv_request(&mut self) -> Request {
        match self.recv() {
            HostFrame::Request(r) => r,
            other => panic!("expected a request, got {other:?}"),
        }
    }

    pub fn send(&mut self, frame: AgentFrame) {
        write_message(&mut self.stream, &frame, DEFAULT_MAX_FRAME_BYTES)
            .expect("write to the client");
    }

    pub fn send_raw_frame(&mut self, body: &[u8]) {
        write_frame(&mut self.stream, body, DEFAULT_MAX_FRAME_BYTES).expect("write to the client");
        self.stream.flush().expect("flush");
    }

    pub fn answer(&mut self, id: u64, value: OpValue) {
        self.send(AgentFrame::Response(Response {
            id,
            result: OpResult::Ok(value),
        }));
    }
}

pub(crate) fn hello_ok() -> HelloOk {
    HelloOk {
        agent_version: "0.0.0-fake".into(),
        guest_os: "fake".into(),
        agent_features: vec![],
    }
}

/// A client connected to a fake agent, handshake done.
pub(crate) fn connect_fake(opts: ClientOptions) -> (AgentClient, FakeAgent) {
    let (host, agent) = UnixStream::pair().expect("socketpair");
    let client = thread::spawn(move || AgentClient::handshake(host, opts));
    let mut fake = FakeAgent { stream: agent };
    match fake.recv() {
        HostFrame::Hello(h) => assert_eq!(h, provium_protocol::Hello::current()),
        other => panic!("expected hello first, got {other:?}"),
    }
    fake.send(AgentFrame::HelloOk(hello_ok()));
    let client: Result<AgentClient, ClientError> =
        client.join().expect("handshake thread panicked");
    (client.expect("handshake with the fake agent"), fake)
}
