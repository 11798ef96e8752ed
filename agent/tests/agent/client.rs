//! A test-only host: starts the built agent on a Unix socket and speaks raw
//! frames to it through the protocol crate.

use std::collections::HashMap;
use std::io::Write;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use provium_protocol::frame::{read_message, write_message, DEFAULT_MAX_FRAME_BYTES};
use provium_protocol::op::{CommandSpec, ExecSpec, Op, SpawnSpec};
use provium_protocol::result::{ErrorCode, ExitInfo, OpError, OpResult};
use provium_protocol::wire::{
    AgentFrame, Channel, HostFrame, Request, StdinData, StreamAck, StreamEndReason,
};
use provium_protocol::{Hello, OpValue, ProtocolError};

/// The agent under test: the crate's binary, or `PROVIUM_AGENT_BIN` (e.g. the
/// static release build) when set.
pub fn agent_bin() -> String {
    std::env::var("PROVIUM_AGENT_BIN")
        .unwrap_or_else(|_| env!("CARGO_BIN_EXE_provium-agent").to_string())
}

/// Poll `cond` until it holds or `what` times out (20 s).
pub fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// True once `pid` is gone or a zombie (killed, not yet reaped by its new parent).
pub fn pid_dead(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(s) => s
            .rsplit_once(") ")
            .is_some_and(|(_, rest)| rest.starts_with('Z') || rest.starts_with('X')),
    }
}

pub struct Agent {
    pub child: Child,
    pub dir: tempfile::TempDir,
    pub sock: PathBuf,
}

impl Agent {
    pub fn start() -> Agent {
        Agent::start_with(|sock| {
            let mut c = Command::new(agent_bin());
            c.arg("--listen")
                .arg(format!("unix:{}", sock.display()))
                .arg("--no-clock");
            c
        })
    }

    /// Start through a custom command line (e.g. under unshare).
    pub fn start_with(cmd: impl FnOnce(&Path) -> Command) -> Agent {
        let dir = tempfile::Builder::new()
            .prefix("provium-agent-test")
            .tempdir_in(scratch_base())
            .unwrap();
        let sock = dir.path().join("a.sock");
        let child = cmd(&sock)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start the agent");
        let agent = Agent { child, dir, sock };
        wait_until("the agent's socket", || {
            UnixStream::connect(&agent.sock).is_ok()
        });
        agent
    }

    pub fn path(&self, name: &str) -> String {
        self.dir.path().join(name).to_str().unwrap().to_string()
    }

    /// A connected client that has done the handshake.
    pub fn client(&self) -> Client {
        let mut c = self.raw();
        match c.hello(provium_protocol::PROTOCOL_VERSION) {
            AgentFrame::HelloOk(ok) => assert_eq!(ok.agent_version, env!("CARGO_PKG_VERSION")),
            other => panic!("handshake failed: {other:?}"),
        }
        c
    }

    pub fn raw(&self) -> Client {
        let sock = UnixStream::connect(&self.sock).unwrap();
        sock.set_read_timeout(Some(Duration::from_secs(30)))
            .unwrap();
        Client::new(sock)
    }

    /// VmRSS of the agent process, in KiB.
    pub fn rss_kib(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap();
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .expect("VmRSS in /proc/pid/status")
    }

    /// The agent is still running (not crashed).
    pub fn alive(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub struct Client {
    pub sock: UnixStream,
    next_id: u64,
    pub auto_ack: bool,
    pub keep_data: bool,
    pub data: HashMap<(u64, Channel), Vec<u8>>,
    pub counts: HashMap<(u64, Channel), u64>,
    pub ends: HashMap<(u64, Channel), StreamEndReason>,
    pub responses: HashMap<u64, OpResult>,
    pub stdin_acked: HashMap<u64, u64>,
    /// Frames in arrival order: ("chunk"|"end"|"response", id).
    pub log: Vec<(&'static str, u64)>,
}

impl Client {
    fn new(sock: UnixStream) -> Client {
        Client {
            sock,
            next_id: 1,
            auto_ack: true,
            keep_data: true,
            data: HashMap::new(),
            counts: HashMap::new(),
            ends: HashMap::new(),
            responses: HashMap::new(),
            stdin_acked: HashMap::new(),
            log: Vec::new(),
        }
    }

    /// Send a frame. A write error (the agent closed on us) is ignored: the
    /// next read reports the close.
    pub fn send(&mut self, f: &HostFrame) {
        let _ = write_message(&mut self.sock, f, DEFAULT_MAX_FRAME_BYTES);
    }

    pub fn send_raw(&mut self, bytes: &[u8]) {
        // The agent may already have closed: a failed write is fine here.
        let _ = self.sock.write_all(bytes);
    }

    pub fn hello(&mut self, version: u32) -> AgentFrame {
        self.send(&HostFrame::Hello(Hello {
            protocol_version: version,
        }));
        self.recv().expect("an answer to hello")
    }

    /// The next frame; None when the agent closed the connection.
    pub fn recv(&mut self) -> Option<AgentFrame> {
        match read_message::<AgentFrame, _>(&mut self.sock, DEFAULT_MAX_FRAME_BYTES) {
            Ok(f) => f,
            // Closed while our bytes were still unread on its side.
            Err(ProtocolError::Io(e)) if e.kind() == std::io::ErrorKind::ConnectionReset => None,
            Err(e) => panic!("reading from the agent: {e}"),
        }
    }

    /// Handle one frame; false at end of stream.
    pub fn pump(&mut self) -> bool {
        let Some(frame) = self.recv() else {
            return false;
        };
        match frame {
            AgentFrame::Response(r) => {
                self.log.push(("response", r.id));
                self.responses.insert(r.id, r.result);
            }
            AgentFrame::StreamChunk(c) => {
                self.log.push(("chunk", c.stream));
                let key = (c.stream, c.channel);
                *self.counts.entry(key).or_default() += c.data.len() as u64;
                if self.auto_ack {
                    self.ack(c.stream, c.channel, c.data.len() as u64);
                }
                if self.keep_data {
                    self.data.entry(key).or_default().extend_from_slice(&c.data);
                }
            }
            AgentFrame::StreamEnd(e) => {
                self.log.push(("end", e.stream));
                self.ends.insert((e.stream, e.channel), e.reason);
            }
            AgentFrame::StdinAck(a) => {
                *self.stdin_acked.entry(a.process).or_default() += a.bytes;
            }
            other => panic!("unexpected frame {other:?}"),
        }
        true
    }

    pub fn ack(&mut self, stream: u64, channel: Channel, bytes: u64) {
        self.send(&HostFrame::StreamAck(StreamAck {
            stream,
            channel,
            bytes,
        }));
    }

    pub fn stdin(&mut self, process: u64, data: &[u8]) {
        self.send(&HostFrame::StdinData(StdinData {
            process,
            data: data.to_vec(),
        }));
    }

    pub fn request(&mut self, worker: Option<u64>, op: Op) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        self.send(&HostFrame::Request(Request { id, worker, op }));
        id
    }

    pub fn response(&mut self, id: u64) -> OpResult {
        loop {
            if let Some(r) = self.responses.remove(&id) {
                return r;
            }
            assert!(
                self.pump(),
                "the agent closed the connection before answering {id}"
            );
        }
    }

    pub fn pump_until(&mut self, what: &str, mut cond: impl FnMut(&Client) -> bool) {
        while !cond(self) {
            assert!(self.pump(), "connection closed while waiting for {what}");
        }
    }

    pub fn call_in(&mut self, worker: Option<u64>, op: Op) -> Result<OpValue, OpError> {
        let id = self.request(worker, op);
        self.response(id).into_result()
    }

    pub fn call(&mut self, op: Op) -> Result<OpValue, OpError> {
        self.call_in(None, op)
    }

    pub fn ok(&mut self, op: Op) -> OpValue {
        let kind = op.kind();
        self.call(op)
            .unwrap_or_else(|e| panic!("{kind} failed: {e:?}"))
    }

    pub fn err(&mut self, op: Op) -> OpError {
        let kind = op.kind();
        match self.call(op) {
            Ok(v) => panic!("{kind} should have failed, got {v:?}"),
            Err(e) => e,
        }
    }

    pub fn output(&self, id: u64, ch: Channel) -> String {
        String::from_utf8_lossy(self.data.get(&(id, ch)).map_or(&[][..], |v| v)).into_owned()
    }

    /// Run an exec; returns (id, exit).
    pub fn exec(&mut self, spec: impl Into<ExecSpec>) -> (u64, ExitInfo) {
        let id = self.request(None, Op::Exec(spec.into()));
        match self.response(id).into_result() {
            Ok(OpValue::Exit(e)) => (id, e),
            other => panic!("exec answered {other:?}"),
        }
    }

    pub fn sh(&mut self, script: &str) -> (ExitInfo, String, String) {
        let (id, exit) = self.exec(shell(script));
        (
            exit,
            self.output(id, Channel::Stdout),
            self.output(id, Channel::Stderr),
        )
    }

    pub fn spawn(&mut self, worker: Option<u64>, spec: SpawnSpec) -> (u64, u32) {
        let id = self.request(worker, Op::Spawn(spec));
        match self.response(id).into_result() {
            Ok(OpValue::Spawned { pid }) => (id, pid),
            other => panic!("spawn answered {other:?}"),
        }
    }
}

/// An exec of `/bin/sh -c script`, no timeout.
pub fn shell(script: &str) -> ExecSpec {
    CommandSpec::shell(script).into()
}

/// An exec of `program args…`, no shell, no timeout.
pub fn argv(program: &str, args: &[&str]) -> ExecSpec {
    CommandSpec::argv(program, args.iter().copied()).into()
}

/// A spawn of `/bin/sh -c script`.
pub fn spawn_sh(script: &str) -> SpawnSpec {
    SpawnSpec::shell(script)
}

pub fn assert_code(err: &OpError, code: ErrorCode) {
    assert_eq!(err.code, code, "{err:?}");
}

/// Where tests put sockets and scripts. Normally cargo's per-target scratch
/// directory; but the agent as PID 1 mounts a fresh tmpfs on /tmp, which would
/// hide anything there from it, so a checkout under /tmp uses /var/tmp.
pub fn scratch_base() -> std::path::PathBuf {
    let base = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    if base.starts_with("/tmp") {
        std::path::PathBuf::from("/var/tmp")
    } else {
        base
    }
}
