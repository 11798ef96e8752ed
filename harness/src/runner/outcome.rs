//! What a file run produces: one [`FileOutcome`] with a [`TestOutcome`] per test.

use std::time::Duration;

use provium_protocol::event::FileStatus;
use provium_protocol::meta::MetaMap;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TestStatus {
    Passed,
    Failed,
    Skipped,
}

impl TestStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            TestStatus::Passed => "passed",
            TestStatus::Failed => "failed",
            TestStatus::Skipped => "skipped",
        }
    }
}

#[derive(Debug, Clone)]
pub struct TestOutcome {
    pub name: String,
    pub status: TestStatus,
    /// Failure message or skip reason.
    pub message: Option<String>,
    pub log: Vec<String>,
    pub duration: Duration,
    pub meta: MetaMap,
}

#[derive(Debug, Clone)]
pub struct FileOutcome {
    /// Test-root-relative path, as shown in output and events.
    pub path: String,
    /// Absolute path, for the rerun state.
    pub abs_path: std::path::PathBuf,
    pub timed_out: bool,
    /// The file's chunk failed to load or run (syntax error, top-level error).
    pub chunk_error: Option<String>,
    /// The runner itself failed (panic, infrastructure error).
    pub crashed: Option<String>,
    pub tests: Vec<TestOutcome>,
    pub duration: Duration,
}

impl FileOutcome {
    pub fn count(&self, status: TestStatus) -> usize {
        self.tests.iter().filter(|t| t.status == status).count()
    }

    /// A file passes when it finished in time, loaded, and no test failed.
    pub fn passed(&self) -> bool {
        !self.timed_out
            && self.chunk_error.is_none()
            && self.crashed.is_none()
            && self.count(TestStatus::Failed) == 0
    }

    pub fn status(&self) -> FileStatus {
        if self.crashed.is_some() {
            FileStatus::Crashed
        } else if self.timed_out {
            FileStatus::TimedOut
        } else if self.passed() {
            FileStatus::Passed
        } else {
            FileStatus::Failed
        }
    }
}
