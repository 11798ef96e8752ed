//! The dispatcher: files run in FIFO order against a pool of memory and
//! vCPUs. Each file reserves the runner overhead plus its declared claim;
//! a file that does not fit waits (`file_blocked`), and `pool_state` is
//! emitted once a second.
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
    Event, FileBlocked, FileCompleted, FileDispatched, PoolState, ResourceAmount,
};

use super::file::run_file;
use super::filter::TestFilter;
use super::outcome::FileOutcome;
use super::FileEnv;
use crate::events::EventSender;

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
pub struct SchedulerOptions {
    pub pool: ResourceAmount,
    pub fail_fast: bool,
    pub file_timeout: Option<Duration>,
    /// Host cores for emulated VMs: `Some(n)` where each running VM needs a
    /// core to itself (the kvm backend on kvm_pvm), `None` elsewhere.
    pub emulated_vm_slots: Option<u32>,
}

pub struct Job {
    pub env: Arc<FileEnv>,
    pub claim: Option<ResourceAmount>,
    /// The VMs the file creates (`discover::vm_estimate`).
    pub vms: u32,
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

/// Run every job; `on_done` sees each outcome as it completes (for live
/// output). Returns the outcomes in completion order.
pub fn run_jobs(
    jobs: Vec<Job>,
    filter: Arc<TestFilter>,
    opts: &SchedulerOptions,
    events: &EventSender,
    pressure: &mut dyn Pressure,
    mut on_start: impl FnMut(&FileEnv),
    mut on_done: impl FnMut(&FileOutcome),
) -> Vec<FileOutcome> {
    let mut queue: VecDeque<Job> = jobs.into();
    let (tx, rx) = mpsc::channel::<(FileOutcome, ResourceAmount, u32)>();
    let mut used = ResourceAmount::default();
    let mut used_vm_slots = 0u32;
    let mut running = 0usize;
    let mut outcomes = Vec::new();
    let mut blocked_reported: Option<String> = None;
    let mut last_pool_state = Instant::now() - Duration::from_secs(1);
    let mut stop = false;
    let mut stop_interrupted = false;
    loop {
        // SIGINT/SIGTERM: no new files; the running ones stop (their
        // watchdogs cancel them) and report.
        if super::interrupt::received().is_some() && !stop_interrupted {
            stop = true;
            stop_interrupted = true;
            // Fixture builds' VMs too, which no file's watchdog tracks.
            super::tear_down_everything();
        }
        // Dispatch as many queued files as fit, in order.
        while let Some(job) = queue.front().filter(|_| !stop) {
            let want = add(RUNNER_OVERHEAD, job.claim.unwrap_or_default());
            let want_vm_slots = opts.emulated_vm_slots.map_or(0, |slots| job.vms.min(slots));
            // A file bigger than the whole pool still runs, alone; pressure
            // pauses new dispatches only while something else is running
            // (load from outside Provium must not stall the run forever).
            let slots_free = opts
                .emulated_vm_slots
                .is_none_or(|slots| used_vm_slots + want_vm_slots <= slots);
            let reason = if !(fits(used, want, opts.pool) || running == 0) {
                Some("pool_full")
            } else if !slots_free && running > 0 {
                Some(EMULATED_VM_SLOTS_REASON)
            } else if running > 0 && opts.emulated_vm_slots.is_none() && pressure.high() {
                // (With emulated VMs the slots are the CPU gate: each running
                // VM keeps its core 100 % busy by design, so CPU pressure is
                // always high and would serialise every file.)
                Some("psi_pressure")
            } else {
                None
            };
            if let Some(reason) = reason {
                let key = format!("{}\0{reason}", job.env.rel_path);
                if blocked_reported.as_deref() != Some(key.as_str()) {
                    events.emit(Event::FileBlocked(FileBlocked {
                        path: job.env.rel_path.clone(),
                        waiting_for: want,
                        reason: reason.into(),
                    }));
                    blocked_reported = Some(key);
                }
                break;
            }
            let job = queue.pop_front().unwrap();
            used = add(used, want);
            used_vm_slots += want_vm_slots;
            running += 1;
            events.emit(Event::FileDispatched(FileDispatched {
                path: job.env.rel_path.clone(),
                reservation: want,
            }));
            on_start(&job.env);
            let (tx, filter, timeout) = (tx.clone(), filter.clone(), opts.file_timeout);
            std::thread::spawn(move || {
                let outcome = run_file(job.env, filter, timeout);
                let _ = tx.send((outcome, want, want_vm_slots));
            });
        }
        if running == 0 && (queue.is_empty() || stop) {
            break;
        }
        if last_pool_state.elapsed() >= Duration::from_secs(1) {
            events.emit(Event::PoolState(PoolState {
                used,
                available: sub(opts.pool, used),
            }));
            last_pool_state = Instant::now();
        }
        match rx.recv_timeout(Duration::from_millis(250)) {
            Ok((outcome, reservation, vm_slots)) => {
                used = sub(used, reservation);
                used_vm_slots -= vm_slots;
                running -= 1;
                events.emit(Event::FileCompleted(FileCompleted {
                    path: outcome.path.clone(),
                    status: outcome.status(),
                    duration_ns: outcome.duration.as_nanos() as u64,
                }));
                if opts.fail_fast && !outcome.passed() {
                    stop = true;
                }
                on_done(&outcome);
                outcomes.push(outcome);
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
        }
    }
    outcomes
}

#[cfg(test)]
mod tests {
    use super::*;

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
    use crate::config::Config;
    use crate::events::EventBus;
    use crate::runner::BackendKind;

    struct Fixed(bool);
    impl Pressure for Fixed {
        fn high(&mut self) -> bool {
            self.0
        }
    }

    fn jobs(
        dir: &std::path::Path,
        n: usize,
        claim: Option<ResourceAmount>,
        events: &EventSender,
    ) -> Vec<Job> {
        (0..n)
            .map(|i| {
                let p = dir.join(format!("f{i}.test.lua"));
                std::fs::write(&p, "test('t', function() end)").unwrap();
                let env = FileEnv::new(
                    format!("f{i}.test.lua"),
                    p,
                    vec![],
                    Arc::new(Config::defaults(dir, &Default::default())),
                    BackendKind::Local,
                    events.clone(),
                );
                Job {
                    env: Arc::new(env),
                    claim,
                    vms: 1,
                }
            })
            .collect()
    }

    fn blocked_reasons(kept: &[provium_protocol::EventFrame]) -> Vec<String> {
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

    fn run_with_slots(
        n: usize,
        claim: Option<ResourceAmount>,
        pool: ResourceAmount,
        high: bool,
        emulated_vm_slots: Option<u32>,
    ) -> Vec<String> {
        let dir = tempfile::tempdir().unwrap();
        let bus = EventBus::start(None, false, None, true).unwrap();
        let events = bus.sender();
        let opts = SchedulerOptions {
            pool,
            fail_fast: false,
            file_timeout: None,
            emulated_vm_slots,
        };
        let out = run_jobs(
            jobs(dir.path(), n, claim, &events),
            Arc::default(),
            &opts,
            &events,
            &mut Fixed(high),
            |_| {},
            |_| {},
        );
        assert_eq!(out.len(), n);
        assert!(out.iter().all(|o| o.passed()));
        drop(events);
        blocked_reasons(&bus.finish().unwrap())
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
