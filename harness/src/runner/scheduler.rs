//! The dispatcher: files run in FIFO order against a pool of memory and
//! vCPUs. Each file reserves the runner overhead plus its declared claim;
//! a file that does not fit waits (`file_blocked`), and `pool_state` is
//! emitted once a second.

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

/// What running one file costs besides its claim: a Lua state and a thread.
pub const RUNNER_OVERHEAD: ResourceAmount = ResourceAmount {
    memory_bytes: 64 << 20,
    cpus: 1,
};

#[derive(Debug, Clone)]
pub struct SchedulerOptions {
    pub pool: ResourceAmount,
    pub fail_fast: bool,
    pub file_timeout: Option<Duration>,
}

pub struct Job {
    pub env: Arc<FileEnv>,
    pub claim: Option<ResourceAmount>,
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
    mut on_start: impl FnMut(&FileEnv),
    mut on_done: impl FnMut(&FileOutcome),
) -> Vec<FileOutcome> {
    let mut queue: VecDeque<Job> = jobs.into();
    let (tx, rx) = mpsc::channel::<(FileOutcome, ResourceAmount)>();
    let mut used = ResourceAmount::default();
    let mut running = 0usize;
    let mut outcomes = Vec::new();
    let mut blocked_reported: Option<String> = None;
    let mut last_pool_state = Instant::now() - Duration::from_secs(1);
    let mut stop = false;
    loop {
        // Dispatch as many queued files as fit, in order.
        while let Some(job) = queue.front().filter(|_| !stop) {
            let want = add(RUNNER_OVERHEAD, job.claim.unwrap_or_default());
            // A file bigger than the whole pool still runs, alone.
            if !(fits(used, want, opts.pool) || running == 0) {
                if blocked_reported.as_deref() != Some(job.env.rel_path.as_str()) {
                    events.emit(Event::FileBlocked(FileBlocked {
                        path: job.env.rel_path.clone(),
                        waiting_for: want,
                        reason: "pool_full".into(),
                    }));
                    blocked_reported = Some(job.env.rel_path.clone());
                }
                break;
            }
            let job = queue.pop_front().unwrap();
            used = add(used, want);
            running += 1;
            events.emit(Event::FileDispatched(FileDispatched {
                path: job.env.rel_path.clone(),
                reservation: want,
            }));
            on_start(&job.env);
            let (tx, filter, timeout) = (tx.clone(), filter.clone(), opts.file_timeout);
            std::thread::spawn(move || {
                let outcome = run_file(job.env, filter, timeout);
                let _ = tx.send((outcome, want));
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
            Ok((outcome, reservation)) => {
                used = sub(used, reservation);
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
