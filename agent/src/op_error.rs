//! Building the [`OpError`]s the agent answers with.
//!
//! Kernel failures keep their errno and name the object they were about, e.g.
//! `No such file or directory (os error 2): /etc/missing`, so a test failure
//! says what was missing without a second round trip.

use std::fmt::Display;
use std::io;

use provium_protocol::op::{HandleId, StreamId, WorkerId};
use provium_protocol::result::{ErrorCode, OpError};

/// Max bytes a single answer may carry (read_file, read, captured output).
/// Well under the 16 MiB frame limit so the encoded answer always fits.
pub const MAX_ANSWER_BYTES: usize = 8 * 1024 * 1024;

/// A kernel error about `what` (a path, a program, a handle).
pub fn io(err: &io::Error, what: impl Display) -> OpError {
    match err.raw_os_error() {
        Some(errno) => OpError {
            code: ErrorCode::Io,
            errno: Some(errno),
            message: format!("{err}: {what}"),
        },
        // std's own refusals (a NUL byte in a path, ...) have no errno: the
        // request was malformed rather than refused by the kernel.
        None => OpError::new(ErrorCode::InvalidArgument, format!("{err}: {what}")),
    }
}

/// The calling thread's last kernel error, about `what`.
pub fn last_os(what: impl Display) -> OpError {
    io(&io::Error::last_os_error(), what)
}

pub fn invalid(message: impl Into<String>) -> OpError {
    OpError::new(ErrorCode::InvalidArgument, message)
}

pub fn too_large(message: impl Into<String>) -> OpError {
    OpError::new(ErrorCode::TooLarge, message)
}

pub fn not_allowed(message: impl Into<String>) -> OpError {
    OpError::new(ErrorCode::NotAllowed, message)
}

pub fn unsupported(message: impl Into<String>) -> OpError {
    OpError::new(ErrorCode::Unsupported, message)
}

pub fn internal(message: impl Into<String>) -> OpError {
    OpError::new(ErrorCode::Internal, message)
}

pub fn unknown_handle(handle: HandleId) -> OpError {
    OpError::new(
        ErrorCode::UnknownHandle,
        format!("unknown handle {handle} in this namespace (closed, or opened by another worker)"),
    )
}

pub fn unknown_process(process: StreamId) -> OpError {
    OpError::new(
        ErrorCode::UnknownProcess,
        format!(
            "unknown process {process} in this namespace (already waited or released, or spawned by another worker)"
        ),
    )
}

pub fn unknown_stream(stream: StreamId) -> OpError {
    OpError::new(
        ErrorCode::UnknownStream,
        format!("unknown stream {stream} in this namespace (already closed or ended)"),
    )
}

pub fn unknown_worker(worker: WorkerId) -> OpError {
    OpError::new(
        ErrorCode::UnknownWorker,
        format!("unknown worker {worker} on this connection (never spawned, or closed)"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_errors_keep_errno_and_name_the_object() {
        let e = io(&io::Error::from_raw_os_error(libc::ENOENT), "/nope");
        assert_eq!(e.code, ErrorCode::Io);
        assert_eq!(e.errno, Some(libc::ENOENT));
        assert_eq!(e.message, "No such file or directory (os error 2): /nope");
        let e = io(
            &io::Error::new(io::ErrorKind::InvalidInput, "nul byte"),
            "a\0b",
        );
        assert_eq!(e.code, ErrorCode::InvalidArgument);
        assert_eq!(e.errno, None);
    }
}
