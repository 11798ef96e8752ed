//! Which disks a kvm restore gives its machine. A kvm machine's virtio-blk
//! devices are fixed when it is built, so a restore gives it either the
//! VM's attached disks (as many as the snapshot's) or the snapshot's own;
//! [`plan_disks`] decides from the disk ids alone, and the Lua layer
//! applies the plan to its `Disk` userdata.

/// A restore's disks do not fit the snapshot's device list (a
/// configuration mismatch).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DiskPlanError {
    /// A restore's attached disks are not the snapshot's device list.
    #[error(
        "vm `{vm}` has {live} disk(s) ({live_ids}) but the snapshot's VM had {want} ({want_ids}); \
         attach as many disks, in the same order, before vm:restore, or none to use the snapshot's images"
    )]
    CountMismatch {
        vm: String,
        live: usize,
        live_ids: String,
        want: usize,
        want_ids: String,
    },
}

/// Which disks a restore gives the machine (see [`plan_disks`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DiskPlan {
    /// The VM's attached disks, as at a boot (the test chose them, e.g. a
    /// copy of the image).
    Attached,
    /// New disks like the snapshot's (same ids and images).
    FromSnapshot,
}

/// A restore's disks: the VM's attached (not detached) disks `live` when
/// it has any, which must then be as many as the snapshot's disk ids `want` (the
/// device list must match: a configuration mismatch otherwise); else the
/// snapshot's own. A VM shut down has only detached disks, so it gets the
/// snapshot's again.
pub fn plan_disks(
    vm_name: &str,
    want: &[String],
    live: &[String],
) -> Result<DiskPlan, DiskPlanError> {
    if live.is_empty() {
        return Ok(DiskPlan::FromSnapshot);
    }
    if live.len() == want.len() {
        return Ok(DiskPlan::Attached);
    }
    let ids = |v: Vec<&str>| {
        if v.is_empty() {
            "none".to_string()
        } else {
            v.join(", ")
        }
    };
    Err(DiskPlanError::CountMismatch {
        vm: vm_name.to_owned(),
        live: live.len(),
        live_ids: ids(live.iter().map(String::as_str).collect()),
        want: want.len(),
        want_ids: ids(want.iter().map(String::as_str).collect()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_restore_uses_the_attached_disks_or_else_the_snapshots() {
        let ids = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let want = ids(&["vda", "vdb"]);
        // A VM shut down (its disks detached) or created without disks.
        assert_eq!(plan_disks("v", &want, &[]), Ok(DiskPlan::FromSnapshot));
        assert_eq!(plan_disks("v", &[], &[]), Ok(DiskPlan::FromSnapshot));
        // The test attached its own (e.g. copies of the images).
        assert_eq!(
            plan_disks("v", &want, &ids(&["copy-a", "copy-b"])),
            Ok(DiskPlan::Attached)
        );
        let e = plan_disks("v", &want, &ids(&["vdb"]))
            .unwrap_err()
            .to_string();
        assert_eq!(
            e,
            "vm `v` has 1 disk(s) (vdb) but the snapshot's VM had 2 (vda, vdb); attach as many disks, in \
             the same order, before vm:restore, or none to use the snapshot's images"
        );
        let e = plan_disks("v", &[], &ids(&["vda"]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("the snapshot's VM had 0 (none)"), "{e}");
    }
}
