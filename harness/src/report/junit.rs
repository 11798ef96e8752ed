//! `--junit PATH`: JUnit XML, one `<testsuite>` per file; failures and skips
//! as child elements, the test's log as `<system-out>`.

use std::fmt::Write as _;

use crate::runner::outcome::{FileOutcome, TestStatus};

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

pub fn render(files: &[FileOutcome]) -> String {
    let mut x =
        String::from("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<testsuites name=\"provium\">\n");
    for f in files {
        let errors = usize::from(f.chunk_error.is_some() || f.crashed.is_some() || f.timed_out);
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
            .or(f.crashed.as_deref())
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
