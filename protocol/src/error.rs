use thiserror::Error;

/// Everything that can go wrong reading or writing the wire. Each message names
/// what was wrong so a user (or a fuzzer triage) can act on it.
#[derive(Debug, Error)]
pub enum ProtocolError {
    #[error("frame of {len} bytes exceeds the maximum of {max} bytes")]
    FrameTooLarge { len: u64, max: usize },
    #[error("truncated frame: expected {expected} bytes, got {got} before end of stream")]
    Truncated { expected: usize, got: usize },
    #[error("cannot decode {what}: {detail}")]
    Decode { what: &'static str, detail: String },
    #[error("cannot decode {what}: {trailing} trailing bytes after the message")]
    TrailingBytes { what: &'static str, trailing: usize },
    #[error("cannot decode {what}: non-canonical msgpack encoding (a conforming peer encodes it differently)")]
    NonCanonical { what: &'static str },
    #[error("invalid {what}: {reason}")]
    Invalid { what: &'static str, reason: String },
    #[error("cannot encode {what}: {detail}")]
    Encode { what: &'static str, detail: String },
    #[error("i/o error on the wire: {0}")]
    Io(#[from] std::io::Error),
}
