//! What `vm:fork(n)` and `lab:fork(n)` share: the checks on `n` and on the
//! source, the copy names, and the disk copies.
//!
//! A fork is a snapshot taken while the source is paused (so its memory,
//! devices and disks are of one instant) and n restores of it, each into a
//! new VM with its own disk copies and its own copies of the bridges. On
//! kvm the n restores map one sealed memfd privately (the run's
//! `RestoreRamCache`): guest RAM is shared copy-on-write, never copied per
//! copy. What a copy keeps and loses is in docs/snapshots.md ("Forking").
//!
//! A fork that fails halfway shuts down the copies it made and deletes
//! their disk copies before the error reaches Lua: no copy is left behind.

use std::path::{Path, PathBuf};

use provium_protocol::ResourceAmount;

use crate::lua::snapshot::VmDevices;

/// Why a fork was refused or failed, each naming the fix.
#[derive(Debug, thiserror::Error)]
pub enum ForkError {
    #[error("n must be a whole number of copies, 1 or more, got {n} (call fork(1) or more)")]
    Count { n: String },
    #[error(
        "{n} copies of {memory_bytes} bytes of guest memory each need {need_bytes} bytes, over the \
         pool's memory budget of {budget_bytes} bytes (fork fewer copies, give the run more with \
         --mem, or make the VMs smaller)"
    )]
    OverBudget {
        n: u64,
        memory_bytes: u64,
        need_bytes: u64,
        budget_bytes: u64,
    },
    #[error(
        "vm `{vm}` is {phase}, and only a running VM forks (call vm:boot() or vm:restore() first)"
    )]
    NotBooted { vm: String, phase: String },
    #[error("cannot copy disk image {} for copy `{copy}` (is there room next to it?)", image.display())]
    DiskCopy {
        image: PathBuf,
        copy: String,
        #[source]
        source: std::io::Error,
    },
}

/// The count `n` a Lua caller gave, checked: a whole number of at least 1.
pub fn copy_count(n: &mlua::Value) -> Result<u64, ForkError> {
    let bad = || ForkError::Count {
        n: match n {
            mlua::Value::String(s) => format!("{:?}", s.to_string_lossy()),
            mlua::Value::Integer(i) => i.to_string(),
            mlua::Value::Number(f) => f.to_string(),
            other => other.type_name().to_string(),
        },
    };
    let n = match n {
        mlua::Value::Integer(i) => *i,
        #[allow(clippy::cast_possible_truncation)]
        mlua::Value::Number(f) if f.fract() == 0.0 && f.abs() < 1e15 => *f as i64,
        _ => return Err(bad()),
    };
    u64::try_from(n).ok().filter(|n| *n >= 1).ok_or_else(bad)
}

/// Refuses `n` copies of VMs of `memory_bytes` (their total guest memory)
/// past the pool's memory budget: every copy may come to write all of its
/// memory, so the budget is the worst case, as for a claim.
pub fn check_budget(
    n: u64,
    memory_bytes: u64,
    pool: Option<ResourceAmount>,
) -> Result<(), ForkError> {
    let Some(pool) = pool else {
        return Ok(());
    };
    let need_bytes = n.saturating_mul(memory_bytes);
    if need_bytes > pool.memory_bytes {
        return Err(ForkError::OverBudget {
            n,
            memory_bytes,
            need_bytes,
            budget_bytes: pool.memory_bytes,
        });
    }
    Ok(())
}

/// The name of copy `i` (1-based) of `source`: `a.1`, `a.2`, ... (a dot,
/// not `~`: a sandbox's name becomes its hostname, which allows a-z, A-Z,
/// 0-9, `-`, `_` and `.` only; `a.1` is unlikely to be a name a test gave).
pub fn copy_name(source: &str, i: u64) -> String {
    format!("{source}.{i}")
}

/// Every backing image a snapshotted VM's disks use (boot disks and disks
/// given after boot).
pub fn images_of(devices: &VmDevices) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = devices
        .disks
        .iter()
        .chain(devices.slot_disks.iter().map(|s| &s.disk))
        .map(|d| d.image.clone())
        .collect();
    out.sort();
    out.dedup();
    out
}

/// Copies `image` for copy `copy` next to it (`<image>.<copy>-<random>`):
/// a reflink where the file system has them (copy_file_range clones on
/// btrfs and XFS), else a full copy. Returns the copy's path.
pub fn copy_image(image: &Path, copy: &str) -> Result<PathBuf, ForkError> {
    let suffix = crate::lua::snapshot::temp_path("");
    let unique = suffix
        .file_name()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    let mut name = image.file_name().unwrap_or_default().to_os_string();
    name.push(format!(".{}.{unique}", copy.replace(['/', '~'], "-")));
    let to = image.with_file_name(name);
    std::fs::copy(image, &to).map_err(|source| ForkError::DiskCopy {
        image: image.to_path_buf(),
        copy: copy.to_string(),
        source,
    })?;
    Ok(to)
}

/// Applies `remap` (source image, copy's image) to a snapshot's disk
/// records, so a copy restores onto its own disk copies.
pub fn remap_images(devices: &mut VmDevices, remap: &[(PathBuf, PathBuf)]) {
    let map = |p: &mut PathBuf| {
        if let Some((_, to)) = remap.iter().find(|(from, _)| from == p) {
            p.clone_from(to);
        }
    };
    for d in &mut devices.disks {
        map(&mut d.image);
    }
    for s in &mut devices.slot_disks {
        map(&mut s.disk.image);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lua::snapshot::{DiskDecl, SlotDiskDecl};

    fn message(r: Result<u64, ForkError>) -> String {
        r.expect_err("refused").to_string()
    }

    #[test]
    fn a_count_is_a_whole_number_of_at_least_one() {
        assert_eq!(copy_count(&mlua::Value::Integer(3)).unwrap(), 3);
        assert_eq!(copy_count(&mlua::Value::Number(2.0)).unwrap(), 2);
        assert_eq!(
            message(copy_count(&mlua::Value::Integer(0))),
            "n must be a whole number of copies, 1 or more, got 0 (call fork(1) or more)"
        );
        assert!(message(copy_count(&mlua::Value::Integer(-2))).contains("got -2"));
        assert!(message(copy_count(&mlua::Value::Number(1.5))).contains("got 1.5"));
        assert!(message(copy_count(&mlua::Value::Nil)).contains("got nil"));
    }

    #[test]
    fn copies_past_the_pool_are_refused_by_their_total() {
        let pool = ResourceAmount {
            memory_bytes: 1 << 30,
            cpus: 2,
        };
        check_budget(16, 64 << 20, Some(pool)).unwrap();
        let e = check_budget(17, 64 << 20, Some(pool))
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("17 copies of 67108864 bytes of guest memory each need 1140850688 bytes"),
            "{e}"
        );
        assert!(e.contains("--mem"), "{e}");
        check_budget(1000, 1 << 30, None).unwrap();
    }

    /// Each copy gets its own file with the source's bytes; a write to one
    /// reaches neither the source nor another copy.
    #[test]
    fn disk_copies_are_independent_files() {
        use std::os::unix::fs::FileExt;
        let d = tempfile::tempdir().unwrap();
        let img = d.path().join("data.img");
        std::fs::write(&img, vec![7u8; 8192]).unwrap();
        let a = copy_image(&img, "v.1").unwrap();
        let b = copy_image(&img, "v.2").unwrap();
        assert_ne!(a, b);
        assert_eq!(std::fs::read(&a).unwrap(), vec![7u8; 8192]);
        std::fs::OpenOptions::new()
            .write(true)
            .open(&a)
            .unwrap()
            .write_all_at(&[1], 0)
            .unwrap();
        assert_eq!(std::fs::read(&b).unwrap()[0], 7);
        assert_eq!(std::fs::read(&img).unwrap()[0], 7);
        let e = copy_image(&d.path().join("gone.img"), "v.1")
            .unwrap_err()
            .to_string();
        assert!(e.contains("gone.img") && e.contains("`v.1`"), "{e}");
    }

    #[test]
    fn a_copy_restores_onto_its_own_images() {
        let disk = |id: &str, image: &str| DiskDecl {
            id: id.into(),
            image: image.into(),
            size_bytes: 512,
            detached: false,
        };
        let mut dev = VmDevices {
            disks: vec![disk("a", "/x/a.img"), disk("b", "/x/b.img")],
            slot_disks: vec![SlotDiskDecl {
                slot: 0,
                disk: disk("c", "/x/a.img"),
            }],
            ..VmDevices::default()
        };
        assert_eq!(
            images_of(&dev),
            [PathBuf::from("/x/a.img"), "/x/b.img".into()]
        );
        remap_images(&mut dev, &[("/x/a.img".into(), "/y/a1.img".into())]);
        assert_eq!(dev.disks[0].image, PathBuf::from("/y/a1.img"));
        assert_eq!(dev.disks[1].image, PathBuf::from("/x/b.img"));
        assert_eq!(dev.slot_disks[0].disk.image, PathBuf::from("/y/a1.img"));
        assert_eq!(copy_name("a", 3), "a.3");
    }
}
