//! The Provium wire protocol: host <-> agent frames, the observability event
//! stream, and the framing both share.
//!
//! [`json_line`] holds the shape of `provium run --json`'s lines, the other
//! machine output.
//!
//! Every frame on the wire is a 4-byte big-endian length followed by a msgpack
//! body ([`frame`]). Structs are encoded as msgpack maps keyed by field name,
//! enums as adjacently tagged maps, bytes as msgpack `bin`. Decoding is strict:
//! unknown fields or kinds, wrong types, trailing bytes and non-canonical
//! encodings are refused with an error that names what was wrong
//! ([`ProtocolError`]), so every body that decodes re-encodes to the same bytes.
//!
//! [`PROTOCOL_VERSION`] pins every shape in this crate; `tests/pins.rs` locks the
//! exact bytes. See `docs/protocol.md` for how to add an op.
//!
//! `missing_docs` is denied here: these types are the contract between the
//! harness and the agent (and the event stream's readers), written by one side
//! and read by the other, so every public item says what it means on the
//! wire, in which units, who sends it and what limits hold.

#![deny(missing_docs)]

#[macro_use]
mod closed_enum;
pub mod event;
pub mod frame;
pub mod handshake;
pub mod json_line;
pub mod meta;
pub mod op;
pub mod result;
pub mod signal;
pub mod wire;

mod codec;
mod error;
#[cfg(test)]
mod proptests;

pub use codec::{decode, encode, WireMessage};
pub use error::ProtocolError;
pub use event::{Event, EventFrame, EventKind, ResourceAmount};
pub use handshake::{Hello, HelloErr, HelloOk};
pub use meta::{MetaMap, MetaValue};
pub use op::{Op, OpKind};
pub use result::{OpError, OpResult, OpValue};
pub use wire::{AgentFrame, HostFrame};

/// The one wire-version constant. Bump it on any change that reaches the wire
/// (see `../shared/spec/protocol-version.md`), and update the pins.
pub const PROTOCOL_VERSION: u32 = 3;

/// vsock port the agent listens on inside a guest.
pub const AGENT_VSOCK_PORT: u32 = 1024;

/// Bytes of output (stdout/stderr/tail data) the agent may have sent on one
/// stream without an acknowledgement from the host, and bytes of stdin the host
/// may have sent to one process without an acknowledgement from the agent.
/// Both sides hold at most this much per stream, whatever the peer does.
pub const STREAM_WINDOW_BYTES: u64 = 256 * 1024;

/// Largest data chunk in one stream frame; well under the frame limit.
pub const MAX_CHUNK_BYTES: usize = 64 * 1024;
