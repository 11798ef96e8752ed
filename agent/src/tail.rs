//! `tail`: follow a file (by path) or an open handle, streaming what is
//! appended as `data` chunks on the request's id.
//!
//! The file is polled every [`POLL`]; a poll that finds new bytes reads them
//! at once (no sleep between chunks), within the stream's window. A path is
//! opened once and followed by descriptor (`tail -f`, not `tail -F`); a file
//! truncated below the tail's offset is followed from its new end. A tail of a
//! handle reads with pread, so the handle's own cursor never moves, and ends
//! with `eof` when the handle is closed. `close_stream` ends it with `closed`.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::{mpsc, Arc, Condvar, Mutex, Weak};
use std::time::Duration;

use provium_protocol::op::{StreamId, TailSource, TailStart};
use provium_protocol::result::OpError;
use provium_protocol::wire::{Channel, StreamEndReason};
use provium_protocol::{OpValue, MAX_CHUNK_BYTES};

use crate::conn::Conn;
use crate::ctx::{Ctx, Then};
use crate::files::open_for_tail;
use crate::locks::{lock, wait_timeout};
use crate::namespace::{Namespace, StoppableStream};
use crate::op_error;
use crate::stream::{Room, StreamOut};

/// How often a quiet file is checked for growth.
const POLL: Duration = Duration::from_millis(25);

pub struct Tail {
    out: Arc<StreamOut>,
    stopped: Mutex<bool>,
    cv: Condvar,
}

impl StoppableStream for Tail {
    fn stream_id(&self) -> StreamId {
        self.id()
    }

    fn stop_stream(&self) {
        self.stop();
    }
}

impl Tail {
    pub fn id(&self) -> StreamId {
        self.out.stream
    }

    /// End the stream with `closed` (close_stream, namespace close).
    pub fn stop(&self) {
        *lock(&self.stopped) = true;
        self.cv.notify_all();
        self.out.end(StreamEndReason::Closed, None);
    }

    fn is_stopped(&self) -> bool {
        *lock(&self.stopped)
    }

    /// Sleep up to [`POLL`], waking early on stop.
    fn nap(&self) {
        let g = lock(&self.stopped);
        if !*g {
            drop(wait_timeout(&self.cv, g, POLL));
        }
    }
}

enum Source {
    Owned(Arc<File>),
    Handle(Weak<File>),
}

impl Source {
    fn get(&self) -> Option<Arc<File>> {
        match self {
            Source::Owned(f) => Some(Arc::clone(f)),
            Source::Handle(w) => w.upgrade(),
        }
    }
}

/// The absolute offset a tail starts at, for a file of `size` bytes.
pub fn resolve_start(start: TailStart, size: u64) -> u64 {
    match start {
        TailStart::Beginning => 0,
        TailStart::End => size,
        TailStart::Offset { offset } => offset.min(size),
        TailStart::FromEnd { bytes } => size.saturating_sub(bytes),
    }
}

pub fn open(
    ctx: &Ctx<'_>,
    id: u64,
    source: TailSource,
    start: TailStart,
) -> (Result<OpValue, OpError>, Then) {
    match start_tail(ctx, id, source, start) {
        Ok((offset, go)) => (
            Ok(OpValue::Tail { stream: id, offset }),
            Some(Box::new(move || drop(go))),
        ),
        Err(e) => (Err(e), None),
    }
}

fn start_tail(
    ctx: &Ctx<'_>,
    id: u64,
    source: TailSource,
    start: TailStart,
) -> Result<(u64, mpsc::Sender<()>), OpError> {
    let (file, what) = match &source {
        TailSource::Path { path } => (Arc::new(open_for_tail(path)?), path.clone()),
        TailSource::Handle { handle } => (ctx.ns.handle(*handle)?, format!("handle {handle}")),
    };
    let size = file.metadata().map_err(|e| op_error::io(&e, &what))?.len();
    let offset = resolve_start(start, size);
    let src = match source {
        TailSource::Path { .. } => Source::Owned(file),
        TailSource::Handle { .. } => Source::Handle(Arc::downgrade(&file)),
    };
    let out = StreamOut::new(ctx.conn.outbox(), id, Channel::Data, None);
    let tail = Arc::new(Tail {
        out: Arc::clone(&out),
        stopped: Mutex::new(false),
        cv: Condvar::new(),
    });
    ctx.ns.insert_tail(tail.clone())?;
    ctx.conn.register_stream(&out);
    let (go_tx, go_rx) = mpsc::channel::<()>();
    let conn = Arc::clone(ctx.conn);
    let ns = Arc::clone(ctx.ns);
    let t = Arc::clone(&tail);
    let started = std::thread::Builder::new()
        .name("provium-tail".into())
        .spawn(move || {
            // Chunks follow the Tail answer.
            let _ = go_rx.recv();
            follow(&t, &src, offset, &what);
            finish(&conn, &ns, &t);
        });
    if let Err(e) = started {
        finish(ctx.conn, ctx.ns, &tail);
        return Err(op_error::io(&e, "tail thread"));
    }
    Ok((offset, go_tx))
}

fn finish(conn: &Conn, ns: &Namespace, t: &Tail) {
    t.out.close();
    conn.unregister_stream(&t.out);
    ns.remove_tail(t.id());
}

fn follow(t: &Tail, src: &Source, mut offset: u64, what: &str) {
    let mut buf = vec![0u8; MAX_CHUNK_BYTES];
    while !t.is_stopped() {
        let Some(file) = src.get() else {
            t.out.end(
                StreamEndReason::Eof,
                Some(format!("the tailed {what} was closed")),
            );
            return;
        };
        let size = match file.metadata() {
            Ok(m) => m.len(),
            Err(e) => {
                t.out.end(
                    StreamEndReason::Error,
                    Some(format!("cannot stat {what}: {e}")),
                );
                return;
            }
        };
        if size < offset {
            offset = size;
        }
        if size == offset {
            drop(file);
            t.nap();
            continue;
        }
        let room = match t.out.wait_room(POLL) {
            Room::Discard => return,
            Room::Send(0) => continue,
            Room::Send(n) => n,
        };
        let want = usize::try_from(size - offset)
            .unwrap_or(usize::MAX)
            .min(room);
        match file.read_at(&mut buf[..want], offset) {
            Ok(0) => t.nap(),
            Ok(n) => {
                if !t.out.send(&buf[..n]) {
                    return;
                }
                offset += n as u64;
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => {
                t.out.end(
                    StreamEndReason::Error,
                    Some(format!("cannot read {what}: {e}")),
                );
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn start_positions_clamp() {
        assert_eq!(resolve_start(TailStart::Beginning, 10), 0);
        assert_eq!(resolve_start(TailStart::End, 10), 10);
        assert_eq!(resolve_start(TailStart::Offset { offset: 4 }, 10), 4);
        assert_eq!(resolve_start(TailStart::Offset { offset: 40 }, 10), 10);
        assert_eq!(resolve_start(TailStart::FromEnd { bytes: 3 }, 10), 7);
        assert_eq!(resolve_start(TailStart::FromEnd { bytes: 30 }, 10), 0);
    }
}
