//! `--json`: one object per file, line-delimited: the reference's schema;
//! under `--partition`, plus `"run"` ([`RunIdentity`]: run id, suite id,
//! suite size, partition), which `provium report merge` reads. The shape
//! is `protocol::json_line`'s, where it is pinned; this fills it in.

use std::io::Write;

use provium_protocol::json_line::{FileLine, RunLine, TestLine, Timeliness};

use super::{ReportError, Reporter, RunIdentity};
use crate::report::run_event::{FileReport, RunEvent};

/// `f` as a `--json` line's value.
pub fn file_line(f: &FileReport, run: &RunIdentity) -> FileLine {
    FileLine {
        chunk_error: f.chunk_error.clone().or_else(|| f.crash.clone()),
        passed: f.passed(),
        path: f.path.clone(),
        run: run.partition.as_ref().map(|partition| RunLine {
            id: run.run_id.clone(),
            partition: Some(partition.clone()),
            suite: run.suite_id.clone(),
            suite_files: run.suite_files,
        }),
        tests: f
            .tests
            .iter()
            .map(|t| TestLine {
                log: t.log.clone(),
                message: t.message.clone(),
                name: t.name.clone(),
                status: t.status,
            })
            .collect(),
        timeout: if f.timed_out {
            Timeliness::TimedOut
        } else {
            Timeliness::InTime
        },
    }
}

/// `f`'s line, newline included.
pub fn render_file(f: &FileReport, run: &RunIdentity) -> String {
    let mut line = serde_json::to_string(&file_line(f, run))
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
    use crate::report::run_event::{TestReport, TestStatus};
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
