//! The Snapshot and LabSnapshot userdata: thin handles over the file written
//! by `vm:snapshot()` and the directory written by `lab:snapshot()`.
//!
//! They hold no agent state: `path`, `size` and `delete` only (see the
//! reference's Snapshot page). A snapshot taken without an explicit path
//! lives in a temporary file that is deleted when the scope that took it
//! closes (the test, or the file for file-scope snapshots), unless a fixture
//! build hands it to the cache first.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use mlua::{UserData, UserDataMethods, Value};

use super::err;
use crate::runner::Closeable;

/// A fresh temporary path `<tmp>/provium-<pid>-<random><suffix>`.
pub fn temp_path(suffix: &str) -> PathBuf {
    let mut r = [0u8; 8];
    let _ = std::fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut r));
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let hex: String = r.iter().map(|b| format!("{b:02x}")).collect();
    std::env::temp_dir().join(format!(
        "provium-{}-{hex}{nanos:08x}{suffix}",
        std::process::id()
    ))
}

/// `vm:snapshot()`'s result.
#[derive(Clone, Debug)]
pub struct SnapshotUd {
    pub path: PathBuf,
}

/// `lab:snapshot()`'s result.
#[derive(Clone, Debug)]
pub struct LabSnapshotUd {
    pub path: PathBuf,
}

/// Deletes a temporary snapshot (file or directory) at scope end.
pub struct TempSnapshot(pub PathBuf);

impl Closeable for TempSnapshot {
    fn auto_close(&self) -> Result<(), String> {
        remove_any(&self.0);
        Ok(())
    }
}

/// Best-effort delete of a file or directory; absent is fine.
pub fn remove_any(path: &Path) {
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.is_dir() => {
            let _ = std::fs::remove_dir_all(path);
        }
        Ok(_) => {
            let _ = std::fs::remove_file(path);
        }
        Err(_) => {}
    }
}

/// Sum of the sizes of the files directly under `dir` (one level).
pub fn dir_size_one_level(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.metadata().ok())
        .filter(|m| m.is_file())
        .map(|m| m.len())
        .sum()
}

impl UserData for SnapshotUd {
    fn add_methods<M: UserDataMethods<Self>>(m: &mut M) {
        m.add_method("path", |_, this, ()| {
            Ok(this.path.to_string_lossy().into_owned())
        });
        m.add_method("size", |_, this, ()| {
            Ok(std::fs::metadata(&this.path).map_or(0, |m| m.len()))
        });
        m.add_method("delete", |_, this, ()| {
            remove_any(&this.path);
            Ok(())
        });
        m.add_meta_method(mlua::MetaMethod::ToString, |_, this, ()| {
            Ok(format!("Snapshot({})", this.path.display()))
        });
    }
}

impl UserData for LabSnapshotUd {
    fn add_methods<M: UserDataMethods<Self>>(m: &mut M) {
        m.add_method("path", |_, this, ()| {
            Ok(this.path.to_string_lossy().into_owned())
        });
        m.add_method("size", |_, this, ()| Ok(dir_size_one_level(&this.path)));
        m.add_method("delete", |_, this, ()| {
            remove_any(&this.path);
            Ok(())
        });
        m.add_meta_method(mlua::MetaMethod::ToString, |_, this, ()| {
            Ok(format!("LabSnapshot({})", this.path.display()))
        });
    }
}

/// A path argument: a Snapshot userdata or a string.
pub fn snapshot_path_arg(v: &Value, what: &str) -> mlua::Result<PathBuf> {
    match v {
        Value::String(s) => Ok(PathBuf::from(s.to_str()?.to_string())),
        Value::UserData(ud) => {
            if let Ok(s) = ud.borrow::<SnapshotUd>() {
                return Ok(s.path.clone());
            }
            if let Ok(s) = ud.borrow::<LabSnapshotUd>() {
                return Ok(s.path.clone());
            }
            Err(err(format!("{what}: expected a snapshot or a path string")))
        }
        other => Err(err(format!(
            "{what}: expected a snapshot or a path string, got {}",
            other.type_name()
        ))),
    }
}

/// The section of a VM snapshot that records how the VM was declared, so a
/// fixture can recreate it.
pub const VM_DECL_SECTION: &str = "vm-decl";

/// How the snapshotted VM was declared (JSON in [`VM_DECL_SECTION`]).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct VmDecl {
    pub name: String,
    pub profile: String,
    pub memory_bytes: u64,
    pub cpus: u32,
}

impl VmDecl {
    pub fn to_json(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("a declaration always serializes")
    }

    /// Read the declaration from the snapshot at `path` (header, checksum
    /// and section verified).
    pub fn read(path: &Path) -> Result<VmDecl, String> {
        let snap = provium_snapshot::Snapshot::open(
            path,
            &provium_snapshot::Expect::protocol(provium_protocol::PROTOCOL_VERSION),
        )
        .map_err(|e| crate::backend::local::snapshot::chain(&e))?;
        let bytes = snap
            .section(VM_DECL_SECTION)
            .map_err(|e| crate::backend::local::snapshot::chain(&e))?;
        serde_json::from_slice(&bytes).map_err(|e| {
            format!(
                "snapshot {}: the `{VM_DECL_SECTION}` section is invalid: {e}",
                path.display()
            )
        })
    }
}

/// The refusal for a snapshot (or restore) with live streams, in the
/// reference's shape.
pub fn live_streams_refusal(what: &str, file: &str, live: &[String]) -> String {
    let list: Vec<String> = live.iter().map(|l| format!("  - {l}")).collect();
    format!(
        "{what} refused — file `{file}` has live streams:\n{}\nClose the streams before snapshotting (or remove the snapshot).",
        list.join("\n")
    )
}

/// Register a temporary snapshot for deletion when the current scope closes.
pub fn delete_at_scope_end(env: &crate::runner::FileEnv, path: &Path) {
    env.register_closeable(
        crate::runner::CloseKind::Stream,
        Arc::new(TempSnapshot(path.to_path_buf())),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusal_names_every_stream() {
        let m = live_streams_refusal(
            "vm:snapshot()",
            "tests/x.test.lua",
            &["tail_file(\"/var/log/messages\") at tests/x.test.lua:42".into()],
        );
        assert_eq!(
            m,
            "vm:snapshot() refused — file `tests/x.test.lua` has live streams:\n  - tail_file(\"/var/log/messages\") at tests/x.test.lua:42\nClose the streams before snapshotting (or remove the snapshot)."
        );
    }

    #[test]
    fn temp_paths_are_distinct_and_sizes_are_one_level() {
        assert_ne!(temp_path(".snap"), temp_path(".snap"));
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("a"), b"123").unwrap();
        std::fs::create_dir(d.path().join("sub")).unwrap();
        std::fs::write(d.path().join("sub/b"), b"12345").unwrap();
        assert_eq!(dir_size_one_level(d.path()), 3);
        remove_any(d.path());
        assert!(!d.path().exists());
        remove_any(d.path());
    }
}
