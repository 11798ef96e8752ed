//! The contract between the executor (`crate::scheduler::executor`), which
//! decides how a file's tests end, and a file's runtime, which runs its code:
//! [`FileRuntime`]. The Lua layer implements it (`crate::lua::test_file`), so
//! neither the runner nor the scheduler knows a Lua type.
//!
//! Errors that cross this boundary are [`TestFailure`]s: the text a test
//! author reads (a Lua error's message), which the runtime has already
//! flattened.

use std::sync::Arc;
use std::time::Duration;

use provium_protocol::meta::MetaMap;

use super::outcome::TestStatus;
use super::FileEnv;

/// Bytes of each VM's console log attached to a failed test.
pub const CONSOLE_EXCERPT_BYTES: usize = 4096;

/// The reference's marking of the tests a crash kept from running.
pub const POISONED: &str = "failed-due-to-poisoned-state";

/// What loading a file (running its chunk) declared.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LoadedFile {
    /// The declared tests' names, in declaration order; the runtime's test
    /// indices are positions in this list.
    pub test_names: Vec<String>,
    /// `todo("why")` at file level: every test is skipped with this reason.
    pub todo: Option<String>,
}

/// Why a file's tests never ran.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LoadFailure {
    /// The source could not be read; nothing ran, nothing needs closing.
    Unreadable(String),
    /// The chunk raised (a syntax or top-level error, or the file timed out
    /// while it ran).
    Chunk(String),
    /// The chunk ran, but what it set up was refused (`provium.timeout`,
    /// `provium.reset_between_tests`).
    Settings(String),
}

impl LoadFailure {
    /// The text shown as the file's chunk error.
    pub fn message(&self) -> &str {
        match self {
            LoadFailure::Unreadable(m) | LoadFailure::Chunk(m) | LoadFailure::Settings(m) => m,
        }
    }
}

/// Why a runtime call failed the test (or the file) it ran for: the
/// message the test fails with, as the runtime wrote it (a Lua error's
/// message, its chain already flattened, or a panic's description). It is
/// an outcome's text, so it has no source of its own.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct TestFailure {
    pub message: String,
}

impl From<String> for TestFailure {
    fn from(message: String) -> TestFailure {
        TestFailure { message }
    }
}

/// Back to the text, where a failure is raised into Lua again
/// (`proc:close()` raises its auto-close failure).
impl From<TestFailure> for String {
    fn from(failure: TestFailure) -> String {
        failure.message
    }
}

/// What one test's body returned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TestRun {
    pub status: TestStatus,
    /// Failure message or skip reason.
    pub message: Option<String>,
    /// The test's `t:log` lines.
    pub log: Vec<String>,
}

/// One file's runtime, driven by the executor on the file's own thread:
/// `load` once, then for each test `enter_test_scope`, `run_test`,
/// `leave_test_scope`, `restore_between_tests`, and `close_all` at the end.
/// Every `Err` is the [`TestFailure`] the test (or file) fails with.
pub trait FileRuntime {
    /// Run the file's chunk and collect the tests it declared.
    fn load(&mut self) -> Result<LoadedFile, LoadFailure>;
    /// The meta of test `index` (as declared, converted for events).
    fn test_meta(&self, index: usize) -> MetaMap;
    /// Test `index`'s `meta.timeout`, else the file default; `Ok(None)`:
    /// no per-test timeout.
    fn test_timeout(&self, index: usize) -> Result<Option<Duration>, TestFailure>;
    /// Open a fresh scope for one test's resources.
    fn enter_test_scope(&mut self);
    /// Run test `index`'s body. `Err`: the runtime itself failed the call.
    fn run_test(&self, index: usize) -> Result<TestRun, TestFailure>;
    /// Close what the test created; the first auto-close error.
    fn leave_test_scope(&mut self) -> Result<(), TestFailure>;
    /// Restore the `reset_between_tests` baseline, if the file has one.
    fn restore_between_tests(&self) -> Result<(), TestFailure>;
    /// File end: close everything at file scope and release the claim.
    fn close_all(&mut self);
}

/// Makes the runtime of each file, on the file's thread (a runtime need not
/// be `Send`). The CLI hands the Lua layer's to the dispatcher.
pub trait FileRuntimeFactory: Send + Sync {
    /// A runtime for `env`'s file. `Err`: the runtime could not be set up;
    /// the file is reported crashed with it.
    fn open(&self, env: Arc<FileEnv>) -> Result<Box<dyn FileRuntime>, RuntimeSetupError>;
}

/// A file's runtime could not be set up (the file is reported crashed).
#[derive(Debug, thiserror::Error)]
#[error("cannot set up the Lua state")]
pub struct RuntimeSetupError(#[source] pub Box<dyn std::error::Error + Send + Sync>);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_setup_error_prints_its_cause_once() {
        let e = RuntimeSetupError("out of memory".into());
        assert_eq!(
            crate::error_chain::flatten(&e),
            "cannot set up the Lua state: out of memory"
        );
    }

    #[test]
    fn a_test_failure_is_its_message_alone() {
        let f = TestFailure::from("vm:boot: profile `p`: no kernel".to_string());
        assert_eq!(f.to_string(), "vm:boot: profile `p`: no kernel");
        assert!(std::error::Error::source(&f).is_none());
        assert_eq!(crate::error_chain::numbered(&f), f.message);
    }

    #[test]
    fn every_load_failure_shows_its_message() {
        for f in [
            LoadFailure::Unreadable("a".into()),
            LoadFailure::Chunk("a".into()),
            LoadFailure::Settings("a".into()),
        ] {
            assert_eq!(f.message(), "a");
        }
    }
}
