//! Test doubles for the scheduler: a scripted [`FileRuntime`] and the
//! factory that hands it out, so the dispatcher and executor are tested
//! without Lua.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use provium_protocol::meta::{MetaMap, MetaValue};

use crate::events::Lifecycle;
use crate::lock::Locked;
use crate::runner::file::{
    FileRuntime, FileRuntimeFactory, LoadFailure, LoadedFile, RuntimeSetupError, TestFailure,
    TestRun,
};
use crate::runner::outcome::TestStatus;
use crate::runner::FileEnv;

/// An event a test body sends, made from its file's path.
pub type SendsEvent = fn(&str) -> Lifecycle;

/// The skip reason of a test [`Scripted::skip`] lists (its `meta.skip`).
pub const SKIP_REASON: &str = "skipped: scripted";

/// A runtime whose tests return what the script says; an `Err` run panics
/// with its text.
#[derive(Clone)]
pub struct Scripted {
    /// Per test: an event its body sends through the file's `EventSender`
    /// (given the file's path), as the Lua layer does when a VM boots.
    pub sends: Vec<Option<SendsEvent>>,
    /// Tests declared `meta.skip` ([`SKIP_REASON`]): the filter skips them.
    pub skip: Vec<usize>,
    /// The file it runs (set by the factory).
    pub env: Option<Arc<FileEnv>>,
    pub load: Result<LoadedFile, LoadFailure>,
    pub runs: Vec<Result<TestRun, &'static str>>,
    /// How long each test body takes.
    pub run_time: Duration,
    pub leave_fails: bool,
    /// Set by `close_all`.
    pub closed: Arc<AtomicBool>,
}

impl Scripted {
    /// Tests `names`, running `runs` in order.
    pub fn new(names: &[&str], runs: Vec<Result<TestRun, &'static str>>) -> Self {
        Scripted {
            load: Ok(LoadedFile {
                test_names: names.iter().map(|n| n.to_string()).collect(),
                todo: None,
            }),
            runs,
            sends: Vec::new(),
            skip: Vec::new(),
            env: None,
            run_time: Duration::ZERO,
            leave_fails: false,
            closed: Arc::default(),
        }
    }
}

/// A passing run that logged `hello`.
pub fn passed() -> Result<TestRun, &'static str> {
    Ok(TestRun {
        status: TestStatus::Passed,
        message: None,
        log: vec!["hello".into()],
    })
}

impl FileRuntime for Scripted {
    fn load(&mut self) -> Result<LoadedFile, LoadFailure> {
        self.load.clone()
    }
    fn test_meta(&self, index: usize) -> MetaMap {
        let mut meta = MetaMap::default();
        if self.skip.contains(&index) {
            let why = SKIP_REASON.trim_start_matches("skipped: ");
            meta.insert("skip".into(), MetaValue::Str(why.into()));
        }
        meta
    }
    fn test_timeout(&self, _: usize) -> Result<Option<Duration>, TestFailure> {
        Ok(None)
    }
    fn enter_test_scope(&mut self) {}
    fn run_test(&self, index: usize) -> Result<TestRun, TestFailure> {
        std::thread::sleep(self.run_time);
        if let (Some(Some(send)), Some(env)) = (self.sends.get(index), &self.env) {
            env.events.send(send(&env.rel_path));
        }
        match &self.runs[index] {
            Ok(r) => Ok(r.clone()),
            Err(panic) => panic!("{panic}"),
        }
    }
    fn leave_test_scope(&mut self) -> Result<(), TestFailure> {
        if self.leave_fails {
            Err("closing vm `a` failed".to_string().into())
        } else {
            Ok(())
        }
    }
    fn restore_between_tests(&self) -> Result<(), TestFailure> {
        Ok(())
    }
    fn close_all(&mut self) {
        self.closed.store(true, Ordering::SeqCst);
    }
}

/// Hands out one [`Scripted`] per file: the same script every time
/// (`every_file`), or one script once (`once`); none left is a setup error.
pub struct ScriptedFactory {
    script: Mutex<Option<Scripted>>,
    reuse: bool,
}

impl ScriptedFactory {
    pub fn every_file(script: Scripted) -> Self {
        ScriptedFactory {
            script: Mutex::new(Some(script)),
            reuse: true,
        }
    }

    pub fn once(script: Option<Scripted>) -> Self {
        ScriptedFactory {
            script: Mutex::new(script),
            reuse: false,
        }
    }
}

impl FileRuntimeFactory for ScriptedFactory {
    fn open(&self, env: Arc<FileEnv>) -> Result<Box<dyn FileRuntime>, RuntimeSetupError> {
        let mut slot = self.script.locked();
        let script = if self.reuse {
            slot.clone()
        } else {
            slot.take()
        };
        match script {
            Some(s) => Ok(Box::new(Scripted {
                env: Some(env),
                ..s
            })),
            None => Err(RuntimeSetupError("no more runtimes".into())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_once_factory_runs_out() {
        let f = ScriptedFactory::once(Some(Scripted::new(&[], vec![])));
        let env = Arc::new(FileEnv::new(
            "f".into(),
            "/f".into(),
            vec![],
            Arc::new(crate::config::Config::defaults(
                std::path::Path::new("/"),
                &Default::default(),
            )),
            crate::backend::for_kind(crate::runner::BackendKind::Local),
            crate::events::EventSender::disabled(),
        ));
        assert!(f.open(env.clone()).is_ok());
        assert!(f.open(env).is_err());
    }
}
