//! The frames of an agent connection.
//!
//! Host -> agent: [`HostFrame`]; agent -> host: [`AgentFrame`]. Wire shape of
//! both: `{"type": "<kind>", "body": {…}}`. The first host frame is `hello`, the
//! first agent frame `hello_ok` or `hello_err`; then requests and their
//! responses interleave freely with stream frames, matched by id, so several
//! requests can be in flight and several streams open on one connection.

use serde::{Deserialize, Serialize};

use crate::handshake::{Hello, HelloErr, HelloOk};
use crate::op::{Op, StreamId, WorkerId};
use crate::result::OpResult;
use crate::{ProtocolError, WireMessage, MAX_CHUNK_BYTES, STREAM_WINDOW_BYTES};

/// Every frame the host sends to the agent.
#[cfg_attr(test, derive(proptest_derive::Arbitrary))]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", content = "body", deny_unknown_fields)]
pub enum HostFrame {
    /// The first frame of a connection, and only the first.
    #[serde(rename = "hello")]
    Hello(Hello),
    /// Ask for one op; answered by one [`AgentFrame::Response`].
    #[serde(rename = "request")]
    Request(Request),
    /// More stdin for a spawned process. The host keeps at most
    /// [`STREAM_WINDOW_BYTES`] unacknowledged per process.
    #[serde(rename = "stdin_data")]
    StdinData(StdinData),
    /// The host consumed `bytes` of a stream; the agent may send that many more.
    #[serde(rename = "stream_ack")]
    StreamAck(StreamAck),
}

/// Every frame the agent sends to the host.
#[cfg_attr(test, derive(proptest_derive::Arbitrary))]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", content = "body", deny_unknown_fields)]
pub enum AgentFrame {
    /// The answer to a matching `hello`: the connection is open.
    #[serde(rename = "hello_ok")]
    HelloOk(HelloOk),
    /// The answer to a `hello` of another protocol version; the agent then
    /// closes the connection.
    #[serde(rename = "hello_err")]
    HelloErr(HelloErr),
    /// The one answer to request `id`. For an exec it is the terminal frame:
    /// every output chunk of that exec precedes it.
    #[serde(rename = "response")]
    Response(Response),
    /// Output of an exec, a spawned process or a tail. At most
    /// [`STREAM_WINDOW_BYTES`] unacknowledged per stream.
    #[serde(rename = "stream_chunk")]
    StreamChunk(StreamChunk),
    /// No more chunks will come on this stream.
    #[serde(rename = "stream_end")]
    StreamEnd(StreamEnd),
    /// The agent wrote `bytes` of stdin to the process; the host may send more.
    #[serde(rename = "stdin_ack")]
    StdinAck(StdinAck),
}

/// One op the host asks for.
#[cfg_attr(test, derive(proptest_derive::Arbitrary))]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Request {
    /// Chosen by the host, unique per connection; the id of streams it opens.
    pub id: u64,
    /// Run in this worker's namespace and queue; `None`: the connection's own.
    pub worker: Option<WorkerId>,
    /// What to do.
    pub op: Op,
}

/// The agent's one answer to a request.
#[cfg_attr(test, derive(proptest_derive::Arbitrary))]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Response {
    /// The request's id.
    pub id: u64,
    /// Its outcome.
    pub result: OpResult,
}

closed_enum! {
    /// Which output of a stream a chunk, end or ack belongs to. Windows and
    /// ends are per stream and channel.
    pub enum Channel {
        /// A process's standard output.
        Stdout => "stdout",
        /// A process's standard error.
        Stderr => "stderr",
        /// Tail data.
        Data => "data",
    }
}

/// A piece of a stream's output, agent to host.
#[cfg_attr(test, derive(proptest_derive::Arbitrary))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StreamChunk {
    /// The stream: the id of the exec, spawn or tail request.
    pub stream: StreamId,
    /// Which output it is.
    pub channel: Channel,
    /// Never empty, at most [`MAX_CHUNK_BYTES`].
    #[serde(with = "serde_bytes")]
    #[cfg_attr(test, proptest(strategy = "crate::proptests::chunk()"))]
    pub data: Vec<u8>,
}

closed_enum! {
    /// Why a stream's channel ended.
    pub enum StreamEndReason {
        /// The source ended (process output closed, tailed handle closed).
        Eof => "eof",
        /// The host closed it (close_stream, release, worker close).
        Closed => "closed",
        /// Reading the source failed; see `message`.
        Error => "error",
    }
}

/// The last frame of one channel of a stream: no chunk follows on it. Sent
/// at most once per stream and channel.
#[cfg_attr(test, derive(proptest_derive::Arbitrary))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StreamEnd {
    /// The stream: the id of the request that opened it.
    pub stream: StreamId,
    /// The channel that ended.
    pub channel: Channel,
    /// Why.
    pub reason: StreamEndReason,
    /// What failed, for `error`; else `None`.
    pub message: Option<String>,
}

/// More stdin for a spawned process, host to agent.
#[cfg_attr(test, derive(proptest_derive::Arbitrary))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StdinData {
    /// The spawned process: its spawn request's id.
    pub process: StreamId,
    /// Never empty, at most [`MAX_CHUNK_BYTES`].
    #[serde(with = "serde_bytes")]
    #[cfg_attr(test, proptest(strategy = "crate::proptests::chunk()"))]
    pub data: Vec<u8>,
}

/// The host consumed bytes of a stream's channel: the agent's window for
/// it reopens by that much.
#[cfg_attr(test, derive(proptest_derive::Arbitrary))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StreamAck {
    /// The stream acknowledged.
    pub stream: StreamId,
    /// Its channel.
    pub channel: Channel,
    /// Never 0, at most [`STREAM_WINDOW_BYTES`].
    #[cfg_attr(test, proptest(strategy = "1..=crate::STREAM_WINDOW_BYTES"))]
    pub bytes: u64,
}

/// The agent wrote bytes of stdin to a process: the host's window for it
/// reopens by that much.
#[cfg_attr(test, derive(proptest_derive::Arbitrary))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StdinAck {
    /// The spawned process: its spawn request's id.
    pub process: StreamId,
    /// Never 0, at most [`STREAM_WINDOW_BYTES`].
    #[cfg_attr(test, proptest(strategy = "1..=crate::STREAM_WINDOW_BYTES"))]
    pub bytes: u64,
}

fn check_chunk(what: &'static str, data: &[u8]) -> Result<(), ProtocolError> {
    if data.is_empty() {
        return Err(ProtocolError::Invalid {
            what,
            reason: "empty data chunk".into(),
        });
    }
    if data.len() > MAX_CHUNK_BYTES {
        return Err(ProtocolError::Invalid {
            what,
            reason: format!(
                "chunk of {} bytes exceeds the maximum of {MAX_CHUNK_BYTES}",
                data.len()
            ),
        });
    }
    Ok(())
}

fn check_ack(what: &'static str, bytes: u64) -> Result<(), ProtocolError> {
    if bytes == 0 || bytes > STREAM_WINDOW_BYTES {
        return Err(ProtocolError::Invalid {
            what,
            reason: format!("acknowledges {bytes} bytes; must be 1..={STREAM_WINDOW_BYTES}"),
        });
    }
    Ok(())
}

impl WireMessage for HostFrame {
    const WHAT: &'static str = "host frame";

    fn validate(&self) -> Result<(), ProtocolError> {
        match self {
            HostFrame::StdinData(d) => check_chunk("stdin_data", &d.data),
            HostFrame::StreamAck(a) => check_ack("stream_ack", a.bytes),
            HostFrame::Hello(_) | HostFrame::Request(_) => Ok(()),
        }
    }
}

impl WireMessage for AgentFrame {
    const WHAT: &'static str = "agent frame";

    fn validate(&self) -> Result<(), ProtocolError> {
        match self {
            AgentFrame::StreamChunk(c) => check_chunk("stream_chunk", &c.data),
            AgentFrame::StdinAck(a) => check_ack("stdin_ack", a.bytes),
            _ => Ok(()),
        }
    }
}

/// serde helper: `Vec<Vec<u8>>` as an array of msgpack `bin`.
pub(crate) mod byte_vecs {
    use serde::{Deserialize, Deserializer, Serializer};
    use serde_bytes::ByteBuf;

    pub fn serialize<S: Serializer>(v: &[Vec<u8>], s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(v.iter().map(|b| serde_bytes::Bytes::new(b)))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<Vec<u8>>, D::Error> {
        Ok(Vec::<ByteBuf>::deserialize(d)?
            .into_iter()
            .map(ByteBuf::into_vec)
            .collect())
    }
}
