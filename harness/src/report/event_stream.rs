//! The msgpack event stream (`--save-events`, `--events-stdout`,
//! `--events-socket`): each `protocol::EventFrame` as one length-prefixed
//! frame to every output. The event bus (`crate::events`) owns the thread
//! and the channel; this only encodes and writes.

use std::io::Write;
use std::os::unix::net::UnixStream;
use std::sync::{Arc, Mutex};

use provium_protocol::frame::{write_frame, DEFAULT_MAX_FRAME_BYTES};
use provium_protocol::{encode, EventFrame};

/// An output that must take every frame (a file, stdout).
pub type Sink = Box<dyn Write + Send>;

/// Dashboards connected to `--events-socket`; each may go away.
pub type SocketClients = Arc<Mutex<Vec<UnixStream>>>;

/// Writes frames to the sinks and the socket's clients.
pub struct EventStreamWriter {
    sinks: Vec<Sink>,
    clients: SocketClients,
}

impl EventStreamWriter {
    pub fn new(sinks: Vec<Sink>, clients: SocketClients) -> Self {
        EventStreamWriter { sinks, clients }
    }

    /// Write one frame. A sink's error ends the stream; a dashboard that
    /// went away is dropped, not fatal.
    pub fn write(&mut self, frame: &EventFrame) -> std::io::Result<()> {
        let body = encode(frame).map_err(std::io::Error::other)?;
        for s in self.sinks.iter_mut() {
            write_frame(s, &body, DEFAULT_MAX_FRAME_BYTES).map_err(std::io::Error::other)?;
        }
        self.clients
            .lock()
            .unwrap()
            .retain_mut(|c| write_frame(c, &body, DEFAULT_MAX_FRAME_BYTES).is_ok());
        Ok(())
    }

    pub fn flush(&mut self) -> std::io::Result<()> {
        for s in self.sinks.iter_mut() {
            s.flush()?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lock::Locked;
    use provium_protocol::event::{Event, FixtureCacheHit};
    use provium_protocol::frame::read_message;

    use super::super::test_utils::SharedBuffer;

    #[test]
    fn frames_read_back_and_a_closed_dashboard_is_dropped() {
        let out = SharedBuffer::default();
        let (ours, theirs) = UnixStream::pair().unwrap();
        drop(theirs);
        let clients: SocketClients = Arc::new(Mutex::new(vec![ours]));
        let mut w = EventStreamWriter::new(vec![Box::new(out.clone())], clients.clone());
        let frame = EventFrame {
            ts: 7,
            event: Event::FixtureCacheHit(FixtureCacheHit { path: "f".into() }),
        };
        // The peer is gone: the first or second write notices.
        w.write(&frame).unwrap();
        w.write(&frame).unwrap();
        w.flush().unwrap();
        assert!(clients.locked().is_empty());
        let bytes = out.bytes();
        let mut r = bytes.as_slice();
        for _ in 0..2 {
            let back = read_message::<EventFrame, _>(&mut r, DEFAULT_MAX_FRAME_BYTES)
                .unwrap()
                .unwrap();
            assert_eq!(back, frame);
        }
    }
}
