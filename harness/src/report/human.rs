//! The default human output: one status line per file, failures indented
//! under it, a summary line at the end; and the [`HumanReporter`] that
//! writes it (with the live progress line) as the run's events arrive.
//! This prose is not API (docs/harness.md): `--json` is.

use std::fmt::Write as _;
use std::io::Write;
use std::time::Duration;

use super::progress::Progress;
use super::{ReportError, Reporter, Verbosity};
use crate::report::run_event::{FileReport, RunEvent, TestStatus};

/// The status word of a file line.
fn file_word(f: &FileReport) -> &'static str {
    if f.timed_out {
        "TIME"
    } else if f.crash.is_some() {
        "CRASH"
    } else if f.passed() {
        "PASS"
    } else {
        "FAIL"
    }
}

fn indent(text: &str, prefix: &str) -> String {
    text.lines().map(|l| format!("{prefix}{l}\n")).collect()
}

/// The lines for one finished file (empty under -q when it passed).
pub fn render_file(f: &FileReport, verbosity: Verbosity) -> String {
    let mut out = String::new();
    if verbosity == Verbosity::Quiet && f.passed() {
        return out;
    }
    writeln!(
        out,
        "{} {} ({} passed, {} failed, {} skipped)",
        file_word(f),
        f.path,
        f.count(TestStatus::Passed),
        f.count(TestStatus::Failed),
        f.count(TestStatus::Skipped)
    )
    .unwrap();
    if let Some(e) = &f.chunk_error {
        out += "    ERROR loading file\n";
        out += &indent(e, "        ");
    }
    if let Some(e) = &f.crash {
        out += "    CRASH runner\n";
        out += &indent(e, "        ");
    }
    for t in &f.tests {
        match t.status {
            TestStatus::Failed => {
                writeln!(out, "    FAIL {}", t.name).unwrap();
                out += &indent(t.message.as_deref().unwrap_or("failed"), "        ");
                for l in &t.log {
                    out += &indent(l, "        log: ");
                }
            }
            TestStatus::Passed if verbosity == Verbosity::Verbose => {
                writeln!(out, "    PASS {}", t.name).unwrap()
            }
            TestStatus::Skipped if verbosity == Verbosity::Verbose => writeln!(
                out,
                "    SKIP {}{}",
                t.name,
                t.message
                    .as_deref()
                    .map(|m| format!(" ({m})"))
                    .unwrap_or_default()
            )
            .unwrap(),
            _ => {}
        }
    }
    out
}

/// Files and tests counted for the summary line.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Totals {
    pub files: usize,
    pub passed: usize,
    pub failed: usize,
    pub skipped: usize,
}

impl Totals {
    /// Count `f` in.
    pub fn add(&mut self, f: &FileReport) {
        self.files += 1;
        self.passed += f.count(TestStatus::Passed);
        self.failed += f.count(TestStatus::Failed);
        self.skipped += f.count(TestStatus::Skipped);
    }

    pub fn of<'a>(files: impl IntoIterator<Item = &'a FileReport>) -> Totals {
        let mut t = Totals::default();
        for f in files {
            t.add(f);
        }
        t
    }
}

pub fn render_summary(totals: &Totals, elapsed: Duration) -> String {
    format!(
        "\n{} file(s); {} passed, {} failed, {} skipped; {:.2}s\n",
        totals.files,
        totals.passed,
        totals.failed,
        totals.skipped,
        elapsed.as_secs_f64()
    )
}

/// Writes each finished file's lines, then the summary, to `out`; keeps
/// the progress line (stderr, on a terminal) out of their way.
pub struct HumanReporter {
    out: Box<dyn Write>,
    verbosity: Verbosity,
    progress: Progress,
    totals: Totals,
}

impl HumanReporter {
    pub fn new(out: Box<dyn Write>, verbosity: Verbosity, progress: Progress) -> Self {
        HumanReporter {
            out,
            verbosity,
            progress,
            totals: Totals::default(),
        }
    }

    fn write(&mut self, text: &str) {
        // Lost terminal output is not a reason to stop the run.
        let _ = self.out.write_all(text.as_bytes());
        let _ = self.out.flush();
    }
}

impl Reporter for HumanReporter {
    fn report(&mut self, event: &RunEvent) -> Result<(), ReportError> {
        match event {
            RunEvent::RunStarted { .. } => {}
            RunEvent::FileStarted { .. } => self.progress.started_file(),
            RunEvent::FileFinished(f) => {
                self.progress.clear();
                self.totals.add(f);
                let text = render_file(f, self.verbosity);
                self.write(&text);
                self.progress.finished_file();
            }
            RunEvent::RunFinished { elapsed } => {
                self.progress.clear();
                let text = render_summary(&self.totals, *elapsed);
                self.write(&text);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_utils::SharedBuffer;
    use super::*;
    use crate::report::run_event::TestReport;
    use provium_protocol::event::FileStatus;

    fn test(name: &str, status: TestStatus, message: Option<&str>, log: &[&str]) -> TestReport {
        TestReport {
            name: name.into(),
            status,
            message: message.map(str::to_string),
            log: log.iter().map(|l| l.to_string()).collect(),
            duration: Duration::from_millis(12),
            meta: Default::default(),
        }
    }

    fn file(path: &str, status: FileStatus, tests: Vec<TestReport>) -> FileReport {
        FileReport {
            path: path.into(),
            status,
            timed_out: false,
            chunk_error: None,
            crash: None,
            tests,
            duration: Duration::from_millis(40),
        }
    }

    /// One run with every kind of line: passes, failures with logs, a
    /// skipped test, tests filtered out by tag, a file that failed to load,
    /// a timed-out file and a crashed one.
    fn a_run() -> Vec<RunEvent> {
        let files = vec![
            file(
                "net/ping.test.lua",
                FileStatus::Passed,
                vec![
                    test("ping answers", TestStatus::Passed, None, &[]),
                    test("ping6 answers", TestStatus::Passed, None, &["rtt 0.3ms"]),
                ],
            ),
            file(
                "disk/fsck.test.lua",
                FileStatus::Failed,
                vec![
                    test("mkfs", TestStatus::Passed, None, &[]),
                    test(
                        "fsck finds nothing",
                        TestStatus::Failed,
                        Some("expected exit 0, got 4\nstderr: /dev/vdb: UNEXPECTED INCONSISTENCY"),
                        &["mounted /dev/vdb", "ran fsck -n"],
                    ),
                    test(
                        "resize",
                        TestStatus::Skipped,
                        Some("todo: needs resize2fs in the image"),
                        &[],
                    ),
                ],
            ),
            file(
                "slow/soak.test.lua",
                FileStatus::Passed,
                vec![
                    test(
                        "soak",
                        TestStatus::Skipped,
                        Some(crate::runner::filter::SLOW_SKIP_REASON),
                        &[],
                    ),
                    test("soak-net", TestStatus::Skipped, Some("--tag net"), &[]),
                ],
            ),
            FileReport {
                chunk_error: Some(
                    "broken.test.lua:3: syntax error near 'end'\nstack traceback: [C]: in ?".into(),
                ),
                ..file("broken.test.lua", FileStatus::Failed, vec![])
            },
            FileReport {
                timed_out: true,
                ..file(
                    "boot/hang.test.lua",
                    FileStatus::TimedOut,
                    vec![test(
                        "boots",
                        TestStatus::Failed,
                        Some("file timed out after 30.000s (--timeout)"),
                        &[],
                    )],
                )
            },
            FileReport {
                crash: Some("the runner panicked: index out of bounds".into()),
                ..file(
                    "crash.test.lua",
                    FileStatus::Crashed,
                    vec![test(
                        "first",
                        TestStatus::Failed,
                        Some("failed-due-to-poisoned-state: not run"),
                        &[],
                    )],
                )
            },
        ];
        let mut events = vec![RunEvent::RunStarted {
            file_count: files.len(),
        }];
        for f in files {
            events.push(RunEvent::FileStarted {
                path: f.path.clone(),
            });
            events.push(RunEvent::FileFinished(f));
        }
        events.push(RunEvent::RunFinished {
            elapsed: Duration::from_millis(4321),
        });
        events
    }

    fn render(verbosity: Verbosity) -> String {
        let out = SharedBuffer::default();
        let mut r = HumanReporter::new(Box::new(out.clone()), verbosity, Progress::new(0, false));
        for e in a_run() {
            r.report(&e).unwrap();
        }
        out.text()
    }

    #[test]
    fn a_mixed_run() {
        insta::assert_snapshot!(render(Verbosity::Normal));
    }

    #[test]
    fn a_mixed_run_verbose() {
        insta::assert_snapshot!(render(Verbosity::Verbose));
    }

    #[test]
    fn a_mixed_run_quiet() {
        insta::assert_snapshot!(render(Verbosity::Quiet));
    }

    #[test]
    fn totals_count_every_file() {
        let t = Totals::of(a_run().iter().filter_map(|e| match e {
            RunEvent::FileFinished(f) => Some(f),
            _ => None,
        }));
        assert_eq!(
            t,
            Totals {
                files: 6,
                passed: 3,
                failed: 3,
                skipped: 3
            }
        );
    }
}
