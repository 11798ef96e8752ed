//! One agent connection: the handshake, request/response routing, stream
//! buffers and both flow-control windows.
//!
//! Threads: a reader thread owns the read half and is the only reader. It
//! decodes [`AgentFrame`]s and files them into [`State`] (responses by request
//! id, stream chunks by (stream, channel), stdin acks by process) and wakes
//! waiters through one condvar. Callers write their own frames under the
//! writer mutex, so a request costs no thread hand-off. The reader never
//! writes: if it blocked on a full send buffer while the agent blocked on a
//! full receive buffer, both would stall. Acknowledgements are therefore sent
//! by whoever consumes the data (see [`Shared::ack`]), and acks for data
//! nobody will read (dropped handles) wait in a small backlog that the next
//! write flushes.
//!
//! Invariants:
//! - Once the connection is lost (peer closed, i/o error, undecodable frame,
//!   protocol violation), `State::lost` is set, the transport is shut down,
//!   and every waiter wakes and returns that error. Nothing waits on a dead
//!   connection.
//! - Per (stream, channel) the host holds at most [`STREAM_WINDOW_BYTES`]
//!   unacknowledged bytes; an agent that sends more breaks the connection.
//!   Streams nobody registered are ignored (no memory is kept for them).
//! - Whatever the agent sends, the host's memory for the connection stays
//!   bounded: a frame is at most `max_frame_bytes` and its buffer grows only
//!   as its bytes arrive (a length field of 2^32-1 allocates nothing); an
//!   agent that stops mid-frame for [`ClientOptions::frame_stall_timeout`]
//!   breaks the connection; an answer to a request never sent, a second
//!   answer and a second end of a stream are protocol violations.

use std::collections::{HashMap, VecDeque};
use std::io::{self, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread;
use std::time::{Duration, Instant};

use provium_protocol::frame::{write_frame, DEFAULT_MAX_FRAME_BYTES};
use provium_protocol::handshake::{Hello, HelloOk};
use provium_protocol::op::{Op, OpKind, StreamId, WorkerId};
use provium_protocol::result::{OpResult, OpValue};
use provium_protocol::wire::{
    AgentFrame, Channel, HostFrame, Request, StdinData, StreamAck, StreamEndReason,
};
use provium_protocol::{decode, encode, ProtocolError, MAX_CHUNK_BYTES, STREAM_WINDOW_BYTES};

use super::error::ClientError;
use crate::lock::Locked;

/// When a call gives up, with the budget it was given: a timeout error
/// names the budget, which is what the caller set.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Deadline {
    pub at: Instant,
    pub budget: Duration,
}

/// Client-side knobs. `Default` gives the values the harness uses.
#[derive(Debug, Clone)]
pub struct ClientOptions {
    /// How long a request may go unanswered before the call fails with
    /// [`ClientError::Timeout`]. Ops that carry their own timeout (exec's
    /// `timeout_ms`, wait's) get that much on top. Default: 60 s.
    pub op_timeout: Duration,
    /// How long to wait for HelloOk after sending Hello. Default: 10 s.
    pub handshake_timeout: Duration,
    /// Largest frame accepted or sent. Default: the protocol's 16 MiB.
    pub max_frame_bytes: usize,
    /// How long the agent may stop sending in the middle of a frame before
    /// the connection is broken (between frames it may be silent for as
    /// long as it likes). Needs a transport whose reads time out
    /// ([`TransportParts::read_poll`]). Default: 10 s.
    pub frame_stall_timeout: Duration,
    /// Most output (stdout and stderr together) a call that collects it
    /// (`exec`) keeps; more fails the call with
    /// [`ClientError::OutputTooLarge`]. Default: [`MAX_COLLECTED_OUTPUT_BYTES`].
    pub max_collected_output_bytes: u64,
}

/// Default of [`ClientOptions::max_collected_output_bytes`]: 64 MiB.
pub const MAX_COLLECTED_OUTPUT_BYTES: u64 = 64 << 20;

impl Default for ClientOptions {
    fn default() -> Self {
        ClientOptions {
            op_timeout: Duration::from_secs(60),
            handshake_timeout: Duration::from_secs(10),
            max_frame_bytes: DEFAULT_MAX_FRAME_BYTES,
            frame_stall_timeout: Duration::from_secs(10),
            max_collected_output_bytes: MAX_COLLECTED_OUTPUT_BYTES,
        }
    }
}

/// How often the reader wakes from a blocked read to check for a stalled
/// frame or a lost connection (the read timeout of Unix sockets).
pub const READ_POLL: Duration = Duration::from_millis(250);

/// How many answered request ids are remembered to recognise a second
/// answer to one of them (older duplicates are indistinguishable from late
/// answers to abandoned calls and are dropped).
const RECENT_ANSWERS: usize = 1024;

/// Body bytes the reader allocates ahead of what has arrived.
const READ_CHUNK: usize = 64 * 1024;

/// A byte stream to an agent, split into an independently usable read half,
/// write half and a way to shut both down (which must make a blocked read
/// return). Unix sockets implement it; the vsock transport will too.
pub trait Transport: Send + 'static {
    /// Split into (reader, writer, shutdown).
    fn split(self) -> io::Result<TransportParts>;
}

/// The halves of a [`Transport`].
pub struct TransportParts {
    pub reader: Box<dyn Read + Send>,
    pub writer: Box<dyn Write + Send>,
    /// Shuts the transport down both ways; called once, on loss or drop.
    pub shutdown: Box<dyn Fn() + Send + Sync>,
    /// Whether `reader`'s reads time out (`WouldBlock`/`TimedOut`) every so
    /// often, letting the reader notice a frame that stalled. Without it a
    /// stalled frame is only ended by the op timeout or the VM's teardown.
    pub read_poll: bool,
}

impl Transport for UnixStream {
    fn split(self) -> io::Result<TransportParts> {
        let reader = self.try_clone()?;
        // Receive timeouts only affect reads, which only the reader does.
        reader.set_read_timeout(Some(READ_POLL))?;
        let closer = self.try_clone()?;
        Ok(TransportParts {
            reader: Box::new(reader),
            writer: Box::new(self),
            shutdown: Box::new(move || {
                // Ignored: ENOTCONN when the peer already went away.
                let _ = closer.shutdown(std::net::Shutdown::Both);
            }),
            read_poll: true,
        })
    }
}

/// Why the connection is unusable; cloned into every waiter's error.
#[derive(Debug, Clone)]
enum Lost {
    Closed(String),
    Broken(String),
}

impl Lost {
    fn error(&self) -> ClientError {
        match self {
            Lost::Closed(reason) => ClientError::ConnectionClosed {
                reason: reason.clone(),
            },
            Lost::Broken(reason) => ClientError::ConnectionBroken {
                reason: reason.clone(),
            },
        }
    }
}

enum Handshake {
    Waiting,
    Done,
}

/// What a request id is waiting for.
enum Slot {
    Waiting,
    Done(OpResult),
    /// Fire-and-forget (cleanup on drop): the answer is dropped.
    Detached,
}

/// Host-side buffer of one (stream, channel).
#[derive(Default)]
struct StreamBuf {
    chunks: VecDeque<Vec<u8>>,
    /// Received and not yet acknowledged; at most the window.
    unacked_bytes: u64,
    end: Option<(StreamEndReason, Option<String>)>,
    /// Nobody will read it: chunks are acknowledged (through the backlog)
    /// and dropped until the stream ends.
    discard: bool,
}

/// Everything the reader files and callers wait on, under one mutex.
#[derive(Default)]
pub(crate) struct State {
    lost: Option<Lost>,
    pending: HashMap<u64, Slot>,
    streams: HashMap<(StreamId, Channel), StreamBuf>,
    /// Per spawned process: stdin bytes sent and not yet acknowledged.
    stdin_unacked: HashMap<StreamId, u64>,
    /// Acks owed for discarded data, sent by the next writer.
    ack_backlog: HashMap<(StreamId, Channel), u64>,
    handshake: Option<Handshake>,
    hello: Option<Result<HelloOk, provium_protocol::HelloErr>>,
    /// The last [`RECENT_ANSWERS`] request ids answered, oldest first.
    answered: VecDeque<u64>,
}

pub(crate) struct Shared {
    state: Mutex<State>,
    cond: Condvar,
    writer: Mutex<Box<dyn Write + Send>>,
    shutdown: Box<dyn Fn() + Send + Sync>,
    next_id: AtomicU64,
    max_frame_bytes: usize,
    frame_stall_timeout: Duration,
    read_poll: bool,
    max_collected_output_bytes: u64,
}

/// Closes the transport when the last [`AgentClient`] clone goes away, which
/// ends the reader thread (it holds only [`Shared`]).
struct Guard {
    shared: Arc<Shared>,
}

impl Drop for Guard {
    fn drop(&mut self) {
        self.shared
            .mark_lost(Lost::Closed("the client was dropped on the host".into()));
    }
}

/// A connected, handshaken agent client. Cheap to clone; clones share the
/// connection and may be used from many threads at once. Each clone carries
/// its own op timeout ([`AgentClient::with_timeout`]).
#[derive(Clone)]
pub struct AgentClient {
    pub(crate) shared: Arc<Shared>,
    _guard: Arc<Guard>,
    op_timeout: Duration,
    hello: Arc<HelloOk>,
}

impl std::fmt::Debug for AgentClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AgentClient")
            .field("agent_version", &self.hello.agent_version)
            .field("op_timeout", &self.op_timeout)
            .finish_non_exhaustive()
    }
}

/// The outcome of waiting on the connection state.
pub(crate) enum WaitError {
    Lost(ClientError),
    TimedOut,
}

impl AgentClient {
    /// Connect to an agent listening on a Unix socket and do the handshake.
    pub fn connect_unix(path: &Path, opts: ClientOptions) -> Result<AgentClient, ClientError> {
        let stream = UnixStream::connect(path).map_err(|source| ClientError::Connect {
            endpoint: format!("unix:{}", path.display()),
            source,
        })?;
        AgentClient::handshake(stream, opts)
    }

    /// Start the reader thread on `transport`, send Hello and wait for HelloOk.
    pub fn handshake<T: Transport>(
        transport: T,
        opts: ClientOptions,
    ) -> Result<AgentClient, ClientError> {
        let parts = transport.split().map_err(|source| ClientError::Connect {
            endpoint: "transport".into(),
            source,
        })?;
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                handshake: Some(Handshake::Waiting),
                ..State::default()
            }),
            cond: Condvar::new(),
            writer: Mutex::new(parts.writer),
            shutdown: parts.shutdown,
            next_id: AtomicU64::new(1),
            max_frame_bytes: opts.max_frame_bytes,
            frame_stall_timeout: opts.frame_stall_timeout,
            read_poll: parts.read_poll,
            max_collected_output_bytes: opts.max_collected_output_bytes,
        });
        let guard = Arc::new(Guard {
            shared: Arc::clone(&shared),
        });
        let reader_shared = Arc::clone(&shared);
        let mut reader = parts.reader;
        thread::Builder::new()
            .name("agent-reader".into())
            .spawn(move || reader_shared.read_loop(&mut reader))
            .map_err(|source| ClientError::Connect {
                endpoint: "agent reader thread".into(),
                source,
            })?;

        shared.send(&HostFrame::Hello(Hello::current()), "hello")?;
        let deadline = Instant::now() + opts.handshake_timeout;
        let answer = shared.wait_for(Some(deadline), |st| st.hello.take());
        let hello = match answer {
            Ok(Ok(ok)) => ok,
            Ok(Err(refused)) => {
                shared.mark_lost(Lost::Closed("the agent refused the handshake".into()));
                return Err(ClientError::HandshakeRefused {
                    agent_protocol_version: refused.agent_protocol_version,
                    host_protocol_version: refused.host_protocol_version,
                    message: refused.message,
                });
            }
            Err(WaitError::Lost(e)) => return Err(e),
            Err(WaitError::TimedOut) => {
                shared.mark_lost(Lost::Closed("handshake timed out".into()));
                return Err(ClientError::HandshakeTimeout {
                    timeout_ms: millis(opts.handshake_timeout),
                });
            }
        };
        Ok(AgentClient {
            shared,
            _guard: guard,
            op_timeout: opts.op_timeout,
            hello: Arc::new(hello),
        })
    }

    /// The agent's HelloOk: its version, guest OS and features.
    pub fn agent_info(&self) -> &HelloOk {
        &self.hello
    }

    /// The most output a collecting call keeps
    /// ([`ClientOptions::max_collected_output_bytes`]).
    pub fn max_collected_output_bytes(&self) -> u64 {
        self.shared.max_collected_output_bytes
    }

    /// The op timeout this handle applies.
    pub fn op_timeout(&self) -> Duration {
        self.op_timeout
    }

    /// A handle on the same connection with another op timeout.
    pub fn with_timeout(&self, op_timeout: Duration) -> AgentClient {
        AgentClient {
            op_timeout,
            ..self.clone()
        }
    }

    /// Whether the connection has been lost (closed or broken).
    pub fn is_lost(&self) -> bool {
        self.shared.lock().lost.is_some()
    }

    /// Close the connection now. Pending calls wake with "agent connection
    /// closed"; the agent sees end of stream. (Closing a file handle is
    /// [`AgentOps::close`](super::AgentOps::close): `AgentOps::close(&client, handle)`.)
    pub fn close(&self) {
        self.shared
            .mark_lost(Lost::Closed("the host closed the connection".into()));
    }

    /// The deadline of a call started now: the op timeout plus `extra`
    /// (None: a budget too large to represent, i.e. no deadline).
    pub(crate) fn deadline_after(&self, extra: Option<Duration>) -> Option<Deadline> {
        let budget = self.op_timeout.checked_add(extra.unwrap_or_default())?;
        Some(Deadline {
            at: Instant::now().checked_add(budget)?,
            budget,
        })
    }

    /// Send a request and return its id; `streams` are registered for the
    /// id before the request leaves, so no early chunk is missed.
    pub(crate) fn begin(
        &self,
        worker: Option<WorkerId>,
        op: Op,
        streams: &[Channel],
        stdin: bool,
    ) -> Result<u64, ClientError> {
        let kind = op.kind();
        let id = self.shared.next_id.fetch_add(1, Ordering::Relaxed);
        {
            let mut st = self.shared.lock();
            if let Some(lost) = &st.lost {
                return Err(lost.error());
            }
            st.pending.insert(id, Slot::Waiting);
            for ch in streams {
                st.streams.insert((id, *ch), StreamBuf::default());
            }
            if stdin {
                st.stdin_unacked.insert(id, 0);
            }
        }
        let frame = HostFrame::Request(Request { id, worker, op });
        if let Err(e) = self.shared.send(&frame, kind.as_str()) {
            let mut st = self.shared.lock();
            st.pending.remove(&id);
            for ch in streams {
                st.streams.remove(&(id, *ch));
            }
            st.stdin_unacked.remove(&id);
            return Err(e);
        }
        Ok(id)
    }

    /// Wait for the answer to request `id`.
    pub(crate) fn finish(
        &self,
        id: u64,
        kind: OpKind,
        deadline: Option<Deadline>,
    ) -> Result<OpValue, ClientError> {
        let res = self
            .shared
            .wait_for(deadline.map(|d| d.at), |st| take_done(st, id));
        match res {
            Ok(result) => result
                .into_result()
                .map_err(|error| ClientError::Op { op: kind, error }),
            Err(e) => {
                self.shared.lock().pending.remove(&id);
                Err(self.wait_error(e, kind.as_str(), deadline))
            }
        }
    }

    pub(crate) fn wait_error(
        &self,
        e: WaitError,
        what: &str,
        deadline: Option<Deadline>,
    ) -> ClientError {
        match e {
            WaitError::Lost(e) => e,
            // The budget the call was given, not the time measured from
            // some later point: a loaded host must not shrink the number.
            WaitError::TimedOut => ClientError::Timeout {
                op: what.to_string(),
                timeout_ms: millis(deadline.map(|d| d.budget).unwrap_or_default()),
            },
        }
    }

    /// Send `op` and wait for its value, within the op timeout plus `extra`.
    pub(crate) fn call_with(
        &self,
        worker: Option<WorkerId>,
        op: Op,
        extra: Option<Duration>,
    ) -> Result<OpValue, ClientError> {
        let kind = op.kind();
        let deadline = self.deadline_after(extra);
        let id = self.begin(worker, op, &[], false)?;
        self.finish(id, kind, deadline)
    }

    /// Stop waiting for request `id` (the caller gave up); a late answer is dropped.
    pub(crate) fn abandon(&self, id: u64) {
        self.shared.lock().pending.remove(&id);
    }

    /// Send `op` without waiting; its answer is dropped (used for cleanup on drop).
    pub(crate) fn send_detached(&self, worker: Option<WorkerId>, op: Op) {
        let id = self.shared.next_id.fetch_add(1, Ordering::Relaxed);
        {
            let mut st = self.shared.lock();
            if st.lost.is_some() {
                return;
            }
            st.pending.insert(id, Slot::Detached);
        }
        let kind = op.kind();
        if self
            .shared
            .send(
                &HostFrame::Request(Request { id, worker, op }),
                kind.as_str(),
            )
            .is_err()
        {
            self.shared.lock().pending.remove(&id);
        }
    }

    /// Acknowledge `bytes` consumed from (stream, channel).
    pub(crate) fn ack(&self, stream: StreamId, channel: Channel, bytes: u64) {
        if bytes == 0 {
            return;
        }
        // Consumers take at most what is unacknowledged, which is at most the
        // window, so one ack frame always suffices; split anyway for safety.
        let mut left = bytes;
        while left > 0 {
            let n = left.min(STREAM_WINDOW_BYTES);
            left -= n;
            let frame = HostFrame::StreamAck(StreamAck {
                stream,
                channel,
                bytes: n,
            });
            if self.shared.send(&frame, "stream_ack").is_err() {
                return; // the loss is recorded; the next call reports it
            }
        }
    }

    /// Write `data` to a spawned process's stdin, blocking while the stdin
    /// window is full, at most until `deadline`.
    pub(crate) fn stdin_write(
        &self,
        process: StreamId,
        data: &[u8],
        deadline: Option<Deadline>,
    ) -> Result<(), ClientError> {
        for chunk in data.chunks(MAX_CHUNK_BYTES) {
            let len = chunk.len() as u64;
            let res = self.shared.wait_for(deadline.map(|d| d.at), |st| {
                let Some(unacked) = st.stdin_unacked.get_mut(&process) else {
                    return Some(Err(ClientError::InvalidArgument {
                        op: OpKind::StdinClose,
                        reason: format!(
                            "process {process} was waited for or released; its stdin is gone"
                        ),
                    }));
                };
                if *unacked + len <= STREAM_WINDOW_BYTES {
                    *unacked += len;
                    Some(Ok(()))
                } else {
                    None
                }
            });
            match res {
                Ok(Ok(())) => {}
                Ok(Err(e)) => return Err(e),
                Err(e) => {
                    let unacked = self
                        .shared
                        .lock()
                        .stdin_unacked
                        .get(&process)
                        .copied()
                        .unwrap_or(0);
                    let cause = self.wait_error(e, "stdin write", deadline);
                    // The window is full: the agent has not acknowledged
                    // what it was sent (its process is not reading, or the
                    // agent does not ack).
                    return Err(ClientError::StdinUnacknowledged {
                        process,
                        unacked,
                        window: STREAM_WINDOW_BYTES,
                        cause: Box::new(cause),
                    });
                }
            }
            let frame = HostFrame::StdinData(StdinData {
                process,
                data: chunk.to_vec(),
            });
            self.shared.send(&frame, "stdin_data")?;
        }
        Ok(())
    }

    /// Stop accounting stdin for a process (it was waited or released).
    pub(crate) fn forget_stdin(&self, process: StreamId) {
        self.shared.lock().stdin_unacked.remove(&process);
        self.shared.cond.notify_all();
    }

    /// Remove the buffers of a finished stream (its end was seen or the
    /// caller no longer cares and the agent has ended it).
    pub(crate) fn drop_streams(&self, stream: StreamId, channels: &[Channel]) {
        let mut st = self.shared.lock();
        for ch in channels {
            st.streams.remove(&(stream, *ch));
            st.ack_backlog.remove(&(stream, *ch));
        }
    }

    /// Nobody will read these streams again: acknowledge what is buffered
    /// and whatever still arrives, until the agent ends them.
    pub(crate) fn discard_streams(&self, stream: StreamId, channels: &[Channel]) {
        {
            let mut st = self.shared.lock();
            for ch in channels {
                let key = (stream, *ch);
                let Some(buf) = st.streams.get_mut(&key) else {
                    continue;
                };
                if buf.end.is_some() {
                    st.streams.remove(&key);
                    continue;
                }
                buf.discard = true;
                buf.chunks.clear();
                let owed = std::mem::take(&mut buf.unacked_bytes);
                if owed > 0 {
                    *st.ack_backlog.entry(key).or_default() += owed;
                }
            }
        }
        self.shared.flush_backlog();
    }

    /// Run `check` against the connection state until it yields, the
    /// connection is lost, or `deadline` passes.
    pub(crate) fn wait_for<T>(
        &self,
        deadline: Option<Instant>,
        check: impl FnMut(&mut State) -> Option<T>,
    ) -> Result<T, WaitError> {
        self.shared.wait_for(deadline, check)
    }
}

/// Data taken from a stream buffer.
#[derive(Default)]
pub(crate) struct Taken {
    pub data: Vec<Vec<u8>>,
    pub bytes: u64,
    /// The stream ended and its buffer is now empty.
    pub ended: Option<(StreamEndReason, Option<String>)>,
    /// No buffer is registered for it (closed, or never opened).
    pub missing: bool,
}

impl Taken {
    pub fn is_empty(&self) -> bool {
        self.data.is_empty() && self.ended.is_none() && !self.missing
    }
}

pub(crate) fn take_chunks(
    st: &mut State,
    stream: StreamId,
    channel: Channel,
    max_chunks: Option<usize>,
) -> Taken {
    let Some(buf) = st.streams.get_mut(&(stream, channel)) else {
        return Taken {
            missing: true,
            ..Taken::default()
        };
    };
    let mut taken = Taken::default();
    let limit = max_chunks.unwrap_or(usize::MAX);
    while taken.data.len() < limit {
        let Some(chunk) = buf.chunks.pop_front() else {
            break;
        };
        taken.bytes += chunk.len() as u64;
        taken.data.push(chunk);
    }
    buf.unacked_bytes -= taken.bytes;
    if buf.chunks.is_empty() {
        taken.ended = buf.end.clone();
    }
    taken
}

/// Whether request `id` has been answered; takes the answer.
pub(crate) fn take_done(st: &mut State, id: u64) -> Option<OpResult> {
    match st.pending.get(&id) {
        Some(Slot::Done(_)) => match st.pending.remove(&id) {
            Some(Slot::Done(r)) => Some(r),
            _ => None,
        },
        _ => None,
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock leaves plain data behind; keep going.
        self.state.locked()
    }

    fn wait_for<T>(
        &self,
        deadline: Option<Instant>,
        mut check: impl FnMut(&mut State) -> Option<T>,
    ) -> Result<T, WaitError> {
        let mut st = self.lock();
        loop {
            if let Some(v) = check(&mut st) {
                return Ok(v);
            }
            if let Some(lost) = &st.lost {
                return Err(WaitError::Lost(lost.error()));
            }
            match deadline {
                None => st = self.cond.wait(st).unwrap_or_else(|p| p.into_inner()),
                Some(d) => {
                    let now = Instant::now();
                    if now >= d {
                        return Err(WaitError::TimedOut);
                    }
                    st = self
                        .cond
                        .wait_timeout(st, d - now)
                        .unwrap_or_else(|p| p.into_inner())
                        .0;
                }
            }
        }
    }

    /// Record the loss (first reason wins), shut the transport down and wake
    /// every waiter.
    fn mark_lost(&self, lost: Lost) {
        {
            let mut st = self.lock();
            if st.lost.is_none() {
                st.lost = Some(lost);
            }
        }
        (self.shutdown)();
        self.cond.notify_all();
    }

    /// Encode and write one frame, then any backlog of acks.
    fn send(&self, frame: &HostFrame, what: &str) -> Result<(), ClientError> {
        let body = encode(frame).map_err(|source| ClientError::Encode {
            what: what.to_string(),
            source,
        })?;
        if body.len() > self.max_frame_bytes {
            return Err(ClientError::Encode {
                what: what.to_string(),
                source: ProtocolError::FrameTooLarge {
                    len: body.len() as u64,
                    max: self.max_frame_bytes,
                },
            });
        }
        self.write_body(&body)?;
        self.flush_backlog();
        Ok(())
    }

    fn write_body(&self, body: &[u8]) -> Result<(), ClientError> {
        if let Some(lost) = &self.lock().lost {
            return Err(lost.error());
        }
        let res = {
            let mut w = self.writer.locked();
            write_frame(&mut *w, body, self.max_frame_bytes)
        };
        res.map_err(|e| {
            let lost = Lost::Closed(format!("writing to the agent failed: {e}"));
            self.mark_lost(lost.clone());
            // Report the first loss, which may be the reader's better reason.
            self.lock().lost.clone().unwrap_or(lost).error()
        })
    }

    fn flush_backlog(&self) {
        let owed: Vec<((StreamId, Channel), u64)> = {
            let mut st = self.lock();
            if st.ack_backlog.is_empty() || st.lost.is_some() {
                return;
            }
            st.ack_backlog.drain().collect()
        };
        for ((stream, channel), bytes) in owed {
            let frame = HostFrame::StreamAck(StreamAck {
                stream,
                channel,
                bytes: bytes.min(STREAM_WINDOW_BYTES),
            });
            let Ok(body) = encode(&frame) else { return };
            if self.write_body(&body).is_err() {
                return;
            }
        }
    }

    /// Read one frame's body: `None` at a clean end of stream. The length
    /// field is checked against the frame limit before anything is
    /// allocated, and the body grows as its bytes arrive.
    fn read_body(&self, reader: &mut Box<dyn Read + Send>) -> Result<Option<Vec<u8>>, ReadFailure> {
        let mut len_buf = [0u8; 4];
        let mut got = 0;
        let mut progress = Instant::now();
        while got < len_buf.len() {
            match self.read_some(reader, &mut len_buf[got..], got > 0, &mut progress)? {
                0 if got == 0 => return Ok(None),
                0 => {
                    return Err(ReadFailure::Protocol(ProtocolError::Truncated {
                        expected: len_buf.len(),
                        got,
                    }))
                }
                n => got += n,
            }
        }
        let len = u32::from_be_bytes(len_buf) as usize;
        if len > self.max_frame_bytes {
            return Err(ReadFailure::Protocol(ProtocolError::FrameTooLarge {
                len: len as u64,
                max: self.max_frame_bytes,
            }));
        }
        let mut body = Vec::with_capacity(len.min(READ_CHUNK));
        while body.len() < len {
            let filled = body.len();
            let want = (len - filled).min(READ_CHUNK);
            body.resize(filled + want, 0);
            let n = self.read_some(reader, &mut body[filled..], true, &mut progress);
            let n = match n {
                Ok(n) => n,
                Err(ReadFailure::Stalled { .. }) => {
                    return Err(ReadFailure::Stalled {
                        got: filled + 4,
                        len: len + 4,
                    })
                }
                Err(e) => return Err(e),
            };
            body.truncate(filled + n);
            if n == 0 {
                return Err(ReadFailure::Protocol(ProtocolError::Truncated {
                    expected: len,
                    got: filled,
                }));
            }
        }
        Ok(Some(body))
    }

    /// One read; a read timeout is retried, unless the connection was lost
    /// meanwhile or, `mid_frame`, nothing arrived for the stall timeout.
    fn read_some(
        &self,
        reader: &mut Box<dyn Read + Send>,
        buf: &mut [u8],
        mid_frame: bool,
        progress: &mut Instant,
    ) -> Result<usize, ReadFailure> {
        loop {
            match reader.read(buf) {
                Ok(n) => {
                    *progress = Instant::now();
                    return Ok(n);
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e)
                    if self.read_poll
                        && matches!(
                            e.kind(),
                            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                        ) =>
                {
                    if self.lock().lost.is_some() {
                        return Err(ReadFailure::Lost);
                    }
                    if mid_frame && progress.elapsed() >= self.frame_stall_timeout {
                        return Err(ReadFailure::Stalled { got: 0, len: 0 });
                    }
                }
                Err(e) => return Err(ReadFailure::Protocol(ProtocolError::Io(e))),
            }
        }
    }

    fn read_loop(&self, reader: &mut Box<dyn Read + Send>) {
        loop {
            let body = match self.read_body(reader) {
                Ok(Some(body)) => body,
                Ok(None) => {
                    self.mark_lost(Lost::Closed("the agent hung up (end of stream)".into()));
                    return;
                }
                Err(ReadFailure::Lost) => return,
                Err(ReadFailure::Protocol(ProtocolError::Io(e))) => {
                    self.mark_lost(Lost::Closed(format!("reading from the agent failed: {e}")));
                    return;
                }
                Err(ReadFailure::Protocol(e @ ProtocolError::Truncated { .. })) => {
                    self.mark_lost(Lost::Closed(format!("the agent hung up mid-frame: {e}")));
                    return;
                }
                Err(ReadFailure::Protocol(e)) => {
                    self.mark_lost(Lost::Broken(e.to_string()));
                    return;
                }
                Err(ReadFailure::Stalled { got, len }) => {
                    self.mark_lost(Lost::Broken(format!(
                        "the agent stopped sending in the middle of a frame: {got} of its {len} bytes arrived, then nothing for {} ms",
                        millis(self.frame_stall_timeout)
                    )));
                    return;
                }
            };
            let frame: AgentFrame = match decode(&body) {
                Ok(f) => f,
                Err(e) => {
                    self.mark_lost(Lost::Broken(format!(
                        "undecodable frame from the agent: {e}"
                    )));
                    return;
                }
            };
            let verdict = {
                let mut st = self.lock();
                if st.lost.is_some() {
                    return;
                }
                let sent_below = self.next_id.load(Ordering::Relaxed);
                dispatch(&mut st, frame, sent_below)
            };
            match verdict {
                Ok(()) => self.cond.notify_all(),
                Err(violation) => {
                    self.mark_lost(Lost::Broken(violation.to_string()));
                    return;
                }
            }
        }
    }
}

/// Why reading a frame stopped.
enum ReadFailure {
    /// The connection was lost meanwhile (closed by the host).
    Lost,
    Protocol(ProtocolError),
    /// `got` of the frame's `len` bytes (length field included) arrived,
    /// then nothing for the stall timeout.
    Stalled {
        got: usize,
        len: usize,
    },
}

/// Remember that request `id` was answered.
fn note_answered(st: &mut State, id: u64) {
    if st.answered.len() == RECENT_ANSWERS {
        st.answered.pop_front();
    }
    st.answered.push_back(id);
}

/// A frame the agent must not have sent: it breaks the connection
/// ([`Lost::Broken`]). Each names the request or stream it was about.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum ProtocolViolation {
    #[error("the agent sent a second handshake answer")]
    SecondHandshakeAnswer,
    #[error("the agent sent `{frame}` before answering the handshake")]
    BeforeHandshake { frame: &'static str },
    #[error("the agent answered request {id} twice")]
    AnsweredTwice { id: u64 },
    #[error(
        "the agent answered request {id}, which the host never sent (the last id sent is {last_sent})"
    )]
    NeverSent { id: u64, last_sent: u64 },
    #[error("the agent sent data on stream {stream} ({channel}) after ending it")]
    DataAfterEnd { stream: StreamId, channel: Channel },
    #[error(
        "the agent overran the stream window: stream {stream} ({channel}) would hold {bytes} unacknowledged bytes, the window is {STREAM_WINDOW_BYTES}"
    )]
    WindowOverrun {
        stream: StreamId,
        channel: Channel,
        bytes: u64,
    },
    #[error("the agent ended stream {stream} ({channel}) twice")]
    EndedTwice { stream: StreamId, channel: Channel },
}

/// File one frame into the state. An `Err` is a protocol violation that
/// breaks the connection. Request ids below `sent_below` may have been sent.
fn dispatch(st: &mut State, frame: AgentFrame, sent_below: u64) -> Result<(), ProtocolViolation> {
    let in_handshake = matches!(st.handshake, Some(Handshake::Waiting));
    match frame {
        AgentFrame::HelloOk(ok) if in_handshake => {
            st.handshake = Some(Handshake::Done);
            st.hello = Some(Ok(ok));
            Ok(())
        }
        AgentFrame::HelloErr(err) if in_handshake => {
            st.handshake = Some(Handshake::Done);
            st.hello = Some(Err(err));
            Ok(())
        }
        AgentFrame::HelloOk(_) | AgentFrame::HelloErr(_) => {
            Err(ProtocolViolation::SecondHandshakeAnswer)
        }
        other if in_handshake => Err(ProtocolViolation::BeforeHandshake {
            frame: frame_name(&other),
        }),
        AgentFrame::Response(resp) => {
            match st.pending.get(&resp.id) {
                Some(Slot::Waiting) => {
                    st.pending.insert(resp.id, Slot::Done(resp.result));
                    note_answered(st, resp.id);
                }
                Some(Slot::Detached) => {
                    st.pending.remove(&resp.id);
                    note_answered(st, resp.id);
                }
                Some(Slot::Done(_)) => {
                    return Err(ProtocolViolation::AnsweredTwice { id: resp.id })
                }
                None if resp.id >= sent_below || resp.id == 0 => {
                    return Err(ProtocolViolation::NeverSent {
                        id: resp.id,
                        last_sent: sent_below.saturating_sub(1),
                    })
                }
                None if st.answered.contains(&resp.id) => {
                    return Err(ProtocolViolation::AnsweredTwice { id: resp.id })
                }
                // A late answer to a call that gave up (timed out): dropped,
                // it costs nothing.
                None => {}
            }
            Ok(())
        }
        AgentFrame::StreamChunk(chunk) => {
            let key = (chunk.stream, chunk.channel);
            let len = chunk.data.len() as u64;
            let Some(buf) = st.streams.get_mut(&key) else {
                return Ok(());
            };
            if buf.end.is_some() {
                return Err(ProtocolViolation::DataAfterEnd {
                    stream: chunk.stream,
                    channel: chunk.channel,
                });
            }
            if buf.discard {
                let owed = st.ack_backlog.entry(key).or_default();
                if *owed + len > STREAM_WINDOW_BYTES {
                    return Err(overrun(chunk.stream, chunk.channel, *owed + len));
                }
                *owed += len;
                return Ok(());
            }
            if buf.unacked_bytes + len > STREAM_WINDOW_BYTES {
                return Err(overrun(
                    chunk.stream,
                    chunk.channel,
                    buf.unacked_bytes + len,
                ));
            }
            buf.unacked_bytes += len;
            buf.chunks.push_back(chunk.data);
            Ok(())
        }
        AgentFrame::StreamEnd(end) => {
            let key = (end.stream, end.channel);
            if let Some(buf) = st.streams.get_mut(&key) {
                if buf.end.is_some() {
                    return Err(ProtocolViolation::EndedTwice {
                        stream: end.stream,
                        channel: end.channel,
                    });
                }
                if buf.discard {
                    st.streams.remove(&key);
                    st.ack_backlog.remove(&key);
                } else {
                    buf.end = Some((end.reason, end.message));
                }
            }
            Ok(())
        }
        AgentFrame::StdinAck(ack) => {
            if let Some(unacked) = st.stdin_unacked.get_mut(&ack.process) {
                // Saturating: initial stdin bytes carried in the spawn request
                // may be acknowledged too, though they never counted here.
                *unacked = unacked.saturating_sub(ack.bytes);
            }
            Ok(())
        }
    }
}

fn overrun(stream: StreamId, channel: Channel, bytes: u64) -> ProtocolViolation {
    ProtocolViolation::WindowOverrun {
        stream,
        channel,
        bytes,
    }
}

fn frame_name(frame: &AgentFrame) -> &'static str {
    match frame {
        AgentFrame::HelloOk(_) => "hello_ok",
        AgentFrame::HelloErr(_) => "hello_err",
        AgentFrame::Response(_) => "response",
        AgentFrame::StreamChunk(_) => "stream_chunk",
        AgentFrame::StreamEnd(_) => "stream_end",
        AgentFrame::StdinAck(_) => "stdin_ack",
    }
}

pub(crate) fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

#[doc(hidden)]
pub mod fuzzing;

#[cfg(test)]
mod tests {
    use std::thread;
    use std::time::{Duration, Instant};

    use provium_protocol::handshake::HelloErr;
    use provium_protocol::op::{CommandSpec, ExecSpec, Op};
    use provium_protocol::result::{ErrorCode, ExitInfo, OpError, OpResult, OpValue};
    use provium_protocol::wire::{
        AgentFrame, Channel, HostFrame, Response, StreamAck, StreamChunk, StreamEnd,
        StreamEndReason,
    };
    use provium_protocol::{MAX_CHUNK_BYTES, PROTOCOL_VERSION, STREAM_WINDOW_BYTES};

    use super::*;
    use crate::client::test_utils::{connect_fake, FakeAgent};
    use crate::client::AgentOps;

    fn exec_spec(script: &str) -> ExecSpec {
        CommandSpec::shell(script).into()
    }

    #[test]
    fn handshake_then_ping_round_trip() {
        let (client, mut fake) = connect_fake(ClientOptions::default());
        assert_eq!(client.agent_info().agent_version, "0.0.0-fake");
        let t = thread::spawn(move || client.ping());
        let req = fake.recv_request();
        assert_eq!(req.op, Op::Ping);
        assert_eq!(req.worker, None);
        fake.answer(req.id, OpValue::Unit);
        t.join().unwrap().expect("ping");
    }

    #[test]
    fn hello_err_is_quoted_with_both_versions() {
        let (host, agent) = UnixStream::pair().unwrap();
        let t = thread::spawn(move || AgentClient::handshake(host, ClientOptions::default()));
        let mut fake = FakeAgent { stream: agent };
        assert!(matches!(fake.recv(), HostFrame::Hello(_)));
        fake.send(AgentFrame::HelloErr(HelloErr {
            agent_protocol_version: 99,
            host_protocol_version: PROTOCOL_VERSION,
            message: format!(
                "protocol version mismatch: host speaks version {PROTOCOL_VERSION}, agent speaks version 99"
            ),
        }));
        let err = t.join().unwrap().unwrap_err();
        let msg = err.to_string();
        assert!(msg.starts_with("agent refused the handshake: "), "{msg}");
        assert!(msg.contains("agent speaks version 99"), "{msg}");
        assert!(
            msg.contains(&format!("host speaks version {PROTOCOL_VERSION}")),
            "{msg}"
        );
    }

    #[test]
    fn handshake_times_out_against_a_silent_peer() {
        let (host, _agent) = UnixStream::pair().unwrap();
        let opts = ClientOptions {
            handshake_timeout: Duration::from_millis(200),
            ..ClientOptions::default()
        };
        let err = AgentClient::handshake(host, opts).unwrap_err();
        assert!(
            matches!(err, ClientError::HandshakeTimeout { timeout_ms: 200 }),
            "{err}"
        );
    }

    #[test]
    fn frames_before_the_handshake_answer_break_the_connection() {
        let (host, agent) = UnixStream::pair().unwrap();
        let t = thread::spawn(move || AgentClient::handshake(host, ClientOptions::default()));
        let mut fake = FakeAgent { stream: agent };
        fake.recv();
        fake.answer(1, OpValue::Unit);
        let err = t.join().unwrap().unwrap_err();
        assert!(
            err.to_string()
                .contains("sent `response` before answering the handshake"),
            "{err}"
        );
    }

    #[test]
    fn peer_disconnect_mid_request_wakes_every_caller() {
        let (client, mut fake) = connect_fake(ClientOptions::default());
        let c1 = client.clone();
        let c2 = client.clone();
        let t1 = thread::spawn(move || c1.ping());
        let t2 = thread::spawn(move || c2.exec(exec_spec("sleep 100")));
        fake.recv_request();
        fake.recv_request();
        let started = Instant::now();
        drop(fake);
        for err in [
            t1.join().unwrap().unwrap_err(),
            t2.join().unwrap().unwrap_err(),
        ] {
            assert!(
                err.to_string().starts_with("agent connection closed: "),
                "{err}"
            );
            assert!(err.is_connection_lost());
        }
        assert!(started.elapsed() < Duration::from_secs(30));
        // Later calls fail at once with the same reason.
        let err = client.ping().unwrap_err();
        assert!(err.to_string().contains("end of stream"), "{err}");
    }

    #[test]
    fn garbage_frame_marks_the_connection_broken() {
        let (client, mut fake) = connect_fake(ClientOptions::default());
        let c = client.clone();
        let t = thread::spawn(move || c.ping());
        fake.recv_request();
        // 0xc1 is never used in msgpack.
        fake.send_raw_frame(&[0xc1, 0xc1, 0xc1]);
        let err = t.join().unwrap().unwrap_err();
        let msg = err.to_string();
        assert!(
            msg.starts_with("agent connection broken: undecodable frame from the agent: cannot decode agent frame"),
            "{msg}"
        );
        assert!(client.is_lost());
        // The transport was shut down: the fake sees end of stream.
        assert!(fake.try_recv(Duration::from_secs(10)).is_none());
    }

    #[test]
    fn unanswered_request_times_out_naming_the_op_and_the_connection_survives() {
        let (client, mut fake) = connect_fake(ClientOptions::default());
        let short = client.with_timeout(Duration::from_millis(150));
        let t = thread::spawn(move || short.read_file("/slow"));
        let late = fake.recv_request();
        let err = t.join().unwrap().unwrap_err();
        assert_eq!(
            err.to_string(),
            "agent did not answer `read_file` within 150 ms (raise the client's op timeout with `AgentClient::with_timeout` if it is expected to take longer)"
        );
        // A late answer is dropped; the next call still works.
        fake.answer(late.id, OpValue::Bytes(b"late".to_vec()));
        let c = client.clone();
        let t = thread::spawn(move || c.read_file("/fast"));
        let req = fake.recv_request();
        fake.answer(req.id, OpValue::Bytes(b"fast".to_vec()));
        assert_eq!(t.join().unwrap().unwrap(), b"fast");
    }

    #[test]
    fn concurrent_requests_answered_out_of_order_reach_their_callers() {
        let (client, mut fake) = connect_fake(ClientOptions::default());
        let (ca, cb) = (client.clone(), client.clone());
        let ta = thread::spawn(move || ca.read_file("/a"));
        let tb = thread::spawn(move || cb.read_file("/b"));
        let r1 = fake.recv_request();
        let r2 = fake.recv_request();
        assert_ne!(r1.id, r2.id);
        // Answer in reverse order of arrival, each with its own path's data.
        for r in [&r2, &r1] {
            let Op::ReadFile { path } = &r.op else {
                panic!("{:?}", r.op)
            };
            fake.answer(r.id, OpValue::Bytes(path.as_bytes().to_vec()));
        }
        assert_eq!(ta.join().unwrap().unwrap(), b"/a");
        assert_eq!(tb.join().unwrap().unwrap(), b"/b");
    }

    #[test]
    fn agent_errors_carry_message_and_errno() {
        let (client, mut fake) = connect_fake(ClientOptions::default());
        let t = thread::spawn(move || client.stat("/missing"));
        let req = fake.recv_request();
        fake.send(AgentFrame::Response(Response {
            id: req.id,
            result: OpResult::Err(OpError {
                code: ErrorCode::Io,
                errno: Some(2),
                message: "stat /missing: No such file or directory".into(),
            }),
        }));
        let err = t.join().unwrap().unwrap_err();
        assert_eq!(err.errno(), Some(2));
        assert_eq!(
            err.to_string(),
            "`stat` failed in the agent: stat /missing: No such file or directory (errno 2)"
        );
    }

    #[test]
    fn exec_collects_more_than_a_window_and_acks_as_it_consumes() {
        let (client, mut fake) = connect_fake(ClientOptions::default());
        let t = thread::spawn(move || client.exec(exec_spec("yes")));
        let req = fake.recv_request();
        let total = 3 * STREAM_WINDOW_BYTES as usize + 123;
        let payload: Vec<u8> = (0..total).map(|i| (i % 251) as u8).collect();
        let mut sent = 0usize;
        let mut acked = 0u64;
        while sent < total {
            // Never exceed the window: wait for acks like a real agent.
            let room = STREAM_WINDOW_BYTES - (sent as u64 - acked);
            if room == 0 {
                match fake.recv() {
                    HostFrame::StreamAck(StreamAck {
                        stream,
                        channel,
                        bytes,
                    }) => {
                        assert_eq!((stream, channel), (req.id, Channel::Stdout));
                        acked += bytes;
                    }
                    other => panic!("expected an ack, got {other:?}"),
                }
                continue;
            }
            let n = (total - sent).min(MAX_CHUNK_BYTES).min(room as usize);
            fake.send(AgentFrame::StreamChunk(StreamChunk {
                stream: req.id,
                channel: Channel::Stdout,
                data: payload[sent..sent + n].to_vec(),
            }));
            sent += n;
        }
        fake.send(AgentFrame::StreamChunk(StreamChunk {
            stream: req.id,
            channel: Channel::Stderr,
            data: b"warn".to_vec(),
        }));
        for ch in [Channel::Stdout, Channel::Stderr] {
            fake.send(AgentFrame::StreamEnd(StreamEnd {
                stream: req.id,
                channel: ch,
                reason: StreamEndReason::Eof,
                message: None,
            }));
        }
        fake.answer(req.id, OpValue::Exit(ExitInfo::exited(3)));
        let out = t.join().unwrap().unwrap();
        assert_eq!(out.exit, ExitInfo::exited(3));
        assert_eq!(out.stdout.len(), total);
        assert!(out.stdout == payload, "stdout differs from what was sent");
        assert_eq!(out.stderr, b"warn");
        assert!(acked >= 3 * STREAM_WINDOW_BYTES - STREAM_WINDOW_BYTES);
    }

    #[test]
    fn window_overrun_breaks_the_connection() {
        let (client, mut fake) = connect_fake(ClientOptions::default());
        let c = client.clone();
        let t = thread::spawn(move || c.spawn(CommandSpec::shell("yes")));
        let req = fake.recv_request();
        fake.answer(req.id, OpValue::Spawned { pid: 7 });
        let proc = t.join().unwrap().unwrap();
        // Nobody reads: a well-behaved agent stops at the window; this one doesn't.
        let chunk = vec![b'y'; MAX_CHUNK_BYTES];
        for _ in 0..(STREAM_WINDOW_BYTES as usize / MAX_CHUNK_BYTES) {
            fake.send(AgentFrame::StreamChunk(StreamChunk {
                stream: req.id,
                channel: Channel::Stdout,
                data: chunk.clone(),
            }));
        }
        let c = client.clone();
        let t = thread::spawn(move || c.ping());
        let ping = fake.recv_request();
        fake.send(AgentFrame::StreamChunk(StreamChunk {
            stream: req.id,
            channel: Channel::Stdout,
            data: b"y".to_vec(),
        }));
        let _ = ping;
        let err = t.join().unwrap().unwrap_err();
        assert!(
            err.to_string().contains("overran the stream window"),
            "{err}"
        );
        drop(proc);
    }

    #[test]
    fn stdin_writes_block_until_the_agent_acknowledges() {
        let (client, mut fake) = connect_fake(ClientOptions::default());
        let c = client.clone();
        let t = thread::spawn(move || c.spawn(CommandSpec::shell("cat")));
        let req = fake.recv_request();
        fake.answer(req.id, OpValue::Spawned { pid: 7 });
        let proc = t.join().unwrap().unwrap();
        let extra = 1000usize;
        let data = vec![b'x'; STREAM_WINDOW_BYTES as usize + extra];
        let writer = thread::spawn(move || {
            let r = proc.stdin_write(&data);
            (proc, r)
        });
        let mut got = 0u64;
        while got < STREAM_WINDOW_BYTES {
            match fake.recv() {
                HostFrame::StdinData(d) => {
                    assert_eq!(d.process, req.id);
                    got += d.data.len() as u64;
                }
                other => panic!("expected stdin data, got {other:?}"),
            }
        }
        assert_eq!(got, STREAM_WINDOW_BYTES);
        // The window is full: nothing more comes until we acknowledge.
        assert!(fake.try_recv(Duration::from_millis(300)).is_none());
        fake.send(AgentFrame::StdinAck(provium_protocol::wire::StdinAck {
            process: req.id,
            bytes: 4096,
        }));
        match fake.recv() {
            HostFrame::StdinData(d) => assert_eq!(d.data.len(), extra),
            other => panic!("expected the rest of stdin, got {other:?}"),
        }
        let (_proc, r) = writer.join().unwrap();
        r.unwrap();
    }

    #[test]
    fn stdin_write_times_out_when_never_acknowledged() {
        let (client, mut fake) = connect_fake(ClientOptions::default());
        let c = client.with_timeout(Duration::from_millis(300));
        let t = thread::spawn(move || c.spawn(CommandSpec::shell("sleep 100")));
        let req = fake.recv_request();
        fake.answer(req.id, OpValue::Spawned { pid: 7 });
        let proc = t.join().unwrap().unwrap();
        let drain = thread::spawn(move || while fake.try_recv(Duration::from_secs(5)).is_some() {});
        let err = proc
            .stdin_write(&vec![0u8; STREAM_WINDOW_BYTES as usize + 1])
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            format!("the agent did not acknowledge the stdin of process {} ({STREAM_WINDOW_BYTES} bytes unacknowledged, the window is {STREAM_WINDOW_BYTES})", req.id)
        );
        let ClientError::StdinUnacknowledged { cause, .. } = &err else {
            panic!("{err:?}")
        };
        assert!(
            cause
                .to_string()
                .starts_with("agent did not answer `stdin write` within 300 ms"),
            "{cause}"
        );
        drop(proc);
        drop(client);
        drain.join().unwrap();
    }

    /// Start a ping and return the error the agent's `misbehave` causes.
    fn ping_broken_by(misbehave: impl FnOnce(&mut FakeAgent, u64)) -> String {
        let opts = ClientOptions {
            frame_stall_timeout: Duration::from_millis(300),
            ..ClientOptions::default()
        };
        let (client, mut fake) = connect_fake(opts);
        let c = client.clone();
        let t = thread::spawn(move || c.ping());
        let req = fake.recv_request();
        misbehave(&mut fake, req.id);
        let err = t.join().unwrap().unwrap_err();
        assert!(client.is_lost(), "{err}");
        // The connection stays unusable, with the same reason.
        assert_eq!(client.ping().unwrap_err().to_string(), err.to_string());
        err.to_string()
    }

    #[test]
    fn an_answer_to_an_id_never_sent_breaks_the_connection() {
        let msg = ping_broken_by(|fake, id| fake.answer(id + 7, OpValue::Unit));
        assert_eq!(
            msg,
            "agent connection broken: the agent answered request 8, which the host never sent (the last id sent is 1)"
        );
    }

    #[test]
    fn a_second_answer_breaks_the_connection() {
        let (client, mut fake) = connect_fake(ClientOptions::default());
        let c = client.clone();
        let t = thread::spawn(move || c.ping());
        let req = fake.recv_request();
        fake.answer(req.id, OpValue::Unit);
        t.join().unwrap().unwrap();
        // The first answer was taken; the second is still recognised.
        fake.answer(req.id, OpValue::Unit);
        let c = client.clone();
        let t = thread::spawn(move || c.ping());
        // The second ping's request may be cut off by the breaking
        // connection, which is not what this test is about.
        fake.drain(Duration::from_secs(5));
        let err = t.join().unwrap().unwrap_err();
        assert_eq!(
            err.to_string(),
            "agent connection broken: the agent answered request 1 twice"
        );
    }

    #[test]
    fn a_late_answer_to_an_abandoned_call_is_not_a_duplicate() {
        let (client, mut fake) = connect_fake(ClientOptions::default());
        let short = client.with_timeout(Duration::from_millis(100));
        let t = thread::spawn(move || short.ping());
        let req = fake.recv_request();
        t.join().unwrap().unwrap_err();
        fake.answer(req.id, OpValue::Unit);
        let c = client.clone();
        let t = thread::spawn(move || c.ping());
        let next = fake.recv_request();
        fake.answer(next.id, OpValue::Unit);
        t.join().unwrap().unwrap();
        assert!(!client.is_lost());
    }

    #[test]
    fn a_second_end_of_a_stream_breaks_the_connection() {
        let (client, mut fake) = connect_fake(ClientOptions::default());
        let t = thread::spawn(move || client.exec(exec_spec("true")));
        let req = fake.recv_request();
        for _ in 0..2 {
            fake.send(AgentFrame::StreamEnd(StreamEnd {
                stream: req.id,
                channel: Channel::Stdout,
                reason: StreamEndReason::Eof,
                message: None,
            }));
        }
        let err = t.join().unwrap().unwrap_err();
        assert_eq!(
            err.to_string(),
            format!(
                "agent connection broken: the agent ended stream {} (stdout) twice",
                req.id
            )
        );
    }

    #[test]
    fn a_frame_that_stalls_mid_body_breaks_the_connection() {
        let msg = ping_broken_by(|fake, _| {
            fake.stream.write_all(&1000u32.to_be_bytes()).unwrap();
            fake.stream.write_all(&[0x82; 10]).unwrap();
        });
        assert_eq!(
            msg,
            "agent connection broken: the agent stopped sending in the middle of a frame: 14 of its 1004 bytes arrived, then nothing for 300 ms"
        );
    }

    #[test]
    fn silence_between_frames_is_not_a_stall() {
        let opts = ClientOptions {
            frame_stall_timeout: Duration::from_millis(50),
            ..ClientOptions::default()
        };
        let (client, mut fake) = connect_fake(opts);
        let c = client.clone();
        let t = thread::spawn(move || c.ping());
        let req = fake.recv_request();
        // Several read polls of silence, then the answer.
        thread::sleep(READ_POLL * 3);
        fake.answer(req.id, OpValue::Unit);
        t.join().unwrap().unwrap();
    }

    #[test]
    fn a_length_field_of_2_pow_32_minus_1_is_refused_before_allocating() {
        let msg = ping_broken_by(|fake, _| {
            fake.stream.write_all(&u32::MAX.to_be_bytes()).unwrap();
        });
        assert_eq!(
            msg,
            "agent connection broken: frame of 4294967295 bytes exceeds the maximum of 16777216 bytes"
        );
    }

    #[test]
    fn exec_output_beyond_the_cap_fails_the_call() {
        let opts = ClientOptions {
            max_collected_output_bytes: 100_000,
            ..ClientOptions::default()
        };
        let (client, mut fake) = connect_fake(opts);
        let c = client.clone();
        let t = thread::spawn(move || c.exec(exec_spec("yes")));
        let req = fake.recv_request();
        for _ in 0..2 {
            fake.send(AgentFrame::StreamChunk(StreamChunk {
                stream: req.id,
                channel: Channel::Stdout,
                data: vec![b'y'; 60_000],
            }));
        }
        let err = t.join().unwrap().unwrap_err();
        assert!(
            matches!(err, ClientError::OutputTooLarge { limit: 100_000, .. }),
            "{err}"
        );
        assert!(!client.is_lost(), "the connection survives the cap");
    }
}
