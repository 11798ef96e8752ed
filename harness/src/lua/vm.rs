//! The VM userdata: lifecycle with the reference's state machine, boot
//! options, accessors, and (through `guest`) every guest operation.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use mlua::{Lua, Table, UserData, UserDataMethods, Value};
use provium_protocol::event::{Event, VmShutdown, VmSpawned};

use super::bridge::{Bridge, WeakBridge};
use super::clock::ClockUd;
use super::disk::{AttachOpts, Disk, DiskList, DiskPlan};
use super::guest::{add_guest_methods, GuestTarget, Ops};
use super::nic::{MachineNic, VmmNics};
use super::snapshot::{VmDecl, VmDevices};
use super::stream::{ByteSource, Stream};
use super::worker::WorkerUd;
use super::{err, guest::client_err};
use crate::backend::{Capabilities, Guest, MachineSpec};
use crate::client::{AgentClient, ClientError};
use crate::config::parse_size;
use crate::error_chain::flatten;
use crate::runner::{CloseKind, Closeable, FileEnv, LiveResource};

pub const DEFAULT_MEMORY_BYTES: u64 = 512 << 20;
pub const DEFAULT_CPUS: u32 = 1;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    Created,
    Booted,
    Paused,
    Shutdown,
    Dead,
}

impl Phase {
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Created => "created",
            Phase::Booted => "booted",
            Phase::Paused => "paused",
            Phase::Shutdown => "shutdown",
            Phase::Dead => "dead",
        }
    }

    /// The reference's wrong-state hint for an op that needs a booted VM:
    /// what the state is and what to do about it.
    pub fn hint(self) -> &'static str {
        match self {
            Phase::Created => "VM not booted; call vm:boot() first",
            Phase::Booted => "VM is booted",
            Phase::Paused => "VM is paused; use resume()",
            Phase::Shutdown => "VM is shutdown; create a new one",
            Phase::Dead => "VM is dead (its agent or machine is gone); create a new one",
        }
    }
}

/// `lab:vm` opts: the sizing the scheduler needs at declaration.
#[derive(Debug, Clone, Copy)]
pub struct VmSizing {
    pub memory_bytes: u64,
    pub cpus: u32,
}

const BOOT_KEYS: &[&str] = &["kernel_cmdline", "rng_seed", "initial_time", "files"];

impl VmSizing {
    pub fn from_opts(opts: Option<&Table>) -> mlua::Result<VmSizing> {
        let mut s = VmSizing {
            memory_bytes: DEFAULT_MEMORY_BYTES,
            cpus: DEFAULT_CPUS,
        };
        let Some(o) = opts else { return Ok(s) };
        for pair in o.pairs::<String, Value>() {
            let (k, v) = pair?;
            match k.as_str() {
                "memory" => {
                    s.memory_bytes = match v {
                        Value::Integer(i) if i > 0 => i as u64,
                        Value::String(t) => parse_size(&t.to_str()?)
                            .map_err(|e| err(format!("vm opts: memory: {e}")))?,
                        other => {
                            return Err(err(format!(
                                "vm opts: memory must be bytes or \"512M\", got {other:?}"
                            )))
                        }
                    }
                }
                "cpus" => {
                    s.cpus = match v {
                        Value::Integer(i) if (1..=256).contains(&i) => i as u32,
                        other => {
                            return Err(err(format!(
                                "vm opts: cpus must be an integer 1..=256, got {other:?}"
                            )))
                        }
                    }
                }
                k if BOOT_KEYS.contains(&k) => {
                    return Err(err(format!(
                        "vm opts: `{k}` is a boot option; pass it to vm:boot({{{k} = ...}})"
                    )))
                }
                other => {
                    return Err(err(format!(
                        "vm opts: unknown key `{other}` (accepted: memory, cpus)"
                    )))
                }
            }
        }
        Ok(s)
    }
}

/// `vm:boot` opts, merged per field into the pending options.
#[derive(Debug, Clone, Default)]
pub struct BootOpts {
    pub kernel_cmdline: Option<String>,
    pub rng_seed: Option<u64>,
    pub initial_time: Option<f64>,
    pub files: Vec<(String, Vec<u8>)>,
}

impl BootOpts {
    fn merge(&mut self, t: &Table) -> mlua::Result<()> {
        for pair in t.pairs::<String, Value>() {
            let (k, v) = pair?;
            match k.as_str() {
                "kernel_cmdline" => self.kernel_cmdline = Some(String::from_lua_value(v, "kernel_cmdline")?),
                "rng_seed" => {
                    self.rng_seed = Some(match v {
                        Value::Integer(i) => i as u64,
                        other => return Err(err(format!("boot: rng_seed must be an integer, got {other:?}"))),
                    })
                }
                "initial_time" => {
                    self.initial_time = Some(match v {
                        Value::Integer(i) => i as f64,
                        Value::Number(n) if n.is_finite() => n,
                        other => return Err(err(format!("boot: initial_time must be finite seconds, got {other:?}"))),
                    })
                }
                "files" => {
                    let Value::Table(list) = v else {
                        return Err(err("boot: files must be an array of {path=..., content=...}"));
                    };
                    for (i, f) in list.sequence_values::<Table>().enumerate() {
                        let f = f.map_err(|_| err(format!("boot: files[{}] must be a table", i + 1)))?;
                        let path: String =
                            f.get("path").map_err(|_| err(format!("boot: files[{}].path must be a string", i + 1)))?;
                        let content: mlua::LuaString = f
                            .get("content")
                            .map_err(|_| err(format!("boot: files[{}].content must be a string", i + 1)))?;
                        self.files.push((path, content.as_bytes().to_vec()));
                    }
                }
                "memory" | "cpus" => {
                    return Err(err(format!("boot: `{k}` is a sizing option; pass it to lab:vm(name, profile, {{{k} = ...}})")))
                }
                other => {
                    return Err(err(format!("boot: unknown option `{other}` (accepted: {})", BOOT_KEYS.join(", "))))
                }
            }
        }
        Ok(())
    }
}

trait FromLuaValue: Sized {
    fn from_lua_value(v: Value, what: &str) -> mlua::Result<Self>;
}

impl FromLuaValue for String {
    fn from_lua_value(v: Value, what: &str) -> mlua::Result<Self> {
        match v {
            Value::String(s) => Ok(s.to_str()?.to_string()),
            other => Err(err(format!(
                "boot: {what} must be a string, got {}",
                other.type_name()
            ))),
        }
    }
}

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
            RestoreError::Failed(e) => super::error_message(e),
        }
    }
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
    fn auto_close(&self) -> Result<(), String> {
        self.shutdown().map_err(|e| super::error_message(&e))
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
        MachineSpec::for_profile(
            &self.0.name,
            &self.0.profile,
            self.0.env.config.profiles.get(&self.0.profile).cloned(),
            self.0.sizing.memory_bytes,
            self.0.sizing.cpus,
        )
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

    /// `vm:restore(path)`: from created or shutdown to booted, running the
    /// snapshot's state in a fresh machine.
    pub fn restore_from(&self, path: &std::path::Path) -> mlua::Result<()> {
        self.restore_checked(path).map_err(RestoreError::into_lua)
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
    /// A VM without an `rng_seed` of its own takes the one the snapshot's
    /// VM was booted with ([`VmDecl::rng_seed`]), so a seeded fixture's
    /// stream continues deterministically in every VM restored from it. A
    /// snapshot without a declaration (written below Lua) pins nothing.
    fn adopt_recorded_rng_seed(&self, path: &std::path::Path) -> Result<(), RestoreError> {
        let mut st = self.0.state.lock().unwrap();
        if st.pending.rng_seed.is_some() {
            return Ok(());
        }
        let decl = VmDecl::read_if_present(path).map_err(|e| {
            RestoreError::Failed(err(format!("vm:restore: vm `{}`: {e}", self.0.name)))
        })?;
        st.pending.rng_seed = decl.and_then(|d| d.rng_seed);
        Ok(())
    }

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
        let name = self.0.name.clone();
        let devices = if caps.device_snapshots {
            VmDevices::read_if_present(path)
                .map_err(|e| Failed(err(format!("vm:restore: vm `{name}`: {e}"))))?
        } else {
            None
        };
        let (want_disks, want_nics) =
            devices.map_or((None, None), |d| (Some(d.disks), Some(d.nics)));
        if caps.seeded_rng {
            self.adopt_recorded_rng_seed(path)?;
        }
        // kvm: the snapshot's virtio-net devices need their ports again (as
        // at boot, before the state lock; dropped, so detached, if the
        // restore is refused).
        let vmm_nics = caps.has_vmm_nics();
        let nics = match (&want_nics, vmm_nics) {
            (_, false) => VmmNics::default(),
            (Some(want), true) => {
                super::nic::restore_ports(self, want, &self.left_bridges()).map_err(|e| {
                    Mismatch(format!(
                        "vm:restore: vm `{name}`: the snapshot's NICs do not fit this VM (a configuration \
                         mismatch): {e}"
                    ))
                })?
            }
            (None, true) => super::nic::vmm_ports(self).map_err(Failed)?,
        };
        let VmmNics {
            configs,
            record,
            lone,
            added,
        } = nics;
        // Host TAPs: the guest comes back on the bridges it left when it
        // was shut down (its NICs, and the interface configuration its
        // snapshot holds, are put back once it runs).
        if !vmm_nics {
            for b in self.left_bridges().into_iter().filter(|b| !b.is_closed()) {
                b.attach_vm(self).map_err(|e| {
                    Failed(err(format!(
                        "vm:restore: vm `{name}`: cannot rejoin bridge `{}`: {e}",
                        b.name()
                    )))
                })?;
            }
        }
        let mut built = false;
        let r = self.restore_machine(
            path,
            want_disks.as_deref(),
            (configs, record, lone),
            &mut built,
        );
        // Memberships for a machine never built are undone; a machine that
        // was built and then lost its agent is dead with its NICs, as after
        // a failed boot.
        if r.is_err() && !built {
            for b in &added {
                b.vm_gone(self);
            }
        }
        let has_nics = r?;
        self.0.left_bridges.lock().unwrap().clear();
        // The restored NICs' members are realised (as after a boot); host
        // TAPs are made now, then the interface configuration the snapshot
        // holds goes back on them.
        if has_nics || (!vmm_nics && !self.bridges().is_empty()) {
            super::nic::realise_all(self).map_err(Failed)?;
        }
        if !vmm_nics {
            self.machine()
                .map_err(Failed)?
                .apply_restored_net()
                .map_err(|e| Failed(err(format!("vm:restore: vm `{name}`: {}", flatten(&e)))))?;
        }
        Ok(())
    }

    /// The part of a restore under the state lock: the disks, the machine
    /// (`built` once it exists), the agent. Returns whether the machine has
    /// NICs.
    fn restore_machine(
        &self,
        path: &std::path::Path,
        want_disks: Option<&[super::snapshot::DiskDecl]>,
        (nics, record, lone): (
            Vec<provium_vmm::vmm_config::NetConfig>,
            Vec<MachineNic>,
            Vec<provium_netsetup::Switch>,
        ),
        built: &mut bool,
    ) -> Result<bool, RestoreError> {
        use RestoreError::{Failed, Mismatch};
        let has_nics = !nics.is_empty();
        let mut st = self.0.state.lock().unwrap();
        if !matches!(st.phase, Phase::Created | Phase::Shutdown) {
            return Err(Failed(self.wrong_state(
                "restore",
                st.phase,
                "created or shutdown (call vm:shutdown() first)",
            )));
        }
        let live = self.live_streams();
        if !live.is_empty() {
            return Err(Failed(err(super::snapshot::live_streams_refusal(
                "vm:restore()",
                &self.0.env.rel_path,
                &live,
            ))));
        }
        let env = &self.0.env;
        let caps = self.capabilities();
        // A pinned rng_seed (vm:boot opts given before the restore) keeps
        // the restored rng's stream deterministic; without one it is reseeded.
        let mut spec = MachineSpec {
            rng_seed: st.pending.rng_seed.filter(|_| caps.seeded_rng),
            ..self.declared_spec()
        };
        // The restored VM's disks (their devices are in the snapshot; the
        // images are not: they are used as they are now).
        let name = &self.0.name;
        let (drives, new_disks) = {
            let disks = self.0.disks.lock().unwrap();
            let failed = |e: String| Failed(err(format!("vm:restore: {e}")));
            match want_disks.filter(|_| caps.device_snapshots) {
                Some(want) => {
                    let live: Vec<Disk> =
                        disks.iter().filter(|d| !d.is_detached()).cloned().collect();
                    let ids: Vec<String> = live.iter().map(|d| d.id().to_string()).collect();
                    let plan = super::disk::plan_disks(name, want, &ids).map_err(|e| {
                        Mismatch(format!(
                            "vm:restore: the snapshot's disks do not fit this VM (a configuration \
                             mismatch): {e}"
                        ))
                    })?;
                    match plan {
                        DiskPlan::Attached => (
                            super::disk::drives_of(name, live).map_err(failed)?,
                            Vec::new(),
                        ),
                        DiskPlan::FromSnapshot => {
                            let new = want
                                .iter()
                                .map(|d| Disk::from_decl(env.clone(), name, d, &self.0.disks))
                                .collect::<Result<Vec<_>, _>>()
                                .map_err(|e| Mismatch(format!("vm:restore: vm `{name}`: {e}")))?;
                            (
                                super::disk::drives_of(name, new.clone()).map_err(failed)?,
                                new,
                            )
                        }
                    }
                }
                None => (
                    super::disk::boot_drives(name, &disks).map_err(failed)?,
                    Vec::new(),
                ),
            }
        };
        spec.drives = drives.drives.clone();
        spec.nics = nics;
        let machine: Arc<dyn Guest> =
            Arc::from(env.machines().restore(&spec, path).map_err(|e| {
                Failed(err(format!(
                    "vm:restore: vm `{name}` from {}: {}",
                    path.display(),
                    flatten(&e)
                )))
            })?);
        *built = true;
        if !new_disks.is_empty() {
            // The snapshot's disks replace the detached ones of those ids.
            let mut disks = self.0.disks.lock().unwrap();
            disks.retain(|d| !new_disks.iter().any(|n| n.id() == d.id()));
            let old = std::mem::take(&mut *disks);
            disks.extend(new_disks);
            disks.extend(old);
        }
        drives.given_to_guest();
        *self.0.machine_disks.lock().unwrap() = drives.disks().to_vec();
        *self.0.machine_nics.lock().unwrap() = record;
        *self.0.lone_switches.lock().unwrap() = lone;
        *self.0.machine.lock().unwrap() = Some(machine.clone());
        let client = match machine.connect() {
            Ok(c) => c,
            Err(e) => {
                machine.kill();
                st.phase = Phase::Dead;
                return Err(Failed(err(format!(
                    "vm:restore: vm `{name}`: the agent did not answer: {}",
                    flatten(&e)
                ))));
            }
        };
        st.client = Some(client);
        st.phase = Phase::Booted;
        st.booted_at = Some(Instant::now());
        env.events.emit(Event::VmSpawned(VmSpawned {
            file: env.rel_path.clone(),
            vm_name: self.0.name.clone(),
            profile: self.0.profile.clone(),
            memory_bytes: self.0.sizing.memory_bytes,
            cid: machine.cid().unwrap_or(0),
        }));
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
            super::nic::vmm_ports(self)?
        } else {
            VmmNics::default()
        };
        let VmmNics {
            configs: nics,
            record: nic_record,
            ..
        } = nics;
        let mut st = self.0.state.lock().unwrap();
        if st.phase != Phase::Created {
            return Err(self.wrong_state(
                "boot",
                st.phase,
                "created (a VM boots once; create another or restore a snapshot)",
            ));
        }
        if let Some(o) = &opts {
            st.pending.merge(o)?;
        }
        let env = &self.0.env;
        let drives = {
            let disks = self.0.disks.lock().unwrap();
            super::disk::boot_drives(&self.0.name, &disks)
                .map_err(|e| err(format!("vm:boot: {e}")))?
        };
        let spec = boot_spec(
            self.declared_spec(),
            &st.pending,
            drives.drives.clone(),
            nics,
        );
        let machine: Arc<dyn Guest> = Arc::from(
            env.machines()
                .boot(&spec)
                .map_err(|e| err(format!("vm:boot: vm `{}`: {}", self.0.name, flatten(&e))))?,
        );
        drives.given_to_guest();
        *self.0.machine_disks.lock().unwrap() = drives.disks().to_vec();
        *self.0.machine_nics.lock().unwrap() = nic_record;
        *self.0.machine.lock().unwrap() = Some(machine.clone());
        let client = match machine.connect() {
            Ok(c) => c,
            Err(e) => {
                machine.kill();
                st.phase = Phase::Dead;
                return Err(err(format!(
                    "vm:boot: vm `{}`: the agent did not answer: {}",
                    self.0.name,
                    flatten(&e)
                )));
            }
        };
        // Files of boot opts land before the test runs anything.
        for (path, content) in std::mem::take(&mut st.pending.files) {
            if let Some(parent) = std::path::Path::new(&path).parent() {
                let _ = provium_ops(&client).mkdir(&parent.to_string_lossy(), true, None);
            }
            provium_ops(&client)
                .write_file(&path, &content)
                .map_err(|e| client_err(&format!("vm:boot: files: {path}"), e))?;
        }
        st.client = Some(client);
        st.phase = Phase::Booted;
        st.booted_at = Some(Instant::now());
        env.events.emit(Event::VmSpawned(VmSpawned {
            file: env.rel_path.clone(),
            vm_name: self.0.name.clone(),
            profile: self.0.profile.clone(),
            memory_bytes: self.0.sizing.memory_bytes,
            cid: machine.cid().unwrap_or(0),
        }));
        // NICs of bridges attached before boot (eth0, eth1, … by bridge name).
        drop(st);
        super::nic::realise_all(self)?;
        Ok(self.clone())
    }

    pub fn shutdown(&self) -> mlua::Result<()> {
        let mut st = self.0.state.lock().unwrap();
        if st.phase == Phase::Shutdown {
            return Ok(());
        }
        if let Some(c) = st.client.take() {
            c.close();
        }
        if let Some(m) = self.0.machine.lock().unwrap().take() {
            m.kill();
        }
        let was_up = st.booted_at.take();
        st.phase = Phase::Shutdown;
        if let Some(t0) = was_up {
            self.0.env.events.emit(Event::VmShutdown(VmShutdown {
                file: self.0.env.rel_path.clone(),
                vm_name: self.0.name.clone(),
                duration_ns: t0.elapsed().as_nanos() as u64,
            }));
        }
        // Leave every bridge (never while holding the state lock: a bridge
        // may read this VM's phase), remembering them for a later
        // `vm:restore` of a snapshot whose NICs were on them.
        drop(st);
        let on: Vec<WeakBridge> = self.bridges().iter().map(Bridge::downgrade).collect();
        if !on.is_empty() {
            *self.0.left_bridges.lock().unwrap() = on;
        }
        super::nic::vm_gone(self);
        self.0.lone_switches.lock().unwrap().clear();
        // A disk does not outlive its VM's life: the guest is gone, and a
        // later sector op must say so rather than act on a dead VM's image.
        for d in self.0.disks.lock().unwrap().iter() {
            d.detach();
        }
        Ok(())
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

/// The spec a boot builds: the declaration's, with the `vm:boot` opts and
/// the VM's disks and (VMM-device) NICs.
fn boot_spec(
    declared: MachineSpec,
    opts: &BootOpts,
    drives: Vec<provium_vmm::vmm_config::DriveConfig>,
    nics: Vec<provium_vmm::vmm_config::NetConfig>,
) -> MachineSpec {
    MachineSpec {
        kernel_cmdline: opts.kernel_cmdline.clone(),
        rng_seed: opts.rng_seed,
        initial_time: opts.initial_time,
        files: opts.files.clone(),
        drives,
        nics,
        ..declared
    }
}

/// The client as its op trait (the VM's own namespace).
fn provium_ops(c: &AgentClient) -> &dyn crate::client::AgentOps {
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

impl UserData for Vm {
    fn add_methods<M: UserDataMethods<Self>>(m: &mut M) {
        m.add_method("boot", |_, this, opts: Option<Table>| this.boot(opts));
        m.add_method("pause", |_, this, ()| this.pause());
        m.add_method("resume", |_, this, ()| this.resume());
        m.add_method("shutdown", |_, this, ()| this.shutdown());
        m.add_method("close", |_, this, ()| this.shutdown());
        m.add_method("reset", |_, this, ()| this.reset());
        m.add_method("power_button", |_, this, ()| {
            let machine = this.booted_machine("power_button")?;
            // A backend without a power button refuses with the VM as it was.
            if let Some(why) = machine.capabilities().power_button.refusal() {
                return Err(err(format!("vm:power_button: vm `{}`: {why}", this.0.name)));
            }
            let pressed = machine.power_button();
            // Shutdown either way (the reference's post-state); a guest that
            // did not power off is still an error, with what it did instead.
            this.shutdown()?;
            pressed.map_err(|e| {
                err(format!(
                    "vm:power_button: vm `{}`: {}",
                    this.0.name,
                    flatten(&e)
                ))
            })
        });
        m.add_method("snapshot", |_, this, path: Option<String>| {
            use super::snapshot::{delete_at_scope_end, temp_path, SnapshotUd};
            let (path, temp) = match path {
                Some(p) => (std::path::PathBuf::from(p), false),
                None => (temp_path(".snap"), true),
            };
            this.snapshot_to(&path)?;
            if temp {
                delete_at_scope_end(&this.0.env, &path);
            }
            Ok(SnapshotUd { path })
        });
        m.add_method("restore", |_, this, v: Value| {
            let path = super::snapshot::snapshot_path_arg(&v, "vm:restore")?;
            this.restore_from(&path)?;
            Ok(this.clone())
        });
        // Always succeeds (the reference): a backend without a console
        // refuses at the console's first use.
        m.add_method("console", |_, this, ()| {
            let vm = this.clone();
            let machine = move || vm.0.machine.lock().unwrap().clone();
            Ok(super::console::ConsoleUd::new(
                this.clone(),
                Box::new(machine),
            ))
        });
        m.add_method("clock", |_, this, ()| Ok(ClockUd::new(this.clone())));
        m.add_method("spawn_worker", |_, this, opts: Option<Table>| {
            if let Some(o) = opts {
                for pair in o.pairs::<Value, Value>() {
                    let (k, v) = pair?;
                    match (k.to_string()?.as_str(), v) {
                        ("thread", Value::Boolean(false) | Value::Nil) => {}
                        ("thread", Value::Boolean(true)) => {
                            return Err(err("vm:spawn_worker: {thread = true} is future work (thread-mode workers are not supported yet); omit it or pass {thread = false}"));
                        }
                        ("thread", other) => {
                            return Err(err(format!(
                                "vm:spawn_worker: `thread` must be a boolean, got {}",
                                other.type_name()
                            )));
                        }
                        (key, _) => {
                            return Err(err(format!(
                                "vm:spawn_worker: unknown option `{key}` (accepted: thread)"
                            )));
                        }
                    }
                }
            }
            let client = this.client("vm:spawn_worker")?;
            let w = this.guard_op("vm:spawn_worker", || client.spawn_worker())?;
            Ok(WorkerUd::new(this.clone(), w))
        });
        m.add_method("nic", |_, this, name: String| {
            super::nic::vm_nic(this, &name)
        });
        m.add_method("disk", |_, this, id: Value| {
            let Value::String(id) = &id else {
                return Err(err(format!(
                    "vm:disk: the id must be a string, got {}",
                    id.type_name()
                )));
            };
            this.disk(&id.to_str()?)
        });
        m.add_method("attach_disk", |_, this, opts: Value| {
            this.attach_disk(&opts)
        });
        m.add_method("name", |_, this, ()| Ok(this.0.name.clone()));
        m.add_method("profile", |_, this, ()| Ok(this.0.profile.clone()));
        m.add_method("state", |_, this, ()| Ok(this.phase().as_str()));
        m.add_method("cid", |_, this, ()| {
            Ok(this
                .0
                .machine
                .lock()
                .unwrap()
                .as_ref()
                .and_then(|m| m.cid())
                .filter(|c| *c != 0))
        });
        m.add_method("is_quiescent", |_, this, ()| {
            Ok(this.0.in_flight.load(Ordering::SeqCst) == 0
                && this.0.open_files.load(Ordering::SeqCst) == 0
                && this.0.open_streams.load(Ordering::SeqCst) == 0)
        });
        m.add_method("open_file_count", |_, this, ()| {
            Ok(this.0.open_files.load(Ordering::SeqCst))
        });
        m.add_method("open_stream_count", |_, this, ()| {
            Ok(this.0.open_streams.load(Ordering::SeqCst))
        });
        add_guest_methods::<Vm, M>(m);
        m.add_meta_method(mlua::MetaMethod::ToString, |_, this, ()| {
            Ok(format!("VM({}, {})", this.0.name, this.phase().as_str()))
        });
        m.add_meta_method(mlua::MetaMethod::Eq, |_, this, other: mlua::AnyUserData| {
            Ok(other
                .borrow::<Vm>()
                .map(|o| Arc::ptr_eq(&o.0, &this.0))
                .unwrap_or(false))
        });
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
    use super::*;
    use crate::config::Config;
    use crate::events::EventSender;
    use crate::lua::snapshot::{DiskDecl, NicDecl, VM_DEVICES_SECTION};
    use crate::runner::BackendKind;

    fn kvm_env() -> Arc<FileEnv> {
        Arc::new(FileEnv::new(
            "t.test.lua".into(),
            "/t.test.lua".into(),
            Vec::new(),
            Arc::new(Config::default()),
            BackendKind::Kvm,
            EventSender::disabled(),
        ))
    }

    fn vm(env: &Arc<FileEnv>) -> Vm {
        let sizing = VmSizing {
            memory_bytes: 64 << 20,
            cpus: 1,
        };
        Vm::create(env.clone(), "v".into(), "p".into(), sizing).unwrap()
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
        VmDevices { disks, nics }
    }

    /// `vm:shutdown(); vm:restore(s)` on a bridged VM: the shutdown leaves
    /// the bridge (its NIC goes), and the restore's ports put the VM back
    /// on it with the snapshot's MAC.
    #[test]
    fn a_vm_shut_down_gets_its_nics_back_on_the_same_bridges() {
        let env = kvm_env();
        let lan = Bridge::create(&env, "lan");
        let v = vm(&env);
        let mac = crate::lua::bridge::nic_mac("v", "lan", &[]);
        lan.restore_member(&v, mac, None).unwrap();
        v.shutdown().unwrap();
        assert!(!lan.is_member("v"), "a shut-down VM is off its bridges");
        let left: Vec<Bridge> =
            v.0.left_bridges
                .lock()
                .unwrap()
                .iter()
                .filter_map(WeakBridge::upgrade)
                .collect();
        assert_eq!(left.len(), 1);
        let nics =
            super::super::nic::restore_ports(&v, &[nic("lan", &mac.to_string())], &left).unwrap();
        assert_eq!(nics.configs.len(), 1);
        assert_eq!(nics.configs[0].mac, mac);
        assert!(lan.has_vm(&v), "back on lan");
        assert_eq!(nics.added.len(), 1);
        nics.undo(&v);
        assert!(!lan.is_member("v"), "undone");
        // A snapshot naming a bridge it was never on is a mismatch.
        let e = super::super::nic::restore_ports(&v, &[nic("wan", &mac.to_string())], &left)
            .err()
            .unwrap();
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
}
