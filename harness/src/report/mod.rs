//! Renderers of a run. Each renders the typed events it is given and
//! decides nothing: human text (default, -v, -q) with a live progress line
//! on a terminal, line-delimited `--json`, JUnit XML, and the msgpack event
//! stream. The dispatcher (`crate::scheduler::dispatcher`) is the only
//! caller of a [`Reporter`].

pub mod event_stream;
pub mod human;
pub mod json;
pub mod junit;
pub mod progress;
pub mod run_event;
#[cfg(test)]
pub mod test_utils;

use std::path::PathBuf;

use crate::report::run_event::RunEvent;

/// A renderer of the run's [`RunEvent`]s, called in order, synchronously,
/// by the dispatcher (so a slow output slows dispatching instead of
/// piling up).
pub trait Reporter {
    fn report(&mut self, event: &RunEvent) -> Result<(), ReportError>;
}

/// What a reporter can fail with.
#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    /// The JUnit file could not be written.
    #[error("--junit `{}`", path.display())]
    Junit {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// Several reporters fed the same events, in order.
#[derive(Default)]
pub struct Reporters(Vec<Box<dyn Reporter>>);

impl Reporters {
    pub fn push(&mut self, r: impl Reporter + 'static) {
        self.0.push(Box::new(r));
    }
}

impl Reporter for Reporters {
    /// Every reporter sees every event; the first error is returned.
    fn report(&mut self, event: &RunEvent) -> Result<(), ReportError> {
        let mut first = None;
        for r in &mut self.0 {
            if let Err(e) = r.report(event) {
                first.get_or_insert(e);
            }
        }
        first.map_or(Ok(()), Err)
    }
}

/// How much the plain renderer shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verbosity {
    Quiet,
    Normal,
    Verbose,
}

/// Which run a report belongs to: what `run_started` carries and each
/// `--json` line repeats under `"run"`, so `provium report merge` can tell
/// shards apart and check that they are shards of one suite.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunIdentity {
    /// Unique per invocation.
    pub run_id: String,
    /// Shared by every shard of one suite (see [`suite_id`]).
    pub suite_id: String,
    /// Files in the suite before partitioning.
    pub suite_files: u32,
    /// `count:I/N` / `hash:I/N`, or none for an unsharded run.
    pub partition: Option<String>,
}

/// A suite's id: a hash over its files' root-relative paths, in discovery
/// order, before partitioning. 16 hex digits.
pub fn suite_id<'a>(paths: impl IntoIterator<Item = &'a str>) -> String {
    let mut k = provium_snapshot::KeyBuilder::new("provium-suite-v1");
    for p in paths {
        k.field("file", p.as_bytes());
    }
    k.finish().hex()[..16].to_string()
}

/// A fresh run id: host name, pid and start time hashed, 16 hex digits, so
/// two shards started at once on two machines still differ.
pub fn new_run_id() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let mut k = provium_snapshot::KeyBuilder::new("provium-run-v1");
    k.field("host", host.trim().as_bytes())
        .field("pid", &std::process::id().to_le_bytes())
        .field("nanos", &nanos.to_le_bytes());
    k.finish().hex()[..16].to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Counts its calls in a shared cell, and always fails.
    struct Failing(std::rc::Rc<std::cell::Cell<usize>>);
    impl Reporter for Failing {
        fn report(&mut self, _: &RunEvent) -> Result<(), ReportError> {
            self.0.set(self.0.get() + 1);
            Err(ReportError::Junit {
                path: "x".into(),
                source: std::io::Error::other("full"),
            })
        }
    }

    #[test]
    fn every_reporter_sees_the_event_despite_an_error() {
        let calls = std::rc::Rc::new(std::cell::Cell::new(0));
        let mut all = Reporters::default();
        all.push(Failing(calls.clone()));
        all.push(Failing(calls.clone()));
        let e = all
            .report(&RunEvent::RunStarted { file_count: 0 })
            .unwrap_err();
        assert_eq!(crate::error_chain::flatten(&e), "--junit `x`: full");
        assert_eq!(calls.get(), 2);
    }

    #[test]
    fn suite_ids_follow_the_file_list_and_run_ids_differ() {
        assert_eq!(suite_id(["a", "b"]), suite_id(["a", "b"]));
        assert_ne!(suite_id(["a", "b"]), suite_id(["b", "a"]));
        assert_ne!(suite_id(["ab"]), suite_id(["a", "b"]));
        assert_eq!(suite_id(["a"]).len(), 16);
        assert_ne!(new_run_id(), new_run_id());
    }
}
