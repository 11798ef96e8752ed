//! `--partition count:I/N` and `--partition hash:I/N`: one CI job's share of
//! a suite, spelled as cargo-nextest spells it.
//!
//! The unit is the file: a file's tests never split across shards, since
//! they share one Lua state, its VMs and its fixtures.
//!
//! - `count` deals files round-robin in discovery order: file k (0-based)
//!   goes to shard `k mod N + 1`. Shards stay within one file of each other
//!   in size, but adding a file moves every later file to another shard.
//! - `hash` puts a file in shard `h mod N + 1`, where `h` is the first 8
//!   bytes (big-endian) of the SHA-256 of its path relative to its test root
//!   (a [`KeyBuilder`] key in the `provium-partition-v1` domain). A file stays
//!   in its shard whatever else is added or removed, and every machine
//!   computes the same assignment, since the path is relative.
//!
//! Either way the N shards are disjoint and together hold every file once.

use std::fmt;
use std::str::FromStr;

use provium_snapshot::KeyBuilder;

/// How a partition deals files.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PartitionKind {
    /// Round-robin in discovery order.
    Count,
    /// By a stable hash of the root-relative path.
    Hash,
}

impl PartitionKind {
    pub fn as_str(self) -> &'static str {
        match self {
            PartitionKind::Count => "count",
            PartitionKind::Hash => "hash",
        }
    }
}

/// Shard `index` of `total` (1-based, as written on the command line).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Partition {
    pub kind: PartitionKind,
    pub index: u32,
    pub total: u32,
}

/// A `--partition` value that does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PartitionError {
    #[error("`{0}` has no kind (write count:I/N or hash:I/N, e.g. count:1/3)")]
    NoKind(String),
    #[error("unknown partition kind `{0}` (the kinds are count and hash: count:I/N or hash:I/N)")]
    UnknownKind(String),
    #[error("`{0}` is not I/N with whole numbers I and N (write e.g. count:1/3)")]
    NotAFraction(String),
    #[error("shard count 0 in `{0}`: N must be at least 1 (write count:I/N with 1 <= I <= N)")]
    ZeroTotal(String),
    #[error("shard 0 in `{0}`: shards are numbered from 1 (write count:I/N with 1 <= I <= N)")]
    ZeroIndex(String),
    #[error(
        "shard {index} of {total} in `{spec}`: I must be at most N (write count:I/N with 1 <= I <= N)"
    )]
    IndexPastTotal {
        spec: String,
        index: u32,
        total: u32,
    },
}

impl FromStr for Partition {
    type Err = PartitionError;

    fn from_str(spec: &str) -> Result<Partition, PartitionError> {
        let (kind, frac) = spec
            .split_once(':')
            .ok_or_else(|| PartitionError::NoKind(spec.to_string()))?;
        let kind = match kind {
            "count" => PartitionKind::Count,
            "hash" => PartitionKind::Hash,
            other => return Err(PartitionError::UnknownKind(other.to_string())),
        };
        let (i, n) = frac
            .split_once('/')
            .ok_or_else(|| PartitionError::NotAFraction(frac.to_string()))?;
        let parse = |s: &str| {
            s.parse::<u32>()
                .map_err(|_| PartitionError::NotAFraction(frac.to_string()))
        };
        let (index, total) = (parse(i)?, parse(n)?);
        if total == 0 {
            return Err(PartitionError::ZeroTotal(spec.to_string()));
        }
        if index == 0 {
            return Err(PartitionError::ZeroIndex(spec.to_string()));
        }
        if index > total {
            return Err(PartitionError::IndexPastTotal {
                spec: spec.to_string(),
                index,
                total,
            });
        }
        Ok(Partition { kind, index, total })
    }
}

impl fmt::Display for Partition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}/{}", self.kind.as_str(), self.index, self.total)
    }
}

/// The stable hash of a root-relative path (see the module docs).
pub fn path_hash(rel: &str) -> u64 {
    let mut k = KeyBuilder::new("provium-partition-v1");
    k.field("path", rel.as_bytes());
    let key = k.finish();
    let mut b = [0u8; 8];
    b.copy_from_slice(&key.0[..8]);
    u64::from_be_bytes(b)
}

impl Partition {
    /// Whether the file at `position` (0-based, in discovery order) with
    /// root-relative path `rel` belongs to this shard.
    pub fn contains(&self, position: usize, rel: &str) -> bool {
        let total = u64::from(self.total);
        let slot = match self.kind {
            PartitionKind::Count => u64::try_from(position).unwrap_or(u64::MAX) % total,
            PartitionKind::Hash => path_hash(rel) % total,
        };
        slot + 1 == u64::from(self.index)
    }

    /// This shard's share of `items` (in discovery order), by their paths.
    pub fn select<T>(&self, items: Vec<T>, rel: impl Fn(&T) -> &str) -> Vec<T> {
        items
            .into_iter()
            .enumerate()
            .filter(|(i, t)| self.contains(*i, rel(t)))
            .map(|(_, t)| t)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_parse_and_print_back() {
        for s in ["count:1/1", "count:2/3", "hash:5/5"] {
            assert_eq!(s.parse::<Partition>().unwrap().to_string(), s);
        }
        let err = |s: &str| s.parse::<Partition>().unwrap_err().to_string();
        assert_eq!(
            err("count:0/3"),
            "shard 0 in `count:0/3`: shards are numbered from 1 (write count:I/N with 1 <= I <= N)"
        );
        assert_eq!(
            err("count:4/3"),
            "shard 4 of 3 in `count:4/3`: I must be at most N (write count:I/N with 1 <= I <= N)"
        );
        assert_eq!(
            err("count:x/y"),
            "`x/y` is not I/N with whole numbers I and N (write e.g. count:1/3)"
        );
        assert!(err("0/3").contains("has no kind"), "{}", err("0/3"));
        assert!(err("slice:1/3").contains("unknown partition kind `slice`"));
        assert!(err("hash:1/0").starts_with("shard count 0"));
    }

    #[test]
    fn shards_are_disjoint_and_cover_for_both_kinds() {
        let files: Vec<String> = (0..23)
            .map(|i| format!("d{}/f{i}.test.lua", i % 4))
            .collect();
        for kind in ["count", "hash"] {
            for n in 1..=5u32 {
                let mut seen = vec![0u32; files.len()];
                for i in 1..=n {
                    let p: Partition = format!("{kind}:{i}/{n}").parse().unwrap();
                    let mine = p.select(files.iter().enumerate().collect(), |(_, f)| f.as_str());
                    for (k, _) in mine {
                        seen[k] += 1;
                    }
                }
                assert!(seen.iter().all(|&c| c == 1), "{kind} N={n}: {seen:?}");
            }
        }
    }

    const PINNED_A: u64 = 4_578_530_966_832_700_461;

    #[test]
    fn count_deals_round_robin_and_hash_ignores_position() {
        let p: Partition = "count:2/3".parse().unwrap();
        let got = p.select((0..7).collect::<Vec<usize>>(), |_| "x");
        assert_eq!(got, [1, 4]);
        // The hash assignment of a path does not depend on its neighbours.
        let h: Partition = "hash:1/4".parse().unwrap();
        let a = h.contains(0, "net/a.test.lua");
        assert_eq!(h.contains(17, "net/a.test.lua"), a);
        // Pinned: the assignment must not change between releases, or shards
        // of one suite run by two provium versions would overlap.
        assert_eq!(path_hash("a.test.lua"), PINNED_A);
        assert_ne!(path_hash("a.test.lua"), path_hash("b.test.lua"));
    }
}
