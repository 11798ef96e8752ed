//! The executor: runs one file on its own thread, with its runtime (the Lua
//! state, through `runner::file::FileRuntime`) and its VMs. Tests run in
//! declaration order, each in its own scope; a watchdog enforces the file
//! timeout and per-test timeouts by tearing the file's lab down. The
//! executor decides how each test ends and sends the dispatcher the file's
//! and its tests' lifecycle events (`Lifecycle::FileStarted`,
//! `TestStarted`, `TestFinished`; what runs below it sends VM, claim and
//! fixture events the same way, through the file's `EventSender`); when
//! the file is done it sends one [`ExecutorMessage::FileFinished`] and
//! touches nothing else of the run. It writes no event stream and calls no
//! reporter.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use provium_protocol::event::TestStarted;

use super::messages::{ExecutorMessage, Reservation};
use crate::events::Lifecycle;
use crate::lock::Locked;
use crate::runner::file::{FileRuntimeFactory, LoadFailure, TestFailure, TestRun, POISONED};
use crate::runner::filter::TestFilter;
use crate::runner::outcome::{FileOutcome, TestReport, TestStatus};
use crate::runner::{interrupt, CancelReason, FileEnv};

/// How the watchdog polls its deadlines and the interrupt flag.
const WATCHDOG_TICK: Duration = Duration::from_millis(20);

/// The thread stack of a file: deep Lua recursion in a test must not
/// overflow the runner.
const FILE_THREAD_STACK_BYTES: usize = 16 << 20;

/// What the executor needs to run any file of the run.
#[derive(Clone)]
pub struct ExecutorContext {
    pub filter: Arc<TestFilter>,
    pub file_timeout: Option<Duration>,
    pub runtimes: Arc<dyn FileRuntimeFactory>,
}

/// Start `env`'s file on its own thread: its `Lifecycle::FileStarted`
/// first (through `env.events`, the dispatcher's inbox), its lifecycle
/// events, then [`ExecutorMessage::FileFinished`] on `to_dispatcher`, with
/// `reservation` to give back.
pub fn spawn(
    env: Arc<FileEnv>,
    reservation: Reservation,
    ctx: ExecutorContext,
    to_dispatcher: mpsc::Sender<ExecutorMessage>,
) {
    std::thread::spawn(move || {
        env.events.send(Lifecycle::FileStarted {
            path: env.rel_path.clone(),
        });
        let outcome = run_file(env, &ctx);
        let _ = to_dispatcher.send(ExecutorMessage::FileFinished {
            outcome,
            reservation,
        });
    });
}

#[derive(Default)]
struct Deadlines {
    file: Option<(Instant, Duration)>,
    test: Option<(Instant, Duration)>,
}

/// Watches the deadlines and cancels the file's work when one passes.
struct Watchdog {
    deadlines: Arc<Mutex<Deadlines>>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Watchdog {
    fn start(env: Arc<FileEnv>, file_timeout: Option<Duration>) -> Watchdog {
        let deadlines = Arc::new(Mutex::new(Deadlines {
            file: file_timeout.map(|d| (Instant::now() + d, d)),
            test: None,
        }));
        let stop = Arc::new(AtomicBool::new(false));
        let (d, s) = (deadlines.clone(), stop.clone());
        let thread = std::thread::Builder::new()
            .name("provium-watchdog".into())
            .spawn(move || {
                let mut interrupted = false;
                while !s.load(Ordering::SeqCst) {
                    let now = Instant::now();
                    let fired = {
                        let mut dl = d.locked();
                        if let Some(sig) = interrupt::received().filter(|_| !interrupted) {
                            interrupted = true;
                            Some(CancelReason::Interrupted(sig))
                        } else if let Some((_, dur)) = dl.file.filter(|(at, _)| *at <= now) {
                            dl.file = None;
                            Some(CancelReason::FileTimeout(dur))
                        } else if let Some((_, dur)) = dl.test.filter(|(at, _)| *at <= now) {
                            dl.test = None;
                            Some(CancelReason::TestTimeout(dur))
                        } else {
                            None
                        }
                    };
                    if let Some(reason) = fired {
                        env.cancel(reason);
                    }
                    std::thread::sleep(WATCHDOG_TICK);
                }
            })
            .expect("spawn watchdog thread");
        Watchdog {
            deadlines,
            stop,
            thread: Some(thread),
        }
    }

    fn set_test_deadline(&self, timeout: Option<Duration>) {
        self.deadlines.locked().test = timeout.map(|d| (Instant::now() + d, d));
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Run one file to completion. Never panics: a panic inside the runner is
/// reported as a crashed file.
pub fn run_file(env: Arc<FileEnv>, ctx: &ExecutorContext) -> FileOutcome {
    let started = Instant::now();
    let (env2, ctx2) = (env.clone(), ctx.clone());
    let result = std::thread::Builder::new()
        .name(format!("provium-file {}", env.rel_path))
        .stack_size(FILE_THREAD_STACK_BYTES)
        .spawn(move || {
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run_file_inner(env2, &ctx2)))
        })
        .map_err(|e| format!("cannot start the file's runner thread: {e}"))
        .and_then(|h| h.join().map_err(|_| "runner thread died".to_string()));
    let mut outcome = match result {
        Ok(Ok(o)) => o,
        Ok(Err(panic)) => crashed(&env, describe_panic(&panic)),
        Err(msg) => crashed(&env, msg),
    };
    outcome.duration = started.elapsed();
    outcome
}

fn describe_panic(p: &Box<dyn std::any::Any + Send>) -> String {
    let text = p
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic payload".into());
    format!("the runner panicked: {text}")
}

fn empty_outcome(env: &FileEnv) -> FileOutcome {
    FileOutcome {
        path: env.rel_path.clone(),
        abs_path: env.abs_path.clone(),
        timed_out: false,
        chunk_error: None,
        crashed: None,
        tests: Vec::new(),
        duration: Duration::ZERO,
    }
}

fn crashed(env: &FileEnv, msg: String) -> FileOutcome {
    FileOutcome {
        crashed: Some(msg),
        ..empty_outcome(env)
    }
}

/// Call `f`, turning a panic into a failure that describes it.
fn unwind<T>(f: impl FnOnce() -> T) -> Result<T, TestFailure> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f))
        .map_err(|p| TestFailure::from(describe_panic(&p)))
}

fn run_file_inner(env: Arc<FileEnv>, ctx: &ExecutorContext) -> FileOutcome {
    let mut outcome = empty_outcome(&env);
    let watchdog = Watchdog::start(env.clone(), ctx.file_timeout);
    let mut runtime = match ctx.runtimes.open(env.clone()) {
        Ok(r) => r,
        Err(e) => {
            outcome.crashed = Some(format!("{e}: {}", e.0));
            return outcome;
        }
    };
    let loaded = match runtime.load() {
        Ok(l) => l,
        Err(failure) => {
            if matches!(failure, LoadFailure::Chunk(_))
                && matches!(env.cancel_reason(), Some(CancelReason::FileTimeout(_)))
            {
                outcome.timed_out = true;
            }
            outcome.chunk_error = Some(failure.message().to_string());
            if !matches!(failure, LoadFailure::Unreadable(_)) {
                runtime.close_all();
            }
            return outcome;
        }
    };

    // A panic inside a test (the runner's own failure, not the test's)
    // leaves the file's runtime and resources suspect: the test fails
    // with the panic, every later test is marked
    // `failed-due-to-poisoned-state` without running, and the file is
    // crashed (the reference's `file_completed` status).
    let mut poisoned: Option<String> = None;
    for (index, name) in loaded.test_names.into_iter().enumerate() {
        if let Some(why) = &poisoned {
            let meta = runtime.test_meta(index);
            let message = format!(
                "{POISONED}: not run, an earlier test in this file crashed the runner ({why})"
            );
            let report = TestReport {
                name,
                status: TestStatus::Failed,
                message: Some(message),
                log: Vec::new(),
                duration: Duration::ZERO,
                meta,
            };
            outcome.tests.push(finished(&env, report, String::new()));
            continue;
        }
        match env.cancel_reason() {
            Some(CancelReason::FileTimeout(_)) => {
                outcome.timed_out = true;
                break;
            }
            // The run is stopping: the rest of the file does not run.
            Some(CancelReason::Interrupted(_)) => break,
            _ => {}
        }
        let meta = runtime.test_meta(index);
        let skip = loaded
            .todo
            .clone()
            .or_else(|| ctx.filter.skip_reason(&meta));
        if let Some(reason) = skip {
            let report = TestReport {
                name,
                status: TestStatus::Skipped,
                message: Some(reason),
                log: Vec::new(),
                duration: Duration::ZERO,
                meta,
            };
            outcome.tests.push(finished(&env, report, String::new()));
            continue;
        }
        env.events.send(Lifecycle::TestStarted(TestStarted {
            path: env.rel_path.clone(),
            name: name.clone(),
            meta: meta.clone(),
        }));
        let started = Instant::now();
        // A failure's console excerpt is taken before the test's own VMs
        // are closed with its scope, so they are in it too.
        let mut excerpt: Option<String> = None;
        let TestRun {
            mut status,
            mut message,
            log,
        } = match runtime.test_timeout(index) {
            Err(e) => failed_run(e),
            Ok(timeout) => {
                watchdog.set_test_deadline(timeout);
                runtime.enter_test_scope();
                let r = unwind(|| runtime.run_test(index)).unwrap_or_else(|why| {
                    poisoned = Some(why.message.clone());
                    Err(why)
                });
                watchdog.set_test_deadline(None);
                if !matches!(
                    r,
                    Ok(TestRun {
                        status: TestStatus::Passed | TestStatus::Skipped,
                        ..
                    })
                ) {
                    excerpt = Some(console_excerpt(&env));
                }
                let left = unwind(|| runtime.leave_test_scope()).unwrap_or_else(|why| {
                    poisoned.get_or_insert_with(|| why.message.clone());
                    Err(why)
                });
                match (left, r) {
                    // Auto-close failures are reported on the test.
                    (
                        Err(e),
                        Ok(TestRun {
                            status: TestStatus::Passed,
                            log,
                            ..
                        }),
                    ) => TestRun {
                        status: TestStatus::Failed,
                        message: Some(e.message),
                        log,
                    },
                    (_, r) => r.unwrap_or_else(failed_run),
                }
            }
        };
        match env.clear_cancel() {
            Some(reason @ CancelReason::TestTimeout(_)) => {
                status = TestStatus::Failed;
                // A call that names the reason and what it was stuck on
                // (`guard_op`) is the better message.
                let why = reason.message();
                message = Some(match message {
                    Some(m) if m.contains(&why) => m,
                    _ => why,
                });
            }
            Some(reason @ CancelReason::FileTimeout(_)) => {
                status = TestStatus::Failed;
                message = Some(reason.message());
                outcome.timed_out = true;
                // Keep the flag set so nothing else runs.
                env.cancel(reason);
            }
            Some(reason @ CancelReason::Interrupted(_)) => {
                status = TestStatus::Failed;
                message = Some(reason.message());
                env.cancel(reason);
            }
            None => {}
        }
        // After every test, failed ones included: the next starts from the
        // baseline (not after a crash: nothing more runs).
        let restored = if poisoned.is_some() {
            Ok(())
        } else {
            runtime.restore_between_tests()
        };
        if let Err(e) = restored {
            if status == TestStatus::Passed || status == TestStatus::Skipped {
                status = TestStatus::Failed;
                message = Some(e.message);
            } else {
                message = Some(format!(
                    "{}\n(and restoring the reset_between_tests baseline failed: {e})",
                    message.unwrap_or_default()
                ));
            }
        }
        // Only a failure carries the console.
        let excerpt = if status == TestStatus::Failed {
            excerpt.unwrap_or_else(|| console_excerpt(&env))
        } else {
            String::new()
        };
        let report = TestReport {
            name,
            status,
            message,
            log,
            duration: started.elapsed(),
            meta,
        };
        outcome.tests.push(finished(&env, report, excerpt));
    }
    if let Some(CancelReason::FileTimeout(_)) = env.cancel_reason() {
        outcome.timed_out = true;
    }
    env.clear_cancel();
    if let Err(why) = unwind(|| runtime.close_all()) {
        poisoned.get_or_insert(why.message);
    }
    outcome.crashed = poisoned;
    drop(watchdog);
    outcome
}

/// A test the runtime could not run: failed with its message, no log.
fn failed_run(failure: TestFailure) -> TestRun {
    TestRun {
        status: TestStatus::Failed,
        message: Some(failure.message),
        log: Vec::new(),
    }
}

/// Tell the dispatcher how a test ended (it writes `test_passed` /
/// `test_failed` / `test_skipped`); `console_excerpt` is a failure's, else
/// empty. Returns the report, for the file's outcome.
fn finished(env: &FileEnv, report: TestReport, console_excerpt: String) -> TestReport {
    env.events.send(Lifecycle::TestFinished {
        path: env.rel_path.clone(),
        test: report.clone(),
        console_excerpt,
    });
    report
}

fn console_excerpt(env: &FileEnv) -> String {
    env.live_resources()
        .iter()
        .filter_map(|r| r.console_excerpt())
        .collect::<Vec<_>>()
        .join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use crate::events::EventSender;
    use crate::runner::BackendKind;
    use crate::scheduler::test_utils::{passed, Scripted, ScriptedFactory};

    fn run(script: Option<Scripted>) -> FileOutcome {
        let dir = tempfile::tempdir().unwrap();
        let env = FileEnv::new(
            "f.test.lua".into(),
            dir.path().join("f.test.lua"),
            vec![],
            Arc::new(Config::defaults(dir.path(), &Default::default())),
            crate::backend::for_kind(BackendKind::Local),
            EventSender::disabled(),
        );
        let ctx = ExecutorContext {
            filter: Arc::default(),
            file_timeout: None,
            runtimes: Arc::new(ScriptedFactory::once(script)),
        };
        run_file(Arc::new(env), &ctx)
    }

    #[test]
    fn a_panicking_test_poisons_the_rest_of_the_file() {
        let closed = Arc::new(AtomicBool::new(false));
        let s = Scripted {
            closed: closed.clone(),
            ..Scripted::new(&["a", "b", "c"], vec![passed(), Err("kaboom"), passed()])
        };
        let o = run(Some(s));
        let statuses: Vec<_> = o.tests.iter().map(|t| t.status).collect();
        assert_eq!(
            statuses,
            [TestStatus::Passed, TestStatus::Failed, TestStatus::Failed]
        );
        assert_eq!(o.tests[0].log, ["hello"]);
        assert!(o.tests[2].message.as_ref().unwrap().starts_with(POISONED));
        assert_eq!(
            o.crashed.as_deref(),
            Some("the runner panicked: kaboom"),
            "{o:?}"
        );
        assert!(closed.load(Ordering::SeqCst), "close_all still runs");
    }

    #[test]
    fn an_auto_close_failure_fails_a_passing_test() {
        let s = Scripted {
            leave_fails: true,
            ..Scripted::new(&["a"], vec![passed()])
        };
        let o = run(Some(s));
        assert_eq!(o.tests[0].status, TestStatus::Failed);
        assert_eq!(o.tests[0].message.as_deref(), Some("closing vm `a` failed"));
        assert_eq!(o.tests[0].log, ["hello"], "the test's log is kept");
    }

    #[test]
    fn load_failures_are_chunk_errors_and_setup_failures_crash() {
        let closed = Arc::new(AtomicBool::new(false));
        let s = Scripted {
            load: Err(LoadFailure::Chunk("syntax error near `end`".into())),
            closed: closed.clone(),
            ..Scripted::new(&[], vec![])
        };
        let o = run(Some(s));
        assert_eq!(o.chunk_error.as_deref(), Some("syntax error near `end`"));
        assert!(!o.timed_out && o.crashed.is_none());
        assert!(closed.load(Ordering::SeqCst));
        let o = run(None);
        assert_eq!(
            o.crashed.as_deref(),
            Some("cannot set up the Lua state: no more runtimes")
        );
    }
}
