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
/// A VM's NIC records are the network model's (`network::ports`).
pub use crate::network::{NicDecl, SlotNicDecl};
use crate::runner::Closeable;

/// Why a snapshot's recorded declaration cannot be read or used.
#[derive(Debug, thiserror::Error)]
pub enum DeclError {
    /// The container itself (header, checksum, section table).
    #[error(transparent)]
    Container(#[from] provium_snapshot::SnapshotError),
    /// A section the Lua layer wrote does not decode.
    #[error("snapshot {}: the `{section}` section is invalid", path.display())]
    InvalidSection {
        path: PathBuf,
        section: String,
        #[source]
        source: serde_json::Error,
    },
}

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

/// Remove the temporary snapshots (`provium-<pid>-…`, and their writers'
/// `.provium-<pid>-….tmp-…` siblings) in `dir` whose process is gone: a
/// SIGKILLed run cannot delete them at scope end, the next run does.
/// Returns how many it removed. Best effort: what cannot be removed stays.
pub fn remove_stale_temps(dir: &Path) -> usize {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return 0;
    };
    let mut removed = 0;
    for ent in rd.flatten() {
        let name = ent.file_name().to_string_lossy().into_owned();
        let Some(rest) = name
            .strip_prefix("provium-")
            .or_else(|| name.strip_prefix(".provium-"))
        else {
            continue;
        };
        let Some(pid) = rest
            .split_once('-')
            .and_then(|(p, _)| p.parse::<u32>().ok())
        else {
            continue;
        };
        if pid == std::process::id() || Path::new(&format!("/proc/{pid}")).exists() {
            continue;
        }
        let path = ent.path();
        let r = match ent.file_type() {
            Ok(t) if t.is_dir() => std::fs::remove_dir_all(&path),
            _ => std::fs::remove_file(&path),
        };
        if r.is_ok() {
            removed += 1;
        }
    }
    removed
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
    fn auto_close(&self) -> Result<(), crate::runner::file::TestFailure> {
        remove_any(&self.0);
        Ok(())
    }
}

/// Best-effort delete of a file or directory; absent is fine. A snapshot
/// file's restore image (`<file>.img`, written with it) goes with it.
pub fn remove_any(path: &Path) {
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.is_dir() => {
            let _ = std::fs::remove_dir_all(path);
        }
        Ok(_) => {
            let _ = std::fs::remove_file(path);
            let _ = std::fs::remove_file(provium_snapshot::image_path(path));
        }
        Err(_) => {}
    }
}

/// Sum of the sizes of the files directly under `dir` (one level), the
/// VMs' restore images (`.img`, derived data, sparse) left out.
pub fn dir_size_one_level(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| !provium_snapshot::image::is_snapshot_image_name(&e.path()))
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

/// How the snapshotted VM was declared (JSON in [`VM_DECL_SECTION`]), so a
/// fixture can recreate it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct VmDecl {
    pub name: String,
    pub profile: String,
    pub memory_bytes: u64,
    pub cpus: u32,
    /// The VM's pinned `rng_seed` (`vm:boot` opts), if any. A restore into
    /// a VM without a seed of its own (a fixture's new VM) pins this one,
    /// so every restore of a seeded snapshot reads the same virtio-rng
    /// stream from the same point: the device's saved state is a stream
    /// position, which only means something under the same seed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rng_seed: Option<u64>,
}

/// The section of a VM snapshot that records its machine's devices.
pub const VM_DEVICES_SECTION: &str = "vm-devices";

/// The devices the snapshotted VM's machine had (JSON in
/// [`VM_DEVICES_SECTION`]), so a restore can give the restoring VM the same
/// ones: the snapshot's device state needs them, and the VMM refuses a
/// restore whose device list differs. Beside [`VmDecl`] rather than in it,
/// so a declaration's shape is the same for every snapshot.
///
/// A snapshot without this section (written before it existed, or below
/// Lua) is restored with the devices the restoring VM has (a fixture's
/// new VM: none), as before.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct VmDevices {
    /// The machine's virtio-blk disks, in device order (the guest's vda,
    /// vdb, ...).
    #[serde(default)]
    pub disks: Vec<DiskDecl>,
    /// The machine's virtio-net NICs, in device order (the guest's eth0,
    /// eth1, ...: by bridge name). Always empty for the local backend,
    /// whose NICs are TAPs made after boot (and which refuses to snapshot a
    /// sandbox that has one).
    #[serde(default)]
    pub nics: Vec<NicDecl>,
    /// Disks a running kvm guest took after boot, by disk slot: a restore
    /// puts each back into its slot.
    #[serde(default)]
    pub slot_disks: Vec<SlotDiskDecl>,
    /// NICs a running kvm guest was given after boot (`bridge:attach` on a
    /// booted VM), by NIC slot: a restore plugs each back onto its bridge.
    #[serde(default)]
    pub slot_nics: Vec<SlotNicDecl>,
}

/// A disk in disk slot `slot` of a snapshotted kvm VM (docs/disks.md).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SlotDiskDecl {
    pub slot: usize,
    pub disk: DiskDecl,
}

/// One disk of a snapshotted VM. Its contents are not in the snapshot: a
/// restore uses the image at `image` as it is then.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct DiskDecl {
    /// `vm:attach_disk`'s id (the device's GET_ID string).
    pub id: String,
    /// Absolute path of the backing image.
    pub image: PathBuf,
    /// The disk's modelled size (`size` at attach). Disks are read-write
    /// (the kvm backend gives no read-only disk today).
    pub size_bytes: u64,
    /// `disk:detach()` was called before the snapshot: the device is still
    /// in the guest (no hot-unplug) and fails every request; restored so.
    #[serde(default)]
    pub detached: bool,
}

impl VmDecl {
    pub fn to_json(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("a declaration always serializes")
    }

    /// Read the declaration from the snapshot at `path` (header, checksum
    /// and section verified).
    pub fn read(path: &Path) -> Result<VmDecl, DeclError> {
        decode_section(&open_snapshot(path)?, path, VM_DECL_SECTION)
    }

    /// [`VmDecl::read`], or `None` for a snapshot without
    /// [`VM_DECL_SECTION`] (one written below Lua).
    pub fn read_if_present(path: &Path) -> Result<Option<VmDecl>, DeclError> {
        let snap = open_snapshot(path)?;
        if !snap.has_section(VM_DECL_SECTION) {
            return Ok(None);
        }
        decode_section(&snap, path, VM_DECL_SECTION).map(Some)
    }
}

impl VmDevices {
    pub fn to_json(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("a device list always serializes")
    }

    /// The devices recorded in the snapshot at `path`, or `None` for a
    /// snapshot without [`VM_DEVICES_SECTION`] (header and checksums
    /// verified; an invalid section is an error).
    pub fn read_if_present(path: &Path) -> Result<Option<VmDevices>, DeclError> {
        let snap = open_snapshot(path)?;
        if !snap.has_section(VM_DEVICES_SECTION) {
            return Ok(None);
        }
        decode_section(&snap, path, VM_DEVICES_SECTION).map(Some)
    }
}

fn open_snapshot(path: &Path) -> Result<provium_snapshot::Snapshot, DeclError> {
    Ok(provium_snapshot::Snapshot::open(
        path,
        &provium_snapshot::Expect::protocol(provium_protocol::PROTOCOL_VERSION),
    )?)
}

fn decode_section<T: serde::de::DeserializeOwned>(
    snap: &provium_snapshot::Snapshot,
    path: &Path,
    section: &str,
) -> Result<T, DeclError> {
    let bytes = snap.section(section)?;
    serde_json::from_slice(&bytes).map_err(|source| DeclError::InvalidSection {
        path: path.to_path_buf(),
        section: section.to_string(),
        source,
    })
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
    fn device_records_read_with_defaults_for_missing_fields() {
        let d: VmDevices = serde_json::from_str("{}").unwrap();
        assert_eq!(d, VmDevices::default());
        let n: NicDecl =
            serde_json::from_str(r#"{"bridge":"lan","mac":"02:00:00:00:00:01"}"#).unwrap();
        assert!(n.attached && n.connected && n.bridge_lab.is_none(), "{n:?}");
    }

    #[test]
    fn a_device_record_round_trips_through_a_snapshot() {
        let d = VmDevices {
            slot_nics: vec![SlotNicDecl {
                slot: 0,
                nic: NicDecl {
                    bridge: "late".into(),
                    mac: "02:00:00:00:00:07".into(),
                    attached: true,
                    connected: false,
                    bridge_lab: None,
                },
            }],
            slot_disks: vec![SlotDiskDecl {
                slot: 1,
                disk: DiskDecl {
                    id: "late".into(),
                    image: "/srv/late.img".into(),
                    size_bytes: 4096,
                    detached: false,
                },
            }],
            disks: vec![DiskDecl {
                id: "vda".into(),
                image: "/srv/a.img".into(),
                size_bytes: 1 << 20,
                detached: true,
            }],
            nics: vec![NicDecl {
                bridge: "lan".into(),
                mac: "02:aa:bb:cc:dd:ee".into(),
                attached: true,
                connected: false,
                bridge_lab: Some(vec!["site".into()]),
            }],
        };
        let dir = tempfile::tempdir().unwrap();
        let write = |name: &str, sections: &[(&str, Vec<u8>)]| {
            let shape = provium_snapshot::Shape {
                backend: "kvm".into(),
                memory_bytes: 1 << 20,
                vcpus: 1,
            };
            let mut b =
                provium_snapshot::SnapshotBuilder::new(provium_protocol::PROTOCOL_VERSION, shape);
            for (n, data) in sections {
                b.add_section(n, data).unwrap();
            }
            let p = dir.path().join(name);
            b.write_file(&p).unwrap();
            p
        };
        let with = write("with.snap", &[(VM_DEVICES_SECTION, d.to_json())]);
        assert_eq!(VmDevices::read_if_present(&with).unwrap(), Some(d.clone()));
        let without = write("without.snap", &[(VM_DECL_SECTION, b"{}".to_vec())]);
        assert_eq!(VmDevices::read_if_present(&without).unwrap(), None);
        let bad = write("bad.snap", &[(VM_DEVICES_SECTION, b"[1]".to_vec())]);
        let e = crate::error_chain::flatten(&VmDevices::read_if_present(&bad).unwrap_err());
        assert!(e.contains("the `vm-devices` section is invalid"), "{e}");
        let n = &d.nics[0];
        assert_eq!(
            n.mac_addr().unwrap(),
            provium_netsetup::MacAddr([0x02, 0xaa, 0xbb, 0xcc, 0xdd, 0xee])
        );
        let bad = NicDecl {
            mac: "nope".into(),
            ..n.clone()
        };
        let e = crate::error_chain::flatten(&bad.mac_addr().unwrap_err());
        assert!(
            e.starts_with("the snapshot's NIC on bridge `lan`: `nope` is not a MAC address"),
            "{e}"
        );
    }

    #[test]
    fn stale_temporary_snapshots_of_dead_runs_are_removed() {
        let d = tempfile::tempdir().unwrap();
        // pid_max is at most 2^22: this pid is never alive.
        let dead = 999_999_999u32;
        let me = std::process::id();
        for name in [
            format!("provium-{dead}-ab12.snap"),
            format!(".provium-{dead}-ab12.snap.tmp-{dead}-5"),
        ] {
            std::fs::write(d.path().join(name), b"partial").unwrap();
        }
        std::fs::create_dir(d.path().join(format!("provium-{dead}-cd34.lab"))).unwrap();
        let keep = [
            format!("provium-{me}-ef56.snap"),
            format!("provium-coverage-{dead}.msgpack"),
            "unrelated".to_string(),
        ];
        for name in &keep {
            std::fs::write(d.path().join(name), b"x").unwrap();
        }
        assert_eq!(remove_stale_temps(d.path()), 3);
        let mut left: Vec<String> = std::fs::read_dir(d.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        let mut want = keep.to_vec();
        want.sort();
        assert_eq!(left, want);
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
