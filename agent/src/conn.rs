//! One host connection: the handshake, the reader loop, request dispatch and
//! teardown.
//!
//! The reader thread only routes: a request goes to a fresh thread (no
//! worker) or to its worker's queue, an ack to its stream's window, stdin
//! bytes to the process's stdin queue. It never blocks on a child or on the
//! host, so a long `exec` never delays a `ping` or an ack. All frames out go
//! through the [`Outbox`].
//!
//! Anything malformed (garbage, an oversize frame, a second hello, a stdin
//! window overrun) is logged to stderr and closes this connection only. When
//! a connection closes, every worker and the connection's own namespace are
//! closed: processes killed, handles closed, streams ended.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use provium_protocol::frame::{read_message, DEFAULT_MAX_FRAME_BYTES};
use provium_protocol::handshake::{answer_hello, HelloOk};
use provium_protocol::op::{Op, StreamId, WorkerId};
use provium_protocol::wire::{AgentFrame, Channel, HostFrame, Request, StdinData, StreamAck};
use provium_protocol::OpValue;

use crate::locks::lock;
use crate::namespace::Namespace;
use crate::op_error;
use crate::outbox::Outbox;
use crate::socket::Socket;
use crate::stdin::{Pushed, StdinPipe};
use crate::stream::StreamOut;
use crate::worker::{self, Workers};
use crate::AgentConfig;

/// Runs one request in a namespace (the connection's own, or a worker's)
/// and answers it: `dispatch::handle`, handed in by whoever serves the
/// connection, so that this module does not depend on the dispatcher.
pub type RunRequest = fn(&Arc<Conn>, &Arc<Namespace>, Option<WorkerId>, u64, Op);

/// Connection-level requests running at once; beyond this a request is
/// refused (each one holds a thread).
const MAX_IN_FLIGHT: usize = 1024;

pub struct Conn {
    outbox: Arc<Outbox>,
    pub config: Arc<AgentConfig>,
    streams: Mutex<HashMap<(StreamId, Channel), Arc<StreamOut>>>,
    stdins: Mutex<HashMap<StreamId, Arc<StdinPipe>>>,
    pub root: Arc<Namespace>,
    pub workers: Workers,
    run_request: RunRequest,
    in_flight: AtomicUsize,
}

impl Conn {
    pub fn new(outbox: Arc<Outbox>, config: Arc<AgentConfig>, run_request: RunRequest) -> Self {
        Conn {
            outbox,
            config,
            streams: Mutex::new(HashMap::new()),
            stdins: Mutex::new(HashMap::new()),
            root: Namespace::new(),
            workers: Workers::default(),
            run_request,
            in_flight: AtomicUsize::new(0),
        }
    }

    /// A connection over one end of a socket pair (the other end is
    /// dropped: frames out go nowhere) whose requests run nowhere, for
    /// handler tests.
    #[cfg(test)]
    pub fn for_tests() -> Arc<Conn> {
        let (a, _b) = std::os::unix::net::UnixStream::pair().expect("a socket pair");
        let outbox = Arc::new(Outbox::new(Socket::from_fd(a.into())));
        Arc::new(Conn::new(
            outbox,
            Arc::new(AgentConfig::default()),
            |_, _, _, _, _| {},
        ))
    }

    pub fn outbox(&self) -> Arc<Outbox> {
        Arc::clone(&self.outbox)
    }

    /// Run request `id` through the dispatcher this connection was served
    /// with.
    pub fn run_request(
        self: &Arc<Self>,
        ns: &Arc<Namespace>,
        worker: Option<WorkerId>,
        id: u64,
        op: Op,
    ) {
        (self.run_request)(self, ns, worker, id, op);
    }

    /// Route acks for `s` to it until [`unregister_stream`](Self::unregister_stream).
    pub fn register_stream(&self, s: &Arc<StreamOut>) {
        lock(&self.streams).insert((s.stream, s.channel), Arc::clone(s));
    }

    pub fn unregister_stream(&self, s: &StreamOut) {
        let mut streams = lock(&self.streams);
        let key = (s.stream, s.channel);
        // Only if it is still this stream (a host may reuse an id later).
        if streams
            .get(&key)
            .is_some_and(|cur| std::ptr::eq(Arc::as_ptr(cur), s))
        {
            streams.remove(&key);
        }
    }

    pub fn register_stdin(&self, process: StreamId, pipe: Arc<StdinPipe>) {
        lock(&self.stdins).insert(process, pipe);
    }

    pub fn unregister_stdin(&self, process: StreamId) {
        lock(&self.stdins).remove(&process);
    }

    fn on_ack(&self, ack: StreamAck) {
        let s = lock(&self.streams).get(&(ack.stream, ack.channel)).cloned();
        // An ack for a stream that already ended is normal (it raced the end).
        if let Some(s) = s {
            s.ack(ack.bytes);
        }
    }

    fn on_stdin(&self, d: StdinData) -> Result<(), String> {
        let pipe = lock(&self.stdins).get(&d.process).cloned();
        match pipe {
            Some(p) => {
                if p.push(d.process, d.data)? == Pushed::Dropped {
                    eprintln!(
                        "provium-agent: stdin for process {} after stdin_close; dropped",
                        d.process
                    );
                }
            }
            None => eprintln!(
                "provium-agent: stdin for unknown or finished process {}; dropped",
                d.process
            ),
        }
        Ok(())
    }

    fn on_request(self: &Arc<Self>, req: Request) {
        let Request { id, worker, op } = req;
        if let Some(w) = worker {
            if let Err(e) = worker::submit(&self.workers, w, id, op) {
                self.outbox.respond(id, Err(e));
            }
            return;
        }
        if matches!(op, Op::Ping) {
            // Answered on the reader: the cheapest possible round trip.
            self.outbox.respond(id, Ok(OpValue::Unit));
            return;
        }
        if self.in_flight.fetch_add(1, Ordering::AcqRel) >= MAX_IN_FLIGHT {
            self.in_flight.fetch_sub(1, Ordering::AcqRel);
            self.outbox.respond(
                id,
                Err(op_error::not_allowed(format!(
                    "{MAX_IN_FLIGHT} requests are already running on this connection; \
                     wait for some answers before sending more"
                ))),
            );
            return;
        }
        let conn = Arc::clone(self);
        let spawned = std::thread::Builder::new()
            .name("provium-req".into())
            .spawn(move || {
                let ns = Arc::clone(&conn.root);
                conn.run_request(&ns, None, id, op);
                conn.in_flight.fetch_sub(1, Ordering::AcqRel);
            });
        if let Err(e) = spawned {
            self.in_flight.fetch_sub(1, Ordering::AcqRel);
            self.outbox
                .respond(id, Err(op_error::io(&e, "starting a request thread")));
        }
    }

    /// Route frames until the host hangs up (None) or misbehaves (Some(why)).
    fn read_loop(self: &Arc<Self>, reader: &Socket) -> Option<String> {
        let mut r = reader;
        loop {
            let frame = match read_message::<HostFrame, _>(&mut r, DEFAULT_MAX_FRAME_BYTES) {
                Ok(Some(f)) => f,
                Ok(None) => return None,
                Err(e) => {
                    if self.outbox.is_dead() {
                        return None;
                    }
                    return Some(e.to_string());
                }
            };
            match frame {
                HostFrame::Hello(_) => return Some("a second hello on an open connection".into()),
                HostFrame::Request(req) => self.on_request(req),
                HostFrame::StreamAck(ack) => self.on_ack(ack),
                HostFrame::StdinData(d) => {
                    if let Err(why) = self.on_stdin(d) {
                        return Some(why);
                    }
                }
            }
        }
    }

    /// Close everything this connection owns.
    fn teardown(&self) {
        self.outbox.close();
        self.workers.close_all();
        self.root.close();
        let streams: Vec<_> = lock(&self.streams).drain().map(|(_, s)| s).collect();
        for s in streams {
            s.close();
        }
        let stdins: Vec<_> = lock(&self.stdins).drain().map(|(_, p)| p).collect();
        for p in stdins {
            p.close();
        }
    }
}

fn guest_os() -> String {
    // SAFETY: utsname is plain data; uname fills it.
    let mut u: libc::utsname = unsafe { std::mem::zeroed() };
    // SAFETY: `u` is a live utsname for the call.
    if unsafe { libc::uname(&mut u) } != 0 {
        return "linux".into();
    }
    let field = |f: &[libc::c_char]| -> String {
        let bytes: Vec<u8> = f
            .iter()
            .take_while(|c| **c != 0)
            .map(|c| c.to_ne_bytes()[0])
            .collect();
        String::from_utf8_lossy(&bytes).into_owned()
    };
    format!(
        "{} {} {}",
        field(&u.sysname).to_lowercase(),
        field(&u.release),
        field(&u.machine)
    )
}

fn hello_ok(config: &AgentConfig) -> HelloOk {
    let mut features: Vec<String> = [
        "exec", "spawn", "files", "tail", "syscall", "ioctl", "workers", "batch",
    ]
    .iter()
    .map(|s| (*s).to_string())
    .collect();
    if !config.no_clock {
        features.push("clock_set".into());
    }
    // Which channel serves this connection: the harness logs it.
    if !config.channel.is_empty() {
        features.push(format!(
            "{}{}",
            provium_protocol::handshake::CHANNEL_FEATURE_PREFIX,
            config.channel
        ));
    }
    HelloOk {
        agent_version: env!("CARGO_PKG_VERSION").into(),
        guest_os: guest_os(),
        agent_features: features,
    }
}

/// Serve one accepted connection until it closes, running its requests
/// with `run_request`.
pub fn serve(sock: Socket, config: Arc<AgentConfig>, run_request: RunRequest) {
    let reader = match sock.try_clone() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("provium-agent: cannot duplicate a connection socket: {e}");
            return;
        }
    };
    let outbox = Arc::new(Outbox::new(sock));
    let mut r = &reader;
    match read_message::<HostFrame, _>(&mut r, DEFAULT_MAX_FRAME_BYTES) {
        Ok(Some(HostFrame::Hello(hello))) => match answer_hello(&hello, || hello_ok(&config)) {
            Ok(ok) => {
                outbox.send(&AgentFrame::HelloOk(ok));
            }
            Err(err) => {
                eprintln!("provium-agent: refusing a connection: {}", err.message);
                outbox.send(&AgentFrame::HelloErr(err));
                outbox.close();
                return;
            }
        },
        Ok(None) => return,
        Ok(Some(_)) => {
            eprintln!("provium-agent: closing a connection whose first frame is not hello");
            outbox.close();
            return;
        }
        Err(e) => {
            eprintln!("provium-agent: closing a connection: bad hello: {e}");
            outbox.close();
            return;
        }
    }
    let conn = Arc::new(Conn::new(outbox, config, run_request));
    if let Some(why) = conn.read_loop(&reader) {
        eprintln!("provium-agent: closing a connection: {why}");
    }
    conn.teardown();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hello_names_the_guest_and_clock_feature() {
        let ok = hello_ok(&AgentConfig {
            no_clock: true,
            channel: "console",
        });
        assert!(ok.agent_features.iter().any(|f| f == "channel:console"));
        assert_eq!(ok.agent_version, env!("CARGO_PKG_VERSION"));
        assert!(ok.guest_os.starts_with("linux "), "{}", ok.guest_os);
        assert!(!ok.agent_features.iter().any(|f| f == "clock_set"));
        let ok = hello_ok(&AgentConfig {
            no_clock: false,
            channel: "",
        });
        assert!(!ok.agent_features.iter().any(|f| f.starts_with("channel:")));
        assert!(ok.agent_features.iter().any(|f| f == "clock_set"));
    }
}
