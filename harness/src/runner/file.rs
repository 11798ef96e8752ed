//! The file runner: one Lua state per file, on its own thread; tests run in
//! declaration order, each in its own scope; a watchdog enforces the file
//! timeout and per-test timeouts by tearing the file's lab down.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use mlua::{Function, HookTriggers, Table, Value, VmState};
use provium_protocol::event::{Event, TestFailed, TestPassed, TestSkipped, TestStarted};

use super::filter::TestFilter;
use super::outcome::{FileOutcome, TestOutcome, TestStatus};
use super::{interrupt, CancelReason, FileEnv};
use crate::lua::{self, duration, meta::table_to_meta};

/// Bytes of each VM's console log attached to a failed test.
pub const CONSOLE_EXCERPT_BYTES: usize = 4096;

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
                        let mut dl = d.lock().unwrap();
                        if let Some(sig) = interrupt::received().filter(|_| !interrupted) {
                            interrupted = true;
                            Some(CancelReason::Interrupted(sig))
                        } else if let Some((at, dur)) = dl.file.filter(|(at, _)| *at <= now) {
                            let _ = at;
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
                    std::thread::sleep(Duration::from_millis(20));
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
        self.deadlines.lock().unwrap().test = timeout.map(|d| (Instant::now() + d, d));
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
pub fn run_file(
    env: Arc<FileEnv>,
    filter: Arc<TestFilter>,
    file_timeout: Option<Duration>,
) -> FileOutcome {
    let started = Instant::now();
    let env2 = env.clone();
    let result = std::thread::Builder::new()
        .name(format!("provium-file {}", env.rel_path))
        .stack_size(16 << 20)
        .spawn(move || {
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                run_file_inner(env2, &filter, file_timeout)
            }))
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

fn crashed(env: &FileEnv, msg: String) -> FileOutcome {
    FileOutcome {
        path: env.rel_path.clone(),
        abs_path: env.abs_path.clone(),
        timed_out: false,
        chunk_error: None,
        crashed: Some(msg),
        tests: Vec::new(),
        duration: Duration::ZERO,
    }
}

struct Entry {
    name: String,
    meta_table: Table,
    /// The registry's `{name, meta, fn}` table, handed back to `run_test`.
    table: Table,
}

fn run_file_inner(
    env: Arc<FileEnv>,
    filter: &TestFilter,
    file_timeout: Option<Duration>,
) -> FileOutcome {
    let mut outcome = FileOutcome {
        path: env.rel_path.clone(),
        abs_path: env.abs_path.clone(),
        timed_out: false,
        chunk_error: None,
        crashed: None,
        tests: Vec::new(),
        duration: Duration::ZERO,
    };
    let watchdog = Watchdog::start(env.clone(), file_timeout);
    let (lua, root) = match lua::new_state(env.clone()) {
        Ok(x) => x,
        Err(e) => {
            outcome.crashed = Some(format!("cannot set up the Lua state: {e}"));
            return outcome;
        }
    };
    // The watchdog's flag is checked between instructions so a busy Lua loop
    // stops too, not only calls blocked on a VM.
    let hook_env = env.clone();
    let _ = lua.set_global_hook(
        HookTriggers::new().every_nth_instruction(4096),
        move |_, _| {
            hook_env.check_cancelled()?;
            Ok(VmState::Continue)
        },
    );

    let source = match std::fs::read(&env.abs_path) {
        Ok(s) => s,
        Err(e) => {
            outcome.chunk_error = Some(format!("read `{}`: {e}", env.abs_path.display()));
            return outcome;
        }
    };
    let chunk_name = format!("@{}", env.rel_path);
    if let Err(e) = lua.load(&source).set_name(chunk_name).exec() {
        if let Some(CancelReason::FileTimeout(_)) = env.cancel_reason() {
            outcome.timed_out = true;
        }
        outcome.chunk_error = Some(lua::error_message(&e));
        root.close_all(&lua);
        return outcome;
    }
    let file_default_timeout = match root.file_timeout() {
        Ok(t) => t,
        Err(e) => {
            outcome.chunk_error = Some(lua::error_message(&e));
            root.close_all(&lua);
            return outcome;
        }
    };
    if let Err(e) = root.prepare_reset_between_tests() {
        outcome.chunk_error = Some(lua::error_message(&e));
        root.close_all(&lua);
        return outcome;
    }

    let framework: Table = lua
        .globals()
        .get("_provium_framework")
        .expect("framework installed");
    let registry: Table = framework.get("registry").expect("registry");
    let run_test: Function = framework.get("run_test").expect("run_test");
    let todo: Option<String> = registry.get("todo").unwrap_or(None);
    let entries: Vec<Entry> = registry
        .get::<Table>("tests")
        .map(|t| {
            t.sequence_values::<Table>()
                .flatten()
                .filter_map(|e| {
                    Some(Entry {
                        name: e.get("name").ok()?,
                        meta_table: e.get("meta").ok()?,
                        table: e,
                    })
                })
                .collect()
        })
        .unwrap_or_default();

    // A panic inside a test (the runner's own failure, not the test's)
    // leaves the file's Lua state and resources suspect: the test fails
    // with the panic, every later test is marked
    // `failed-due-to-poisoned-state` without running, and the file is
    // crashed (the reference's `file_completed` status).
    let mut poisoned: Option<String> = None;
    for entry in entries {
        if let Some(why) = &poisoned {
            let meta = table_to_meta(&entry.meta_table);
            let message = format!(
                "{POISONED}: not run, an earlier test in this file crashed the runner ({why})"
            );
            env.events.emit(Event::TestFailed(TestFailed {
                path: env.rel_path.clone(),
                name: entry.name.clone(),
                duration_ns: 0,
                reason: message.clone(),
                console_excerpt: String::new(),
                meta: meta.clone(),
            }));
            outcome.tests.push(TestOutcome {
                name: entry.name,
                status: TestStatus::Failed,
                message: Some(message),
                log: Vec::new(),
                duration: Duration::ZERO,
                meta,
            });
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
        let meta = table_to_meta(&entry.meta_table);
        let skip = todo.clone().or_else(|| filter.skip_reason(&meta));
        if let Some(reason) = skip {
            env.events.emit(Event::TestSkipped(TestSkipped {
                path: env.rel_path.clone(),
                name: entry.name.clone(),
                reason: reason.clone(),
                meta: meta.clone(),
            }));
            outcome.tests.push(TestOutcome {
                name: entry.name,
                status: TestStatus::Skipped,
                message: Some(reason),
                log: Vec::new(),
                duration: Duration::ZERO,
                meta,
            });
            continue;
        }
        env.events.emit(Event::TestStarted(TestStarted {
            path: env.rel_path.clone(),
            name: entry.name.clone(),
            meta: meta.clone(),
        }));
        let started = Instant::now();
        let test_timeout = match entry.meta_table.get::<Value>("timeout") {
            Ok(Value::Nil) | Err(_) => Ok(file_default_timeout),
            Ok(v) => duration::from_lua(&v, "meta.timeout").map(Some),
        };
        // A failure's console excerpt is taken before the test's own VMs
        // are closed with its scope, so they are in it too.
        let mut excerpt: Option<String> = None;
        let (mut status, mut message, log) = match test_timeout {
            Err(e) => (TestStatus::Failed, Some(lua::error_message(&e)), Vec::new()),
            Ok(timeout) => {
                watchdog.set_test_deadline(timeout);
                let scope = root.enter_test_scope(&lua);
                let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    run_one(&run_test, &entry)
                }))
                .unwrap_or_else(|panic| {
                    let why = describe_panic(&panic);
                    poisoned = Some(why.clone());
                    Err(why)
                });
                watchdog.set_test_deadline(None);
                if !matches!(r, Ok((TestStatus::Passed | TestStatus::Skipped, _, _))) {
                    excerpt = Some(console_excerpt(&env));
                }
                let left = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    root.leave_test_scope(&lua, scope)
                }))
                .unwrap_or_else(|panic| {
                    let why = describe_panic(&panic);
                    poisoned.get_or_insert_with(|| why.clone());
                    Err(why)
                });
                if let Err(e) = left {
                    // Auto-close failures are reported on the test.
                    match r {
                        Ok((TestStatus::Passed, _, log)) => (TestStatus::Failed, Some(e), log),
                        other => {
                            other.unwrap_or_else(|m| (TestStatus::Failed, Some(m), Vec::new()))
                        }
                    }
                } else {
                    r.unwrap_or_else(|m| (TestStatus::Failed, Some(m), Vec::new()))
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
            root.restore_between_tests()
        };
        if let Err(e) = restored {
            if status == TestStatus::Passed || status == TestStatus::Skipped {
                status = TestStatus::Failed;
                message = Some(e);
            } else {
                message = Some(format!(
                    "{}\n(and restoring the reset_between_tests baseline failed: {e})",
                    message.unwrap_or_default()
                ));
            }
        }
        let duration = started.elapsed();
        match status {
            TestStatus::Passed => env.events.emit(Event::TestPassed(TestPassed {
                path: env.rel_path.clone(),
                name: entry.name.clone(),
                duration_ns: duration.as_nanos() as u64,
                meta: meta.clone(),
            })),
            TestStatus::Failed => env.events.emit(Event::TestFailed(TestFailed {
                path: env.rel_path.clone(),
                name: entry.name.clone(),
                duration_ns: duration.as_nanos() as u64,
                reason: message.clone().unwrap_or_default(),
                console_excerpt: excerpt.take().unwrap_or_else(|| console_excerpt(&env)),
                meta: meta.clone(),
            })),
            TestStatus::Skipped => env.events.emit(Event::TestSkipped(TestSkipped {
                path: env.rel_path.clone(),
                name: entry.name.clone(),
                reason: message.clone().unwrap_or_default(),
                meta: meta.clone(),
            })),
        }
        outcome.tests.push(TestOutcome {
            name: entry.name,
            status,
            message,
            log,
            duration,
            meta,
        });
    }
    if let Some(CancelReason::FileTimeout(_)) = env.cancel_reason() {
        outcome.timed_out = true;
    }
    env.clear_cancel();
    let closed = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| root.close_all(&lua)));
    if let Err(panic) = closed {
        poisoned.get_or_insert_with(|| describe_panic(&panic));
    }
    outcome.crashed = poisoned;
    drop(watchdog);
    outcome
}

/// The reference's marking of the tests a crash kept from running.
pub const POISONED: &str = "failed-due-to-poisoned-state";

type RunResult = Result<(TestStatus, Option<String>, Vec<String>), String>;

fn run_one(run_test: &Function, entry: &Entry) -> RunResult {
    let (status, message, log) = run_test
        .call::<(String, Option<String>, Vec<String>)>(entry.table.clone())
        .map_err(|e| lua::error_message(&e))?;
    let status = match status.as_str() {
        "passed" => TestStatus::Passed,
        "skipped" => TestStatus::Skipped,
        _ => TestStatus::Failed,
    };
    Ok((status, message, log))
}

fn console_excerpt(env: &FileEnv) -> String {
    env.live_resources()
        .iter()
        .filter_map(|r| r.console_excerpt())
        .collect::<Vec<_>>()
        .join("\n")
}
