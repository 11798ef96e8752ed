//! `--json`: one object per file, line-delimited: the reference's schema;
//! under `--partition`, plus `"run"` ([`RunIdentity`]: run id, suite id,
//! suite size, partition), which `provium report merge` reads.

use serde_json::json;

use super::RunIdentity;
use crate::runner::outcome::FileOutcome;

pub fn render_file(f: &FileOutcome, run: &RunIdentity) -> String {
    let tests: Vec<_> = f
        .tests
        .iter()
        .map(|t| json!({"name": t.name, "status": t.status.as_str(), "message": t.message, "log": t.log}))
        .collect();
    let chunk_error = f.chunk_error.clone().or_else(|| f.crashed.clone());
    let mut obj = json!({
        "path": f.path,
        "timeout": if f.timed_out { "timed_out" } else { "in_time" },
        "passed": f.passed(),
        "chunk_error": chunk_error,
        "tests": tests,
    });
    // Only a shard's lines carry the run: an unsharded run keeps the
    // reference's schema exactly.
    if run.partition.is_some() {
        obj["run"] = json!({
            "id": run.run_id,
            "suite": run.suite_id,
            "suite_files": run.suite_files,
            "partition": run.partition,
        });
    }
    let mut line = obj.to_string();
    line.push('\n');
    line
}
