//! A lab's snapshot and restore: `lab:snapshot()` writes one snapshot per
//! booted VM of the lab and its sub-labs plus `lab.json` (the VMs and the
//! bridges, by sub-lab path); `lab:restore()` rebuilds that topology and
//! restores each VM into it. `provium.reset_between_tests` is the same pair
//! around each test, from a baseline taken after the file's chunk.

use std::path::{Path, PathBuf};

use mlua::{Lua, Value};

use super::Lab;
use crate::lock::Locked;
use crate::lua::snapshot::{self, LabSnapshotUd};
use crate::lua::vm::{Phase, RestoreError, Vm, VmSizing};
use crate::lua::{err, error_message, rust_err};
use crate::network::Bridge;

impl Lab {
    /// `provium.reset_between_tests = true`: after the chunk, snapshot the
    /// root lab as the baseline every test is restored to.
    pub fn prepare_reset_between_tests(&self) -> mlua::Result<()> {
        if !self.0.file.settings.locked().reset_between_tests {
            return Ok(());
        }
        let mut vms = Vec::new();
        self.vms_downward(&mut Vec::new(), &mut vms);
        let live: Vec<String> = vms.iter().flat_map(|(_, vm)| vm.live_streams()).collect();
        if !live.is_empty() {
            return Err(err(format!(
                "provium.reset_between_tests would auto-snapshot a live stream: {}",
                snapshot::live_streams_refusal(
                    "the baseline snapshot",
                    &self.0.env.rel_path,
                    &live
                )
            )));
        }
        let dir = snapshot::temp_path(".lab");
        *self.0.file.baseline.locked() = Some(dir.clone());
        self.snapshot_into(&dir).map_err(|e| {
            err(format!(
                "provium.reset_between_tests: taking the baseline failed: {}",
                error_message(&e)
            ))
        })
    }

    /// Restore the baseline after a test (only with reset_between_tests).
    /// Fails with the test failure the runner reports (the Lua error's
    /// message, flattened once here).
    pub fn restore_between_tests(&self) -> Result<(), crate::runner::file::TestFailure> {
        let Some(dir) = self.0.file.baseline.locked().clone() else {
            return Ok(());
        };
        self.restore_from_dir(&dir)
            .map_err(|e| format!("reset_between_tests: {}", error_message(&e)).into())
    }

    /// `lab:snapshot()` into `dir`: one snapshot per booted VM (this lab and
    /// its sub-labs) and `lab.json`. Refuses while any of them has live streams.
    pub fn snapshot_into(&self, dir: &std::path::Path) -> mlua::Result<()> {
        use provium_snapshot::{LabIndex, LabVm};
        let mut vms = Vec::new();
        self.vms_downward(&mut Vec::new(), &mut vms);
        let live: Vec<String> = vms.iter().flat_map(|(_, vm)| vm.live_streams()).collect();
        if !live.is_empty() {
            return Err(err(snapshot::live_streams_refusal(
                "lab:snapshot()",
                &self.0.env.rel_path,
                &live,
            )));
        }
        std::fs::create_dir_all(dir).map_err(|e| {
            err(format!(
                "lab:snapshot: cannot create {}: {e}",
                dir.display()
            ))
        })?;
        let mut bridges = Vec::new();
        self.bridges_downward(&mut Vec::new(), &mut bridges);
        let bridge_lab = |b: &Bridge| {
            bridges
                .iter()
                .find(|(_, x)| x.ptr_eq(b))
                .map(|(p, _)| p.clone())
        };
        let mut index = LabIndex::new(&self.0.name);
        index.bridges = bridges.iter().map(|(p, b)| b.record(p)).collect();
        for (path, vm) in vms {
            if !matches!(vm.phase(), Phase::Booted | Phase::Paused) {
                continue;
            }
            let file = index.file_name_for(&path, vm.name());
            vm.snapshot_in(&dir.join(&file), &bridge_lab)?;
            let sizing = vm.sizing();
            index.vms.push(LabVm {
                lab_path: path,
                name: vm.name().to_string(),
                profile: vm.profile_name().to_string(),
                memory_bytes: sizing.memory_bytes,
                cpus: sizing.cpus,
                file,
            });
        }
        index.write(dir).map_err(|e| rust_err("lab:snapshot", &e))
    }

    /// `lab:restore(dir)`: every VM in `dir/lab.json` is restored into the
    /// VM of that name (created from its recorded declaration where this
    /// lab has none; shut down first where it runs), with its snapshot's
    /// devices: on kvm it joins bridges of the recorded names (see
    /// [`Lab::join_recorded_bridges`]), so VMs that shared a bridge share
    /// one again.
    pub fn restore_from_dir(&self, dir: &std::path::Path) -> mlua::Result<()> {
        self.restore_from_dir_checked(dir)
            .map_err(RestoreError::into_lua)
    }

    /// [`Lab::restore_from_dir`], telling a device mismatch from other
    /// failures.
    pub(super) fn restore_from_dir_checked(
        &self,
        dir: &std::path::Path,
    ) -> Result<(), RestoreError> {
        use RestoreError::Failed;
        let index = provium_snapshot::LabIndex::read(dir)
            .map_err(|e| Failed(rust_err("lab:restore", &e)))?;
        // VMM NICs come back with the VM's devices (recorded in its
        // snapshot); host TAPs rejoin the recorded bridges by name.
        let vmm_nics = self.0.env.machines().capabilities().has_vmm_nics();
        // The topology first, so restored VMs find their bridges.
        for rec in &index.bridges {
            let lab = self.sub_lab_at(&rec.lab_path).map_err(Failed)?;
            let vm_names: Vec<String> = index.vms.iter().map(|v| v.name.clone()).collect();
            Lab::bridge_for_restore(&lab, &rec.name)
                .and_then(|b| Ok(b.apply_record(rec, &vm_names)?))
                .map_err(|e| {
                    RestoreError::Mismatch(format!(
                        "lab:restore: bridge `{}`: {} (a configuration mismatch)",
                        rec.name,
                        crate::error_chain::flatten(&e)
                    ))
                })?;
        }
        for v in &index.vms {
            let lab = self.sub_lab_at(&v.lab_path).map_err(Failed)?;
            let existing = lab.0.state.locked().vms.get(&v.name).cloned();
            let vm = match existing {
                Some(vm) => vm,
                None => {
                    lab.check_new_name("vm", &v.name).map_err(Failed)?;
                    lab.new_recorded_vm(v).map_err(Failed)?
                }
            };
            if !matches!(vm.phase(), Phase::Created | Phase::Shutdown) {
                vm.shutdown().map_err(Failed)?;
            }
            let file = dir.join(&v.file);
            if !vmm_nics {
                // Host TAPs (local): the sandbox joins the recorded bridges it was on
                // (its NICs and their configuration come back with it).
                for rec in index.bridges.iter().filter(|b| b.members.contains(&v.name)) {
                    let lab = self.sub_lab_at(&rec.lab_path).map_err(Failed)?;
                    Lab::bridge_for_restore(&lab, &rec.name)
                        .and_then(|b| Ok(b.attach_vm(&vm.net())?))
                        .map_err(|e| {
                            RestoreError::Mismatch(format!(
                                "lab:restore: vm `{}` on bridge `{}`: {} (a configuration mismatch)",
                                v.name,
                                rec.name,
                                crate::error_chain::flatten(&e)
                            ))
                        })?;
                }
            }
            if vmm_nics {
                let devices = snapshot::VmDevices::read_if_present(&file)
                    .map_err(|e| Failed(rust_err(&format!("lab:restore: vm `{}`", v.name), &e)))?;
                if let Some(devices) = devices {
                    self.join_recorded_bridges(&vm, &devices)?;
                }
            }
            vm.restore_checked(&file)?;
        }
        Ok(())
    }

    /// A new VM in this lab as a lab snapshot recorded it (name, profile,
    /// sizing); the caller checked the name.
    pub(super) fn new_recorded_vm(&self, v: &provium_snapshot::LabVm) -> mlua::Result<Vm> {
        let sizing = VmSizing {
            memory_bytes: v.memory_bytes,
            cpus: v.cpus,
        };
        let vm = Vm::create(
            self.0.env.clone(),
            v.name.clone(),
            v.profile.clone(),
            sizing,
        )?;
        self.put_vm(v.name.clone(), &vm);
        Ok(vm)
    }

    /// `lab:snapshot(dir)` writes there and returns the dir as a string;
    /// `lab:snapshot()` returns a LabSnapshot in a temp dir (deleted with
    /// the scope).
    pub(super) fn snapshot_method(&self, lua: &Lua, path: Option<String>) -> mlua::Result<Value> {
        if let Some(p) = path {
            self.snapshot_into(Path::new(&p))?;
            return Ok(Value::String(lua.create_string(&p)?));
        }
        let path = snapshot::temp_path(".lab");
        if let Err(e) = self.snapshot_into(&path) {
            snapshot::remove_any(&path);
            return Err(e);
        }
        snapshot::delete_at_scope_end(&self.0.env, &path);
        Ok(Value::UserData(
            lua.create_userdata(LabSnapshotUd { path })?,
        ))
    }

    /// `lab:restore(snapshot_or_dir)`.
    pub(super) fn restore_method(&self, v: &Value) -> mlua::Result<Lab> {
        let path: PathBuf = snapshot::snapshot_path_arg(v, "lab:restore")?;
        self.restore_from_dir(&path)?;
        Ok(self.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_utils::{add_bridge, env, kvm_env};
    use super::*;
    use crate::runner::BackendKind;

    /// Without VMs a lab snapshot is its topology: the bridges come back
    /// in the sub-labs that held them.
    #[test]
    fn a_lab_snapshot_restores_its_bridges_into_their_sub_labs() {
        for backend in [BackendKind::Kvm, BackendKind::Local] {
            let d = tempfile::tempdir().unwrap();
            let dir = d.path().join("s.lab");
            let root = Lab::root(env(backend));
            add_bridge(&root, "lan");
            let site = root.sub_lab_at(&["site".into()]).unwrap();
            add_bridge(&site, "dmz");
            root.snapshot_into(&dir).unwrap();
            assert!(dir.join("lab.json").is_file());
            let fresh = Lab::root(env(backend));
            fresh.restore_from_dir(&dir).unwrap();
            assert_eq!(fresh.bridge_names(), ["lan"]);
            let site = fresh.find_sub_lab("site").expect("the sub-lab comes back");
            assert_eq!(site.bridge_names(), ["dmz"]);
            // Restoring again reuses what is there.
            fresh.restore_from_dir(&dir).unwrap();
            assert_eq!(fresh.bridge_names(), ["lan"]);
        }
    }

    #[test]
    fn a_missing_lab_snapshot_is_refused_by_name() {
        let d = tempfile::tempdir().unwrap();
        let root = Lab::root(kvm_env());
        let e = error_message(&root.restore_from_dir(&d.path().join("nope")).unwrap_err());
        assert!(e.starts_with("lab:restore: "), "{e}");
    }

    #[test]
    fn without_reset_between_tests_there_is_no_baseline() {
        let root = Lab::root(kvm_env());
        root.prepare_reset_between_tests().unwrap();
        assert!(root.0.file.baseline.locked().is_none());
        root.restore_between_tests().unwrap();
    }

    #[test]
    fn the_baseline_is_taken_after_the_chunk_and_restored_after_each_test() {
        let root = Lab::root(kvm_env());
        root.set_setting("reset_between_tests", Value::Boolean(true))
            .unwrap();
        add_bridge(&root, "lan");
        root.prepare_reset_between_tests().unwrap();
        let dir = root.0.file.baseline.locked().clone().unwrap();
        assert!(dir.join("lab.json").is_file());
        root.restore_between_tests().unwrap();
        assert_eq!(root.bridge_names(), ["lan"]);
        let lua = Lua::new();
        root.close_all(&lua);
        assert!(!dir.exists(), "the baseline goes with the file");
    }
}
