//! The `--json` output of `provium run`: one [`FileLine`] per finished file,
//! serialised as one line of JSON (docs/harness.md lists it as API).
//!
//! Every struct declares its fields in alphabetical order. That is the
//! order the lines have always had (they were first built as sorted JSON
//! maps), and readers may rely on the bytes, so the order must not move:
//! the pin test below holds the exact line.

use serde::Serialize;

closed_enum! {
    /// How a test ended.
    pub enum TestStatus {
        /// It ran and passed.
        Passed => "passed",
        /// It ran and failed; `message` says why.
        Failed => "failed",
        /// It did not run; `message` says why.
        Skipped => "skipped",
    }
}

closed_enum! {
    /// Whether a file finished within `--timeout`.
    pub enum Timeliness {
        /// It ran past `--timeout` and was stopped.
        TimedOut => "timed_out",
        /// It finished within it (or no timeout was set).
        InTime => "in_time",
    }
}

/// One `--json` line: a finished file.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FileLine {
    /// The file's chunk error, else the runner's crash message, else null.
    pub chunk_error: Option<String>,
    /// The file finished in time, loaded, and no test failed.
    pub passed: bool,
    /// Test-root-relative path.
    pub path: String,
    /// Only a shard's lines (`--partition`) carry the run; an unsharded
    /// run's lines have no `run` key at all.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub run: Option<RunLine>,
    /// In declaration order.
    pub tests: Vec<TestLine>,
    /// Whether the file finished within `--timeout`.
    pub timeout: Timeliness,
}

/// One test of a [`FileLine`].
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TestLine {
    /// The test's `t:log` lines.
    pub log: Vec<String>,
    /// Failure message or skip reason; null for a pass.
    pub message: Option<String>,
    /// The test's name.
    pub name: String,
    /// How it ended.
    pub status: TestStatus,
}

/// The run a shard's [`FileLine`]s belong to, which `provium report merge`
/// reads: the same values as the `run_started` event.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RunLine {
    /// Unique per invocation.
    pub id: String,
    /// `count:I/N` or `hash:I/N`.
    pub partition: Option<String>,
    /// Shared by every shard of one suite.
    pub suite: String,
    /// Files in the suite before partitioning.
    pub suite_files: u32,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(run: Option<RunLine>) -> FileLine {
        FileLine {
            chunk_error: None,
            passed: false,
            path: "net/ping.test.lua".into(),
            run,
            tests: vec![
                TestLine {
                    log: vec!["rtt 0.3ms".into()],
                    message: None,
                    name: "ping".into(),
                    status: TestStatus::Passed,
                },
                TestLine {
                    log: vec![],
                    message: Some("expected 0, got 1".into()),
                    name: "ping6".into(),
                    status: TestStatus::Failed,
                },
            ],
            timeout: Timeliness::InTime,
        }
    }

    /// The exact bytes of a line; a change here is a change of API.
    #[test]
    fn pins_the_line() {
        assert_eq!(
            serde_json::to_string(&line(None)).unwrap(),
            r#"{"chunk_error":null,"passed":false,"path":"net/ping.test.lua","tests":[{"log":["rtt 0.3ms"],"message":null,"name":"ping","status":"passed"},{"log":[],"message":"expected 0, got 1","name":"ping6","status":"failed"}],"timeout":"in_time"}"#
        );
        let shard = line(Some(RunLine {
            id: "r".into(),
            partition: Some("hash:2/3".into()),
            suite: "s".into(),
            suite_files: 9,
        }));
        let text = serde_json::to_string(&shard).unwrap();
        assert!(
            text.contains(r#""path":"net/ping.test.lua","run":{"id":"r","partition":"hash:2/3","suite":"s","suite_files":9},"tests":"#),
            "{text}"
        );
    }

    #[test]
    fn spellings_match_serde() {
        for s in TestStatus::ALL {
            assert_eq!(serde_json::to_value(s).unwrap(), s.as_str());
        }
        for t in Timeliness::ALL {
            assert_eq!(serde_json::to_value(t).unwrap(), t.as_str());
        }
    }
}
