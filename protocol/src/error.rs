use thiserror::Error;

/// Everything that can go wrong reading or writing the wire. Each message names
/// what was wrong so a user (or a fuzzer triage) can act on it.
#[derive(Debug, Error)]
pub enum ProtocolError {
    /// A frame's announced (or given) body length is over the limit; on
    /// read the stream's framing is lost.
    #[error("frame of {len} bytes exceeds the maximum of {max} bytes")]
    FrameTooLarge {
        /// The body length, in bytes.
        len: u64,
        /// The limit it broke, in bytes.
        max: usize,
    },
    /// The stream ended inside a frame (in its length prefix or its body).
    #[error("truncated frame: expected {expected} bytes, got {got} before end of stream")]
    Truncated {
        /// Bytes the prefix (or the length) called for.
        expected: usize,
        /// Bytes that came.
        got: usize,
    },
    /// The body is not a valid message of the expected type (unknown kind
    /// or field, wrong type, missing field), as serde reported it.
    #[error("cannot decode {what}: {detail}")]
    Decode {
        /// The message type ("host frame", "event frame", …).
        what: &'static str,
        /// serde's description of the problem.
        detail: String,
    },
    /// A valid message was followed by more bytes in the same body.
    #[error("cannot decode {what}: {trailing} trailing bytes after the message")]
    TrailingBytes {
        /// The message type.
        what: &'static str,
        /// How many bytes followed it.
        trailing: usize,
    },
    /// The body decodes but does not re-encode to the same bytes (a wider
    /// integer format, keys out of order, a missing optional field…).
    #[error("cannot decode {what}: non-canonical msgpack encoding (a conforming peer encodes it differently)")]
    NonCanonical {
        /// The message type.
        what: &'static str,
    },
    /// A rule serde cannot express is broken (empty chunk, ack out of
    /// range, bad syscall or open arguments).
    #[error("invalid {what}: {reason}")]
    Invalid {
        /// What was checked ("stdin_data", "open mode", …).
        what: &'static str,
        /// The rule broken, with the offending value.
        reason: String,
    },
    /// A message could not be encoded (a serde error on our own value).
    #[error("cannot encode {what}: {detail}")]
    Encode {
        /// The message type.
        what: &'static str,
        /// The encoder's description.
        detail: String,
    },
    /// Reading or writing the underlying stream failed.
    #[error("i/o error on the wire: {0}")]
    Io(#[from] std::io::Error),
}
