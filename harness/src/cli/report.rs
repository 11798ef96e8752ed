//! `provium report merge INPUT...`: one report from the shards of a
//! sharded run (`--partition`, docs/ci.md).
//!
//! Each input is what one shard saved: its event stream (`--save-events`,
//! msgpack frames) or its `--json` lines; the format is told from the first
//! byte (`{` is JSON). Every input names its run (`run_started`, or the
//! `"run"` object each JSON line of a `--partition` run carries): a run id, the suite id (a hash of the
//! suite's files before partitioning) and the partition. The merge refuses
//! inputs of different suites, of different partition schemes, a shard
//! given twice, and a missing shard, naming it. It then prints the plain
//! report of every file and one summary, writes one JUnit file, and exits
//! 0 when every file passed, else 1.
//!
//! From events, a test's `t:log` lines are not known (the stream does not
//! carry them) and a file whose chunk failed gets a placeholder message;
//! `--json` inputs carry both.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Subcommand;
use provium_protocol::event::FileStatus;
use provium_protocol::frame::{read_message, DEFAULT_MAX_FRAME_BYTES};
use provium_protocol::{Event, EventFrame};

use super::{EXIT_FAILED, EXIT_OK};
use crate::partition::{Partition, PartitionError, PartitionKind};
use crate::report::human::{self, Totals};
use crate::report::run_event::FileReport;
use crate::report::{self, RunIdentity, Verbosity};
use crate::runner::outcome::{FileOutcome, TestReport, TestStatus};

#[derive(Debug, Subcommand)]
pub enum ReportOp {
    /// Combine N shards' saved events (or --json outputs) into one summary,
    /// one JUnit file and one exit code.
    Merge {
        /// Each shard's `--save-events` file or `--json` output.
        #[arg(required = true)]
        inputs: Vec<PathBuf>,
        /// Write the merged JUnit XML here.
        #[arg(long, value_name = "PATH")]
        junit: Option<PathBuf>,
    },
}

/// Why shards could not be merged; each names the input and the fix.
#[derive(Debug, thiserror::Error)]
pub enum MergeError {
    #[error("report merge: no inputs")]
    NoInputs,
    #[error("`{}` records partition `{partition}`, which does not parse", input.display())]
    BadPartition {
        input: PathBuf,
        partition: String,
        #[source]
        source: PartitionError,
    },
    #[error(
        "`{}` is from suite {suite} ({suite_files} files) but `{}` is from suite {first_suite} \
         ({first_suite_files} files): merge only shards of one suite (run every shard from the \
         same checkout with the same paths and selection flags)",
        input.display(),
        first_input.display()
    )]
    OtherSuite {
        input: PathBuf,
        suite: String,
        suite_files: u32,
        first_input: PathBuf,
        first_suite: String,
        first_suite_files: u32,
    },
    #[error(
        "`{}` is shard {part} but `{}` is shard {first_part}: merge shards of one partition \
         scheme (the same KIND and N on every shard)",
        input.display(),
        first_input.display()
    )]
    OtherScheme {
        input: PathBuf,
        part: Partition,
        first_input: PathBuf,
        first_part: Partition,
    },
    #[error(
        "shard {part} is given twice: `{}` (run {first_run}) and `{}` (run {run}); pass each \
         shard once",
        first_input.display(),
        input.display()
    )]
    GivenTwice {
        part: Partition,
        first_input: PathBuf,
        first_run: String,
        input: PathBuf,
        run: String,
    },
    #[error(
        "shard {} of suite {suite} is missing: pass every shard's --save-events or --json output \
         (got {got} of {total})",
        missing.join(", ")
    )]
    Missing {
        missing: Vec<String>,
        suite: String,
        got: usize,
        total: u32,
    },
    #[error("report merge: `{}`", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "report merge: `{}` is empty (give a shard's --save-events file or --json output)",
        path.display()
    )]
    Empty { path: PathBuf },
    #[error(
        "report merge: `{}` is neither --json lines nor a readable event stream (frame {frame})",
        path.display()
    )]
    NotEvents {
        path: PathBuf,
        frame: usize,
        #[source]
        source: provium_protocol::ProtocolError,
    },
    #[error(
        "report merge: `{}` has no run_started event, so its run and suite are unknown (save it \
         with this provium's --save-events)",
        path.display()
    )]
    NoRunStarted { path: PathBuf },
    #[error("report merge: `{}` is not UTF-8 JSON", path.display())]
    NotUtf8 { path: PathBuf },
    /// A `--json` line that is not what `provium run --json` writes.
    #[error(
        "report merge: `{}` line {line}: {what} (give a shard's --json output)",
        path.display()
    )]
    BadJsonLine {
        path: PathBuf,
        line: usize,
        what: String,
    },
    #[error("report merge: `{}` has no lines", path.display())]
    NoLines { path: PathBuf },
    #[error(transparent)]
    Report(#[from] report::ReportError),
}

/// One shard's report, as read back.
#[derive(Debug)]
pub struct Shard {
    pub input: PathBuf,
    pub run: RunIdentity,
    pub files: Vec<FileOutcome>,
    pub elapsed: Duration,
}

pub fn run(op: ReportOp) -> Result<i32, MergeError> {
    match op {
        ReportOp::Merge { inputs, junit } => {
            let shards = inputs
                .iter()
                .map(|p| read_shard(p))
                .collect::<Result<Vec<_>, _>>()?;
            let merged = merge(shards)?;
            let reports: Vec<FileReport> = merged.files.iter().map(FileOutcome::report).collect();
            let mut out = String::new();
            for f in &reports {
                out += &human::render_file(f, Verbosity::Normal);
            }
            out += &human::render_summary(&Totals::of(&reports), merged.elapsed);
            print!("{out}");
            if let Some(path) = junit {
                std::fs::write(&path, report::junit::render(&reports))
                    .map_err(|source| report::ReportError::Junit { path, source })?;
            }
            Ok(if merged.files.iter().all(FileOutcome::passed) {
                EXIT_OK
            } else {
                EXIT_FAILED
            })
        }
    }
}

/// Every shard's files, sorted by path, and the longest shard's run time
/// (shards run side by side).
#[derive(Debug)]
pub struct Merged {
    pub files: Vec<FileOutcome>,
    pub elapsed: Duration,
}

fn shard_of(s: &Shard) -> Result<Partition, MergeError> {
    match &s.run.partition {
        None => Ok(Partition {
            kind: PartitionKind::Count,
            index: 1,
            total: 1,
        }),
        Some(p) => p.parse().map_err(|source| MergeError::BadPartition {
            input: s.input.clone(),
            partition: p.clone(),
            source,
        }),
    }
}

/// Check that `shards` are exactly the shards of one suite, then combine.
pub fn merge(shards: Vec<Shard>) -> Result<Merged, MergeError> {
    let first = shards.first().ok_or(MergeError::NoInputs)?;
    let first_part = shard_of(first)?;
    let mut by_index: BTreeMap<u32, &Shard> = BTreeMap::new();
    for s in &shards {
        if s.run.suite_id != first.run.suite_id || s.run.suite_files != first.run.suite_files {
            return Err(MergeError::OtherSuite {
                input: s.input.clone(),
                suite: s.run.suite_id.clone(),
                suite_files: s.run.suite_files,
                first_input: first.input.clone(),
                first_suite: first.run.suite_id.clone(),
                first_suite_files: first.run.suite_files,
            });
        }
        let part = shard_of(s)?;
        if part.kind != first_part.kind || part.total != first_part.total {
            return Err(MergeError::OtherScheme {
                input: s.input.clone(),
                part,
                first_input: first.input.clone(),
                first_part,
            });
        }
        if let Some(other) = by_index.insert(part.index, s) {
            return Err(MergeError::GivenTwice {
                part,
                first_input: other.input.clone(),
                first_run: other.run.run_id.clone(),
                input: s.input.clone(),
                run: s.run.run_id.clone(),
            });
        }
    }
    let missing: Vec<String> = (1..=first_part.total)
        .filter(|i| !by_index.contains_key(i))
        .map(|i| {
            Partition {
                index: i,
                ..first_part
            }
            .to_string()
        })
        .collect();
    if !missing.is_empty() {
        return Err(MergeError::Missing {
            missing,
            suite: first.run.suite_id.clone(),
            got: by_index.len(),
            total: first_part.total,
        });
    }
    let suite_files = first.run.suite_files;
    let elapsed = shards.iter().map(|s| s.elapsed).max().unwrap_or_default();
    let mut files: Vec<FileOutcome> = shards.into_iter().flat_map(|s| s.files).collect();
    files.sort_by(|a, b| a.path.cmp(&b.path));
    let total = files.len();
    if u32::try_from(total).ok() != Some(suite_files) {
        eprintln!(
            "provium: report merge: warning: the shards hold {total} file(s) but the suite has {} \
             (a shard stopped early, e.g. under --fail-fast)",
            suite_files
        );
    }
    Ok(Merged { files, elapsed })
}

/// Read one input, events or JSON lines.
pub fn read_shard(path: &Path) -> Result<Shard, MergeError> {
    let bytes = std::fs::read(path).map_err(|source| MergeError::Read {
        path: path.into(),
        source,
    })?;
    match bytes.iter().find(|b| !b.is_ascii_whitespace()) {
        None => Err(MergeError::Empty { path: path.into() }),
        Some(b'{') => shard_from_json(path, &bytes),
        Some(_) => shard_from_events(path, &bytes),
    }
}

fn shard_from_events(path: &Path, bytes: &[u8]) -> Result<Shard, MergeError> {
    let mut r = bytes;
    let mut frames: Vec<EventFrame> = Vec::new();
    loop {
        match read_message::<EventFrame, _>(&mut r, DEFAULT_MAX_FRAME_BYTES) {
            Ok(Some(f)) => frames.push(f),
            Ok(None) => break,
            Err(source) => {
                return Err(MergeError::NotEvents {
                    path: path.into(),
                    frame: frames.len() + 1,
                    source,
                })
            }
        }
    }
    let mut run = None;
    let mut order: Vec<String> = Vec::new();
    let mut files: BTreeMap<String, FileOutcome> = BTreeMap::new();
    let blank = |p: &str| FileOutcome {
        path: p.to_string(),
        abs_path: PathBuf::from(p),
        timed_out: false,
        chunk_error: None,
        crashed: None,
        tests: Vec::new(),
        duration: Duration::ZERO,
    };
    let test = |name: &str, status, message: Option<String>, ns: u64, meta| TestReport {
        name: name.to_string(),
        status,
        message,
        log: Vec::new(),
        duration: Duration::from_nanos(ns),
        meta,
    };
    for f in &frames {
        match &f.event {
            Event::RunStarted(r) => {
                run = Some(RunIdentity {
                    run_id: r.run_id.clone(),
                    suite_id: r.suite_id.clone(),
                    suite_files: r.suite_files,
                    partition: r.partition.clone(),
                })
            }
            Event::FileDiscovered(d) => {
                order.push(d.path.clone());
                files.insert(d.path.clone(), blank(&d.path));
            }
            Event::TestPassed(t) => {
                if let Some(o) = files.get_mut(&t.path) {
                    o.tests.push(test(
                        &t.name,
                        TestStatus::Passed,
                        None,
                        t.duration_ns,
                        t.meta.clone(),
                    ));
                }
            }
            Event::TestFailed(t) => {
                if let Some(o) = files.get_mut(&t.path) {
                    o.tests.push(test(
                        &t.name,
                        TestStatus::Failed,
                        Some(t.reason.clone()),
                        t.duration_ns,
                        t.meta.clone(),
                    ));
                }
            }
            Event::TestSkipped(t) => {
                if let Some(o) = files.get_mut(&t.path) {
                    o.tests.push(test(
                        &t.name,
                        TestStatus::Skipped,
                        Some(t.reason.clone()),
                        0,
                        t.meta.clone(),
                    ));
                }
            }
            Event::FileCompleted(c) => {
                if let Some(o) = files.get_mut(&c.path) {
                    o.duration = Duration::from_nanos(c.duration_ns);
                    match c.status {
                        FileStatus::TimedOut => o.timed_out = true,
                        FileStatus::Crashed => {
                            o.crashed =
                                Some("the file's runner crashed (see the shard's output)".into())
                        }
                        FileStatus::Failed if o.count(TestStatus::Failed) == 0 => {
                            o.chunk_error = Some(
                                "the file failed outside its tests (see the shard's output)".into(),
                            )
                        }
                        FileStatus::Failed | FileStatus::Passed => {}
                    }
                }
            }
            _ => {}
        }
    }
    let run = run.ok_or_else(|| MergeError::NoRunStarted { path: path.into() })?;
    let elapsed = match (frames.first(), frames.last()) {
        (Some(a), Some(b)) => {
            Duration::from_nanos(u64::try_from(b.ts.saturating_sub(a.ts)).unwrap_or(0))
        }
        _ => Duration::ZERO,
    };
    let files = order.iter().filter_map(|p| files.remove(p)).collect();
    Ok(Shard {
        input: path.to_path_buf(),
        run,
        files,
        elapsed,
    })
}

fn shard_from_json(path: &Path, bytes: &[u8]) -> Result<Shard, MergeError> {
    let text = std::str::from_utf8(bytes).map_err(|_| MergeError::NotUtf8 { path: path.into() })?;
    let mut run: Option<RunIdentity> = None;
    let mut files = Vec::new();
    for (n, line) in text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
    {
        let bad = |what: &str| MergeError::BadJsonLine {
            path: path.into(),
            line: n + 1,
            what: what.to_string(),
        };
        let v: serde_json::Value =
            serde_json::from_str(line).map_err(|e| bad(&format!("not JSON: {e}")))?;
        let str_of = |v: &serde_json::Value| v.as_str().map(str::to_string);
        let r = &v["run"];
        let this = RunIdentity {
            run_id: str_of(&r["id"]).ok_or_else(|| bad("no run.id"))?,
            suite_id: str_of(&r["suite"]).ok_or_else(|| bad("no run.suite"))?,
            suite_files: r["suite_files"]
                .as_u64()
                .and_then(|n| u32::try_from(n).ok())
                .ok_or_else(|| bad("no run.suite_files"))?,
            partition: str_of(&r["partition"]),
        };
        match &run {
            Some(prev) if *prev != this => {
                return Err(bad(&format!(
                "run {} differs from the earlier lines' run {}; one input is one shard's output",
                this.run_id, prev.run_id
            )))
            }
            Some(_) => {}
            None => run = Some(this),
        }
        let fpath = str_of(&v["path"]).ok_or_else(|| bad("no path"))?;
        let mut tests = Vec::new();
        for t in v["tests"].as_array().ok_or_else(|| bad("no tests array"))? {
            let status = match t["status"].as_str() {
                Some("passed") => TestStatus::Passed,
                Some("failed") => TestStatus::Failed,
                Some("skipped") => TestStatus::Skipped,
                other => return Err(bad(&format!("unknown test status {other:?}"))),
            };
            tests.push(TestReport {
                name: str_of(&t["name"]).ok_or_else(|| bad("a test without a name"))?,
                status,
                message: str_of(&t["message"]),
                log: t["log"]
                    .as_array()
                    .map(|l| l.iter().filter_map(str_of).collect())
                    .unwrap_or_default(),
                duration: Duration::ZERO,
                meta: Default::default(),
            });
        }
        files.push(FileOutcome {
            abs_path: PathBuf::from(&fpath),
            path: fpath,
            timed_out: v["timeout"] == "timed_out",
            chunk_error: str_of(&v["chunk_error"]),
            crashed: None,
            tests,
            duration: Duration::ZERO,
        });
    }
    let run = run.ok_or_else(|| MergeError::NoLines { path: path.into() })?;
    Ok(Shard {
        input: path.to_path_buf(),
        run,
        files,
        elapsed: Duration::ZERO,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shard(input: &str, suite: &str, partition: Option<&str>, files: &[&str]) -> Shard {
        Shard {
            input: input.into(),
            run: RunIdentity {
                run_id: format!("run-{input}"),
                suite_id: suite.into(),
                suite_files: 3,
                partition: partition.map(str::to_string),
            },
            files: files
                .iter()
                .map(|p| FileOutcome {
                    path: p.to_string(),
                    abs_path: p.into(),
                    timed_out: false,
                    chunk_error: None,
                    crashed: None,
                    tests: Vec::new(),
                    duration: Duration::ZERO,
                })
                .collect(),
            elapsed: Duration::from_secs(1),
        }
    }

    #[test]
    fn unreadable_inputs_name_the_file_and_chain_the_cause() {
        let d = tempfile::tempdir().unwrap();
        let absent = d.path().join("absent");
        let e = read_shard(&absent).unwrap_err();
        assert!(matches!(e, MergeError::Read { .. }), "{e:?}");
        assert_eq!(
            crate::error_chain::messages(&e)[0],
            format!("report merge: `{}`", absent.display())
        );
        let junk = d.path().join("junk");
        std::fs::write(&junk, b"\x00\x00\x00\x02\xc1\xc1").unwrap();
        let e = read_shard(&junk).unwrap_err();
        assert!(matches!(e, MergeError::NotEvents { frame: 1, .. }), "{e:?}");
        assert!(std::error::Error::source(&e).is_some());
        let empty = d.path().join("empty");
        std::fs::write(&empty, b"  \n").unwrap();
        assert!(crate::error_chain::flatten(&read_shard(&empty).unwrap_err()).contains("is empty"));
        let bad = d.path().join("bad.json");
        std::fs::write(&bad, b"{\"path\": 1}\n").unwrap();
        assert_eq!(
            read_shard(&bad).unwrap_err().to_string(),
            format!(
                "report merge: `{}` line 1: no run.id (give a shard's --json output)",
                bad.display()
            )
        );
    }

    #[test]
    fn refuses_other_suites_other_schemes_twice_given_and_missing_shards() {
        let err = |s: Vec<Shard>| crate::error_chain::flatten(&merge(s).unwrap_err());
        let e = err(vec![
            shard("a", "s1", Some("count:1/2"), &["x"]),
            shard("b", "s2", Some("count:2/2"), &["y"]),
        ]);
        assert!(
            e.starts_with("`b` is from suite s2 (3 files) but `a` is from suite s1"),
            "{e}"
        );
        let e = err(vec![
            shard("a", "s", Some("count:1/2"), &["x"]),
            shard("b", "s", Some("hash:2/2"), &["y"]),
        ]);
        assert!(
            e.contains("`b` is shard hash:2/2 but `a` is shard count:1/2"),
            "{e}"
        );
        let e = err(vec![
            shard("a", "s", Some("count:1/2"), &["x"]),
            shard("b", "s", Some("count:1/2"), &["y"]),
        ]);
        assert!(
            e.starts_with("shard count:1/2 is given twice: `a` (run run-a) and `b`"),
            "{e}"
        );
        let e = err(vec![
            shard("a", "s", Some("hash:1/3"), &["x"]),
            shard("c", "s", Some("hash:3/3"), &["z"]),
        ]);
        assert!(e.starts_with("shard hash:2/3 of suite s is missing"), "{e}");
        let m = merge(vec![
            shard("b", "s", Some("count:2/2"), &["b", "d"]),
            shard("a", "s", Some("count:1/2"), &["a", "c"]),
        ])
        .unwrap();
        let paths: Vec<&str> = m.files.iter().map(|f| f.path.as_str()).collect();
        assert_eq!(paths, ["a", "b", "c", "d"]);
    }
}
