//! Running test files: the per-file environment, the file runner, the
//! watchdog, and the scheduler that dispatches files against the pool.

pub mod file;
pub mod filter;
pub mod interrupt;
pub mod outcome;
pub mod scheduler;

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use crate::backend::Backend;
use crate::config::Config;
use crate::events::EventSender;

/// Which backend creates VMs for this run (defined with the backends).
pub use crate::backend::BackendKind;

/// Something the watchdog can tear down (a VM) and read a console excerpt from.
pub trait LiveResource: Send + Sync {
    /// Kill it now; blocked calls on it return with an error.
    fn teardown(&self);
    /// Last bytes of its console log, if it has one and is booted.
    fn console_excerpt(&self) -> Option<String>;
}

/// Every resource any [`FileEnv`] tracks, fixture builds' included (their
/// build-time environments have no watchdog of their own), for
/// [`tear_down_everything`].
static ALL_LIVE: Mutex<Vec<Weak<dyn LiveResource>>> = Mutex::new(Vec::new());

/// Tear down every live resource of the run (the run was interrupted).
pub fn tear_down_everything() {
    let live: Vec<Arc<dyn LiveResource>> = ALL_LIVE
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .iter()
        .filter_map(Weak::upgrade)
        .collect();
    for r in live {
        r.teardown();
    }
}

/// Auto-close order within a scope: streams first, VMs last, so nothing is
/// closed while something that depends on it is still open.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum CloseKind {
    Stream,
    Process,
    File,
    Worker,
    Bridge,
    Vm,
}

/// A userdata the harness closes when its scope (a test, or the file) ends.
pub trait Closeable: Send + Sync {
    /// Idempotent; an error is reported on the test (or file) that owned it.
    fn auto_close(&self) -> Result<(), String>;
}

/// What one scope closes when it ends.
type ScopeItems = Vec<(CloseKind, Arc<dyn Closeable>)>;

/// Why the file's work was cancelled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CancelReason {
    TestTimeout(Duration),
    FileTimeout(Duration),
    /// The run got SIGINT or SIGTERM (the signal number).
    Interrupted(i32),
}

impl CancelReason {
    pub fn message(&self) -> String {
        match self {
            CancelReason::TestTimeout(d) => format!(
                "test timed out after {:.3}s; the watchdog tore the file's lab down",
                d.as_secs_f64()
            ),
            CancelReason::FileTimeout(d) => {
                format!("file timed out after {:.3}s (--timeout)", d.as_secs_f64())
            }
            CancelReason::Interrupted(sig) => format!(
                "the run was interrupted by {}; the file's lab was torn down",
                interrupt::signal_name(*sig)
            ),
        }
    }
}

/// Everything one file's Lua state needs from the run.
pub struct FileEnv {
    /// Test-root-relative path (shown in output and events).
    pub rel_path: String,
    pub abs_path: PathBuf,
    pub roots: Vec<PathBuf>,
    pub config: Arc<Config>,
    pub backend: BackendKind,
    /// What boots this file's VMs (see [`FileEnv::with_machines`]).
    machines: Arc<dyn Backend>,
    pub events: EventSender,
    /// The run seed: every bridge's drop pattern derives from it (and the
    /// bridge name), so the same seed reproduces the same drops.
    pub run_seed: u64,
    cancelled: AtomicBool,
    cancel_reason: Mutex<Option<CancelReason>>,
    live: Mutex<Vec<Weak<dyn LiveResource>>>,
    /// One entry per open scope (file, then the running test).
    scopes: Mutex<Vec<ScopeItems>>,
}

impl FileEnv {
    pub fn new(
        rel_path: String,
        abs_path: PathBuf,
        roots: Vec<PathBuf>,
        config: Arc<Config>,
        backend: BackendKind,
        events: EventSender,
    ) -> Self {
        FileEnv {
            rel_path,
            abs_path,
            roots,
            config,
            backend,
            machines: crate::backend::for_kind(backend),
            events,
            run_seed: 0,
            cancelled: AtomicBool::new(false),
            cancel_reason: Mutex::new(None),
            live: Mutex::new(Vec::new()),
            scopes: Mutex::new(vec![Vec::new()]),
        }
    }

    /// Shares the run's backend value (its CID allocator among them)
    /// instead of the fresh one `new` makes for `backend`: a run makes one
    /// ([`crate::backend::for_kind`]) and hands it to every file.
    pub fn with_machines(mut self, machines: Arc<dyn Backend>) -> Self {
        self.machines = machines;
        self
    }

    /// What boots this file's VMs; its capabilities are the guests'.
    pub fn machines(&self) -> &Arc<dyn Backend> {
        &self.machines
    }

    /// Sets the run seed (see [`FileEnv::run_seed`]).
    pub fn with_run_seed(mut self, seed: u64) -> Self {
        self.run_seed = seed;
        self
    }

    /// Register something to auto-close at the end of the current scope.
    /// The scope holds it (alive) until it ends.
    pub fn register_closeable(&self, kind: CloseKind, c: Arc<dyn Closeable>) {
        let mut scopes = self.scopes.lock().unwrap();
        if let Some(top) = scopes.last_mut() {
            top.push((kind, c));
        }
    }

    pub fn push_scope(&self) {
        self.scopes.lock().unwrap().push(Vec::new());
    }

    /// Close everything registered in the innermost scope, in [`CloseKind`]
    /// order (newest first within a kind); returns the first error.
    pub fn pop_scope(&self) -> Result<(), String> {
        let mut items = self.scopes.lock().unwrap().pop().unwrap_or_default();
        if self.scopes.lock().unwrap().is_empty() {
            self.scopes.lock().unwrap().push(Vec::new());
        }
        items.reverse();
        items.sort_by_key(|(k, _)| *k);
        let mut first_err = None;
        for (_, c) in items {
            if let Err(e) = c.auto_close() {
                first_err.get_or_insert(e);
            }
        }
        first_err.map_or(Ok(()), Err)
    }

    /// Register a resource for watchdog teardown and console excerpts.
    pub fn track(&self, r: Weak<dyn LiveResource>) {
        {
            let mut all = ALL_LIVE.lock().unwrap_or_else(|p| p.into_inner());
            all.retain(|w| w.strong_count() > 0);
            all.push(r.clone());
        }
        let mut live = self.live.lock().unwrap();
        live.retain(|w| w.strong_count() > 0);
        live.push(r);
    }

    pub fn live_resources(&self) -> Vec<Arc<dyn LiveResource>> {
        self.live
            .lock()
            .unwrap()
            .iter()
            .filter_map(Weak::upgrade)
            .collect()
    }

    /// Called by the watchdog: flag the cancellation and kill every VM so
    /// that calls blocked on an agent return.
    pub fn cancel(&self, reason: CancelReason) {
        *self.cancel_reason.lock().unwrap() = Some(reason);
        self.cancelled.store(true, Ordering::SeqCst);
        for r in self.live_resources() {
            r.teardown();
        }
    }

    /// Clear a per-test cancellation so the next test can run.
    pub fn clear_cancel(&self) -> Option<CancelReason> {
        self.cancelled.store(false, Ordering::SeqCst);
        self.cancel_reason.lock().unwrap().take()
    }

    pub fn cancel_reason(&self) -> Option<CancelReason> {
        self.cancel_reason.lock().unwrap().clone()
    }

    /// An error to raise in Lua when the watchdog fired.
    pub fn check_cancelled(&self) -> mlua::Result<()> {
        if self.cancelled.load(Ordering::SeqCst) {
            let msg = self
                .cancel_reason()
                .map(|r| r.message())
                .unwrap_or_else(|| "cancelled".into());
            return Err(mlua::Error::runtime(msg));
        }
        Ok(())
    }

    /// Sleep that wakes early (with an error) when the watchdog fires.
    pub fn sleep(&self, d: Duration) -> mlua::Result<()> {
        let end = Instant::now() + d;
        loop {
            self.check_cancelled()?;
            let now = Instant::now();
            if now >= end {
                return Ok(());
            }
            std::thread::sleep((end - now).min(Duration::from_millis(20)));
        }
    }
}
