//! The agent client: a typed Rust client for the guest agent's protocol
//! (`provium_protocol`), over any byte stream ([`Transport`]).
//!
//! [`AgentClient::handshake`] sends Hello and requires HelloOk; a HelloErr
//! fails with the agent's message, which names both protocol versions. After
//! that, any number of threads may issue requests on clones of the client:
//! ids are allocated here, a reader thread routes each response to its caller
//! and each stream chunk to its stream's buffer. Every call has a deadline
//! (the op timeout, 60 s by default, plus the op's own timeout where it has
//! one), and a lost or misbehaving connection wakes every caller with an
//! error: nothing hangs on a dead agent.
//!
//! Flow control follows the wire: output chunks are acknowledged as they are
//! consumed (at most [`provium_protocol::STREAM_WINDOW_BYTES`] buffered per
//! stream), and stdin writes block until the agent acknowledges the window.

mod connection;
mod error;
mod ops;
mod process;
mod stream;
mod worker;

#[cfg(test)]
pub(crate) mod test_utils;

/// For the fuzz targets only (harness/fuzz): not an API.
#[doc(hidden)]
pub use connection::fuzzing;
pub use connection::{AgentClient, ClientOptions, Transport, TransportParts};
pub use error::ClientError;
pub use ops::{AgentOps, ClockReading};
pub use process::{Process, RunOutput};
pub use stream::StreamReader;
pub use worker::Worker;
