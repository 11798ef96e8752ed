//! The reporters' events: what the dispatcher tells the human, `--json`
//! and JUnit renderers, in order. Each carries outcomes already decided
//! ([`FileReport::status`]), so renderers only render.

use std::time::Duration;

use provium_protocol::event::FileStatus;
use provium_protocol::meta::MetaMap;

/// How a test ended (`passed`, `failed`, `skipped`: the `--json` spelling).
pub use provium_protocol::json_line::TestStatus;

/// How one test ended: what the executor records and reporters show.
#[derive(Debug, Clone, PartialEq)]
pub struct TestReport {
    pub name: String,
    pub status: TestStatus,
    /// Failure message or skip reason.
    pub message: Option<String>,
    /// The test's `t:log` lines.
    pub log: Vec<String>,
    pub duration: Duration,
    /// The test's meta, as its events carry it.
    pub meta: MetaMap,
}

/// A finished file, as reporters show it.
#[derive(Debug, Clone, PartialEq)]
pub struct FileReport {
    /// Test-root-relative path.
    pub path: String,
    /// The decided outcome (the `file_completed` status).
    pub status: FileStatus,
    /// The file ran past `--timeout` (a crashed file can have timed out too).
    pub timed_out: bool,
    /// The chunk failed to load or run.
    pub chunk_error: Option<String>,
    /// The runner itself failed (a panic, an infrastructure error).
    pub crash: Option<String>,
    /// In declaration order.
    pub tests: Vec<TestReport>,
    pub duration: Duration,
}

impl FileReport {
    pub fn passed(&self) -> bool {
        self.status == FileStatus::Passed
    }

    /// How many of its tests ended `status`.
    pub fn count(&self, status: TestStatus) -> usize {
        self.tests.iter().filter(|t| t.status == status).count()
    }
}

/// What the dispatcher tells reporters, in this order: `RunStarted`, then
/// `FileStarted` / `FileFinished` per file (files overlap), `RunFinished`.
#[derive(Debug, Clone, PartialEq)]
pub enum RunEvent {
    /// Before the first dispatch.
    RunStarted {
        file_count: usize,
    },
    /// A file was dispatched to an executor.
    FileStarted {
        path: String,
    },
    FileFinished(FileReport),
    /// Every file that will run has finished; `elapsed` since the run began.
    RunFinished {
        elapsed: Duration,
    },
}
