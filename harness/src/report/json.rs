//! `--json`: one object per file, line-delimited: the reference's schema;
//! under `--partition`, plus `"run"` ([`RunIdentity`]: run id, suite id,
//! suite size, partition), which `provium report merge` reads.
//!
//! The line is [`FileLine`] serialised. Its fields, and those of
//! [`TestLine`] and [`RunLine`], are declared in alphabetical order: that is
//! the order the reference's lines have always had (serde_json's sorted
//! maps), and `--json` is API, so it must not move.

use std::io::Write;

use serde::Serialize;

use super::{ReportError, Reporter, RunIdentity};
use crate::events::{FileReport, RunEvent, TestReport};

/// One `--json` line.
#[derive(Debug, Serialize)]
pub struct FileLine<'a> {
    /// The chunk error, else the runner's crash message, else null.
    pub chunk_error: Option<&'a str>,
    pub passed: bool,
    pub path: &'a str,
    /// Only a shard's lines carry the run: an unsharded run keeps the
    /// reference's schema exactly.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub run: Option<RunLine<'a>>,
    pub tests: Vec<TestLine<'a>>,
    /// `timed_out` or `in_time`.
    pub timeout: &'static str,
}

/// One test in a [`FileLine`].
#[derive(Debug, Serialize)]
pub struct TestLine<'a> {
    pub log: &'a [String],
    pub message: Option<&'a str>,
    pub name: &'a str,
    /// `passed`, `failed` or `skipped`.
    pub status: &'static str,
}

/// A shard's run, in each of its [`FileLine`]s.
#[derive(Debug, Serialize)]
pub struct RunLine<'a> {
    pub id: &'a str,
    pub partition: Option<&'a str>,
    pub suite: &'a str,
    pub suite_files: u32,
}

impl<'a> FileLine<'a> {
    pub fn new(f: &'a FileReport, run: &'a RunIdentity) -> Self {
        FileLine {
            chunk_error: f.chunk_error.as_deref().or(f.crash.as_deref()),
            passed: f.passed(),
            path: &f.path,
            run: run.partition.as_deref().map(|partition| RunLine {
                id: &run.run_id,
                partition: Some(partition),
                suite: &run.suite_id,
                suite_files: run.suite_files,
            }),
            tests: f.tests.iter().map(TestLine::new).collect(),
            timeout: if f.timed_out { "timed_out" } else { "in_time" },
        }
    }
}

impl<'a> TestLine<'a> {
    fn new(t: &'a TestReport) -> Self {
        TestLine {
            log: &t.log,
            message: t.message.as_deref(),
            name: &t.name,
            status: t.status.as_str(),
        }
    }
}

/// `f`'s line, newline included.
pub fn render_file(f: &FileReport, run: &RunIdentity) -> String {
    let mut line = serde_json::to_string(&FileLine::new(f, run))
        .expect("a FileLine has only strings, bools and numbers");
    line.push('\n');
    line
}

/// Writes one line per finished file to `out` (stdout, or stderr when
/// stdout carries event frames).
pub struct JsonReporter {
    out: Box<dyn Write>,
    run: RunIdentity,
}

impl JsonReporter {
    pub fn new(out: Box<dyn Write>, run: RunIdentity) -> Self {
        JsonReporter { out, run }
    }
}

impl Reporter for JsonReporter {
    fn report(&mut self, event: &RunEvent) -> Result<(), ReportError> {
        if let RunEvent::FileFinished(f) = event {
            // A reader that went away is not a reason to stop the run.
            let _ = self.out.write_all(render_file(f, &self.run).as_bytes());
            let _ = self.out.flush();
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::TestStatus;
    use provium_protocol::event::FileStatus;
    use serde_json::json;
    use std::time::Duration;

    fn report() -> FileReport {
        FileReport {
            path: "a \"q\".test.lua".into(),
            status: FileStatus::Failed,
            timed_out: true,
            chunk_error: None,
            crash: Some("the runner panicked: x".into()),
            tests: vec![
                TestReport {
                    name: "t1".into(),
                    status: TestStatus::Passed,
                    message: None,
                    log: vec!["l1".into(), "l\n2".into()],
                    duration: Duration::ZERO,
                    meta: Default::default(),
                },
                TestReport {
                    name: "t2".into(),
                    status: TestStatus::Skipped,
                    message: Some("slow".into()),
                    log: vec![],
                    duration: Duration::ZERO,
                    meta: Default::default(),
                },
            ],
            duration: Duration::ZERO,
        }
    }

    fn run(partition: Option<&str>) -> RunIdentity {
        RunIdentity {
            run_id: "r1".into(),
            suite_id: "s1".into(),
            suite_files: 7,
            partition: partition.map(str::to_string),
        }
    }

    /// The line the reference built with `json!` (sorted keys), which the
    /// typed structs must reproduce byte for byte.
    fn reference_line(f: &FileReport, run: &RunIdentity) -> String {
        let tests: Vec<_> = f
            .tests
            .iter()
            .map(|t| json!({"name": t.name, "status": t.status.as_str(), "message": t.message, "log": t.log}))
            .collect();
        let mut obj = json!({
            "path": f.path,
            "timeout": if f.timed_out { "timed_out" } else { "in_time" },
            "passed": f.passed(),
            "chunk_error": f.chunk_error.clone().or_else(|| f.crash.clone()),
            "tests": tests,
        });
        if run.partition.is_some() {
            obj["run"] = json!({
                "id": run.run_id,
                "suite": run.suite_id,
                "suite_files": run.suite_files,
                "partition": run.partition,
            });
        }
        format!("{obj}\n")
    }

    #[test]
    fn lines_are_byte_for_byte_the_reference_schema() {
        let f = report();
        for r in [run(None), run(Some("hash:2/3"))] {
            assert_eq!(render_file(&f, &r), reference_line(&f, &r));
        }
        let mut passing = report();
        passing.status = FileStatus::Passed;
        passing.timed_out = false;
        passing.crash = None;
        passing.chunk_error = Some("e".into());
        assert_eq!(
            render_file(&passing, &run(None)),
            reference_line(&passing, &run(None))
        );
    }

    #[test]
    fn an_unsharded_line_has_no_run() {
        let line = render_file(&report(), &run(None));
        assert!(line.starts_with("{\"chunk_error\":\"the runner panicked: x\",\"passed\":false,"));
        assert!(!line.contains("\"run\""), "{line}");
        assert!(line.ends_with("\"timeout\":\"timed_out\"}\n"), "{line}");
    }
}
