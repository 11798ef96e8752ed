//! The VM userdata: its state, accessors, the ops on a booted VM (pause,
//! reset, snapshot, disks) and (through `guest`) every guest operation.
//! The pieces: `methods` (the Lua methods), `phase` (the reference's
//! state machine and its hints),
//! `opts` (sizing and `vm:boot` options, and the backend spec they make),
//! `lifecycle` (boot, restore, shutdown). What the VM can do is what its
//! backend's [`Capabilities`] say; no code here knows which backend runs.

mod lifecycle;
mod methods;
mod opts;
mod phase;
#[cfg(test)]
pub(crate) mod test_utils;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use mlua::{Lua, Value};

pub use lifecycle::RestoreError;
pub use opts::{BootOpts, VmSizing, DEFAULT_CPUS, DEFAULT_MEMORY_BYTES};
pub use phase::Phase;

use super::bridge::{Bridge, WeakBridge};
use super::disk::{AttachOpts, Disk, DiskList};
use super::err;
use super::guest::{client_err, GuestTarget, Ops};
use super::nic::MachineNic;
use super::snapshot::{VmDecl, VmDevices};
use super::stream::{ByteSource, Stream};
use crate::backend::{Capabilities, Guest, MachineSpec};
use crate::client::{AgentClient, ClientError};
use crate::error_chain::flatten;
use crate::runner::{CloseKind, Closeable, FileEnv, LiveResource};

struct VmState {
    phase: Phase,
    pending: BootOpts,
    client: Option<AgentClient>,
    booted_at: Option<Instant>,
}

pub struct VmInner {
    name: String,
    profile: String,
    sizing: VmSizing,
    env: Arc<FileEnv>,
    state: Mutex<VmState>,
    /// Held only briefly, so the watchdog can always reach the kill switch.
    machine: Mutex<Option<Arc<dyn Guest>>>,
    open_files: Arc<AtomicUsize>,
    open_streams: Arc<AtomicUsize>,
    /// Streams opened on this VM, so a snapshot can name the live ones.
    streams: Mutex<Vec<Stream>>,
    in_flight: AtomicUsize,
    /// Bridges this VM is attached to (weak: bridges hold their VMs).
    bridges: Mutex<Vec<WeakBridge>>,
    /// Disks in attach order (the guest's vda, vdb, … on kvm).
    disks: DiskList,
    /// The kvm machine's disks and NICs, in device order, set when a boot
    /// or restore builds it: what a snapshot records (see [`VmDevices`]).
    machine_disks: Mutex<Vec<Disk>>,
    machine_nics: Mutex<Vec<MachineNic>>,
    /// Switches of NICs restored without a network (their ports need them).
    lone_switches: Mutex<Vec<provium_netsetup::Switch>>,
    /// The bridges this VM was on when it last shut down: a restore from a
    /// snapshot with NICs on them joins them again.
    left_bridges: Mutex<Vec<WeakBridge>>,
}

/// A VM handle; clones share the VM.
#[derive(Clone)]
pub struct Vm(Arc<VmInner>);

impl LiveResource for VmInner {
    fn teardown(&self) {
        // Only the machine's kill switch: never wait on the state lock, which
        // the file's thread may hold while blocked on the agent.
        if let Some(m) = self.machine.lock().unwrap().as_ref() {
            m.kill();
        }
    }

    fn console_excerpt(&self) -> Option<String> {
        let m = self.machine.lock().unwrap().clone()?;
        m.console_tail(crate::runner::file::CONSOLE_EXCERPT_BYTES)
            .map(|t| format!("--- {} console ---\n{t}", self.name))
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
            name,
            profile,
            sizing,
            env: env.clone(),
            state: Mutex::new(VmState {
                phase: Phase::Created,
                pending: BootOpts::default(),
                client: None,
                booted_at: None,
            }),
            machine: Mutex::new(None),
            open_files: Arc::new(AtomicUsize::new(0)),
            open_streams: Arc::new(AtomicUsize::new(0)),
            streams: Mutex::new(Vec::new()),
            in_flight: AtomicUsize::new(0),
            bridges: Mutex::new(Vec::new()),
            disks: Arc::new(Mutex::new(Vec::new())),
            machine_disks: Mutex::new(Vec::new()),
            machine_nics: Mutex::new(Vec::new()),
            lone_switches: Mutex::new(Vec::new()),
            left_bridges: Mutex::new(Vec::new()),
        }));
        let live: Arc<dyn LiveResource> = vm.0.clone();
        env.track(Arc::downgrade(&live));
        env.register_closeable(CloseKind::Vm, Arc::new(vm.clone()));
        Ok(vm)
    }

    pub fn name(&self) -> &str {
        &self.0.name
    }

    pub fn env(&self) -> &Arc<FileEnv> {
        &self.0.env
    }

    pub fn phase(&self) -> Phase {
        self.0.state.lock().unwrap().phase
    }

    /// True when both handles are the same VM.
    pub fn same(&self, other: &Vm) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }

    /// Records that this VM is attached to `b` (called by the bridge).
    pub fn link_bridge(&self, b: &Bridge) {
        let mut bs = self.0.bridges.lock().unwrap();
        bs.retain(|w| w.upgrade().is_some());
        if !bs.iter().any(|w| w.is(b)) {
            bs.push(b.downgrade());
        }
    }

    /// Forgets the attachment to `b` (called by the bridge).
    pub fn unlink_bridge(&self, b: &Bridge) {
        self.0.bridges.lock().unwrap().retain(|w| !w.is(b));
    }

    /// The live bridges this VM is attached to.
    pub fn bridges(&self) -> Vec<Bridge> {
        let bs = self.0.bridges.lock().unwrap().clone();
        bs.iter().filter_map(WeakBridge::upgrade).collect()
    }

    /// The live bridges this VM was on when it last shut down (until a
    /// restore puts it back).
    pub fn left_bridges(&self) -> Vec<Bridge> {
        let bs = self.0.left_bridges.lock().unwrap().clone();
        bs.iter().filter_map(WeakBridge::upgrade).collect()
    }

    /// The machine, while booted (for creating NICs).
    pub fn running_machine(&self) -> Option<Arc<dyn Guest>> {
        if self.phase() != Phase::Booted {
            return None;
        }
        self.0.machine.lock().unwrap().clone()
    }

    pub fn file_counter(&self) -> Arc<AtomicUsize> {
        self.0.open_files.clone()
    }

    fn wrong_state(&self, method: &str, phase: Phase, wanted: &str) -> mlua::Error {
        err(format!(
            "vm:{method}: vm `{}`: {}; {method} needs it {wanted}",
            self.0.name,
            phase.hint()
        ))
    }

    /// The connection for guest ops: only while booted.
    pub fn client(&self, method: &str) -> mlua::Result<AgentClient> {
        let st = self.0.state.lock().unwrap();
        match (st.phase, &st.client) {
            (Phase::Booted, Some(c)) => Ok(c.clone()),
            (phase, _) => Err(err(format!(
                "{method}: vm `{}`: {}",
                self.0.name,
                phase.hint()
            ))),
        }
    }

    /// Run an agent call, counted as in flight, with the watchdog's reason
    /// taking precedence over the connection error it causes.
    pub fn guard_op<T>(
        &self,
        method: &str,
        f: impl FnOnce() -> Result<T, ClientError>,
    ) -> mlua::Result<T> {
        self.0.in_flight.fetch_add(1, Ordering::SeqCst);
        let r = f();
        self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
        r.map_err(|e| {
            if let Some(reason) = self.0.env.cancel_reason() {
                if let ClientError::StdinUnacknowledged { .. } = e {
                    // What the call was stuck on, besides why it was stopped.
                    return err(format!(
                        "{method}: {} (vm `{}`: {e})",
                        reason.message(),
                        self.0.name
                    ));
                }
                return err(format!("{method}: {}", reason.message()));
            }
            if e.is_connection_lost() {
                let mut st = self.0.state.lock().unwrap();
                if st.phase == Phase::Booted {
                    st.phase = Phase::Dead;
                }
            }
            if blames_the_agent(&e) {
                // Name the VM whose agent misbehaved: a file may have many.
                return err(format!(
                    "{method}: vm `{}`: {}",
                    self.0.name,
                    crate::error_chain::flatten(&e)
                ));
            }
            client_err(method, e)
        })
    }

    pub fn open_stream(
        &self,
        lua: &Lua,
        source: Box<dyn ByteSource>,
        kind: &'static str,
        detail: String,
    ) -> Stream {
        let s = Stream::open(
            lua,
            self.0.env.clone(),
            source,
            kind,
            detail,
            Some(self.0.open_streams.clone()),
        );
        let mut streams = self.0.streams.lock().unwrap();
        streams.retain(Stream::is_open);
        streams.push(s.clone());
        s
    }

    /// This VM's open streams, each as `kind(detail) at file:line`.
    /// A `bridge:capture()` on a bridge this VM is attached to counts too
    /// (the reference: it blocks this VM's snapshot, as `nic:capture` does).
    pub fn live_streams(&self) -> Vec<String> {
        let mut streams = {
            let mut own = self.0.streams.lock().unwrap();
            own.retain(Stream::is_open);
            own.clone()
        };
        for b in self.bridges() {
            streams.extend(b.live_capture_streams());
        }
        streams
            .iter()
            .map(|s| match &s.site {
                Some(site) => format!("{} at {}:{}", s.describe(), site.file, site.line),
                None => format!("{} at (unknown site)", s.describe()),
            })
            .collect()
    }

    pub fn profile_name(&self) -> &str {
        &self.0.profile
    }

    pub fn sizing(&self) -> VmSizing {
        self.0.sizing
    }

    /// What every guest of this file's backend can do.
    pub fn capabilities(&self) -> Capabilities {
        self.0.env.machines().capabilities()
    }

    /// The spec of this VM's declaration: sizing and profile, no boot opts
    /// or devices (what a restore starts from).
    fn declared_spec(&self) -> MachineSpec {
        MachineSpec {
            settings: self.0.env.config.settings.clone(),
            ..MachineSpec::for_profile(
                &self.0.name,
                &self.0.profile,
                self.0.env.config.profiles.get(&self.0.profile).cloned(),
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
        let machine_nics = self.0.machine_nics.lock().unwrap().clone();
        let nics = super::nic::nic_decls(self, &machine_nics, bridge_lab);
        let disks = super::disk::disk_decls(&self.0.machine_disks.lock().unwrap());
        let st = self.0.state.lock().unwrap();
        if !matches!(st.phase, Phase::Booted | Phase::Paused) {
            return Err(self.wrong_state("snapshot", st.phase, "booted"));
        }
        let live = self.live_streams();
        if !live.is_empty() {
            return Err(err(super::snapshot::live_streams_refusal(
                "vm:snapshot()",
                &self.0.env.rel_path,
                &live,
            )));
        }
        let machine = self.machine()?;
        let decl = VmDecl {
            name: self.0.name.clone(),
            profile: self.0.profile.clone(),
            memory_bytes: self.0.sizing.memory_bytes,
            cpus: self.0.sizing.cpus,
            rng_seed: st.pending.rng_seed,
        };
        let devices = VmDevices { disks, nics };
        machine
            .snapshot_to(
                path,
                &[
                    (super::snapshot::VM_DECL_SECTION, decl.to_json()),
                    (super::snapshot::VM_DEVICES_SECTION, devices.to_json()),
                ],
            )
            .map_err(|e| {
                err(format!(
                    "vm:snapshot: vm `{}`: {}",
                    self.0.name,
                    flatten(&e)
                ))
            })
    }

    /// `vm:attach_disk(opts)`: kvm only, before boot (see `lua::disk`).
    pub fn attach_disk(&self, opts: &Value) -> mlua::Result<Disk> {
        const M: &str = "vm:attach_disk";
        if let Some(why) = self.capabilities().disks.refusal() {
            return Err(err(format!("{M}: vm `{}`: {why}", self.0.name)));
        }
        let opts = AttachOpts::parse(&self.0.name, opts)?;
        let phase = self.phase();
        if phase != Phase::Created {
            return Err(err(format!(
                "{M}: vm `{}` is {}; the kvm backend's virtio-mmio disks are announced on the kernel \
                 command line at boot and cannot be hot-plugged (no ACPI), so attach disks before vm:boot()",
                self.0.name,
                phase.as_str()
            )));
        }
        let mut disks = self.0.disks.lock().unwrap();
        if disks.iter().any(|d| d.id() == opts.id) {
            return Err(err(format!(
                "{M}: vm `{}` already has a disk `{}` (ids are unique per VM: pick another id, or use \
                 vm:disk(\"{}\"))",
                self.0.name, opts.id, opts.id
            )));
        }
        if let Some(img) = &opts.image {
            super::disk::check_image_unused(M, &self.0.name, img, &disks)?;
        }
        let disk = Disk::new(self.0.env.clone(), &self.0.name, opts, &self.0.disks);
        disks.push(disk.clone());
        Ok(disk)
    }

    /// `vm:disk(id)`.
    pub fn disk(&self, id: &str) -> mlua::Result<Disk> {
        let disks = self.0.disks.lock().unwrap();
        if let Some(d) = disks.iter().find(|d| d.id() == id) {
            return Ok(d.clone());
        }
        let ids: Vec<&str> = disks.iter().map(Disk::id).collect();
        Err(err(format!(
            "vm:disk(\"{id}\"): vm `{}` has no disk with that id (disks: {}); attach one with vm:attach_disk{{id = \"{id}\", ...}}",
            self.0.name,
            if ids.is_empty() { "none".to_string() } else { ids.join(", ") }
        )))
    }

    pub fn pause(&self) -> mlua::Result<()> {
        let mut st = self.0.state.lock().unwrap();
        if st.phase != Phase::Booted {
            return Err(self.wrong_state("pause", st.phase, "booted"));
        }
        self.machine()?
            .pause()
            .map_err(|e| err(format!("vm:pause: {}", flatten(&e))))?;
        st.phase = Phase::Paused;
        Ok(())
    }

    pub fn resume(&self) -> mlua::Result<()> {
        let mut st = self.0.state.lock().unwrap();
        if st.phase != Phase::Paused {
            return Err(self.wrong_state("resume", st.phase, "paused"));
        }
        self.machine()?
            .resume()
            .map_err(|e| err(format!("vm:resume: {}", flatten(&e))))?;
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
            return Err(err(format!("vm:reset: vm `{}`: {why}", self.0.name)));
        }
        let mut st = self.0.state.lock().unwrap();
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
                Err(err(format!(
                    "vm:reset: vm `{}`: {}",
                    self.0.name,
                    flatten(&e)
                )))
            }
        }
    }

    fn machine(&self) -> mlua::Result<Arc<dyn Guest>> {
        self.0
            .machine
            .lock()
            .unwrap()
            .clone()
            .ok_or_else(|| err(format!("vm `{}` has no running machine", self.0.name)))
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

    fn vm(&self) -> &Vm {
        self
    }
}

/// Errors about the agent or its connection rather than an op the agent
/// ran and reported failed.
fn blames_the_agent(e: &ClientError) -> bool {
    matches!(
        e,
        ClientError::ConnectionClosed { .. }
            | ClientError::ConnectionBroken { .. }
            | ClientError::Timeout { .. }
            | ClientError::OutputTooLarge { .. }
            | ClientError::StdinUnacknowledged { .. }
            | ClientError::UnexpectedValue { .. }
    )
}

#[cfg(test)]
mod tests {
    use super::test_utils::{env, message, vm};
    use super::*;
    use crate::runner::BackendKind;
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
