//! The one event path (STYLE.md §3, after cargo-nextest's runner): every
//! lifecycle event reaches the reporters and the msgpack stream through the
//! dispatcher, and through nothing else.
//!
//! - Below the dispatcher, producers (the executor, the Lua VM lifecycle,
//!   the lab's claims, the fixture builder) hold an [`EventSender`] (on
//!   `runner::FileEnv`) and send a typed [`Lifecycle`] event, stamped when
//!   it happened. The sender is the dispatcher's own inbox
//!   (`scheduler::messages::ExecutorMessage::Lifecycle`), so a file's
//!   events reach it in the order its thread sent them, before the file's
//!   `FileFinished`: a test's VM and fixture events fall between its
//!   `test_started` and its end.
//! - The dispatcher turns each into reporter calls and `protocol::Event`s,
//!   and alone writes the [`EventBus`] (`--save-events`, `--events-stdout`,
//!   `--events-socket`, encoded by `report::event_stream`) through its
//!   [`StreamSender`].
//!
//! This module names no scheduler type (the runner, which the scheduler
//! uses, holds an [`EventSender`]): the dispatcher hands its inbox over as
//! a function. The reporters' own events (`RunEvent`) live in
//! `report::run_event`.

use std::os::unix::net::UnixListener;
use std::path::Path;
use std::sync::{mpsc, Arc};
use std::time::{SystemTime, UNIX_EPOCH};

use provium_protocol::event::{
    ClaimAcquired, ClaimReleased, FixtureBuildDone, FixtureBuildStarted, FixtureBuildWaiting,
    FixtureCacheHit, TestStarted, VmForked, VmShutdown, VmSpawned,
};
use provium_protocol::{Event, EventFrame};

use crate::lock::Locked;
use crate::report::event_stream::{EventStreamWriter, Sink, SocketClients as Clients};
use crate::report::run_event::TestReport;

/// What happened in a running file: the vocabulary of everything below the
/// dispatcher. The wire shapes are the protocol's payloads, except where
/// the dispatcher decides the wire variant ([`Lifecycle::TestFinished`]).
#[derive(Debug, Clone, PartialEq)]
pub enum Lifecycle {
    /// The file's executor began running it (the reporters' `FileStarted`;
    /// no wire event: `file_dispatched` is the dispatcher's own).
    FileStarted {
        path: String,
    },
    /// A test's body is about to run.
    TestStarted(TestStarted),
    /// A test ended as the executor decided (passed, failed, skipped, or
    /// failed unrun in a poisoned file): `test_passed` / `test_failed` /
    /// `test_skipped`. `console_excerpt` is a failure's, else empty.
    TestFinished {
        path: String,
        test: TestReport,
        console_excerpt: String,
    },
    FixtureBuildStarted(FixtureBuildStarted),
    FixtureBuildWaiting(FixtureBuildWaiting),
    FixtureBuildDone(FixtureBuildDone),
    /// Fires after a successful restore only (the reference's guarantee).
    FixtureCacheHit(FixtureCacheHit),
    /// A VM booted or was restored, and its agent answered.
    VmSpawned(VmSpawned),
    VmShutdown(VmShutdown),
    /// A running VM was forked (its copies each have a `VmSpawned` too).
    VmForked(VmForked),
    ClaimAcquired(ClaimAcquired),
    ClaimReleased(ClaimReleased),
}

/// A [`Lifecycle`] event and when it happened (the wire frame's `ts`, ns
/// since the Unix epoch), so forwarding does not move its time.
#[derive(Debug, Clone, PartialEq)]
pub struct Stamped {
    pub ts: i64,
    pub event: Lifecycle,
}

/// The host clock as the event stream's `ts`: ns since the Unix epoch.
pub fn now_ns() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
}

/// Where a [`Stamped`] event goes: the dispatcher's inbox.
type Deliver = Arc<dyn Fn(Stamped) + Send + Sync>;

/// A cheap, cloneable handle producers use to send lifecycle events to the
/// dispatcher.
#[derive(Clone)]
pub struct EventSender {
    deliver: Option<Deliver>,
}

impl EventSender {
    /// A sender that drops everything (a fixture build outside a run, the
    /// REPL, unit tests).
    pub fn disabled() -> Self {
        EventSender { deliver: None }
    }

    /// A sender whose events `deliver` hands on (the dispatcher wraps them
    /// into its inbox's message).
    pub fn to(deliver: impl Fn(Stamped) + Send + Sync + 'static) -> Self {
        EventSender {
            deliver: Some(Arc::new(deliver)),
        }
    }

    /// Send `event`, stamped now.
    pub fn send(&self, event: Lifecycle) {
        if let Some(deliver) = &self.deliver {
            deliver(Stamped {
                ts: now_ns(),
                event,
            });
        }
    }
}

/// The dispatcher's handle on the stream: the only writer of frames.
#[derive(Clone)]
pub struct StreamSender {
    tx: Option<mpsc::Sender<EventFrame>>,
}

impl StreamSender {
    /// A stream that drops everything (no outputs configured, unit tests).
    pub fn disabled() -> Self {
        StreamSender { tx: None }
    }

    /// Write `event` as having happened at `ts` (ns since the Unix epoch).
    pub fn emit_at(&self, ts: i64, event: Event) {
        if let Some(tx) = &self.tx {
            let _ = tx.send(EventFrame { ts, event });
        }
    }

    /// Write `event`, stamped now.
    pub fn emit(&self, event: Event) {
        self.emit_at(now_ns(), event);
    }
}

/// Owns the outputs; `finish` flushes everything that was emitted.
pub struct EventBus {
    sender: StreamSender,
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
                sender: StreamSender::disabled(),
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
            sender: StreamSender { tx: Some(tx) },
            worker: Some(worker),
        })
    }

    /// The dispatcher's handle (no one else writes the stream).
    pub fn sender(&self) -> StreamSender {
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

    #[test]
    fn the_bus_keeps_every_frame_in_order_and_a_disabled_sender_drops() {
        let bus = EventBus::start(None, false, None, true).unwrap();
        let tx = bus.sender();
        for p in ["a", "b"] {
            tx.emit(Event::FixtureCacheHit(FixtureCacheHit { path: p.into() }));
        }
        StreamSender::disabled().emit(Event::FixtureCacheHit(FixtureCacheHit {
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

    #[test]
    fn a_sender_stamps_and_hands_on_in_order_and_a_disabled_one_drops() {
        let (tx, rx) = mpsc::channel();
        let sender = EventSender::to(move |s| tx.send(s).unwrap());
        let before = now_ns();
        for p in ["a", "b"] {
            sender.send(Lifecycle::FixtureCacheHit(FixtureCacheHit {
                path: p.into(),
            }));
        }
        EventSender::disabled().send(Lifecycle::FileStarted {
            path: "lost".into(),
        });
        drop(sender);
        let got: Vec<Stamped> = rx.iter().collect();
        assert_eq!(
            got.iter().map(|s| s.event.clone()).collect::<Vec<_>>(),
            ["a", "b"].map(|p| Lifecycle::FixtureCacheHit(FixtureCacheHit { path: p.into() }))
        );
        assert!(got.iter().all(|s| s.ts >= before), "{got:?}");
        assert!(got[0].ts <= got[1].ts);
    }
}
