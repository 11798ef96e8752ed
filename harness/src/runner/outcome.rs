//! What a file run produces: one [`FileOutcome`] with a [`TestReport`] per
//! test; reporters get it as a `FileReport`, its status decided.

use std::time::Duration;

use provium_protocol::event::FileStatus;

use crate::report::run_event::FileReport;
pub use crate::report::run_event::{TestReport, TestStatus};

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
    pub tests: Vec<TestReport>,
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

    /// What reporters render of this file: its decided status, errors and
    /// tests.
    pub fn report(&self) -> FileReport {
        FileReport {
            path: self.path.clone(),
            status: self.status(),
            timed_out: self.timed_out,
            chunk_error: self.chunk_error.clone(),
            crash: self.crashed.clone(),
            tests: self.tests.clone(),
            duration: self.duration,
        }
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

#[cfg(test)]
mod tests {
    use super::*;
    use provium_protocol::meta::MetaMap;

    fn file(tests: &[TestStatus]) -> FileOutcome {
        FileOutcome {
            path: "a.test.lua".into(),
            abs_path: "/t/a.test.lua".into(),
            timed_out: false,
            chunk_error: None,
            crashed: None,
            tests: tests
                .iter()
                .map(|&status| TestReport {
                    name: status.as_str().into(),
                    status,
                    message: None,
                    log: vec![],
                    duration: Duration::ZERO,
                    meta: MetaMap::default(),
                })
                .collect(),
            duration: Duration::from_millis(5),
        }
    }

    #[test]
    fn a_crash_outranks_a_timeout_and_a_failure_fails_the_file() {
        assert_eq!(file(&[TestStatus::Passed]).status(), FileStatus::Passed);
        assert_eq!(
            file(&[TestStatus::Passed, TestStatus::Failed]).status(),
            FileStatus::Failed
        );
        let mut f = file(&[TestStatus::Skipped]);
        f.timed_out = true;
        assert_eq!(f.status(), FileStatus::TimedOut);
        f.crashed = Some("panic".into());
        assert_eq!(f.status(), FileStatus::Crashed);
        let r = f.report();
        assert!(r.timed_out && !r.passed());
        assert_eq!(r.status, FileStatus::Crashed);
        assert_eq!(r.count(TestStatus::Skipped), 1);
    }
}
