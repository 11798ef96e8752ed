//! `lab:fork(n)` (and `provium:fork(n)` for the root): n sub-labs, each a
//! copy of every running VM and every bridge of this lab and its sub-labs
//! at one instant.
//!
//! The lab is frozen once: its running kvm VMs paused together, the lab
//! snapshotted (`lab:snapshot`'s `lab.json` plus one snapshot per VM), each
//! VM's disk images copied once, the VMs resumed. Each copy is then a new
//! lab `<name>.<i>` (not put in any lab: the caller holds it) into which
//! that snapshot is restored (`lab:restore`'s path): its bridges are new
//! ones of the same names with the recorded partitions, impairments and
//! seeds, its VMs new ones of the same names on them, each on its own disk
//! copies. Copies therefore reach their members as `copy.a` and
//! `copy.lan`, and share nothing with each other or with the source. VMs,
//! bridges and disk copies are closed with the scope that forked.

use std::path::PathBuf;
use std::time::Instant;

use mlua::Value;
use provium_protocol::event::VmForked;

use super::Lab;
use crate::events::Lifecycle;
use crate::lock::Locked;
use crate::lua::fork::{self, ForkError};
use crate::lua::snapshot;
use crate::lua::vm::{Phase, Vm};
use crate::lua::{err, rust_err};

const M: &str = "lab:fork";

impl Lab {
    /// What a fork of this lab copies: for a test scope, the file root's
    /// members as well as the scope's own (a detached view holding both).
    fn fork_view(&self) -> Lab {
        let Some(parent) = &self.0.parent else {
            return self.clone();
        };
        let view = self.child(self.0.name.clone(), None);
        for lab in [parent, self] {
            let st = lab.0.state.locked();
            let mut v = view.0.state.locked();
            v.vms.extend(st.vms.clone());
            v.bridges.extend(st.bridges.clone());
            v.sub_labs.extend(st.sub_labs.clone());
        }
        view
    }

    /// `lab:fork(n)`: see the module doc.
    pub fn fork(&self, n: &Value) -> mlua::Result<Vec<Lab>> {
        let fail = |e: &ForkError| rust_err(&format!("{M}: lab `{}`", self.0.name), e);
        let n = fork::copy_count(n).map_err(|e| fail(&e))?;
        let view = self.fork_view();
        let mut vms = Vec::new();
        view.vms_downward(&mut Vec::new(), &mut vms);
        let running: Vec<(Vec<String>, Vm)> = vms
            .into_iter()
            .filter(|(_, vm)| matches!(vm.phase(), Phase::Booted | Phase::Paused))
            .collect();
        let total: u64 = running.iter().map(|(_, v)| v.sizing().memory_bytes).sum();
        fork::check_budget(n, total, self.0.env.run_resources().pool()).map_err(|e| fail(&e))?;
        for (_, vm) in &running {
            vm.check_forkable("lab:fork()", 1)?;
        }
        // Freeze: every running VM paused together, one snapshot, one copy
        // of each disk, then all resumed.
        let dir = snapshot::temp_path(".fork.lab");
        let t0 = Instant::now();
        let mut paused = Vec::new();
        let mut frozen_images: Vec<(String, Vec<(PathBuf, PathBuf)>)> = Vec::new();
        let r = (|| {
            for (_, vm) in &running {
                if vm.pause_for_fork()? {
                    paused.push(vm.clone());
                }
            }
            view.snapshot_into(&dir)?;
            let index = provium_snapshot::LabIndex::read(&dir).map_err(|e| rust_err(M, &e))?;
            for v in &index.vms {
                let devices = snapshot::VmDevices::read_if_present(&dir.join(&v.file))
                    .map_err(|e| rust_err(M, &e))?
                    .unwrap_or_default();
                let mut images = Vec::new();
                for img in fork::images_of(&devices) {
                    let to = fork::copy_image(&img, &format!("{}.frozen", v.name))
                        .map_err(|e| fail(&e))?;
                    images.push((img, to));
                }
                frozen_images.push((v.file.clone(), images));
            }
            Ok::<_, mlua::Error>(index)
        })();
        let paused_ns = u64::try_from(t0.elapsed().as_nanos()).unwrap_or(u64::MAX);
        for vm in &paused {
            let _ = vm.resume();
        }
        let remove_frozen = || {
            if let Ok(index) = provium_snapshot::LabIndex::read(&dir) {
                for v in &index.vms {
                    self.0
                        .env
                        .machines()
                        .forget_restore_image(&dir.join(&v.file));
                }
            }
            snapshot::remove_any(&dir);
            for (_, imgs) in &frozen_images {
                for (_, f) in imgs {
                    snapshot::remove_any(f);
                }
            }
        };
        let index = match r {
            Ok(index) => index,
            Err(e) => {
                remove_frozen();
                return Err(e);
            }
        };
        let mut copies = Vec::new();
        let mut images = Vec::new();
        let r = (1..=n).try_for_each(|i| {
            let copy = self.child(fork::copy_name(&self.0.name, i), None);
            copies.push(copy.clone());
            // Its VMs first, each set to restore onto its own disk copies.
            for v in &index.vms {
                let vm = copy.sub_lab_at(&v.lab_path)?.new_recorded_vm(v)?;
                let mut remap = Vec::new();
                let frozen = frozen_images.iter().find(|(f, _)| *f == v.file);
                for (src, f) in frozen.map(|(_, i)| i.as_slice()).unwrap_or_default() {
                    let to = fork::copy_image(f, &format!("{}.{}", copy.0.name, v.name))
                        .map_err(|e| fail(&e))?;
                    images.push(to.clone());
                    remap.push((src.clone(), to));
                }
                vm.set_image_remap(remap);
            }
            copy.restore_from_dir_checked(&dir)
                .map_err(|e| err(format!("{M}: copy `{}`: {}", copy.0.name, e.message())))
        });
        remove_frozen();
        if let Err(e) = r {
            for copy in &copies {
                copy.undo_fork_copy();
            }
            for img in &images {
                snapshot::remove_any(img);
            }
            return Err(e);
        }
        let env = &self.0.env;
        for img in &images {
            snapshot::delete_at_scope_end(env, img);
        }
        for v in &index.vms {
            let mut name = v.lab_path.clone();
            name.push(v.name.clone());
            env.events.send(Lifecycle::VmForked(VmForked {
                file: env.rel_path.clone(),
                source: name.join("/"),
                copies: copies
                    .iter()
                    .map(|c| format!("{}/{}", c.0.name, name.join("/")))
                    .collect(),
                source_paused_ns: paused_ns,
            }));
        }
        Ok(copies)
    }

    /// Shuts down every VM of a copy that failed and closes its bridges.
    fn undo_fork_copy(&self) {
        let mut vms = Vec::new();
        self.vms_downward(&mut Vec::new(), &mut vms);
        for (_, vm) in vms {
            let _ = vm.shutdown();
        }
        let mut bridges = Vec::new();
        self.bridges_downward(&mut Vec::new(), &mut bridges);
        for (_, b) in bridges {
            let _ = crate::runner::Closeable::auto_close(&b);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_utils::{add_bridge, add_vm, kvm_env, vm};
    use super::*;

    fn message(e: mlua::Error) -> String {
        crate::lua::error_message(&e)
    }

    #[test]
    fn a_fork_of_nothing_running_copies_the_bridges() {
        let root = Lab::root(kvm_env());
        add_bridge(&root, "lan");
        add_vm(&root, &vm(&root, "a"));
        let copies = root.fork(&Value::Integer(2)).unwrap();
        let names: Vec<&str> = copies.iter().map(Lab::name).collect();
        assert_eq!(names, ["provium.1", "provium.2"]);
        for c in &copies {
            assert_eq!(c.bridge_names(), ["lan"]);
            let b = c.find_bridge("lan").unwrap();
            assert!(
                !b.ptr_eq(&root.find_bridge("lan").unwrap()),
                "its own bridge"
            );
            assert!(c.find_vm("a").is_none(), "a VM never booted is not copied");
        }
    }

    #[test]
    fn a_bad_count_is_refused_by_name() {
        let root = Lab::root(kvm_env());
        let e = message(root.fork(&Value::Integer(0)).err().expect("refused"));
        assert_eq!(
            e,
            "lab:fork: lab `provium`: n must be a whole number of copies, 1 or more, got 0 \
             (call fork(1) or more)"
        );
    }
}
