//! A running guest, whatever backend made it: the VM userdata talks to this,
//! never to a backend directly.

use std::sync::Mutex;

use provium_vmm::vmm_config::{DriveConfig, NetConfig};

use crate::backend::kvm::{KvmBootOpts, KvmMachine};
use crate::backend::local::{locate_agent, LocalOptions, LocalSandbox};
use crate::client::AgentClient;
use crate::config::Profile;
use crate::runner::BackendKind;

/// Refusal for virtio-net configs handed to the local backend.
const LOCAL_NICS: &str = "virtio-net devices need the kvm backend (the local sandbox uses TAPs)";
/// Why a local machine takes no drives (the Disk userdata refuses earlier).
const LOCAL_DISKS: &str = "disks need the kvm backend (the local sandbox has no block devices)";

/// Refuses kvm-only devices for the local backend.
fn local_takes_no_devices(
    backend: BackendKind,
    drives: &[DriveConfig],
    nics: &[NetConfig],
) -> Result<(), String> {
    if backend == BackendKind::Local {
        if !nics.is_empty() {
            return Err(LOCAL_NICS.into());
        }
        if !drives.is_empty() {
            return Err(LOCAL_DISKS.into());
        }
    }
    Ok(())
}

/// What a boot needs from the VM declaration and `vm:boot` opts.
#[derive(Debug, Clone)]
pub struct BootSpec {
    pub vm_name: String,
    pub profile_name: String,
    pub profile: Option<Profile>,
    pub memory_bytes: u64,
    pub cpus: u32,
    pub kernel_cmdline: Option<String>,
    pub rng_seed: Option<u64>,
    pub initial_time: Option<f64>,
    /// The environment `cli::main` read (the agent search, kvm overrides).
    pub settings: crate::settings::Settings,
}

pub enum Machine {
    Local(Mutex<LocalSandbox>),
    Kvm(KvmMachine),
}

impl Machine {
    pub fn boot(backend: BackendKind, spec: &BootSpec) -> Result<Machine, String> {
        Machine::boot_with_files(backend, spec, &[])
    }

    /// [`Machine::boot`] with boot opts `files`: the kvm backend puts them in
    /// the initrd (there before init runs); the local sandbox has none, and
    /// its caller writes them through the agent.
    pub fn boot_with_files(
        backend: BackendKind,
        spec: &BootSpec,
        files: &[(String, Vec<u8>)],
    ) -> Result<Machine, String> {
        Machine::boot_with_nics(backend, spec, files, Vec::new())
    }

    /// [`Machine::boot_with_files`] with the kvm backend's virtio-net devices
    /// (`nic::vmm_ports`: one per bridge, in bridge-name order). The local
    /// backend creates its NICs after boot (`open_nic`) and takes none here.
    pub fn boot_with_nics(
        backend: BackendKind,
        spec: &BootSpec,
        files: &[(String, Vec<u8>)],
        nics: Vec<NetConfig>,
    ) -> Result<Machine, String> {
        Machine::boot_with_devices(backend, spec, files, &[], nics)
    }

    /// [`Machine::boot_with_nics`] with the VM's disks `drives` too (attach
    /// order: the guest's vda, vdb, …; `lua::disk::boot_drives`), which
    /// only the kvm backend has.
    pub fn boot_with_devices(
        backend: BackendKind,
        spec: &BootSpec,
        files: &[(String, Vec<u8>)],
        drives: &[DriveConfig],
        nics: Vec<NetConfig>,
    ) -> Result<Machine, String> {
        local_takes_no_devices(backend, drives, &nics)?;
        match backend {
            BackendKind::Local => {
                // The sandbox has no kernel of its own: refuse what only a
                // kernel could honour instead of silently ignoring it.
                if spec.kernel_cmdline.is_some() {
                    return Err(
                        "kernel_cmdline needs the kvm backend (the local sandbox has no kernel)"
                            .into(),
                    );
                }
                if spec.rng_seed.is_some() {
                    return Err("rng_seed needs the kvm backend (the local sandbox uses the host's random device)".into());
                }
                if spec.initial_time.is_some() {
                    return Err("initial_time needs the kvm backend (the local sandbox shares the host's clock)".into());
                }
                let agent = locate_agent(&spec.settings).map_err(|e| e.to_string())?;
                let sandbox = LocalSandbox::start(&spec.vm_name, &LocalOptions::new(agent))
                    .map_err(|e| e.to_string())?;
                Ok(Machine::Local(Mutex::new(sandbox)))
            }
            BackendKind::Kvm => {
                let profile = spec.profile.as_ref().ok_or_else(|| {
                    format!(
                        "the kvm backend boots a profile's kernel, and profile `{}` is not in provium.toml",
                        spec.profile_name
                    )
                })?;
                let opts = KvmBootOpts {
                    memory_bytes: spec.memory_bytes,
                    cpus: spec.cpus,
                    kernel_cmdline: spec.kernel_cmdline.clone(),
                    rng_seed: spec.rng_seed,
                    files: files.to_vec(),
                    inject_agent: profile.inject_agent,
                    nics,
                    drives: drives.to_vec(),
                    boot_timer: None,
                    settings: spec.settings.clone(),
                };
                KvmMachine::boot(&spec.vm_name, profile, &opts, spec.initial_time).map(Machine::Kvm)
            }
        }
    }

    pub fn connect(&self) -> Result<AgentClient, String> {
        match self {
            Machine::Local(s) => s.lock().unwrap().connect().map_err(|e| e.to_string()),
            Machine::Kvm(k) => k.connect(),
        }
    }

    /// The vsock CID (0 where there is none).
    pub fn cid(&self) -> u32 {
        match self {
            Machine::Local(_) => 0,
            Machine::Kvm(k) => k.cid(),
        }
    }

    /// What this machine holds of the host's memory now, as (resident,
    /// proportional) bytes: a local sandbox's processes, or a kvm VM's
    /// guest RAM mappings (the VMM runs in this process, whose own heap is
    /// not the VM's).
    pub fn resident_memory(&self) -> (u64, u64) {
        match self {
            Machine::Local(s) => {
                let pids = s.lock().unwrap_or_else(|e| e.into_inner()).host_pids();
                crate::host_memory::memory_of(&pids)
            }
            Machine::Kvm(k) => crate::host_memory::mapping_memory(&k.vm().ram_host_ranges()),
        }
    }

    /// Stop it now (watchdog, failed boot); safe to call more than once.
    pub fn kill(&self) {
        match self {
            Machine::Local(s) => {
                let _ = s.lock().unwrap().shutdown();
            }
            Machine::Kvm(k) => k.kill(),
        }
    }

    pub fn shutdown(&self) {
        self.kill()
    }

    /// Freeze every process of the guest (the agent included) until resume.
    pub fn pause(&self) -> Result<(), String> {
        match self {
            Machine::Local(s) => signal_all(&s.lock().unwrap(), libc::SIGSTOP),
            Machine::Kvm(k) => k.pause(),
        }
    }

    pub fn resume(&self) -> Result<(), String> {
        match self {
            Machine::Local(s) => signal_all(&s.lock().unwrap(), libc::SIGCONT),
            Machine::Kvm(k) => k.resume(),
        }
    }

    /// Warm reset; returns the agent connection of the new boot.
    pub fn reset(&self) -> Result<AgentClient, String> {
        match self {
            Machine::Local(_) => Err(LOCAL_NO_RESET.into()),
            Machine::Kvm(k) => k.reset(),
        }
    }

    /// Why this backend cannot reset at all (`None`: it can), so the caller
    /// refuses before it changes anything (the VM stays as it was).
    pub fn reset_refusal(&self) -> Option<&'static str> {
        match self {
            Machine::Local(_) => Some(LOCAL_NO_RESET),
            Machine::Kvm(_) => None,
        }
    }

    /// Local: puts back the interface configuration a restore captured, once
    /// the restored sandbox's NICs are on its bridges again (kvm: the
    /// guest's memory holds its own).
    pub fn apply_restored_net(&self) -> Result<(), String> {
        match self {
            Machine::Local(s) => s.lock().unwrap().apply_restored_net(),
            Machine::Kvm(_) => Ok(()),
        }
    }

    /// Presses the power button and waits for the guest to power off.
    pub fn power_button(&self) -> Result<(), String> {
        match self {
            Machine::Local(_) => Err(LOCAL_NO_POWER_BUTTON.into()),
            Machine::Kvm(k) => k.power_button(),
        }
    }

    /// Why this backend has no power button (`None`: it has one).
    pub fn power_button_refusal(&self) -> Option<&'static str> {
        match self {
            Machine::Local(_) => Some(LOCAL_NO_POWER_BUTTON),
            Machine::Kvm(_) => None,
        }
    }

    /// Creates NIC `ifname` with `mac` inside the guest and returns the fd
    /// of its host end, for a bridge's switch to hold (local: a TAP in the
    /// sandbox's network namespace).
    pub fn open_nic(
        &self,
        ifname: &str,
        mac: provium_netsetup::MacAddr,
    ) -> Result<std::os::fd::OwnedFd, String> {
        match self {
            Machine::Local(s) => {
                // The lock keeps the sandbox (and so its init pid) alive.
                let s = s.lock().unwrap();
                if !s.is_running() {
                    return Err(format!("sandbox `{}` is not running", s.name()));
                }
                crate::backend::local::net::open_tap_in_netns(s.init_pid(), ifname, mac)
                    .map_err(|e| crate::error_chain::flatten(&e))
            }
            Machine::Kvm(_) => Err(format!(
                "NIC {ifname}: a booted kvm VM cannot get a new NIC: its virtio-net devices are \
                 virtio-mmio, which a guest without ACPI finds only on its kernel command line at \
                 boot (no hotplug); attach the bridge before vm:boot()"
            )),
        }
    }

    /// Whether this machine's NICs are VMM devices made before boot (kvm)
    /// rather than created after boot by `open_nic` (local TAPs).
    pub fn has_vmm_nics(&self) -> bool {
        matches!(self, Machine::Kvm(_))
    }

    /// The shape a snapshot of a machine booted from `spec` records.
    pub fn snapshot_shape(backend: BackendKind, spec: &BootSpec) -> provium_snapshot::Shape {
        provium_snapshot::Shape {
            backend: match backend {
                BackendKind::Local => crate::backend::local::snapshot::BACKEND.into(),
                BackendKind::Kvm => "kvm".into(),
            },
            memory_bytes: spec.memory_bytes,
            vcpus: spec.cpus,
        }
    }

    /// Write a snapshot of the running guest to `path` (atomically); returns
    /// its size in bytes. Local: the sandbox's files (see
    /// `backend::local::snapshot`).
    pub fn snapshot_to(
        &self,
        path: &std::path::Path,
        shape: provium_snapshot::Shape,
        extra: &[(&str, Vec<u8>)],
    ) -> Result<u64, String> {
        use crate::backend::local::snapshot;
        match self {
            Machine::Local(s) => snapshot::write_snapshot(
                &s.lock().unwrap(),
                path,
                shape,
                provium_protocol::PROTOCOL_VERSION,
                extra,
            )
            .map_err(|e| crate::error_chain::flatten(&e)),
            // The VMM records its own shape (memory, vCPUs); the harness's
            // is the same sizing, so `shape` adds nothing there.
            Machine::Kvm(k) => k.snapshot_to(path, extra),
        }
    }

    /// A new machine restored from the snapshot at `path`. The file is
    /// validated (version, checksums, shape) before anything boots.
    pub fn restore(
        backend: BackendKind,
        spec: &BootSpec,
        path: &std::path::Path,
    ) -> Result<Machine, String> {
        Machine::restore_with_nics(backend, spec, path, Vec::new())
    }

    /// [`Machine::restore`] with the kvm backend's virtio-net devices (the
    /// snapshot's device list must have as many, with the same MACs).
    pub fn restore_with_nics(
        backend: BackendKind,
        spec: &BootSpec,
        path: &std::path::Path,
        nics: Vec<NetConfig>,
    ) -> Result<Machine, String> {
        Machine::restore_with_devices(backend, spec, path, &[], nics)
    }

    /// [`Machine::restore_with_nics`] with the VM's disks `drives` too (the
    /// snapshot holds their devices' state, so the restored VM needs as
    /// many; the images are used as they are now).
    pub fn restore_with_devices(
        backend: BackendKind,
        spec: &BootSpec,
        path: &std::path::Path,
        drives: &[DriveConfig],
        nics: Vec<NetConfig>,
    ) -> Result<Machine, String> {
        use crate::backend::local::snapshot;
        local_takes_no_devices(backend, drives, &nics)?;
        match backend {
            BackendKind::Local => {
                let state = snapshot::read_snapshot(
                    path,
                    Machine::snapshot_shape(backend, spec),
                    provium_protocol::PROTOCOL_VERSION,
                )
                .map_err(|e| crate::error_chain::flatten(&e))?;
                let machine = Machine::boot(backend, spec)?;
                let Machine::Local(s) = &machine else {
                    unreachable!("Machine::boot(Local) makes a local machine")
                };
                let applied = s.lock().unwrap().restore_fs(&state);
                if let Err(e) = applied {
                    machine.kill();
                    return Err(crate::error_chain::flatten(&e));
                }
                s.lock().unwrap().set_restored_net(state.net);
                Ok(machine)
            }
            BackendKind::Kvm => {
                let profile = spec.profile.as_ref().ok_or_else(|| {
                    format!(
                        "the kvm backend restores into profile `{}`, which is not in provium.toml",
                        spec.profile_name
                    )
                })?;
                // The snapshot carries RAM and device state; the config has
                // the same shape and devices, and the boot a later
                // `vm:reset()` makes: so the agent is injected as at boot
                // (without it, a reset restored VM booted no agent).
                let opts = KvmBootOpts {
                    memory_bytes: spec.memory_bytes,
                    cpus: spec.cpus,
                    kernel_cmdline: None,
                    rng_seed: spec.rng_seed,
                    files: Vec::new(),
                    inject_agent: profile.inject_agent,
                    nics,
                    drives: drives.to_vec(),
                    boot_timer: None,
                    settings: spec.settings.clone(),
                };
                KvmMachine::restore(&spec.vm_name, profile, &opts, path).map(Machine::Kvm)
            }
        }
    }

    /// The last `max` bytes of the console log, where there is a console.
    pub fn console_tail(&self, max: usize) -> Option<String> {
        match self {
            Machine::Local(_) => None,
            Machine::Kvm(k) => Some(k.console_tail(max)),
        }
    }

    /// The serial console (log, live subscribers, input), where there is one.
    pub fn console(&self) -> Option<std::sync::Arc<provium_vmm::Console>> {
        match self {
            Machine::Local(_) => None,
            Machine::Kvm(k) => Some(k.console()),
        }
    }
}

const LOCAL_NO_RESET: &str =
    "reset needs the kvm backend (the local sandbox has no kernel to reboot)";
const LOCAL_NO_POWER_BUTTON: &str =
    "power_button needs the kvm backend (the local sandbox has no i8042 to press)";

/// Signal every process in the sandbox. Enumerates twice so a process forked
/// while the first pass ran is caught by the second.
fn signal_all(s: &LocalSandbox, sig: i32) -> Result<(), String> {
    if !s.is_running() {
        return Err(format!("sandbox `{}` is not running", s.name()));
    }
    for _ in 0..2 {
        for pid in s.host_pids() {
            // SAFETY: kill(2) on pids enumerated from the sandbox's pid
            // namespace, which its init keeps alive while running.
            unsafe { libc::kill(pid, sig) };
        }
    }
    Ok(())
}
