//! Renderers of a run: plain text (default, -v, -q), line-delimited JSON,
//! JUnit XML, and a live progress line on a terminal.

pub mod json;
pub mod junit;
pub mod plain;
pub mod progress;

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

    #[test]
    fn suite_ids_follow_the_file_list_and_run_ids_differ() {
        assert_eq!(suite_id(["a", "b"]), suite_id(["a", "b"]));
        assert_ne!(suite_id(["a", "b"]), suite_id(["b", "a"]));
        assert_ne!(suite_id(["ab"]), suite_id(["a", "b"]));
        assert_eq!(suite_id(["a"]).len(), 16);
        assert_ne!(new_run_id(), new_run_id());
    }
}
