//! `lab.json`: the index of a lab snapshot directory.
//!
//! A lab snapshot is a directory holding one snapshot file per VM of the lab
//! and its sub-labs, plus this index, which says which file belongs to which
//! VM (by sub-lab path and name) and how each VM was declared, so a restore
//! can recreate VMs the restoring lab does not have yet.
//!
//! ```json
//! {"format": 1, "lab": "provium",
//!  "vms": [{"lab_path": [], "name": "a", "profile": "peios",
//!           "memory_bytes": 536870912, "cpus": 1, "file": "a.snap"}]}
//! ```
//!
//! Format 2 adds `bridges`: each bridge of the lab and its sub-labs with its
//! attachments, partitions, isolation, impairments and routes, so a
//! restore reproduces the topology, not only the VMs. Format 1 indexes
//! (no `bridges`) still read, as a lab without bridges.
//!
//! The index is read from disk and treated as untrusted: file names must be
//! plain names inside the directory, and every file must exist.

use std::path::Path;

use serde::{Deserialize, Serialize};

/// The file name of the index inside a lab snapshot directory.
pub const LAB_INDEX_FILE: &str = "lab.json";
/// The index layout version.
pub const LAB_INDEX_FORMAT: u32 = 2;
/// The oldest index layout this build still reads.
pub const LAB_INDEX_OLDEST_FORMAT: u32 = 1;

/// One VM of a lab snapshot.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LabVm {
    /// Sub-lab names from the snapshotted lab down to the VM's lab (empty:
    /// the lab itself).
    pub lab_path: Vec<String>,
    /// The VM's name.
    pub name: String,
    /// Its profile.
    pub profile: String,
    /// Declared memory in bytes.
    pub memory_bytes: u64,
    /// Declared vCPUs.
    pub cpus: u32,
    /// Its snapshot file, a plain name inside the directory.
    pub file: String,
}

/// One axis set of impairments (`None`: not impaired on that axis).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LabImpairment {
    /// One-way delay, nanoseconds.
    pub latency_ns: Option<u64>,
    /// Drop probability, percent (0..=100).
    pub drop_pct: Option<f64>,
    /// Rate cap, bits per second.
    pub bandwidth_bps: Option<u64>,
}

/// A per-pair impairment: frames from `from` to `to`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LabPairImpairment {
    /// Sending attachment.
    pub from: String,
    /// Receiving attachment.
    pub to: String,
    /// What is declared for that direction.
    pub impairment: LabImpairment,
}

/// One bridge of a lab snapshot, as declared (graph state).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LabBridge {
    /// Sub-lab names from the snapshotted lab down to the bridge's lab.
    pub lab_path: Vec<String>,
    /// The bridge's name.
    pub name: String,
    /// Attachment names (VMs or bare names), sorted.
    pub members: Vec<String>,
    /// Partitioned (from, to) pairs, sorted.
    pub partitions: Vec<(String, String)>,
    /// Isolated attachment names, sorted.
    pub isolated: Vec<String>,
    /// Whole-bridge impairments.
    pub impairment: LabImpairment,
    /// Per-pair impairments, sorted by (from, to).
    pub pair_impairments: Vec<LabPairImpairment>,
    /// `bridge:route` targets (graph state only).
    pub routes: Vec<String>,
}

/// The whole index.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LabIndex {
    /// [`LAB_INDEX_FORMAT`].
    pub format: u32,
    /// The snapshotted lab's name.
    pub lab: String,
    /// Every VM, in snapshot order.
    pub vms: Vec<LabVm>,
    /// Every bridge (format 2; empty in a format 1 index).
    #[serde(default)]
    pub bridges: Vec<LabBridge>,
}

/// Why an index cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum LabIndexError {
    /// Reading or writing failed.
    #[error("cannot access lab snapshot index {path}")]
    Io {
        /// The index's path.
        path: String,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The JSON does not parse as an index.
    #[error("lab snapshot index {path} is not valid: {detail} (take the lab snapshot again)")]
    Invalid {
        /// The index's path.
        path: String,
        /// What is wrong.
        detail: String,
    },
}

/// A file name that stays inside the directory.
pub fn is_plain_file_name(name: &str) -> bool {
    !name.is_empty()
        && name != "."
        && name != ".."
        && !name.contains('/')
        && !name.contains('\0')
        && name != LAB_INDEX_FILE
}

impl LabIndex {
    /// An empty index for lab `lab`.
    pub fn new(lab: &str) -> LabIndex {
        LabIndex {
            format: LAB_INDEX_FORMAT,
            lab: lab.into(),
            vms: Vec::new(),
            bridges: Vec::new(),
        }
    }

    /// A file name for a VM at `lab_path`/`name`, unique within this index.
    pub fn file_name_for(&self, lab_path: &[String], name: &str) -> String {
        let mut parts: Vec<String> = lab_path.to_vec();
        parts.push(name.to_string());
        let stem: String = parts
            .join(".")
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        let stem = stem.trim_start_matches('.').to_string();
        let mut file = format!("{stem}.snap");
        let mut n = 1;
        while self.vms.iter().any(|v| v.file == file) {
            n += 1;
            file = format!("{stem}-{n}.snap");
        }
        file
    }

    /// Write `dir/lab.json` (temporary file, then rename).
    pub fn write(&self, dir: &Path) -> Result<(), LabIndexError> {
        let path = dir.join(LAB_INDEX_FILE);
        let io = |source| LabIndexError::Io {
            path: path.display().to_string(),
            source,
        };
        let json = serde_json::to_vec_pretty(self).expect("an index always serializes");
        let tmp = crate::install::temp_sibling(&path);
        std::fs::write(&tmp, json).map_err(io)?;
        std::fs::rename(&tmp, &path).map_err(io)
    }

    /// Read and validate `dir/lab.json`.
    pub fn read(dir: &Path) -> Result<LabIndex, LabIndexError> {
        let path = dir.join(LAB_INDEX_FILE);
        let shown = path.display().to_string();
        let bytes = std::fs::read(&path).map_err(|source| LabIndexError::Io {
            path: shown.clone(),
            source,
        })?;
        LabIndex::parse(&shown, &bytes, &|file| dir.join(file).is_file())
    }

    /// Validate the bytes of an index (`shown` names it in errors);
    /// `file_exists` says whether a plain file name exists in its directory.
    /// [`LabIndex::read`] is this over `dir/lab.json`; it is public so the
    /// fuzz target can drive it without a filesystem.
    pub fn parse(
        shown: &str,
        bytes: &[u8],
        file_exists: &dyn Fn(&str) -> bool,
    ) -> Result<LabIndex, LabIndexError> {
        let invalid = |detail: String| LabIndexError::Invalid {
            path: shown.to_string(),
            detail,
        };
        let index: LabIndex = serde_json::from_slice(bytes).map_err(|e| invalid(e.to_string()))?;
        if !(LAB_INDEX_OLDEST_FORMAT..=LAB_INDEX_FORMAT).contains(&index.format) {
            return Err(invalid(format!(
                "format {} (this provium reads {LAB_INDEX_OLDEST_FORMAT} to {LAB_INDEX_FORMAT})",
                index.format
            )));
        }
        let mut bridges = std::collections::BTreeSet::new();
        for b in &index.bridges {
            if !bridges.insert((b.lab_path.clone(), b.name.clone())) {
                return Err(invalid(format!("bridge `{}` is listed twice", b.name)));
            }
            let bad_pct =
                |i: &LabImpairment| i.drop_pct.is_some_and(|p| !(0.0..=100.0).contains(&p));
            if bad_pct(&b.impairment) || b.pair_impairments.iter().any(|p| bad_pct(&p.impairment)) {
                return Err(invalid(format!(
                    "bridge `{}` has a drop rate outside 0..=100 percent",
                    b.name
                )));
            }
        }
        let mut seen = std::collections::BTreeSet::new();
        for vm in &index.vms {
            if !is_plain_file_name(&vm.file) {
                return Err(invalid(format!(
                    "vm `{}` names file `{}`, which is not a plain file name in the directory",
                    vm.name, vm.file
                )));
            }
            if !seen.insert((vm.lab_path.clone(), vm.name.clone())) {
                return Err(invalid(format!("vm `{}` is listed twice", vm.name)));
            }
            if !file_exists(&vm.file) {
                return Err(invalid(format!(
                    "vm `{}`'s snapshot `{}` is missing",
                    vm.name, vm.file
                )));
            }
        }
        Ok(index)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vm(name: &str, file: &str) -> LabVm {
        LabVm {
            lab_path: vec![],
            name: name.into(),
            profile: "p".into(),
            memory_bytes: 1 << 29,
            cpus: 1,
            file: file.into(),
        }
    }

    #[test]
    fn write_read_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let mut idx = LabIndex::new("provium");
        let f = idx.file_name_for(&[], "a");
        assert_eq!(f, "a.snap");
        idx.vms.push(vm("a", &f));
        let f2 = idx.file_name_for(&["dc1".into()], "a");
        assert_eq!(f2, "dc1.a.snap");
        std::fs::write(dir.path().join("a.snap"), b"x").unwrap();
        idx.bridges.push(LabBridge {
            lab_path: vec!["dc1".into()],
            name: "lan".into(),
            members: vec!["a".into(), "b".into()],
            partitions: vec![("a".into(), "b".into())],
            isolated: vec!["b".into()],
            impairment: LabImpairment {
                latency_ns: Some(5_000_000),
                drop_pct: Some(12.5),
                bandwidth_bps: None,
            },
            pair_impairments: vec![LabPairImpairment {
                from: "a".into(),
                to: "b".into(),
                impairment: LabImpairment {
                    bandwidth_bps: Some(1000),
                    ..LabImpairment::default()
                },
            }],
            routes: vec!["wan".into()],
        });
        idx.write(dir.path()).unwrap();
        assert_eq!(LabIndex::read(dir.path()).unwrap(), idx);
    }

    #[test]
    fn a_format_1_index_reads_as_a_lab_without_bridges() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("a.snap"), b"x").unwrap();
        std::fs::write(
            dir.path().join(LAB_INDEX_FILE),
            br#"{"format": 1, "lab": "provium", "vms": [{"lab_path": [], "name": "a",
                "profile": "p", "memory_bytes": 1, "cpus": 1, "file": "a.snap"}]}"#,
        )
        .unwrap();
        let idx = LabIndex::read(dir.path()).unwrap();
        assert_eq!(idx.vms.len(), 1);
        assert!(idx.bridges.is_empty());
    }

    #[test]
    fn bridge_records_are_checked() {
        let dir = tempfile::tempdir().unwrap();
        let mut idx = LabIndex::new("provium");
        let b = LabBridge {
            lab_path: vec![],
            name: "lan".into(),
            members: vec![],
            partitions: vec![],
            isolated: vec![],
            impairment: LabImpairment {
                drop_pct: Some(150.0),
                ..LabImpairment::default()
            },
            pair_impairments: vec![],
            routes: vec![],
        };
        idx.bridges.push(b.clone());
        idx.write(dir.path()).unwrap();
        let e = LabIndex::read(dir.path()).unwrap_err().to_string();
        assert!(e.contains("drop rate outside"), "{e}");
        idx.bridges = vec![
            LabBridge {
                impairment: LabImpairment::default(),
                ..b.clone()
            };
            2
        ];
        idx.write(dir.path()).unwrap();
        let e = LabIndex::read(dir.path()).unwrap_err().to_string();
        assert!(e.contains("listed twice"), "{e}");
    }

    #[test]
    fn hostile_indexes_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let mut idx = LabIndex::new("provium");
        idx.vms.push(vm("a", "../etc/passwd"));
        idx.write(dir.path()).unwrap();
        let e = LabIndex::read(dir.path()).unwrap_err().to_string();
        assert!(e.contains("not a plain file name"), "{e}");

        let mut idx = LabIndex::new("provium");
        idx.vms.push(vm("a", "a.snap"));
        idx.write(dir.path()).unwrap();
        let e = LabIndex::read(dir.path()).unwrap_err().to_string();
        assert!(e.contains("`a.snap` is missing"), "{e}");

        std::fs::write(dir.path().join(LAB_INDEX_FILE), b"{\"format\": 1").unwrap();
        let e = LabIndex::read(dir.path()).unwrap_err().to_string();
        assert!(e.contains("is not valid"), "{e}");
        let e = LabIndex::read(&dir.path().join("nope"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("cannot access"), "{e}");
    }
}
