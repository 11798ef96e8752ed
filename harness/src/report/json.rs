//! `--json`: one object per file, line-delimited, exactly the reference's schema.

use serde_json::json;

use crate::runner::outcome::FileOutcome;

pub fn render_file(f: &FileOutcome) -> String {
    let tests: Vec<_> = f
        .tests
        .iter()
        .map(|t| json!({"name": t.name, "status": t.status.as_str(), "message": t.message, "log": t.log}))
        .collect();
    let chunk_error = f.chunk_error.clone().or_else(|| f.crashed.clone());
    let obj = json!({
        "path": f.path,
        "timeout": if f.timed_out { "timed_out" } else { "in_time" },
        "passed": f.passed(),
        "chunk_error": chunk_error,
        "tests": tests,
    });
    let mut line = obj.to_string();
    line.push('\n');
    line
}
