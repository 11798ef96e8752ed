//! `--junit PATH`: JUnit XML, one `<testsuite>` per file; failures and skips
//! as child elements, the test's log as `<system-out>`. [`JunitReporter`]
//! collects the run's files and writes the file when the run finishes.

use std::fmt::Write as _;
use std::path::PathBuf;

use super::{ReportError, Reporter};
use crate::report::run_event::{FileReport, RunEvent, TestStatus};

fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            // XML 1.0 forbids most control characters even escaped.
            c if (c as u32) < 0x20 && !matches!(c, '\n' | '\r' | '\t') => {
                out.push_str(&format!("\\x{:02x}", c as u32))
            }
            c => out.push(c),
        }
    }
    out
}

pub fn render(files: &[FileReport]) -> String {
    let mut x =
        String::from("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<testsuites name=\"provium\">\n");
    for f in files {
        let errors = usize::from(f.chunk_error.is_some() || f.crash.is_some() || f.timed_out);
        writeln!(
            x,
            "  <testsuite name=\"{}\" tests=\"{}\" failures=\"{}\" errors=\"{}\" skipped=\"{}\" time=\"{:.3}\">",
            esc(&f.path),
            f.tests.len(),
            f.count(TestStatus::Failed),
            errors,
            f.count(TestStatus::Skipped),
            f.duration.as_secs_f64()
        )
        .unwrap();
        let file_error = f
            .chunk_error
            .as_deref()
            .or(f.crash.as_deref())
            .or(f.timed_out.then_some("file timed out"));
        if let Some(e) = file_error {
            writeln!(
                x,
                "    <error message=\"{}\"/>",
                esc(e.lines().next().unwrap_or(""))
            )
            .unwrap();
            writeln!(x, "    <system-err>{}</system-err>", esc(e)).unwrap();
        }
        for t in &f.tests {
            write!(
                x,
                "    <testcase classname=\"{}\" name=\"{}\" time=\"{:.3}\">",
                esc(&f.path),
                esc(&t.name),
                t.duration.as_secs_f64()
            )
            .unwrap();
            let msg = t.message.as_deref().unwrap_or("");
            match t.status {
                TestStatus::Failed => write!(
                    x,
                    "<failure message=\"{}\">{}</failure>",
                    esc(msg),
                    esc(msg)
                )
                .unwrap(),
                TestStatus::Skipped => write!(x, "<skipped message=\"{}\"/>", esc(msg)).unwrap(),
                TestStatus::Passed => {}
            }
            if !t.log.is_empty() {
                write!(x, "<system-out>{}</system-out>", esc(&t.log.join("\n"))).unwrap();
            }
            x += "</testcase>\n";
        }
        x += "  </testsuite>\n";
    }
    x += "</testsuites>\n";
    x
}

/// Collects every finished file; writes `path` at the end of the run.
pub struct JunitReporter {
    path: PathBuf,
    files: Vec<FileReport>,
}

impl JunitReporter {
    pub fn new(path: PathBuf) -> Self {
        JunitReporter {
            path,
            files: Vec::new(),
        }
    }
}

impl Reporter for JunitReporter {
    fn report(&mut self, event: &RunEvent) -> Result<(), ReportError> {
        match event {
            RunEvent::FileFinished(f) => self.files.push(f.clone()),
            RunEvent::RunFinished { .. } => std::fs::write(&self.path, render(&self.files))
                .map_err(|source| ReportError::Junit {
                    path: self.path.clone(),
                    source,
                })?,
            RunEvent::RunStarted { .. } | RunEvent::FileStarted { .. } => {}
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::run_event::TestReport;
    use provium_protocol::event::FileStatus;
    use std::time::Duration;

    fn file() -> FileReport {
        FileReport {
            path: "a<b>.test.lua".into(),
            status: FileStatus::Failed,
            timed_out: false,
            chunk_error: None,
            crash: None,
            tests: vec![
                TestReport {
                    name: "fails".into(),
                    status: TestStatus::Failed,
                    message: Some("got \"x\"\u{1}".into()),
                    log: vec!["one".into(), "two".into()],
                    duration: Duration::from_millis(1500),
                    meta: Default::default(),
                },
                TestReport {
                    name: "skips".into(),
                    status: TestStatus::Skipped,
                    message: Some("slow".into()),
                    log: vec![],
                    duration: Duration::ZERO,
                    meta: Default::default(),
                },
            ],
            duration: Duration::from_secs(2),
        }
    }

    #[test]
    fn renders_failures_skips_and_logs_escaped() {
        let x = render(&[file()]);
        assert!(x.contains(
            "<testsuite name=\"a&lt;b&gt;.test.lua\" tests=\"2\" failures=\"1\" errors=\"0\" skipped=\"1\" time=\"2.000\">"
        ), "{x}");
        assert!(
            x.contains("<failure message=\"got &quot;x&quot;\\x01\">"),
            "{x}"
        );
        assert!(x.contains("<skipped message=\"slow\"/>"), "{x}");
        assert!(x.contains("<system-out>one\ntwo</system-out>"), "{x}");
    }

    #[test]
    fn the_reporter_writes_at_run_end_and_names_an_unwritable_path() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("junit.xml");
        let mut r = JunitReporter::new(path.clone());
        r.report(&RunEvent::FileFinished(file())).unwrap();
        assert!(!path.exists());
        r.report(&RunEvent::RunFinished {
            elapsed: Duration::ZERO,
        })
        .unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), render(&[file()]));
        let bad = dir.path().join("missing/junit.xml");
        let e = JunitReporter::new(bad.clone())
            .report(&RunEvent::RunFinished {
                elapsed: Duration::ZERO,
            })
            .unwrap_err();
        assert!(
            crate::error_chain::flatten(&e).starts_with(&format!("--junit `{}`: ", bad.display())),
            "{e}"
        );
    }
}
