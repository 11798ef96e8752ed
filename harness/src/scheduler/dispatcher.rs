//! The dispatcher owns the run's state: the queue, the pool, each running
//! file's reservation, PSI and cancellation. Files run in FIFO order
//! against a pool of memory and vCPUs. Each file reserves the runner
//! overhead plus its declared claim; a file that does not fit waits
//! (`file_blocked`), and `pool_state` is emitted once a second.
//!
//! The dispatcher is the one end of the event path (`crate::events`):
//! executors, and everything below them (the Lua VM lifecycle, claims, the
//! fixture builder), send it every lifecycle event as an
//! [`ExecutorMessage`], through the [`EventSender`] it hands out
//! ([`Dispatcher::event_sender`]). It alone turns them into reporter calls
//! and `protocol::Event`s, adds its own (`run_started`, `file_discovered`,
//! `file_dispatched`, `file_blocked`, `pool_state`, `file_completed`) and
//! writes the msgpack stream.
//!
//! Where guest kernel code is emulated (kvm_pvm, DESIGN.md "This machine's
//! KVM") a VM needs a host core to itself: two emulated VMs on one core
//! each run at half speed, and a booting kernel that slow misses every
//! timeout. There the dispatcher also counts VMs against
//! `emulated_vm_slots` (one per host core), and a file that would exceed
//! them waits with `file_blocked` reason `emulated_vm_slots`.

use std::collections::VecDeque;
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use provium_protocol::event::{
    Event, FileBlocked, FileCompleted, FileDiscovered, FileDispatched, PoolState, ResourceAmount,
    RunStarted, TestFailed, TestPassed, TestSkipped,
};

use super::executor::{self, ExecutorContext};
use super::messages::{ExecutorMessage, Reservation};
use crate::events::{EventSender, Lifecycle, Stamped, StreamSender};
use crate::report::run_event::{RunEvent, TestStatus};
use crate::report::{ReportError, Reporter, RunIdentity};
use crate::runner::outcome::FileOutcome;
use crate::runner::{interrupt, FileEnv, RunResources};

/// What running one file costs besides its claim (the reference's per-file
/// default: a Lua state and a thread, no vCPU).
pub const RUNNER_OVERHEAD: ResourceAmount = ResourceAmount {
    memory_bytes: 50 << 20,
    cpus: 0,
};

/// Some-pressure (avg10, percent) above which new dispatches pause.
pub const PSI_THRESHOLD: f64 = 10.0;

/// The `file_blocked` reason for a file that waits for a host core for each
/// of its VMs (emulated kvm only).
pub const EMULATED_VM_SLOTS_REASON: &str = "emulated_vm_slots";

/// How often `pool_state` is emitted while files run.
const POOL_STATE_EVERY: Duration = Duration::from_secs(1);

/// How long the dispatcher waits for an executor before it looks at the
/// interrupt flag and the pool again.
const DISPATCH_TICK: Duration = Duration::from_millis(250);

/// Where pressure readings come from: the kernel's PSI files, or a test's.
pub trait Pressure: Send {
    /// `true` when the host is too loaded to start another file.
    fn high(&mut self) -> bool;
}

/// `/proc/pressure/{cpu,memory}`, read at most once a second.
pub struct PsiMonitor {
    dir: std::path::PathBuf,
    last_read: Option<Instant>,
    high: bool,
}

impl PsiMonitor {
    pub fn new(dir: impl Into<std::path::PathBuf>) -> Self {
        PsiMonitor {
            dir: dir.into(),
            last_read: None,
            high: false,
        }
    }

    /// The `some avg10=` value of one PSI file, if present.
    pub fn some_avg10(text: &str) -> Option<f64> {
        let line = text.lines().find(|l| l.starts_with("some "))?;
        line.split_whitespace()
            .find_map(|f| f.strip_prefix("avg10=")?.parse().ok())
    }
}

impl Pressure for PsiMonitor {
    fn high(&mut self) -> bool {
        if self
            .last_read
            .is_none_or(|t| t.elapsed() >= Duration::from_secs(1))
        {
            self.last_read = Some(Instant::now());
            // Hosts without PSI never throttle.
            self.high = ["cpu", "memory"].iter().any(|f| {
                std::fs::read_to_string(self.dir.join(f))
                    .ok()
                    .and_then(|t| Self::some_avg10(&t))
                    .is_some_and(|v| v > PSI_THRESHOLD)
            });
        }
        self.high
    }
}

#[derive(Debug, Clone)]
pub struct DispatcherOptions {
    /// Which run this is (the `run_started` event).
    pub identity: RunIdentity,
    pub pool: ResourceAmount,
    pub fail_fast: bool,
    /// Host cores for emulated VMs: `Some(n)` where each running VM needs a
    /// core to itself (the kvm backend on kvm_pvm), `None` elsewhere.
    pub emulated_vm_slots: Option<u32>,
    /// When the run began (the summary's elapsed time counts from here).
    pub run_started: Instant,
    /// Every live resource of the run, torn down on a signal.
    pub run_resources: RunResources,
}

/// One file to run.
pub struct Job {
    /// Its `events` should be [`Dispatcher::event_sender`]'s, or the
    /// file's VM, claim, fixture and test events are lost.
    pub env: Arc<FileEnv>,
    /// The file's declared claim (`file_discovered`'s `declared_claim`).
    pub claim: Option<ResourceAmount>,
    /// The fixtures the file names (`file_discovered`'s `fixture_refs`).
    pub fixture_refs: Vec<String>,
    /// The VMs the file creates (`discover::vm_estimate`).
    pub vms: u32,
}

/// What the run produced.
#[derive(Debug)]
pub struct RunSummary {
    /// In completion order.
    pub outcomes: Vec<FileOutcome>,
    /// The first reporter error (the run itself went on).
    pub report_error: Option<ReportError>,
}

fn add(a: ResourceAmount, b: ResourceAmount) -> ResourceAmount {
    ResourceAmount {
        memory_bytes: a.memory_bytes + b.memory_bytes,
        cpus: a.cpus + b.cpus,
    }
}

fn sub(a: ResourceAmount, b: ResourceAmount) -> ResourceAmount {
    ResourceAmount {
        memory_bytes: a.memory_bytes.saturating_sub(b.memory_bytes),
        cpus: a.cpus.saturating_sub(b.cpus),
    }
}

fn fits(used: ResourceAmount, want: ResourceAmount, pool: ResourceAmount) -> bool {
    used.memory_bytes + want.memory_bytes <= pool.memory_bytes && used.cpus + want.cpus <= pool.cpus
}

/// The run's state between messages.
pub struct Dispatcher<'a> {
    opts: DispatcherOptions,
    executor: ExecutorContext,
    /// The msgpack stream, which no one else writes.
    stream: StreamSender,
    /// The executors' (and [`EventSender`]s') way in, and the dispatcher's
    /// end of it.
    to_dispatcher: mpsc::Sender<ExecutorMessage>,
    inbox: mpsc::Receiver<ExecutorMessage>,
    pressure: &'a mut dyn Pressure,
    reporter: &'a mut dyn Reporter,
    queue: VecDeque<Job>,
    used: Reservation,
    running: usize,
    outcomes: Vec<FileOutcome>,
    report_error: Option<ReportError>,
    /// The (file, reason) last announced as blocked, so a wait is said once.
    blocked_reported: Option<(String, &'static str)>,
    /// No new files: `--fail-fast` saw a failure, or the run was interrupted.
    stop: bool,
    interrupted: bool,
}

impl<'a> Dispatcher<'a> {
    pub fn new(
        opts: DispatcherOptions,
        executor: ExecutorContext,
        stream: StreamSender,
        pressure: &'a mut dyn Pressure,
        reporter: &'a mut dyn Reporter,
    ) -> Self {
        let (to_dispatcher, inbox) = mpsc::channel();
        Dispatcher {
            opts,
            executor,
            stream,
            to_dispatcher,
            inbox,
            pressure,
            reporter,
            queue: VecDeque::new(),
            used: Reservation::default(),
            running: 0,
            outcomes: Vec::new(),
            report_error: None,
            blocked_reported: None,
            stop: false,
            interrupted: false,
        }
    }

    /// The handle every file's lifecycle events come in by: put it in each
    /// job's `FileEnv`.
    pub fn event_sender(&self) -> EventSender {
        let tx = self.to_dispatcher.clone();
        EventSender::to(move |stamped| {
            // Gone only once the run is over: nothing is left to tell.
            let _ = tx.send(ExecutorMessage::Lifecycle(stamped));
        })
    }

    /// Run every job; returns the outcomes in completion order.
    pub fn run(mut self, jobs: Vec<Job>) -> RunSummary {
        let id = &self.opts.identity;
        self.stream.emit(Event::RunStarted(RunStarted {
            run_id: id.run_id.clone(),
            suite_id: id.suite_id.clone(),
            suite_files: id.suite_files,
            partition: id.partition.clone(),
        }));
        for job in &jobs {
            self.stream.emit(Event::FileDiscovered(FileDiscovered {
                path: job.env.rel_path.clone(),
                fixture_refs: job.fixture_refs.clone(),
                declared_claim: job.claim,
            }));
        }
        self.report(RunEvent::RunStarted {
            file_count: jobs.len(),
        });
        self.queue = jobs.into();
        let mut last_pool_state = Instant::now() - POOL_STATE_EVERY;
        loop {
            self.check_interrupt();
            self.dispatch_what_fits();
            if self.running == 0 && (self.queue.is_empty() || self.stop) {
                break;
            }
            if last_pool_state.elapsed() >= POOL_STATE_EVERY {
                self.stream.emit(Event::PoolState(PoolState {
                    used: self.used.resources,
                    available: sub(self.opts.pool, self.used.resources),
                }));
                last_pool_state = Instant::now();
            }
            match self.inbox.recv_timeout(DISPATCH_TICK) {
                Ok(message) => self.handle(message),
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => break,
            }
        }
        // Every file's own events came before its end; what is left was
        // sent from elsewhere (a VM torn down on a signal, from this very
        // thread), and still belongs in the stream.
        while let Ok(message) = self.inbox.try_recv() {
            self.handle(message);
        }
        self.report(RunEvent::RunFinished {
            elapsed: self.opts.run_started.elapsed(),
        });
        RunSummary {
            outcomes: self.outcomes,
            report_error: self.report_error,
        }
    }

    fn report(&mut self, event: RunEvent) {
        if let Err(e) = self.reporter.report(&event) {
            self.report_error.get_or_insert(e);
        }
    }

    /// SIGINT/SIGTERM: no new files; the running ones stop (their
    /// watchdogs cancel them) and report.
    fn check_interrupt(&mut self) {
        if interrupt::received().is_some() && !self.interrupted {
            self.stop = true;
            self.interrupted = true;
            // Fixture builds' VMs too, which no file's watchdog tracks.
            self.opts.run_resources.tear_down_all();
        }
    }

    /// Why the queue's head must wait, if it must.
    fn wait_reason(&mut self, want: ResourceAmount, want_vm_slots: u32) -> Option<&'static str> {
        // A file bigger than the whole pool still runs, alone; pressure
        // pauses new dispatches only while something else is running
        // (load from outside Provium must not stall the run forever).
        let slots_free = self
            .opts
            .emulated_vm_slots
            .is_none_or(|slots| self.used.emulated_vm_slots + want_vm_slots <= slots);
        if !(fits(self.used.resources, want, self.opts.pool) || self.running == 0) {
            Some("pool_full")
        } else if !slots_free && self.running > 0 {
            Some(EMULATED_VM_SLOTS_REASON)
        } else if self.running > 0 && self.opts.emulated_vm_slots.is_none() && self.pressure.high()
        {
            // (With emulated VMs the slots are the CPU gate: each running
            // VM keeps its core 100 % busy by design, so CPU pressure is
            // always high and would serialise every file.)
            Some("psi_pressure")
        } else {
            None
        }
    }

    /// Dispatch as many queued files as fit, in order.
    fn dispatch_what_fits(&mut self) {
        while !self.stop {
            let Some(job) = self.queue.front() else {
                return;
            };
            let want = add(RUNNER_OVERHEAD, job.claim.unwrap_or_default());
            let want_vm_slots = self
                .opts
                .emulated_vm_slots
                .map_or(0, |slots| job.vms.min(slots));
            let path = job.env.rel_path.clone();
            if let Some(reason) = self.wait_reason(want, want_vm_slots) {
                let key = (path, reason);
                if self.blocked_reported.as_ref() != Some(&key) {
                    self.stream.emit(Event::FileBlocked(FileBlocked {
                        path: key.0.clone(),
                        waiting_for: want,
                        reason: reason.into(),
                    }));
                    self.blocked_reported = Some(key);
                }
                return;
            }
            let job = self
                .queue
                .pop_front()
                .expect("the queue's front was just read");
            let reservation = Reservation {
                resources: want,
                emulated_vm_slots: want_vm_slots,
            };
            self.used = Reservation {
                resources: add(self.used.resources, want),
                emulated_vm_slots: self.used.emulated_vm_slots + want_vm_slots,
            };
            self.running += 1;
            self.stream.emit(Event::FileDispatched(FileDispatched {
                path,
                reservation: want,
            }));
            executor::spawn(
                job.env,
                reservation,
                self.executor.clone(),
                self.to_dispatcher.clone(),
            );
        }
    }

    fn handle(&mut self, message: ExecutorMessage) {
        match message {
            ExecutorMessage::Lifecycle(Stamped { ts, event }) => {
                if let Lifecycle::FileStarted { path } = &event {
                    self.report(RunEvent::FileStarted { path: path.clone() });
                }
                if let Some(wire) = wire_event(event) {
                    self.stream.emit_at(ts, wire);
                }
            }
            ExecutorMessage::FileFinished {
                outcome,
                reservation,
            } => {
                self.used = Reservation {
                    resources: sub(self.used.resources, reservation.resources),
                    emulated_vm_slots: self.used.emulated_vm_slots - reservation.emulated_vm_slots,
                };
                self.running -= 1;
                self.stream.emit(Event::FileCompleted(FileCompleted {
                    path: outcome.path.clone(),
                    status: outcome.status(),
                    duration_ns: outcome.duration.as_nanos() as u64,
                }));
                if self.opts.fail_fast && !outcome.passed() {
                    self.stop = true;
                }
                self.report(RunEvent::FileFinished(outcome.report()));
                self.outcomes.push(outcome);
            }
        }
    }
}

/// The stream's form of a lifecycle event (none for `FileStarted`, which
/// only the reporters hear of). A test's end becomes the variant of its
/// status: the executor decided it, this only spells it.
fn wire_event(event: Lifecycle) -> Option<Event> {
    Some(match event {
        Lifecycle::FileStarted { .. } => return None,
        Lifecycle::TestStarted(e) => Event::TestStarted(e),
        Lifecycle::TestFinished {
            path,
            test,
            console_excerpt,
        } => {
            let duration_ns = test.duration.as_nanos() as u64;
            let reason = test.message.unwrap_or_default();
            let (name, meta) = (test.name, test.meta);
            match test.status {
                TestStatus::Passed => Event::TestPassed(TestPassed {
                    path,
                    name,
                    duration_ns,
                    meta,
                }),
                TestStatus::Failed => Event::TestFailed(TestFailed {
                    path,
                    name,
                    duration_ns,
                    reason,
                    console_excerpt,
                    meta,
                }),
                TestStatus::Skipped => Event::TestSkipped(TestSkipped {
                    path,
                    name,
                    reason,
                    meta,
                }),
            }
        }
        Lifecycle::FixtureBuildStarted(e) => Event::FixtureBuildStarted(e),
        Lifecycle::FixtureBuildWaiting(e) => Event::FixtureBuildWaiting(e),
        Lifecycle::FixtureBuildDone(e) => Event::FixtureBuildDone(e),
        Lifecycle::FixtureCacheHit(e) => Event::FixtureCacheHit(e),
        Lifecycle::VmSpawned(e) => Event::VmSpawned(e),
        Lifecycle::VmShutdown(e) => Event::VmShutdown(e),
        Lifecycle::VmForked(e) => Event::VmForked(e),
        Lifecycle::ClaimAcquired(e) => Event::ClaimAcquired(e),
        Lifecycle::ClaimReleased(e) => Event::ClaimReleased(e),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use crate::events::EventBus;
    use crate::runner::file::TestRun;
    use crate::runner::BackendKind;
    use crate::scheduler::test_utils::{passed, Scripted, ScriptedFactory, SKIP_REASON};
    use provium_protocol::EventFrame;

    /// docs/harness.md states the per-file reservation; it must be the code's.
    #[test]
    fn the_docs_state_the_per_file_reservation() {
        let doc = include_str!("../../../docs/harness.md");
        let text = doc.split_whitespace().collect::<Vec<_>>().join(" ");
        let want = format!(
            "Each file reserves {} MiB and {} vCPU",
            RUNNER_OVERHEAD.memory_bytes >> 20,
            RUNNER_OVERHEAD.cpus
        );
        assert!(text.contains(&want), "docs/harness.md must say: {want}");
    }

    struct Fixed(bool);
    impl Pressure for Fixed {
        fn high(&mut self) -> bool {
            self.0
        }
    }

    /// Records the events it is given.
    #[derive(Default)]
    struct Recorder(Vec<RunEvent>);
    impl Reporter for Recorder {
        fn report(&mut self, event: &RunEvent) -> Result<(), ReportError> {
            self.0.push(event.clone());
            Ok(())
        }
    }

    fn jobs(
        dir: &std::path::Path,
        n: usize,
        claim: Option<ResourceAmount>,
        d: &Dispatcher,
    ) -> Vec<Job> {
        (0..n)
            .map(|i| {
                let p = dir.join(format!("f{i}.test.lua"));
                let env = FileEnv::new(
                    format!("f{i}.test.lua"),
                    p,
                    vec![],
                    Arc::new(Config::defaults(dir, &Default::default())),
                    crate::backend::for_kind(BackendKind::Local),
                    d.event_sender(),
                );
                Job {
                    env: Arc::new(env),
                    claim,
                    fixture_refs: vec![format!("fx{i}")],
                    vms: 1,
                }
            })
            .collect()
    }

    fn blocked_reasons(kept: &[EventFrame]) -> Vec<String> {
        kept.iter()
            .filter_map(|f| match &f.event {
                Event::FileBlocked(b) => Some(b.reason.clone()),
                _ => None,
            })
            .collect()
    }

    fn run(
        n: usize,
        claim: Option<ResourceAmount>,
        pool: ResourceAmount,
        high: bool,
    ) -> Vec<String> {
        run_with_slots(n, claim, pool, high, None)
    }

    /// What one dispatcher run wrote to the stream and told its reporter.
    struct Ran {
        frames: Vec<EventFrame>,
        reported: Vec<RunEvent>,
        summary: RunSummary,
    }

    /// Run `n` files of `script` through a dispatcher.
    fn run_script(
        n: usize,
        claim: Option<ResourceAmount>,
        pool: ResourceAmount,
        high: bool,
        emulated_vm_slots: Option<u32>,
        script: Scripted,
    ) -> Ran {
        let dir = tempfile::tempdir().unwrap();
        let bus = EventBus::start(None, false, None, true).unwrap();
        let opts = DispatcherOptions {
            identity: RunIdentity {
                run_id: "r".into(),
                suite_id: "s".into(),
                suite_files: u32::try_from(n).unwrap(),
                partition: None,
            },
            pool,
            fail_fast: false,
            emulated_vm_slots,
            run_started: Instant::now(),
            run_resources: RunResources::default(),
        };
        let executor = ExecutorContext {
            filter: Arc::default(),
            file_timeout: None,
            runtimes: Arc::new(ScriptedFactory::every_file(script)),
        };
        let mut recorder = Recorder::default();
        let mut pressure = Fixed(high);
        let d = Dispatcher::new(opts, executor, bus.sender(), &mut pressure, &mut recorder);
        let jobs = jobs(dir.path(), n, claim, &d);
        let summary = d.run(jobs);
        Ran {
            frames: bus.finish().unwrap(),
            reported: recorder.0,
            summary,
        }
    }

    fn run_with_slots(
        n: usize,
        claim: Option<ResourceAmount>,
        pool: ResourceAmount,
        high: bool,
        emulated_vm_slots: Option<u32>,
    ) -> Vec<String> {
        // Long enough for files to overlap, so the pool fills.
        let script = Scripted {
            run_time: Duration::from_millis(50),
            ..Scripted::new(&["t"], vec![passed()])
        };
        let ran = run_script(n, claim, pool, high, emulated_vm_slots, script);
        let out = ran.summary;
        assert_eq!(out.outcomes.len(), n);
        assert!(out.outcomes.iter().all(|o| o.passed()));
        assert!(out.report_error.is_none());
        // Reporters hear of every file, between the run's start and end.
        let r = &ran.reported;
        assert_eq!(r.first(), Some(&RunEvent::RunStarted { file_count: n }));
        assert!(matches!(r.last(), Some(RunEvent::RunFinished { .. })));
        let started = r
            .iter()
            .filter(|e| matches!(e, RunEvent::FileStarted { .. }))
            .count();
        let finished = r
            .iter()
            .filter(|e| matches!(e, RunEvent::FileFinished(f) if f.passed()))
            .count();
        assert_eq!((started, finished), (n, n));
        blocked_reasons(&ran.frames)
    }

    /// The stream's kinds for file `path` (or run-wide ones), in order.
    fn kinds_of(frames: &[EventFrame], path: &str) -> Vec<&'static str> {
        frames
            .iter()
            .filter(|f| {
                let e = serde_json::to_value(f).unwrap();
                let payload = &e["payload"];
                [&payload["path"], &payload["file"]]
                    .iter()
                    .any(|p| p.as_str() == Some(path))
            })
            .map(|f| f.event.kind().as_str())
            .collect()
    }

    #[test]
    fn every_lifecycle_event_reaches_the_stream_through_the_dispatcher_in_order() {
        let vm = |path: &str| {
            Lifecycle::VmSpawned(provium_protocol::event::VmSpawned {
                file: path.into(),
                vm_name: "a".into(),
                profile: "default".into(),
                memory_bytes: 1 << 20,
                cid: 3,
            })
        };
        // Each file: a passing test that boots a VM (sent from below the
        // executor, as the Lua layer does), a failing one, a skipped one.
        let failed = Ok(TestRun {
            status: TestStatus::Failed,
            message: Some("boom".into()),
            log: vec![],
        });
        let script = Scripted {
            sends: vec![Some(vm), None, None],
            skip: vec![2],
            ..Scripted::new(&["a", "b", "c"], vec![passed(), failed, passed()])
        };
        let pool = ResourceAmount {
            memory_bytes: 8 << 30,
            cpus: 8,
        };
        let ran = run_script(2, None, pool, false, None, script);
        let frames = &ran.frames;
        assert!(matches!(&frames[0].event, Event::RunStarted(r) if r.run_id == "r"));
        for i in 0..2 {
            let path = format!("f{i}.test.lua");
            assert_eq!(
                kinds_of(frames, &path),
                [
                    "file_discovered",
                    "file_dispatched",
                    "test_started",
                    "vm_spawned",
                    "test_passed",
                    "test_started",
                    "test_failed",
                    "test_skipped",
                    "file_completed",
                ],
                "{frames:#?}"
            );
            let discovered = frames.iter().find_map(|f| match &f.event {
                Event::FileDiscovered(d) if d.path == path => Some(d),
                _ => None,
            });
            assert_eq!(discovered.unwrap().fixture_refs, [format!("fx{i}")]);
        }
        // Every file was discovered before the first dispatch.
        let first_dispatch = frames
            .iter()
            .position(|f| f.event.kind().as_str() == "file_dispatched")
            .unwrap();
        let discovered = frames
            .iter()
            .rposition(|f| f.event.kind().as_str() == "file_discovered");
        assert!(discovered.unwrap() < first_dispatch);
        // The failure's reason and the skip's are the executor's.
        assert!(frames.iter().any(|f| matches!(&f.event,
            Event::TestFailed(t) if t.reason == "boom" && t.name == "b")));
        assert!(frames.iter().any(|f| matches!(&f.event,
            Event::TestSkipped(t) if t.reason == SKIP_REASON && t.name == "c")));
        // The reporters heard of each file once it started, before its end.
        for i in 0..2 {
            let path = format!("f{i}.test.lua");
            let at = |want: fn(&RunEvent, &str) -> bool| {
                ran.reported.iter().position(|e| want(e, &path)).unwrap()
            };
            let started = at(|e, p| matches!(e, RunEvent::FileStarted { path } if path == p));
            let finished = at(|e, p| matches!(e, RunEvent::FileFinished(f) if f.path == p));
            assert!(started < finished);
        }
    }

    /// The lifecycle event a producer would send for `event`, where one
    /// does (the inverse of [`wire_event`], for the pins below).
    fn lifecycle_of(event: &Event) -> Option<Lifecycle> {
        use crate::report::run_event::TestReport;
        let ended = |path, name, status, message, duration_ns, meta, console_excerpt| {
            let duration = Duration::from_nanos(duration_ns);
            let test = TestReport {
                name,
                status,
                message,
                log: vec![],
                duration,
                meta,
            };
            Lifecycle::TestFinished {
                path,
                test,
                console_excerpt,
            }
        };
        let (passed, failed, skipped) =
            (TestStatus::Passed, TestStatus::Failed, TestStatus::Skipped);
        Some(match event.clone() {
            Event::TestStarted(e) => Lifecycle::TestStarted(e),
            Event::TestPassed(t) => ended(
                t.path,
                t.name,
                passed,
                None,
                t.duration_ns,
                t.meta,
                String::new(),
            ),
            Event::TestFailed(t) => ended(
                t.path,
                t.name,
                failed,
                Some(t.reason),
                t.duration_ns,
                t.meta,
                t.console_excerpt,
            ),
            Event::TestSkipped(t) => ended(
                t.path,
                t.name,
                skipped,
                Some(t.reason),
                0,
                t.meta,
                String::new(),
            ),
            Event::FixtureBuildStarted(e) => Lifecycle::FixtureBuildStarted(e),
            Event::FixtureBuildWaiting(e) => Lifecycle::FixtureBuildWaiting(e),
            Event::FixtureBuildDone(e) => Lifecycle::FixtureBuildDone(e),
            Event::FixtureCacheHit(e) => Lifecycle::FixtureCacheHit(e),
            Event::VmSpawned(e) => Lifecycle::VmSpawned(e),
            Event::VmShutdown(e) => Lifecycle::VmShutdown(e),
            Event::VmForked(e) => Lifecycle::VmForked(e),
            Event::ClaimAcquired(e) => Lifecycle::ClaimAcquired(e),
            Event::ClaimReleased(e) => Lifecycle::ClaimReleased(e),
            _ => return None,
        })
    }

    fn unhex(s: &str) -> Vec<u8> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    /// The protocol's pins lock each event's bytes; the dispatcher's route
    /// (a producer's `Lifecycle`, stamped, turned back into a wire event)
    /// writes exactly those bytes for every event a producer sends.
    #[test]
    fn the_dispatchers_route_writes_the_pinned_bytes() {
        let pins = include_str!("../../../protocol/tests/pins.txt");
        let mut routed = Vec::new();
        for line in pins.lines().filter(|l| l.starts_with("event.")) {
            let mut cols = line.split(" | ");
            let (name, hex) = (cols.next().unwrap(), cols.next().unwrap());
            let pinned = unhex(hex);
            let frame: EventFrame = provium_protocol::decode(&pinned).unwrap();
            let Some(lifecycle) = lifecycle_of(&frame.event) else {
                continue;
            };
            let wire = wire_event(lifecycle).expect("a producer's event reaches the wire");
            let written = provium_protocol::encode(&EventFrame {
                ts: frame.ts,
                event: wire,
            })
            .unwrap();
            assert_eq!(written, pinned, "{name}");
            routed.push(name);
        }
        // Every kind a producer sends (all but the dispatcher's own six).
        assert_eq!(routed.len(), 13, "{routed:?}");
        assert_eq!(
            wire_event(Lifecycle::FileStarted { path: "f".into() }),
            None
        );
    }

    #[test]
    fn parses_psi_lines() {
        let text = "some avg10=12.50 avg60=1.00 avg300=0.00 total=1\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=0\n";
        assert_eq!(PsiMonitor::some_avg10(text), Some(12.5));
        assert_eq!(PsiMonitor::some_avg10("garbage"), None);
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("cpu"), text).unwrap();
        assert!(PsiMonitor::new(dir.path()).high());
        assert!(!PsiMonitor::new(dir.path().join("absent")).high());
    }

    #[test]
    fn emulated_vms_get_a_host_core_each() {
        let pool = ResourceAmount {
            memory_bytes: 64 << 30,
            cpus: 64,
        };
        // Three one-VM files, two cores: the third waits for a slot, and
        // says so; the roomy pool never blocks anything.
        let reasons = run_with_slots(3, None, pool, false, Some(2));
        assert!(
            !reasons.is_empty() && reasons.iter().all(|r| r == EMULATED_VM_SLOTS_REASON),
            "{reasons:?}"
        );
        // Without slots (hardware KVM, local) all three go at once.
        assert!(run_with_slots(3, None, pool, false, None).is_empty());
        // One slot: every file waits for the one before it, but all run.
        let reasons = run_with_slots(3, None, pool, false, Some(1));
        assert!(!reasons.is_empty(), "{reasons:?}");
        // CPU pressure (which emulated VMs cause themselves) does not
        // serialise files that have a slot each.
        assert!(run_with_slots(2, None, pool, true, Some(2)).is_empty());
    }

    #[test]
    fn a_full_pool_blocks_in_fifo_order() {
        let claim = ResourceAmount {
            memory_bytes: 1 << 30,
            cpus: 2,
        };
        let pool = ResourceAmount {
            memory_bytes: 3 << 30,
            cpus: 2,
        };
        let reasons = run(3, Some(claim), pool, false);
        assert!(
            !reasons.is_empty() && reasons.iter().all(|r| r == "pool_full"),
            "{reasons:?}"
        );
    }

    #[test]
    fn pressure_pauses_new_dispatches_but_never_stalls() {
        let pool = ResourceAmount {
            memory_bytes: 8 << 30,
            cpus: 8,
        };
        let reasons = run(3, None, pool, true);
        assert!(reasons.iter().any(|r| r == "psi_pressure"), "{reasons:?}");
        assert!(run(3, None, pool, false).is_empty());
    }
}
