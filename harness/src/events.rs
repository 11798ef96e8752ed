//! The wire event stream: producers (executors, the dispatcher, the Lua
//! layer) send `protocol::Event`s to one [`EventBus`], which stamps them and
//! fans them out to the configured outputs (`--save-events`,
//! `--events-stdout`, `--events-socket`) through `report::event_stream`.
//! The reporters' own events (`RunEvent`) live in `report::run_event`.

use std::os::unix::net::UnixListener;
use std::path::Path;
use std::sync::mpsc;
use std::time::{SystemTime, UNIX_EPOCH};

use provium_protocol::{Event, EventFrame};

use crate::lock::Locked;
use crate::report::event_stream::{EventStreamWriter, Sink, SocketClients as Clients};

/// A cheap, cloneable handle producers use to emit events.
#[derive(Clone)]
pub struct EventSender {
    tx: Option<mpsc::Sender<EventFrame>>,
}

impl EventSender {
    /// A sender that drops everything (no outputs configured, unit tests).
    pub fn disabled() -> Self {
        EventSender { tx: None }
    }

    pub fn emit(&self, event: Event) {
        if let Some(tx) = &self.tx {
            let ts = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as i64);
            let _ = tx.send(EventFrame { ts, event });
        }
    }
}

/// Owns the outputs; `finish` flushes everything that was emitted.
pub struct EventBus {
    sender: EventSender,
    worker: Option<std::thread::JoinHandle<std::io::Result<Vec<EventFrame>>>>,
}

/// Subscribers of `--events-socket`, fed by the bus worker.
#[derive(Clone, Default)]
struct SocketClients(Clients);

/// The `--events-socket` listener. Bound once per `provium` invocation, so
/// a dashboard stays connected across `--watch` iterations.
#[derive(Clone)]
pub struct EventSocket {
    clients: SocketClients,
}

impl EventSocket {
    pub fn bind(path: &Path) -> std::io::Result<EventSocket> {
        let _ = std::fs::remove_file(path);
        let listener = UnixListener::bind(path).map_err(|e| {
            std::io::Error::new(
                e.kind(),
                format!("--events-socket `{}`: {e}", path.display()),
            )
        })?;
        let clients = SocketClients::default();
        let c = clients.clone();
        std::thread::spawn(move || {
            for conn in listener.incoming().flatten() {
                c.0.locked().push(conn);
            }
        });
        Ok(EventSocket { clients })
    }
}

impl EventBus {
    /// `keep`: also return every frame from `finish` (for in-process checks).
    pub fn start(
        save_to: Option<&Path>,
        to_stdout: bool,
        socket: Option<&EventSocket>,
        keep: bool,
    ) -> std::io::Result<EventBus> {
        let mut sinks: Vec<Sink> = Vec::new();
        if let Some(p) = save_to {
            let f = std::fs::File::create(p).map_err(|e| {
                std::io::Error::new(e.kind(), format!("--save-events `{}`: {e}", p.display()))
            })?;
            sinks.push(Box::new(std::io::BufWriter::new(f)));
        }
        if to_stdout {
            sinks.push(Box::new(std::io::stdout()));
        }
        let clients = socket.map(|s| s.clients.clone()).unwrap_or_default();
        if sinks.is_empty() && socket.is_none() && !keep {
            return Ok(EventBus {
                sender: EventSender::disabled(),
                worker: None,
            });
        }
        let (tx, rx) = mpsc::channel::<EventFrame>();
        let worker = std::thread::spawn(move || {
            let mut writer = EventStreamWriter::new(sinks, clients.0);
            let mut kept = Vec::new();
            for frame in rx {
                writer.write(&frame)?;
                if keep {
                    kept.push(frame);
                }
            }
            writer.flush()?;
            Ok(kept)
        });
        Ok(EventBus {
            sender: EventSender { tx: Some(tx) },
            worker: Some(worker),
        })
    }

    pub fn sender(&self) -> EventSender {
        self.sender.clone()
    }

    /// Close the bus and wait until every emitted frame is written.
    pub fn finish(mut self) -> std::io::Result<Vec<EventFrame>> {
        self.sender.tx = None;
        match self.worker.take() {
            Some(w) => w
                .join()
                .unwrap_or_else(|_| Err(std::io::Error::other("event writer panicked"))),
            None => Ok(Vec::new()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use provium_protocol::event::FixtureCacheHit;

    #[test]
    fn the_bus_keeps_every_frame_in_order_and_a_disabled_sender_drops() {
        let bus = EventBus::start(None, false, None, true).unwrap();
        let tx = bus.sender();
        for p in ["a", "b"] {
            tx.emit(Event::FixtureCacheHit(FixtureCacheHit { path: p.into() }));
        }
        EventSender::disabled().emit(Event::FixtureCacheHit(FixtureCacheHit {
            path: "lost".into(),
        }));
        drop(tx);
        let paths: Vec<String> = bus
            .finish()
            .unwrap()
            .into_iter()
            .map(|f| match f.event {
                Event::FixtureCacheHit(h) => h.path,
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(paths, ["a", "b"]);
    }
}
