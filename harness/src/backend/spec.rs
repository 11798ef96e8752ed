//! [`MachineSpec`]: everything one boot or restore needs, in one shape.
//! The Lua layer (`lua::vm`) builds it from a VM's declaration and
//! `vm:boot` opts; each backend takes what it has (the kvm backend turns it
//! into the VMM's `VmConfig` once, in `backend/kvm/config.rs`, its devices
//! in `backend/kvm/devices.rs`) and refuses what it cannot honour.
//!
//! The spec speaks the harness's vocabulary, not a backend's: a NIC is a
//! switch port ([`NicSpec`]), a disk an image with its fault set
//! ([`DiskSpec`]). Only `backend/kvm/` knows the VMM's device configs.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use provium_netsetup::{MacAddr, Port};

use super::vmm_models::{BootTimer, DiskFaults};

use crate::config::Profile;
use crate::settings::Settings;

/// One guest's configuration.
#[derive(Debug, Clone, Default)]
pub struct MachineSpec {
    pub vm_name: String,
    /// The profile the VM declared, and its provium.toml table (`None` when
    /// provium.toml has none of that name: the local backend needs none).
    pub profile_name: String,
    pub profile: Option<Profile>,
    pub memory_bytes: u64,
    pub cpus: u32,
    /// `kernel_cmdline`: replaces the profile's cmdline / cmdline_file.
    pub kernel_cmdline: Option<String>,
    pub rng_seed: Option<u64>,
    /// Seconds since the epoch the guest clock is set to after Hello.
    pub initial_time: Option<f64>,
    /// Boot opts `files`: (absolute guest path, contents), mode 0644. The
    /// kvm backend puts them in the initrd (there before init runs); the
    /// local one has none, and its caller writes them through the agent.
    pub files: Vec<(String, Vec<u8>)>,
    /// Inject the agent into the initrd (the profile's `inject_agent`;
    /// `provium console` only with `--agent`).
    pub inject_agent: bool,
    /// NICs fixed when the machine is built, one per attached bridge in
    /// bridge-name order (the guest's eth0, eth1, …;
    /// `network::vmm_ports`); their ports are already on the switches.
    pub nics: Vec<NicSpec>,
    /// The VM's disks in attach order (the guest's vda, vdb, …); each
    /// carries its Disk userdata's fault set (`lua::disk::boot_drives`).
    pub disks: Vec<DiskSpec>,
    /// Disks given to the guest after boot, by slot (a restore of a
    /// snapshot taken while they were in: `Guest::take_restored_disks`
    /// hands their leases back). Backends without slots refuse none: a
    /// boot has none.
    pub slot_disks: Vec<SlotDisk>,
    /// NICs a running guest was given after boot, by NIC slot, each on the
    /// port it goes back on (a restore of a snapshot taken while they were
    /// plugged: `Guest::take_restored_nics` hands their leases back).
    pub slot_nics: Vec<SlotNic>,
    /// The VMM boot timer to attach (`provium bench boot` keeps a clone and
    /// reads its marks); none for tests. A backend with no VMM ignores it.
    pub boot_timer: Option<BootTimer>,
    /// How long [`crate::backend::Guest::connect`] waits for a booting
    /// guest's agent (`provium bench boot --ready-timeout`); `None` takes
    /// the backend's own (on kvm, `PROVIUM_KVM_AGENT_TIMEOUT` or its
    /// default). A local sandbox's agent runs once the sandbox does, so
    /// there is nothing to wait for and it ignores this.
    pub agent_timeout: Option<Duration>,
    /// The environment `cli::main` read once: the agent search, the
    /// overlay cache, the kvm agent timeout and kvm_pvm override.
    pub settings: Settings,
}

/// One NIC of a machine: the switch port its frames go through. The guest
/// sees the port's MAC; the port stays attached while the spec (or a
/// machine built from it) holds it, and `Switch::disconnect` on it drops
/// the guest's link.
#[derive(Debug, Clone)]
pub struct NicSpec {
    pub port: Arc<Port>,
}

impl NicSpec {
    /// A NIC on `port` (with the port's MAC).
    pub fn on_port(port: Arc<Port>) -> NicSpec {
        NicSpec { port }
    }

    /// The guest NIC's MAC: its port's.
    pub fn mac(&self) -> MacAddr {
        self.port.mac()
    }
}

/// One disk of a machine, in the guest's device order.
#[derive(Debug, Clone)]
pub struct DiskSpec {
    /// The disk's id (the guest reads it as the device's serial).
    pub id: String,
    /// The backing image (its size, rounded down to 512 bytes, is the
    /// capacity).
    pub image: PathBuf,
    /// The disk's fault modes, shared with its `Disk` userdata: a change
    /// reaches the running guest's requests.
    pub faults: Arc<DiskFaults>,
}

/// Linux's virtio-blk name for the disk at `index` (vda … vdz, vdaa, …):
/// virtio_blk names disks in probe order, which is the VMM's device order.
pub fn guest_device_name(index: usize) -> String {
    let mut letters = Vec::new();
    let mut i = index;
    loop {
        letters.push(b'a' + u8::try_from(i % 26).expect("below 26"));
        if i < 26 {
            break;
        }
        i = i / 26 - 1;
    }
    letters.reverse();
    format!(
        "/dev/vd{}",
        String::from_utf8(letters).expect("ascii letters")
    )
}

/// A disk in slot `slot` of a machine's disk slots (see
/// [`MachineSpec::slot_disks`]).
#[derive(Debug, Clone)]
pub struct SlotDisk {
    pub slot: usize,
    pub disk: DiskSpec,
}

/// A NIC slot `slot` plugged into `port` from the start (see
/// [`MachineSpec::slot_nics`]); `bridge` names the bridge it is for, which
/// the restored lease carries back.
#[derive(Debug, Clone)]
pub struct SlotNic {
    pub slot: usize,
    pub bridge: String,
    pub port: Arc<provium_netsetup::Port>,
}

impl MachineSpec {
    /// A spec of this name and sizing on `profile` (its table, if
    /// provium.toml has one), taking the profile's `inject_agent`; every
    /// option unset.
    pub fn for_profile(
        vm_name: &str,
        profile_name: &str,
        profile: Option<Profile>,
        memory_bytes: u64,
        cpus: u32,
    ) -> MachineSpec {
        MachineSpec {
            vm_name: vm_name.to_string(),
            profile_name: profile_name.to_string(),
            inject_agent: profile.as_ref().is_some_and(|p| p.inject_agent),
            profile,
            memory_bytes,
            cpus,
            ..MachineSpec::default()
        }
    }

    /// The shape a snapshot of this guest records (and a restore requires).
    pub fn snapshot_shape(&self, backend: &str) -> provium_snapshot::Shape {
        provium_snapshot::Shape {
            backend: backend.into(),
            memory_bytes: self.memory_bytes,
            vcpus: self.cpus,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_profiles_spec_takes_its_inject_agent() {
        let none = MachineSpec::for_profile("v", "p", None, 64 << 20, 2);
        assert!(!none.inject_agent);
        assert_eq!((none.memory_bytes, none.cpus), (64 << 20, 2));
        assert!(none.files.is_empty() && none.rng_seed.is_none());
        assert!(none.agent_timeout.is_none(), "the backend's own timeout");
        let shape = none.snapshot_shape("kvm");
        assert_eq!((shape.backend.as_str(), shape.vcpus), ("kvm", 2));
    }
}
