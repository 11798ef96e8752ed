//! The default human output: one status line per file, failures indented
//! under it, a summary line at the end.

use std::fmt::Write as _;
use std::time::Duration;

use super::Verbosity;
use crate::runner::outcome::{FileOutcome, TestStatus};

/// The status word of a file line.
fn file_word(f: &FileOutcome) -> &'static str {
    if f.timed_out {
        "TIME"
    } else if f.crashed.is_some() {
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
pub fn render_file(f: &FileOutcome, verbosity: Verbosity) -> String {
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
    if let Some(e) = &f.crashed {
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

pub fn render_summary(files: &[FileOutcome], elapsed: Duration) -> String {
    let sum = |s| files.iter().map(|f| f.count(s)).sum::<usize>();
    format!(
        "\n{} file(s); {} passed, {} failed, {} skipped; {:.2}s\n",
        files.len(),
        sum(TestStatus::Passed),
        sum(TestStatus::Failed),
        sum(TestStatus::Skipped),
        elapsed.as_secs_f64()
    )
}
