//! The agent client's error type.

use provium_protocol::op::OpKind;
use provium_protocol::result::{OpError, OpValue};
use provium_protocol::ProtocolError;

/// Everything an agent call can fail with. Messages name what failed, the
/// offending value and, where there is one, the fix.
///
/// Connection losses (`ConnectionClosed`, `ConnectionBroken`) are shared by
/// every pending call on the connection, so they carry the cause flattened to
/// text rather than as a `#[source]` (one cause, many receivers).
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// Opening the transport failed (e.g. the sandbox's socket is absent).
    #[error("cannot connect to the agent at {endpoint}")]
    Connect {
        endpoint: String,
        #[source]
        source: std::io::Error,
    },
    /// The agent answered Hello with HelloErr; its message names both versions.
    #[error("agent refused the handshake: {message}")]
    HandshakeRefused {
        agent_protocol_version: u32,
        host_protocol_version: u32,
        message: String,
    },
    /// No HelloOk/HelloErr arrived in time.
    #[error("agent did not answer the handshake within {timeout_ms} ms (is it a provium agent listening on this endpoint?)")]
    HandshakeTimeout { timeout_ms: u64 },
    /// The peer hung up, or reading/writing the transport failed. Every
    /// pending call and stream on the connection wakes with this.
    #[error("agent connection closed: {reason}")]
    ConnectionClosed { reason: String },
    /// The peer sent something the protocol forbids (an undecodable frame, a
    /// window overrun); the connection is unusable from then on.
    #[error("agent connection broken: {reason}")]
    ConnectionBroken { reason: String },
    /// A request was not answered in time. `op` is the op's wire name.
    #[error("agent did not answer `{op}` within {timeout_ms} ms (raise the client's op timeout with `AgentClient::with_timeout` if it is expected to take longer)")]
    Timeout { op: String, timeout_ms: u64 },
    /// The agent ran the op and reported a failure.
    #[error("`{op}` failed in the agent: {}{}", error.message, errno_suffix(error.errno))]
    Op { op: OpKind, error: OpError },
    /// The agent answered with a value of the wrong kind for the op.
    #[error(
        "agent answered `{op}` with an unexpected `{got}` value (agent and host out of step?)"
    )]
    UnexpectedValue { op: OpKind, got: String },
    /// The request was refused on the host before it was sent.
    #[error("invalid `{op}` request")]
    InvalidRequest {
        op: OpKind,
        #[source]
        source: ProtocolError,
    },
    /// A request that cannot be expressed at all (e.g. a zero wait timeout).
    #[error("invalid argument to `{op}`: {reason}")]
    InvalidArgument { op: OpKind, reason: String },
    /// A request frame could not be encoded or exceeds the frame limit.
    #[error("cannot send `{what}` to the agent")]
    Encode {
        what: String,
        #[source]
        source: ProtocolError,
    },
    /// A collecting call (`exec`) got more output than the client keeps.
    #[error("the agent sent more than {limit} bytes of output for `{op}`; a call that collects output keeps at most that much (stream a larger output with a spawned process's stdout instead)")]
    OutputTooLarge { op: OpKind, limit: u64 },
    /// A stdin write found the window full and the agent never made room.
    #[error("the agent did not acknowledge the stdin of process {process} ({unacked} bytes unacknowledged, the window is {window})")]
    StdinUnacknowledged {
        process: u64,
        unacked: u64,
        window: u64,
        #[source]
        cause: Box<ClientError>,
    },
    /// A stream ended because the agent could not read its source.
    #[error("stream {stream} ({channel}) failed in the agent: {message}")]
    StreamFailed {
        stream: u64,
        channel: String,
        message: String,
    },
}

impl ClientError {
    /// The agent's error, when the agent ran the op and it failed.
    pub fn op_error(&self) -> Option<&OpError> {
        match self {
            ClientError::Op { error, .. } => Some(error),
            _ => None,
        }
    }

    /// The guest errno of an agent-side failure, if it has one.
    pub fn errno(&self) -> Option<i32> {
        self.op_error().and_then(|e| e.errno)
    }

    /// An op answered with a value of the wrong kind: the ops
    /// (`ops.rs`), processes and workers all check their replies with it.
    pub(crate) fn unexpected(op: OpKind, got: &OpValue) -> ClientError {
        ClientError::UnexpectedValue {
            op,
            got: value_kind(got).to_string(),
        }
    }

    /// Whether the connection is gone (closed or broken) rather than one call failing.
    pub fn is_connection_lost(&self) -> bool {
        match self {
            ClientError::ConnectionClosed { .. } | ClientError::ConnectionBroken { .. } => true,
            ClientError::StdinUnacknowledged { cause, .. } => cause.is_connection_lost(),
            _ => false,
        }
    }
}

/// The value's wire kind, for "unexpected value" errors.
fn value_kind(v: &OpValue) -> &'static str {
    match v {
        OpValue::Unit => "unit",
        OpValue::Exit(_) => "exit",
        OpValue::Ran { .. } => "ran",
        OpValue::Spawned { .. } => "spawned",
        OpValue::ProcessStatus(_) => "process_status",
        OpValue::Pid { .. } => "pid",
        OpValue::Bytes(_) => "bytes",
        OpValue::Stat(_) => "stat",
        OpValue::Entries(_) => "entries",
        OpValue::Handle { .. } => "handle",
        OpValue::Written { .. } => "written",
        OpValue::Offset { .. } => "offset",
        OpValue::Tail { .. } => "tail",
        OpValue::Syscall(_) => "syscall",
        OpValue::Ioctl(_) => "ioctl",
        OpValue::Clock { .. } => "clock",
        OpValue::Worker { .. } => "worker",
        OpValue::Batch(_) => "batch",
    }
}

fn errno_suffix(errno: Option<i32>) -> String {
    match errno {
        Some(n) => format!(" (errno {n})"),
        None => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use provium_protocol::result::ErrorCode;

    #[test]
    fn op_errors_quote_message_and_errno() {
        let err = ClientError::Op {
            op: OpKind::ReadFile,
            error: OpError {
                code: ErrorCode::Io,
                errno: Some(2),
                message: "/nope: No such file or directory".into(),
            },
        };
        assert_eq!(
            err.to_string(),
            "`read_file` failed in the agent: /nope: No such file or directory (errno 2)"
        );
        assert_eq!(err.errno(), Some(2));
        assert!(!err.is_connection_lost());
    }

    #[test]
    fn an_unexpected_value_names_its_wire_kind() {
        let ClientError::UnexpectedValue { op, got } =
            ClientError::unexpected(OpKind::ReadFile, &OpValue::Unit)
        else {
            panic!("not UnexpectedValue")
        };
        assert_eq!((op, got.as_str()), (OpKind::ReadFile, "unit"));
    }
}
