//! A VM's way up and down: `vm:boot` and `vm:restore` (one path from a
//! built machine to a VM with an agent, [`Vm::bring_up`]) and
//! `vm:shutdown`. Each asks the backend's capabilities how to wire NICs and
//! disks; none knows which backend runs.

use std::sync::Arc;
use std::time::Instant;

use mlua::Table;
use provium_protocol::event::{VmShutdown, VmSpawned};

use super::opts::boot_spec;
use super::{provium_ops, Phase, Vm};
use crate::backend::DiskPlan;
use crate::backend::{Guest, MachineSpec};
use crate::client::AgentClient;
use crate::error_chain::flatten;
use crate::events::Lifecycle;
use crate::lock::Locked;
use crate::lua::disk::{BootDrives, Disk};
use crate::lua::snapshot::{VmDecl, VmDevices};
use crate::lua::vm_ctx::{client_err, VmState};
use crate::lua::{err, rust_err};
use crate::network::{MachineNic, VmmNics};

/// Why `vm:restore` failed.
#[derive(Debug)]
pub enum RestoreError {
    /// The snapshot's machine had other devices than this VM would have
    /// (disks, NICs): a configuration mismatch, not a bad file.
    Mismatch(String),
    /// Anything else: a bad or foreign file, a wrong state, the agent.
    Failed(mlua::Error),
}

impl RestoreError {
    pub fn into_lua(self) -> mlua::Error {
        match self {
            RestoreError::Mismatch(m) => err(m),
            RestoreError::Failed(e) => e,
        }
    }

    /// The message (for the fixture cache's verdicts).
    pub fn message(&self) -> String {
        match self {
            RestoreError::Mismatch(m) => m.clone(),
            RestoreError::Failed(e) => crate::lua::error_message(e),
        }
    }
}

impl Vm {
    /// `vm:restore(path)`: from created or shutdown to booted, running the
    /// snapshot's state in a fresh machine.
    pub fn restore_from(&self, path: &std::path::Path) -> mlua::Result<()> {
        self.restore_checked(path).map_err(RestoreError::into_lua)
    }

    /// A VM without an `rng_seed` of its own takes the one the snapshot's
    /// VM was booted with ([`VmDecl::rng_seed`]), so a seeded fixture's
    /// stream continues deterministically in every VM restored from it. A
    /// snapshot without a declaration (written below Lua) pins nothing.
    fn adopt_recorded_rng_seed(&self, path: &std::path::Path) -> Result<(), RestoreError> {
        let st = self.lock_state();
        let mut pending = self.0.pending.locked();
        if pending.rng_seed.is_some() {
            return Ok(());
        }
        let decl = VmDecl::read_if_present(path).map_err(|e| {
            RestoreError::Failed(rust_err(&format!("vm:restore: vm `{}`", self.name()), &e))
        })?;
        pending.rng_seed = decl.and_then(|d| d.rng_seed);
        drop(st);
        Ok(())
    }

    /// [`Vm::restore_from`], telling a device mismatch from other failures.
    ///
    /// # Devices (kvm)
    /// The snapshot's machine state includes its virtio devices, so the
    /// restored machine must have the same ones. When the snapshot records
    /// them ([`VmDevices`]):
    /// - disks: this VM's attached (not detached) disks if it has any (as
    ///   many as the snapshot's, in order: e.g. a copy of the image), else
    ///   new disks with the snapshot's ids and images (a VM shut down has
    ///   only detached disks, so it gets them again; `vm:disk(id)` then
    ///   returns the new disk). Images are used as they are now.
    /// - NICs: each on a bridge of the recorded name, with the recorded MAC:
    ///   one this VM is attached to, else one it left when it shut down
    ///   (it joins again, with the recorded link state). A bridge it is on
    ///   that the snapshot's VM was not, or a recorded bridge it has no way
    ///   to, is a mismatch. A NIC that had been detached from its bridge
    ///   comes back on a port of its own, link down.
    ///
    /// A snapshot without that record (older, or written below Lua) gets
    /// this VM's disks and bridges as they are.
    pub fn restore_checked(&self, path: &std::path::Path) -> Result<(), RestoreError> {
        use RestoreError::{Failed, Mismatch};
        let phase = self.phase();
        if !matches!(phase, Phase::Created | Phase::Shutdown) {
            return Err(Failed(self.wrong_state(
                "restore",
                phase,
                "created or shutdown (call vm:shutdown() first)",
            )));
        }
        let caps = self.capabilities();
        let name = self.name().to_string();
        let devices = if caps.device_snapshots {
            VmDevices::read_if_present(path)
                .map_err(|e| Failed(rust_err(&format!("vm:restore: vm `{name}`"), &e)))?
        } else {
            None
        };
        // A fork's copy: the snapshot's disks are its own copies of them.
        let devices = devices.map(|mut d| {
            crate::lua::fork::remap_images(&mut d, &self.0.image_remap.locked());
            d
        });
        let (want_disks, want_nics, slot_disks, slot_nics) = devices
            .map_or((None, None, Vec::new(), Vec::new()), |d| {
                (Some(d.disks), Some(d.nics), d.slot_disks, d.slot_nics)
            });
        if caps.seeded_rng {
            self.adopt_recorded_rng_seed(path)?;
        }
        // kvm: the snapshot's virtio-net devices need their ports again (as
        // at boot, before the state lock; dropped, so detached, if the
        // restore is refused).
        let vmm_nics = caps.has_vmm_nics();
        // NICs the snapshot's guest was given after boot go back into their
        // NIC slots, on their bridges (the boot NICs' plan leaves those out).
        let (slot_ports, slot_added) = if vmm_nics && !slot_nics.is_empty() {
            crate::network::restore_slot_ports(&self.net(), &slot_nics, &self.left_bridges())
                .map_err(|e| {
                    Mismatch(format!(
                        "vm:restore: vm `{name}`: the snapshot's NICs added after boot do not fit \
                         this VM (a configuration mismatch): {}",
                        flatten(&e)
                    ))
                })?
        } else {
            (Vec::new(), Vec::new())
        };
        let slot_bridges: Vec<String> = slot_ports.iter().map(|p| p.bridge.clone()).collect();
        let nics = match (&want_nics, vmm_nics) {
            (_, false) => VmmNics::default(),
            (Some(want), true) => {
                crate::network::restore_ports(&self.net(), want, &self.left_bridges(), &slot_bridges).map_err(|e| {
                    Mismatch(format!(
                        "vm:restore: vm `{name}`: the snapshot's NICs do not fit this VM (a configuration \
                         mismatch): {}",
                        flatten(&e)
                    ))
                })?
            }
            (None, true) => crate::lua::network::vmm_ports(&self.net()).map_err(Failed)?,
        };
        let VmmNics {
            configs,
            record,
            lone,
            mut added,
        } = nics;
        added.extend(slot_added);
        // Host TAPs: the guest comes back on the bridges it left when it
        // was shut down (its NICs, and the interface configuration its
        // snapshot holds, are put back once it runs).
        if !vmm_nics {
            for b in self.left_bridges().into_iter().filter(|b| !b.is_closed()) {
                b.attach_vm(&self.net()).map_err(|e| {
                    Failed(rust_err(
                        &format!(
                            "vm:restore: vm `{name}`: cannot rejoin bridge `{}`",
                            b.name()
                        ),
                        &e,
                    ))
                })?;
            }
        }
        let mut built = false;
        let r = self.restore_machine(
            path,
            want_disks.as_deref(),
            (&slot_disks, slot_ports),
            (configs, record, lone),
            &mut built,
        );
        // Memberships for a machine never built are undone; a machine that
        // was built and then lost its agent is dead with its NICs, as after
        // a failed boot.
        if r.is_err() && !built {
            let me = self.net();
            for b in &added {
                b.vm_gone(&me);
            }
        }
        let has_nics = r?;
        self.net().forget_left();
        // The restored NICs' members are realised (as after a boot); host
        // TAPs are made now, then the interface configuration the snapshot
        // holds goes back on them.
        if has_nics || (!vmm_nics && !self.bridges().is_empty()) {
            crate::lua::network::realise_all(&self.net()).map_err(Failed)?;
        }
        if !vmm_nics {
            self.machine()
                .map_err(Failed)?
                .apply_restored_net()
                .map_err(|e| Failed(rust_err(&format!("vm:restore: vm `{name}`"), &e)))?;
        }
        Ok(())
    }

    /// The part of a restore under the state lock: the disks, the machine
    /// (`built` once it exists), the agent. Returns whether the machine has
    /// NICs.
    fn restore_machine(
        &self,
        path: &std::path::Path,
        want_disks: Option<&[crate::lua::snapshot::DiskDecl]>,
        (slot_disks, slot_nics): (
            &[crate::lua::snapshot::SlotDiskDecl],
            Vec<crate::backend::SlotNic>,
        ),
        (nics, record, lone): (
            Vec<crate::backend::NicSpec>,
            Vec<MachineNic>,
            Vec<provium_netsetup::Switch>,
        ),
        built: &mut bool,
    ) -> Result<bool, RestoreError> {
        use RestoreError::{Failed, Mismatch};
        let has_nics = !nics.is_empty();
        let mut st = self.lock_state();
        if !matches!(st.phase, Phase::Created | Phase::Shutdown) {
            return Err(Failed(self.wrong_state(
                "restore",
                st.phase,
                "created or shutdown (call vm:shutdown() first)",
            )));
        }
        let live = self.live_streams();
        if !live.is_empty() {
            return Err(Failed(err(crate::lua::snapshot::live_streams_refusal(
                "vm:restore()",
                &self.env().rel_path,
                &live,
            ))));
        }
        let env = self.env();
        let caps = self.capabilities();
        // A pinned rng_seed (vm:boot opts given before the restore) keeps
        // the restored rng's stream deterministic; without one it is reseeded.
        let mut spec = MachineSpec {
            rng_seed: self
                .0
                .pending
                .lock()
                .unwrap()
                .rng_seed
                .filter(|_| caps.seeded_rng),
            ..self.declared_spec()
        };
        // The restored VM's disks (their devices are in the snapshot; the
        // images are not: they are used as they are now).
        let name = self.name();
        let (drives, new_disks) = {
            let disks = self.0.disks.locked();
            let failed = |e: crate::lua::disk::DiskError| Failed(rust_err("vm:restore", &e));
            match want_disks.filter(|_| caps.device_snapshots) {
                Some(want) => {
                    let live: Vec<Disk> =
                        disks.iter().filter(|d| !d.is_detached()).cloned().collect();
                    let ids: Vec<String> = live.iter().map(|d| d.id().to_string()).collect();
                    let want_ids: Vec<String> = want.iter().map(|d| d.id.clone()).collect();
                    let plan = crate::backend::plan_disks(name, &want_ids, &ids).map_err(|e| {
                        Mismatch(format!(
                            "vm:restore: the snapshot's disks do not fit this VM (a configuration \
                             mismatch): {e}"
                        ))
                    })?;
                    match plan {
                        DiskPlan::Attached => (
                            crate::lua::disk::drives_of(name, live).map_err(failed)?,
                            Vec::new(),
                        ),
                        DiskPlan::FromSnapshot => {
                            let new = want
                                .iter()
                                .map(|d| Disk::from_decl(env.clone(), name, d, &self.0.disks))
                                .collect::<Result<Vec<_>, _>>()
                                .map_err(|e| Mismatch(format!("vm:restore: vm `{name}`: {e}")))?;
                            (
                                crate::lua::disk::drives_of(name, new.clone()).map_err(failed)?,
                                new,
                            )
                        }
                    }
                }
                None => (
                    crate::lua::disk::boot_drives(name, &disks).map_err(failed)?,
                    Vec::new(),
                ),
            }
        };
        spec.disks = drives.specs.clone();
        spec.nics = nics;
        spec.slot_nics = slot_nics;
        // Disks the snapshot's guest took after boot go back into their
        // slots (new Disk userdata like the snapshot's).
        let mut slot_new = Vec::new();
        for s in slot_disks {
            let d = Disk::from_decl(env.clone(), name, &s.disk, &self.0.disks)
                .map_err(|e| Mismatch(format!("vm:restore: vm `{name}`: {e}")))?;
            spec.slot_disks.push(crate::backend::SlotDisk {
                slot: s.slot,
                disk: d.spec().ok_or_else(|| {
                    Mismatch(format!(
                        "vm:restore: vm `{name}`: disk `{}` has no image",
                        d.id()
                    ))
                })?,
            });
            slot_new.push((s.slot, d));
        }
        let machine: Arc<dyn Guest> =
            Arc::from(env.machines().restore(&spec, path).map_err(|e| {
                Failed(rust_err(
                    &format!("vm:restore: vm `{name}` from {}", path.display()),
                    &e,
                ))
            })?);
        *built = true;
        if !new_disks.is_empty() {
            // The snapshot's disks replace the detached ones of those ids.
            let mut disks = self.0.disks.locked();
            disks.retain(|d| !new_disks.iter().any(|n| n.id() == d.id()));
            let old = std::mem::take(&mut *disks);
            disks.extend(new_disks);
            disks.extend(old);
        }
        if !slot_new.is_empty() {
            let mut back = machine.take_restored_disks();
            let mut disks = self.0.disks.locked();
            for (slot, d) in slot_new {
                if let Some(i) = back.iter().position(|a| a.slot == slot) {
                    d.adopt(back.swap_remove(i));
                }
                disks.retain(|o| o.id() != d.id());
                disks.push(d);
            }
        }
        // The NIC slots plugged back are their bridges' members' NICs.
        for (bridge, added) in machine.take_restored_nics() {
            if let Some(b) = self.bridges().into_iter().find(|b| b.name() == bridge) {
                b.adopt_slot_nic(&self.net(), added);
            }
        }
        *self.0.lone_switches.locked() = lone;
        let client = self
            .bring_up(&mut st, "restore", &machine, &drives, record)
            .map_err(Failed)?;
        self.mark_booted(&mut st, client, machine.as_ref());
        Ok(has_nics)
    }

    pub fn boot(&self, opts: Option<Table>) -> mlua::Result<Vm> {
        // kvm: the NICs of bridges attached before boot are virtio-net
        // devices, so they must exist before the VM is built. Made before
        // taking the state lock (bridges may read this VM's phase); if the
        // boot is refused below, dropping them detaches the ports.
        // (A VM past Created gets the wrong-state error below, with no port
        // attached.)
        let nics = if self.capabilities().has_vmm_nics() && self.phase() == Phase::Created {
            crate::lua::network::vmm_ports(&self.net())?
        } else {
            VmmNics::default()
        };
        let VmmNics {
            configs: nics,
            record: nic_record,
            ..
        } = nics;
        let mut st = self.lock_state();
        if st.phase != Phase::Created {
            return Err(self.wrong_state(
                "boot",
                st.phase,
                "created (a VM boots once; create another or restore a snapshot)",
            ));
        }
        let mut pending = self.0.pending.locked();
        if let Some(o) = &opts {
            pending.merge(o)?;
        }
        let env = self.env();
        let drives = {
            let disks = self.0.disks.locked();
            crate::lua::disk::boot_drives(self.name(), &disks)
                .map_err(|e| rust_err("vm:boot", &e))?
        };
        let spec = boot_spec(self.declared_spec(), &pending, drives.specs.clone(), nics);
        let machine: Arc<dyn Guest> = Arc::from(
            env.machines()
                .boot(&spec)
                .map_err(|e| rust_err(&format!("vm:boot: vm `{}`", self.name()), &e))?,
        );
        let client = self.bring_up(&mut st, "boot", &machine, &drives, nic_record)?;
        // Files of boot opts land before the test runs anything.
        for (path, content) in std::mem::take(&mut pending.files) {
            if let Some(parent) = std::path::Path::new(&path).parent() {
                let _ = provium_ops(&client).mkdir(&parent.to_string_lossy(), true, None);
            }
            provium_ops(&client)
                .write_file(&path, &content)
                .map_err(|e| client_err(&format!("vm:boot: files: {path}"), e))?;
        }
        self.mark_booted(&mut st, client, machine.as_ref());
        // NICs of bridges attached before boot (eth0, eth1, … by bridge name).
        drop(st);
        crate::lua::network::realise_all(&self.net())?;
        Ok(self.clone())
    }

    /// The one path from a just-built machine to a VM with an agent, for
    /// boot and restore alike: the machine's disks go to the guest, its
    /// devices are recorded (what a snapshot writes), and its agent is
    /// reached. When no agent answers the machine is killed and the VM is
    /// dead (its devices stay recorded, as the machine had them).
    fn bring_up(
        &self,
        st: &mut VmState,
        method: &str,
        machine: &Arc<dyn Guest>,
        drives: &BootDrives,
        nics: Vec<MachineNic>,
    ) -> mlua::Result<AgentClient> {
        drives.given_to_guest();
        *self.0.machine_disks.locked() = drives.disks().to_vec();
        *self.0.machine_nics.locked() = nics;
        self.set_machine(machine.clone());
        machine.connect().map_err(|e| {
            machine.kill();
            st.phase = Phase::Dead;
            rust_err(
                &format!(
                    "vm:{method}: vm `{}`: the agent did not answer",
                    self.name()
                ),
                &e,
            )
        })
    }

    /// The agent answered: the VM is booted, and the run hears of it.
    fn mark_booted(&self, st: &mut VmState, client: AgentClient, machine: &dyn Guest) {
        st.client = Some(client);
        st.phase = Phase::Booted;
        st.booted_at = Some(Instant::now());
        let env = self.env();
        env.events.send(Lifecycle::VmSpawned(VmSpawned {
            file: env.rel_path.clone(),
            vm_name: self.name().to_string(),
            profile: self.0.profile.clone(),
            memory_bytes: self.0.sizing.memory_bytes,
            cid: machine.cid().unwrap_or(0),
        }));
    }

    pub fn shutdown(&self) -> mlua::Result<()> {
        let mut st = self.lock_state();
        if st.phase == Phase::Shutdown {
            return Ok(());
        }
        if let Some(c) = st.client.take() {
            c.close();
        }
        if let Some(m) = self.take_machine() {
            m.kill();
        }
        let was_up = st.booted_at.take();
        st.phase = Phase::Shutdown;
        if let Some(t0) = was_up {
            self.env().events.send(Lifecycle::VmShutdown(VmShutdown {
                file: self.env().rel_path.clone(),
                vm_name: self.name().to_string(),
                duration_ns: t0.elapsed().as_nanos() as u64,
            }));
        }
        // Leave every bridge (never while holding the state lock: a bridge
        // may read this VM's phase), remembering them for a later
        // `vm:restore` of a snapshot whose NICs were on them.
        drop(st);
        self.net().leave_all();
        self.0.lone_switches.locked().clear();
        // A disk does not outlive its VM's life: the guest is gone, and a
        // later sector op must say so rather than act on a dead VM's image.
        for d in self.0.disks.locked().iter() {
            d.detach();
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lua::snapshot::{DiskDecl, NicDecl, VM_DEVICES_SECTION};
    use crate::lua::vm::test_utils::{env, message, vm};
    use crate::network::Bridge;
    use crate::runner::{BackendKind, FileEnv};

    fn kvm_env() -> Arc<FileEnv> {
        env(BackendKind::Kvm)
    }

    fn nic(bridge: &str, mac: &str) -> NicDecl {
        NicDecl {
            bridge: bridge.into(),
            mac: mac.into(),
            attached: true,
            connected: true,
            bridge_lab: None,
        }
    }

    /// A snapshot container holding only a `vm-decl` section (enough for
    /// everything a restore checks before it builds a machine).
    fn decl_only_snapshot(dir: &std::path::Path, devices: &VmDevices) -> std::path::PathBuf {
        let path = dir.join("v.snap");
        let shape = provium_snapshot::Shape {
            backend: "kvm".into(),
            memory_bytes: 64 << 20,
            vcpus: 1,
        };
        let mut b =
            provium_snapshot::SnapshotBuilder::new(provium_protocol::PROTOCOL_VERSION, shape);
        b.add_section(VM_DEVICES_SECTION, &devices.to_json())
            .unwrap();
        b.write_file(&path).unwrap();
        path
    }

    fn decl(disks: Vec<DiskDecl>, nics: Vec<NicDecl>) -> VmDevices {
        VmDevices {
            disks,
            nics,
            slot_disks: vec![],
            slot_nics: vec![],
        }
    }

    /// `vm:shutdown(); vm:restore(s)` on a bridged VM: the shutdown leaves
    /// the bridge (its NIC goes), and the restore's ports put the VM back
    /// on it with the snapshot's MAC.
    #[test]
    fn a_vm_shut_down_gets_its_nics_back_on_the_same_bridges() {
        let env = kvm_env();
        let lan = Bridge::create(&env, "lan");
        let v = vm(&env);
        let mac = crate::network::nic_mac("v", "lan", &[]);
        lan.restore_member(&v.net(), mac, None).unwrap();
        v.shutdown().unwrap();
        assert!(!lan.is_member("v"), "a shut-down VM is off its bridges");
        let left: Vec<Bridge> = v.left_bridges();
        assert_eq!(left.len(), 1);
        let nics =
            crate::network::restore_ports(&v.net(), &[nic("lan", &mac.to_string())], &left, &[])
                .unwrap();
        assert_eq!(nics.configs.len(), 1);
        assert_eq!(nics.configs[0].mac(), mac);
        assert!(lan.has_vm(&v.net()), "back on lan");
        assert_eq!(nics.added.len(), 1);
        nics.undo(&v.net());
        assert!(!lan.is_member("v"), "undone");
        // A snapshot naming a bridge it was never on is a mismatch.
        let e =
            crate::network::restore_ports(&v.net(), &[nic("wan", &mac.to_string())], &left, &[])
                .err()
                .unwrap();
        let e = e.to_string();
        assert!(e.contains("NIC on bridge `wan`"), "{e}");
        assert!(!lan.is_member("v"));
    }

    /// A device mismatch is told apart from a bad file, before any machine
    /// is built: NICs on a bridge the VM has no way to, or a disk whose
    /// image is gone.
    #[test]
    fn a_device_mismatch_is_not_a_failed_restore() {
        let d = tempfile::tempdir().unwrap();
        let env = kvm_env();
        let v = vm(&env);
        let snap = decl_only_snapshot(
            d.path(),
            &decl(vec![], vec![nic("lan", "02:00:00:00:00:01")]),
        );
        match v.restore_checked(&snap) {
            Err(RestoreError::Mismatch(m)) => assert!(
                m.starts_with("vm:restore: vm `v`: the snapshot's NICs do not fit this VM (a configuration mismatch): the snapshot's VM had a NIC on bridge `lan`"),
                "{m}"
            ),
            Err(RestoreError::Failed(e)) => panic!("not a mismatch: {e}"),
            Ok(()) => panic!("restored without its NIC"),
        }
        let gone = DiskDecl {
            id: "vda".into(),
            image: "/nonexistent/vda.img".into(),
            size_bytes: 512,
            detached: false,
        };
        let snap = decl_only_snapshot(d.path(), &decl(vec![gone], vec![]));
        match v.restore_checked(&snap) {
            Err(RestoreError::Mismatch(m)) => {
                assert!(
                    m.contains("disk `vda`") && m.contains("/nonexistent/vda.img"),
                    "{m}"
                )
            }
            Err(RestoreError::Failed(e)) => panic!("not a mismatch: {e}"),
            Ok(()) => panic!("restored without its disk"),
        }
        assert_eq!(v.phase(), Phase::Created, "nothing happened to the VM");
        // A truncated file is a failure, not a mismatch.
        std::fs::write(&snap, b"PRVMSNAP").unwrap();
        assert!(matches!(
            v.restore_checked(&snap),
            Err(RestoreError::Failed(_))
        ));
    }

    /// The backend refuses a spec before it builds anything: the VM stays
    /// created (it may boot again), and the error names the VM and the
    /// backend's reason.
    #[test]
    fn a_boot_the_backend_refuses_leaves_the_vm_created() {
        let v = vm(&kvm_env());
        let e = message(v.boot(None).err().unwrap());
        assert!(
            e.contains(
                "vm:boot: vm `v`: the kvm backend boots a profile's kernel, and profile `p` is \
                 not in provium.toml"
            ),
            "{e}"
        );
        assert_eq!(v.phase(), Phase::Created);
        let lua = mlua::Lua::new();
        let opts: Table = lua.load("{kernel_cmdline = 'quiet'}").eval().unwrap();
        let local = vm(&env(BackendKind::Local));
        let e = message(local.boot(Some(opts)).err().unwrap());
        assert!(
            e.contains(
                "vm:boot: vm `v`: kernel_cmdline needs the kvm backend (the local sandbox has \
                 no kernel)"
            ),
            "{e}"
        );
        assert_eq!(local.phase(), Phase::Created);
    }

    #[test]
    fn a_vm_boots_once_and_shuts_down_once() {
        let v = vm(&kvm_env());
        v.shutdown().unwrap();
        v.shutdown().unwrap();
        assert_eq!(v.phase(), Phase::Shutdown);
        let e = message(v.boot(None).err().unwrap());
        assert!(
            e.contains(
                "vm:boot: vm `v`: VM is shutdown; create a new one; boot needs it created (a VM \
                 boots once; create another or restore a snapshot)"
            ),
            "{e}"
        );
    }

    /// A backend error with causes reaches Lua as its chain, each level
    /// once: the boot, the profile, the file the profile names.
    #[test]
    fn a_boot_error_carries_its_chain_once() {
        let d = tempfile::tempdir().unwrap();
        let kernel = d.path().join("bzImage");
        std::fs::write(&kernel, provium_vmm::tiny_guest::BZIMAGE).unwrap();
        let missing = d.path().join("missing.cmdline");
        let mut config = crate::config::Config::default();
        config.profiles.insert(
            "p".into(),
            crate::config::Profile {
                disk_slots: crate::config::profile::DEFAULT_DISK_SLOTS,
                nic_slots: crate::config::profile::DEFAULT_NIC_SLOTS,
                name: "p".into(),
                kernel: Some(kernel),
                initrd: None,
                cmdline: "quiet".into(),
                cmdline_file: Some(missing.clone()),
                guest_os: "linux".into(),
                transport: Default::default(),
                inject_agent: false,
                agent_overlay_path: None,
                agent_channel: Default::default(),
                modules: None,
                build: None,
                build_out: d.path().into(),
            },
        );
        let env = Arc::new(FileEnv::new(
            "t.test.lua".into(),
            "/t.test.lua".into(),
            Vec::new(),
            Arc::new(config),
            crate::backend::for_kind(BackendKind::Kvm),
            crate::events::EventSender::disabled(),
        ));
        let e = message(vm(&env).boot(None).err().unwrap());
        let want = format!(
            "vm:boot: vm `v`: profile `p`: cmdline_file `{}`: No such file or directory (os error 2)",
            missing.display()
        );
        assert!(e.contains(&want), "{e}");
        assert_eq!(e.matches("profile `p`").count(), 1, "{e}");
        assert_eq!(e.matches("No such file").count(), 1, "{e}");
    }
}
