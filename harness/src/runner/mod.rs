//! What one test file needs from the run, shared by the scheduler
//! (`crate::scheduler`) and the Lua layer: the per-file environment
//! ([`FileEnv`]: paths, config, events, cancellation, auto-close scopes),
//! the test filter, the outcome types, the interrupt flag, and the
//! [`file::FileRuntime`] contract a file's runtime fulfils. Nothing here
//! names a Lua type: the Lua layer converts [`RunnerError`] into its own errors.

pub mod file;
pub mod filter;
pub mod interrupt;
pub mod outcome;

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use self::file::TestFailure;
use crate::backend::Backend;
use crate::config::Config;
use crate::events::EventSender;
use crate::file_digest::FileDigests;
use crate::lock::Locked;

/// Which backend creates VMs for this run (defined with the backends).
pub use crate::backend::BackendKind;

/// Something the watchdog can tear down (a VM) and read a console excerpt from.
pub trait LiveResource: Send + Sync {
    /// Kill it now; blocked calls on it return with an error.
    fn teardown(&self);
    /// Last bytes of its console log, if it has one and is booted.
    fn console_excerpt(&self) -> Option<String>;
}

/// What one run shares among its files: every live resource, fixture
/// builds' included (their build-time environments have no watchdog of
/// their own), so an interrupt can tear them all down at once; and the
/// digests of the host files fixture keys depend on, so a kernel is hashed
/// once per run, not once per key. One per run, shared by each of its
/// [`FileEnv`]s (and handed on to the environments derived from them); no
/// process-wide list.
#[derive(Clone, Default)]
pub struct RunResources {
    live: Arc<Mutex<Vec<Weak<dyn LiveResource>>>>,
    file_digests: FileDigests,
    verified_entries: crate::verified_entries::VerifiedEntries,
    /// The pool's budget (`--mem`, `--cpus`), where a run set one: what
    /// `vm:fork(n)` checks its n copies against.
    pool: Option<provium_protocol::ResourceAmount>,
}

impl std::fmt::Debug for RunResources {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let n = self.live.lock().map_or(0, |l| l.len());
        write!(f, "RunResources({n} tracked, {:?})", self.file_digests)
    }
}

impl RunResources {
    /// The run's resources under the pool budget `pool`.
    pub fn with_pool(pool: provium_protocol::ResourceAmount) -> RunResources {
        RunResources {
            pool: Some(pool),
            ..RunResources::default()
        }
    }

    /// The pool's budget, where the run has one.
    pub fn pool(&self) -> Option<provium_protocol::ResourceAmount> {
        self.pool
    }

    /// The run's memo of host-file digests, for fixture keys.
    pub fn file_digests(&self) -> &FileDigests {
        &self.file_digests
    }

    /// The run's memo of fixture cache entries that passed their
    /// whole-entry check (checked once per entry per run).
    pub fn verified_entries(&self) -> &crate::verified_entries::VerifiedEntries {
        &self.verified_entries
    }

    fn track(&self, r: Weak<dyn LiveResource>) {
        let mut all = self.live.locked();
        all.retain(|w| w.strong_count() > 0);
        all.push(r);
    }

    /// Tear down every live resource of the run (the run was interrupted).
    pub fn tear_down_all(&self) {
        let live: Vec<Arc<dyn LiveResource>> = self
            .live
            .locked()
            .iter()
            .filter_map(Weak::upgrade)
            .collect();
        for r in live {
            r.teardown();
        }
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
    fn auto_close(&self) -> Result<(), TestFailure>;
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

/// What the runner's own calls can fail with.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RunnerError {
    /// The watchdog cancelled the file's work (a timeout or a signal); the
    /// message says which, and what was torn down.
    #[error("{}", .0.message())]
    Cancelled(CancelReason),
    /// Cancelled, but the reason was cleared in between (the next test
    /// already started).
    #[error("cancelled")]
    CancelledWithoutReason,
}

/// Everything one file's Lua state needs from the run.
pub struct FileEnv {
    /// Test-root-relative path (shown in output and events).
    pub rel_path: String,
    pub abs_path: PathBuf,
    pub roots: Vec<PathBuf>,
    pub config: Arc<Config>,
    /// What boots this file's VMs: the run's backend value, shared by all
    /// its files (one CID allocator for the run).
    machines: Arc<dyn Backend>,
    /// Where this file's lifecycle events (tests, VMs, claims, fixtures)
    /// go: the dispatcher's inbox in a run (`crate::events`), nowhere
    /// outside one.
    pub events: EventSender,
    /// The run seed: every bridge's drop pattern derives from it (and the
    /// bridge name), so the same seed reproduces the same drops.
    pub run_seed: u64,
    /// Where this file's bridges number their kernel-path wires: one
    /// counter for all of them, since a sandbox on two bridges has both
    /// bridges' wires in its namespace.
    pub wire_numbers: provium_netsetup::WireNumbers,
    /// The run's resources, which this file's join.
    run_resources: RunResources,
    cancelled: AtomicBool,
    cancel_reason: Mutex<Option<CancelReason>>,
    live: Mutex<Vec<Weak<dyn LiveResource>>>,
    /// One entry per open scope (file, then the running test).
    scopes: Mutex<Vec<ScopeItems>>,
}

impl FileEnv {
    /// The environment of the file at `abs_path` (`rel_path` under one of
    /// `roots`), whose VMs `machines` boots: the run's backend, made once
    /// per run ([`crate::backend::for_kind`]) and handed to every file.
    pub fn new(
        rel_path: String,
        abs_path: PathBuf,
        roots: Vec<PathBuf>,
        config: Arc<Config>,
        machines: Arc<dyn Backend>,
        events: EventSender,
    ) -> Self {
        FileEnv {
            rel_path,
            abs_path,
            roots,
            config,
            machines,
            events,
            run_seed: 0,
            wire_numbers: provium_netsetup::WireNumbers::default(),
            run_resources: RunResources::default(),
            cancelled: AtomicBool::new(false),
            cancel_reason: Mutex::new(None),
            live: Mutex::new(Vec::new()),
            scopes: Mutex::new(vec![Vec::new()]),
        }
    }

    /// What boots this file's VMs; its capabilities are the guests'.
    pub fn machines(&self) -> &Arc<dyn Backend> {
        &self.machines
    }

    /// The backend's name, as `--vmm` spells it (`local`, `kvm`).
    pub fn backend_name(&self) -> &'static str {
        self.machines.capabilities().backend
    }

    /// Sets the run seed (see [`FileEnv::run_seed`]).
    pub fn with_run_seed(mut self, seed: u64) -> Self {
        self.run_seed = seed;
        self
    }

    /// Joins the run's resources (see [`RunResources`]); without it the
    /// file's resources are its own.
    pub fn with_run_resources(mut self, resources: RunResources) -> Self {
        self.run_resources = resources;
        self
    }

    /// The run's resources, for an environment derived from this one (a
    /// fixture build's).
    pub fn run_resources(&self) -> &RunResources {
        &self.run_resources
    }

    /// The run's memo of host-file digests (see [`RunResources`]): fixture
    /// keys computed through this environment share it.
    pub fn file_digests(&self) -> &FileDigests {
        self.run_resources.file_digests()
    }

    /// Register something to auto-close at the end of the current scope.
    /// The scope holds it (alive) until it ends.
    pub fn register_closeable(&self, kind: CloseKind, c: Arc<dyn Closeable>) {
        let mut scopes = self.scopes.locked();
        if let Some(top) = scopes.last_mut() {
            top.push((kind, c));
        }
    }

    pub fn push_scope(&self) {
        self.scopes.locked().push(Vec::new());
    }

    /// Close everything registered in the innermost scope, in [`CloseKind`]
    /// order (newest first within a kind); returns the first error.
    pub fn pop_scope(&self) -> Result<(), TestFailure> {
        let mut items = self.scopes.locked().pop().unwrap_or_default();
        if self.scopes.locked().is_empty() {
            self.scopes.locked().push(Vec::new());
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
        self.run_resources.track(r.clone());
        let mut live = self.live.locked();
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
        *self.cancel_reason.locked() = Some(reason);
        self.cancelled.store(true, Ordering::SeqCst);
        for r in self.live_resources() {
            r.teardown();
        }
    }

    /// Clear a per-test cancellation so the next test can run.
    pub fn clear_cancel(&self) -> Option<CancelReason> {
        self.cancelled.store(false, Ordering::SeqCst);
        self.cancel_reason.locked().take()
    }

    pub fn cancel_reason(&self) -> Option<CancelReason> {
        self.cancel_reason.locked().clone()
    }

    /// [`RunnerError::Cancelled`] once the watchdog fired, for calls to
    /// stop at (the Lua layer raises it as a Lua error).
    pub fn check_cancelled(&self) -> Result<(), RunnerError> {
        if self.cancelled.load(Ordering::SeqCst) {
            return Err(self
                .cancel_reason()
                .map_or(RunnerError::CancelledWithoutReason, RunnerError::Cancelled));
        }
        Ok(())
    }

    /// Sleep that wakes early (with an error) when the watchdog fires.
    pub fn sleep(&self, d: Duration) -> Result<(), RunnerError> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    /// Counts its teardowns.
    #[derive(Default)]
    struct Counted(AtomicUsize);
    impl LiveResource for Counted {
        fn teardown(&self) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
        fn console_excerpt(&self) -> Option<String> {
            None
        }
    }

    fn env(resources: &RunResources) -> FileEnv {
        FileEnv::new(
            "f.test.lua".into(),
            "/f.test.lua".into(),
            vec![],
            Arc::new(Config::defaults(
                std::path::Path::new("/"),
                &Default::default(),
            )),
            crate::backend::for_kind(BackendKind::Local),
            EventSender::disabled(),
        )
        .with_run_resources(resources.clone())
    }

    #[test]
    fn a_run_tears_down_only_its_own_resources() {
        let (ours, theirs) = (RunResources::default(), RunResources::default());
        let a = Arc::new(Counted::default());
        let b = Arc::new(Counted::default());
        let a_dyn: Arc<dyn LiveResource> = a.clone();
        let b_dyn: Arc<dyn LiveResource> = b.clone();
        env(&ours).track(Arc::downgrade(&a_dyn));
        env(&theirs).track(Arc::downgrade(&b_dyn));
        ours.tear_down_all();
        assert_eq!(a.0.load(Ordering::SeqCst), 1);
        assert_eq!(b.0.load(Ordering::SeqCst), 0);
    }

    #[test]
    fn every_file_boots_on_the_backend_it_is_given() {
        let machines = crate::backend::for_kind(BackendKind::Kvm);
        let config = Arc::new(Config::default());
        let file = |name: &str| {
            FileEnv::new(
                name.into(),
                PathBuf::from("/").join(name),
                vec![],
                config.clone(),
                machines.clone(),
                EventSender::disabled(),
            )
        };
        let (a, b) = (file("a.test.lua"), file("b.test.lua"));
        assert!(Arc::ptr_eq(a.machines(), &machines));
        assert!(
            Arc::ptr_eq(a.machines(), b.machines()),
            "one backend value (one CID allocator) for the run's files"
        );
        assert_eq!(a.backend_name(), "kvm");
    }

    #[test]
    fn cancelling_raises_the_reason_until_cleared() {
        let e = env(&RunResources::default());
        assert_eq!(e.check_cancelled(), Ok(()));
        e.cancel(CancelReason::FileTimeout(Duration::from_secs(2)));
        let err = e.check_cancelled().unwrap_err();
        assert_eq!(err.to_string(), "file timed out after 2.000s (--timeout)");
        assert!(
            e.sleep(Duration::from_secs(60)).is_err(),
            "sleep wakes early"
        );
        assert_eq!(
            e.clear_cancel(),
            Some(CancelReason::FileTimeout(Duration::from_secs(2)))
        );
        assert_eq!(e.check_cancelled(), Ok(()));
    }
}
