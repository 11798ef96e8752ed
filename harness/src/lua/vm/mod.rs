//! The VM userdata: its state, accessors, the ops on a booted VM (pause,
//! reset, snapshot, disks) and (through `guest`) every guest operation.
//! The pieces: `methods` (the Lua methods), `phase` (the reference's
//! state machine and its hints),
//! `opts` (sizing and `vm:boot` options, and the backend spec they make),
//! `lifecycle` (boot, restore, shutdown). What the VM can do is what its
//! backend's [`Capabilities`] say; no code here knows which backend runs.

mod fork;
mod lifecycle;
mod methods;
mod opts;
#[cfg(test)]
pub(crate) mod test_utils;

use std::ops::Deref;
use std::sync::{Arc, Mutex};

use mlua::Value;

pub use lifecycle::RestoreError;
pub use opts::{BootOpts, VmSizing, DEFAULT_CPUS, DEFAULT_MEMORY_BYTES};

use super::disk::{AttachOpts, Disk, DiskList};
use super::guest::GuestTarget;
pub use super::phase::Phase;
use super::snapshot::{VmDecl, VmDevices};
use super::stream::Stream;
use super::vm_ctx::{Ops, VmCtx};
use super::{err, rust_err};
use crate::backend::{Guest, MachineSpec};
use crate::client::AgentClient;
use crate::lock::Locked;
use crate::network::{Bridge, MachineNic, NetMember, VmLinks};
use crate::runner::{CloseKind, Closeable, FileEnv};

pub struct VmInner {
    /// What the VM's userdata share (see `lua::vm_ctx`).
    ctx: VmCtx,
    /// The bridges it is on and those it left (see `network::membership`).
    links: Arc<VmLinks>,
    profile: String,
    sizing: VmSizing,
    /// The `vm:boot` opts given so far. Locked after the state lock, never
    /// before it.
    pending: Mutex<BootOpts>,
    /// Disks in attach order (the guest's vda, vdb, … on kvm).
    disks: DiskList,
    /// The kvm machine's disks and NICs, in device order, set when a boot
    /// or restore builds it: what a snapshot records (see [`VmDevices`]).
    machine_disks: Mutex<Vec<Disk>>,
    machine_nics: Mutex<Vec<MachineNic>>,
    /// Switches of NICs restored without a network (their ports need them).
    lone_switches: Mutex<Vec<provium_netsetup::Switch>>,
    /// A fork's copy restores onto its own disk copies: (the snapshot's
    /// image, this VM's copy of it), applied to the snapshot's disk records
    /// (see `lua::fork`). Empty for every other VM.
    image_remap: Mutex<Vec<(std::path::PathBuf, std::path::PathBuf)>>,
    /// How many copies `vm:fork` made of this VM so far: the next copy is
    /// `<name>.<forks + 1>`, so two forks never reuse a name.
    forks: std::sync::atomic::AtomicU64,
}

/// A VM handle; clones share the VM.
#[derive(Clone)]
pub struct Vm(Arc<VmInner>);

/// A VM is its context plus the state only the VM itself touches, so the
/// context's accessors (name, phase, guard_op, ...) are the VM's.
impl Deref for Vm {
    type Target = VmCtx;

    fn deref(&self) -> &VmCtx {
        &self.0.ctx
    }
}

impl Closeable for Vm {
    fn auto_close(&self) -> Result<(), crate::runner::file::TestFailure> {
        self.shutdown().map_err(|e| super::error_message(&e).into())
    }
}

impl Vm {
    pub fn create(
        env: Arc<FileEnv>,
        name: String,
        profile: String,
        sizing: VmSizing,
    ) -> mlua::Result<Vm> {
        if env.config.path.is_some() && !env.config.profiles.contains_key(&profile) {
            let known: Vec<&str> = env.config.profiles.keys().map(String::as_str).collect();
            return Err(err(format!(
                "vm `{name}`: profile `{profile}` not found in provium.toml (profiles: {})",
                if known.is_empty() {
                    "none".to_string()
                } else {
                    known.join(", ")
                }
            )));
        }
        let vm = Vm(Arc::new(VmInner {
            ctx: VmCtx::new(env.clone(), name),
            links: Arc::new(VmLinks::default()),
            profile,
            sizing,
            pending: Mutex::new(BootOpts::default()),
            disks: Arc::new(Mutex::new(Vec::new())),
            machine_disks: Mutex::new(Vec::new()),
            machine_nics: Mutex::new(Vec::new()),
            lone_switches: Mutex::new(Vec::new()),
            image_remap: Mutex::new(Vec::new()),
            forks: std::sync::atomic::AtomicU64::new(0),
        }));
        env.register_closeable(CloseKind::Vm, Arc::new(vm.clone()));
        Ok(vm)
    }

    /// The VM's context, for the userdata made from it.
    pub fn ctx(&self) -> &VmCtx {
        &self.0.ctx
    }

    /// The VM as its bridges see it.
    pub fn net(&self) -> NetMember {
        NetMember::new(Arc::new(self.0.ctx.clone()), self.0.links.clone())
    }

    /// The live bridges this VM is attached to.
    pub fn bridges(&self) -> Vec<Bridge> {
        self.net().bridges()
    }

    /// The live bridges this VM was on when it last shut down (until a
    /// restore puts it back).
    pub fn left_bridges(&self) -> Vec<Bridge> {
        self.net().left_bridges()
    }

    /// This VM's open streams, each as `kind(detail) at file:line`.
    /// A `bridge:capture()` on a bridge this VM is attached to counts too
    /// (the reference: it blocks this VM's snapshot, as `nic:capture` does).
    pub fn live_streams(&self) -> Vec<String> {
        let mut streams: Vec<String> = self
            .own_streams()
            .iter()
            .map(Stream::described_at)
            .collect();
        for b in self.bridges() {
            streams.extend(b.live_capture_labels());
        }
        streams
    }

    pub fn profile_name(&self) -> &str {
        &self.0.profile
    }

    pub fn sizing(&self) -> VmSizing {
        self.0.sizing
    }

    /// The spec of this VM's declaration: sizing and profile, no boot opts
    /// or devices (what a restore starts from).
    fn declared_spec(&self) -> MachineSpec {
        MachineSpec {
            settings: self.env().config.settings.clone(),
            ..MachineSpec::for_profile(
                self.name(),
                &self.0.profile,
                self.env().config.profiles.get(&self.0.profile).cloned(),
                self.0.sizing.memory_bytes,
                self.0.sizing.cpus,
            )
        }
    }

    /// `vm:snapshot(path)`: write a snapshot of this booted VM to `path`;
    /// refuses while streams are live. Returns the size in bytes.
    pub fn snapshot_to(&self, path: &std::path::Path) -> mlua::Result<u64> {
        self.snapshot_in(path, &|_| None)
    }

    /// [`Vm::snapshot_to`] for a lab snapshot: `bridge_lab` gives a
    /// bridge's sub-lab path in the snapshotted lab (recorded per NIC).
    pub fn snapshot_in(
        &self,
        path: &std::path::Path,
        bridge_lab: &dyn Fn(&Bridge) -> Option<Vec<String>>,
    ) -> mlua::Result<u64> {
        // Read from the bridges before the state lock (a bridge may read
        // this VM's phase).
        let machine_nics = self.0.machine_nics.locked().clone();
        let nics = crate::network::nic_decls(&self.net(), &machine_nics, bridge_lab);
        let slot_nics = crate::network::slot_nic_decls(&self.net(), bridge_lab);
        let disks = super::disk::disk_decls(&self.0.machine_disks.locked());
        let st = self.lock_state();
        if !matches!(st.phase, Phase::Booted | Phase::Paused) {
            return Err(self.wrong_state("snapshot", st.phase, "booted"));
        }
        let live = self.live_streams();
        if !live.is_empty() {
            return Err(err(super::snapshot::live_streams_refusal(
                "vm:snapshot()",
                &self.env().rel_path,
                &live,
            )));
        }
        let machine = self.machine()?;
        let decl = VmDecl {
            name: self.name().to_string(),
            profile: self.0.profile.clone(),
            memory_bytes: self.0.sizing.memory_bytes,
            cpus: self.0.sizing.cpus,
            rng_seed: self.0.pending.locked().rng_seed,
        };
        let slot_disks = self
            .0
            .disks
            .locked()
            .iter()
            .filter_map(Disk::slot_decl)
            .collect();
        let devices = VmDevices {
            disks,
            nics,
            slot_disks,
            slot_nics,
        };
        machine
            .snapshot_to(
                path,
                &[
                    (super::snapshot::VM_DECL_SECTION, decl.to_json()),
                    (super::snapshot::VM_DEVICES_SECTION, devices.to_json()),
                ],
            )
            .map_err(|e| rust_err(&format!("vm:snapshot: vm `{}`", self.name()), &e))
    }

    /// `vm:attach_disk(opts)`: kvm only, before boot (see `lua::disk`).
    pub fn attach_disk(&self, opts: &Value) -> mlua::Result<Disk> {
        const M: &str = "vm:attach_disk";
        if let Some(why) = self.capabilities().disks.refusal() {
            return Err(err(format!("{M}: vm `{}`: {why}", self.name())));
        }
        let opts = AttachOpts::parse(self.name(), opts)?;
        let phase = self.phase();
        if phase != Phase::Created && phase != Phase::Booted {
            return Err(err(format!(
                "{M}: vm `{}` is {}; attach disks to a created vm (given at vm:boot()) or a booted one \
                 (into a disk slot)",
                self.name(),
                phase.as_str()
            )));
        }
        if phase == Phase::Booted {
            if let Some(why) = self.capabilities().disks_after_boot.refusal() {
                return Err(err(format!("{M}: vm `{}` is booted: {why}", self.name())));
            }
            if opts.image.is_none() {
                return Err(err(format!(
                    "{M}: vm `{}` is booted, and a running guest's disk needs its backing image now: \
                     attach it with {{id = \"{}\", image = path}}",
                    self.name(),
                    opts.id
                )));
            }
        }
        let mut disks = self.0.disks.locked();
        if disks.iter().any(|d| d.id() == opts.id) {
            return Err(err(format!(
                "{M}: vm `{}` already has a disk `{}` (ids are unique per VM: pick another id, or use \
                 vm:disk(\"{}\"))",
                self.name(), opts.id, opts.id
            )));
        }
        if let Some(img) = &opts.image {
            super::disk::check_image_unused(M, self.name(), img, &disks)?;
        }
        let disk = Disk::new(self.env().clone(), self.name(), opts, &self.0.disks);
        if phase == Phase::Booted {
            // A running guest takes it into a disk slot now (`Guest::add_disk`).
            let machine = self.ctx().machine()?;
            disk.give_to_running_guest(machine.as_ref())
                .map_err(|e| rust_err(&format!("{M}: vm `{}`", self.name()), &e))?;
        }
        disks.push(disk.clone());
        Ok(disk)
    }

    /// `vm:disk(id)`.
    pub fn disk(&self, id: &str) -> mlua::Result<Disk> {
        let disks = self.0.disks.locked();
        if let Some(d) = disks.iter().find(|d| d.id() == id) {
            return Ok(d.clone());
        }
        let ids: Vec<&str> = disks.iter().map(Disk::id).collect();
        Err(err(format!(
            "vm:disk(\"{id}\"): vm `{}` has no disk with that id (disks: {}); attach one with vm:attach_disk{{id = \"{id}\", ...}}",
            self.name(),
            if ids.is_empty() { "none".to_string() } else { ids.join(", ") }
        )))
    }

    pub fn pause(&self) -> mlua::Result<()> {
        let mut st = self.lock_state();
        if st.phase != Phase::Booted {
            return Err(self.wrong_state("pause", st.phase, "booted"));
        }
        self.machine()?
            .pause()
            .map_err(|e| rust_err("vm:pause", &e))?;
        st.phase = Phase::Paused;
        Ok(())
    }

    pub fn resume(&self) -> mlua::Result<()> {
        let mut st = self.lock_state();
        if st.phase != Phase::Paused {
            return Err(self.wrong_state("resume", st.phase, "paused"));
        }
        self.machine()?
            .resume()
            .map_err(|e| rust_err("vm:resume", &e))?;
        st.phase = Phase::Booted;
        Ok(())
    }

    /// `vm:reset()`: warm reboot, then the agent of the new boot answers
    /// (a new Hello) before this returns. When it does not, the VM is dead
    /// and the error says why, as for `vm:boot()`.
    pub fn reset(&self) -> mlua::Result<()> {
        let machine = self.booted_machine("reset")?;
        // A backend that cannot reset refuses before anything changes.
        if let Some(why) = machine.capabilities().reset.refusal() {
            return Err(err(format!("vm:reset: vm `{}`: {why}", self.name())));
        }
        let mut st = self.lock_state();
        if st.phase != Phase::Booted {
            return Err(self.wrong_state("reset", st.phase, "booted"));
        }
        // The old connection dies with the old boot.
        if let Some(c) = st.client.take() {
            c.close();
        }
        match machine.reset() {
            Ok(client) => {
                st.client = Some(client);
                Ok(())
            }
            Err(e) => {
                machine.kill();
                st.phase = Phase::Dead;
                Err(rust_err(&format!("vm:reset: vm `{}`", self.name()), &e))
            }
        }
    }

    fn booted_machine(&self, method: &str) -> mlua::Result<Arc<dyn Guest>> {
        let phase = self.phase();
        if phase != Phase::Booted {
            return Err(self.wrong_state(method, phase, "booted"));
        }
        self.machine()
    }
}

/// The client as its op trait (the VM's own namespace).
pub(super) fn provium_ops(c: &AgentClient) -> &dyn crate::client::AgentOps {
    c
}

impl GuestTarget for Vm {
    const PREFIX: &'static str = "vm";

    fn ops(&self) -> mlua::Result<Ops> {
        Ok(Arc::new(self.client("vm")?))
    }

    fn ctx(&self) -> &VmCtx {
        &self.0.ctx
    }
}

#[cfg(test)]
mod tests {
    use super::test_utils::{env, message, vm};
    use super::*;
    use crate::runner::BackendKind;
    use mlua::Lua;
    use mlua::Table;

    fn vm_on(backend: BackendKind) -> Vm {
        vm(&env(backend))
    }

    #[test]
    fn a_vm_answers_with_its_backends_capabilities() {
        assert!(vm_on(BackendKind::Kvm).capabilities().has_vmm_nics());
        assert!(!vm_on(BackendKind::Local).capabilities().has_vmm_nics());
    }

    #[test]
    fn a_disk_is_refused_where_the_backend_has_none() {
        let lua = Lua::new();
        let opts: Table = lua.load("{id = 'data', size = '1M'}").eval().unwrap();
        let e = message(
            vm_on(BackendKind::Local)
                .attach_disk(&Value::Table(opts))
                .err()
                .unwrap(),
        );
        assert!(
            e.contains(
                "vm:attach_disk: vm `v`: the local backend has no block devices (a sandbox \
                 shares the host's kernel, so there is no virtio-blk disk to give it); run with \
                 --vmm kvm"
            ),
            "{e}"
        );
    }

    #[test]
    fn ops_on_a_vm_not_booted_say_what_to_do() {
        let v = vm_on(BackendKind::Kvm);
        let e = message(v.pause().err().unwrap());
        assert!(
            e.contains(
                "vm:pause: vm `v`: VM not booted; call vm:boot() first; pause needs it booted"
            ),
            "{e}"
        );
        let e = message(v.resume().err().unwrap());
        assert!(e.contains("resume needs it paused"), "{e}");
        let e = message(v.reset().err().unwrap());
        assert!(e.contains("vm:reset: vm `v`: VM not booted"), "{e}");
        let e = message(v.client("vm:run").err().unwrap());
        assert!(
            e.contains("vm:run: vm `v`: VM not booted; call vm:boot() first"),
            "{e}"
        );
    }
}
