//! Backends: the ways a test VM is created. `local` runs the agent in fresh
//! namespaces on the host; `kvm` (the product) boots a guest on our VMM.
//!
//! This module is the boundary the rest of the harness sees: a [`Backend`]
//! boots or restores one [`MachineSpec`] into a [`Guest`] handle, and both
//! report their [`Capabilities`], so a caller asks "can this guest take a
//! disk after boot?" rather than "is this kvm?". [`for_kind`] is the only
//! place that turns the user's `--vmm` choice ([`BackendKind`]) into a
//! concrete backend; outside `backend/` no code names one
//! (`harness/tests/workspace_edges.rs` holds that).

pub mod capabilities;
pub mod cid;
pub mod error;
pub mod kvm;
pub mod local;
pub mod spec;
pub mod vmm_models;

use std::os::fd::OwnedFd;
use std::path::Path;
use std::sync::Arc;

pub use capabilities::{Capabilities, NicKind, Support};
pub use cid::CidAllocator;
pub use error::BackendError;
pub use spec::{guest_device_name, DiskSpec, MachineSpec, NicSpec, SlotDisk, SlotNic};
pub use vmm_models::{BootSource, BootTimer, Console, ConsoleRead, ConsoleSubscriber, DiskFaults};
// How a restore fits the snapshot's devices into a machine whose devices
// are fixed when it is built (kvm's, `Capabilities::device_snapshots`):
// pure plans over names the Lua layer applies to its bridges and disks.
pub use kvm::disk_plan::{plan_disks, DiskPlan, DiskPlanError};
pub use kvm::nic_plan::{lone_port, plan_nics, NicPlanError, NicSource};

use crate::client::AgentClient;

/// Which backend creates VMs for this run (the user's `--vmm` choice).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackendKind {
    Local,
    Kvm,
}

impl BackendKind {
    pub fn as_str(self) -> &'static str {
        match self {
            BackendKind::Local => "local",
            BackendKind::Kvm => "kvm",
        }
    }
}

/// Makes guests from specs. One value serves a whole run (it holds the
/// run's guest CID allocator), shared by every file's environment.
pub trait Backend: Send + Sync {
    /// What every guest of this backend can do (known before any boots).
    fn capabilities(&self) -> Capabilities;

    /// Builds a guest ready to [`Guest::start`] (subscribe to its console
    /// first and nothing is missed). A backend with no separate start (a
    /// sandbox runs once made) returns it running.
    fn create(&self, spec: &MachineSpec) -> Result<Box<dyn Guest>, BackendError>;

    /// Builds and starts a guest (returns once it runs; [`Guest::connect`]
    /// waits for its agent).
    fn boot(&self, spec: &MachineSpec) -> Result<Box<dyn Guest>, BackendError> {
        let guest = self.create(spec)?;
        guest.start()?;
        Ok(guest)
    }

    /// A new guest running the snapshot at `path` (validated: version,
    /// checksums, shape, before anything boots). `spec` sizes it and gives
    /// its devices, which must match the snapshot's.
    fn restore(&self, spec: &MachineSpec, path: &Path) -> Result<Box<dyn Guest>, BackendError>;

    /// Lets go of what the backend keeps of the snapshot at `path` for
    /// later restores of it (kvm: its sealed copy of guest RAM), once no
    /// more restores of it will come: guests restored from it keep what
    /// they use. `vm:fork` calls it after its copies' restores.
    fn forget_restore_image(&self, path: &Path) {
        let _ = path;
    }

    /// What booting `spec` would run (the kernel, the initrd as built, the
    /// whole command line), for a report such as `provium bench boot`'s;
    /// `None` where the backend boots no kernel. It builds the config a
    /// boot would, so a bad spec fails here, before anything runs.
    fn boot_source(&self, spec: &MachineSpec) -> Result<Option<BootSource>, BackendError> {
        let _ = spec;
        Ok(None)
    }
}

/// Why a guest is no longer running.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stopped {
    /// Its stop reason (or state), as the VMM or sandbox says it.
    pub why: String,
    /// Whether it shut down cleanly (powered off) rather than died.
    pub clean: bool,
}

/// A running guest, whatever backend made it.
pub trait Guest: Send + Sync {
    /// What this guest can do.
    fn capabilities(&self) -> Capabilities;

    /// Runs a guest [`Backend::create`] made (a no-op where it runs already).
    fn start(&self) -> Result<(), BackendError>;

    /// `None` while it runs (or is paused); else why it stopped.
    fn stopped(&self) -> Option<Stopped>;

    /// A new agent connection, Hello done (waits for a booting agent).
    fn connect(&self) -> Result<AgentClient, BackendError>;

    /// The guest's vsock CID, where it has one.
    fn cid(&self) -> Option<u32>;

    /// What this guest holds of the host's memory now, as (resident,
    /// proportional) bytes.
    fn resident_memory(&self) -> (u64, u64);

    /// Stops it now (watchdog, failed boot, shutdown); safe to call more
    /// than once, from any thread.
    fn kill(&self);

    /// Freezes every process of the guest (the agent included) until resume.
    fn pause(&self) -> Result<(), BackendError>;

    fn resume(&self) -> Result<(), BackendError>;

    /// Warm reset; returns the agent connection of the new boot. Refused
    /// (nothing changed) where [`Capabilities::reset`] says so.
    fn reset(&self) -> Result<AgentClient, BackendError>;

    /// Presses the power button and waits for the guest to power off.
    fn power_button(&self) -> Result<(), BackendError>;

    /// Creates NIC `ifname` with `mac` inside the guest after boot and
    /// returns the fd of its host end, for a bridge's switch to hold (only
    /// where [`Capabilities::nics`] is [`NicKind::HostTaps`]).
    fn open_nic(
        &self,
        ifname: &str,
        mac: provium_netsetup::MacAddr,
    ) -> Result<OwnedFd, BackendError>;

    /// Gives the running guest `disk` (see [`Capabilities::disks_after_boot`]).
    fn add_disk(&self, disk: &DiskSpec) -> Result<AddedDisk, BackendError> {
        let _ = disk;
        Err(BackendError::Unsupported(
            "this backend gives a running guest no new disk",
        ))
    }

    /// The disks a restore put back into their slots
    /// ([`MachineSpec::slot_disks`]), once: their leases take them out.
    fn take_restored_disks(&self) -> Vec<AddedDisk> {
        Vec::new()
    }

    /// The NICs a restore plugged back into their slots
    /// ([`MachineSpec::slot_nics`]), once, each with its bridge's name:
    /// their leases park them again.
    fn take_restored_nics(&self) -> Vec<(String, AddedNic)> {
        Vec::new()
    }

    /// Gives the running guest a new NIC of a VMM device whose port
    /// `connect` makes (it is told the device's own MAC; a port with
    /// another MAC is fine: the backend gives the guest interface the
    /// port's MAC) (only where
    /// [`Capabilities::nics`] is [`NicKind::VmmDevices`] and
    /// [`Capabilities::nics_after_boot`] says yes). `want` is the interface
    /// name the naming rule gives; the guest may already have fixed
    /// another (the result says which).
    fn add_nic(&self, want: &str, connect: &mut ConnectPort<'_>) -> Result<AddedNic, BackendError> {
        let _ = (want, connect);
        Err(BackendError::Unsupported(
            "this backend gives a running guest no new VMM NIC",
        ))
    }

    /// Puts back the interface configuration a restore captured, once the
    /// restored guest's NICs are on their bridges again (a guest whose
    /// memory holds its own has nothing to do).
    fn apply_restored_net(&self) -> Result<(), BackendError> {
        Ok(())
    }

    /// Writes a snapshot of the running guest to `path` (atomically) with
    /// the caller's `extra` sections; returns its size in bytes.
    fn snapshot_to(&self, path: &Path, extra: &[(&str, Vec<u8>)]) -> Result<u64, BackendError>;

    /// The serial console (log, live subscribers, input), where there is one.
    fn console(&self) -> Option<Arc<Console>>;

    /// The last `max` bytes of the console log (lossy UTF-8), where there
    /// is a console.
    fn console_tail(&self, max: usize) -> Option<String> {
        let log = self.console()?.log();
        Some(String::from_utf8_lossy(&log[log.len().saturating_sub(max)..]).into_owned())
    }
}

/// Makes the bridge port for a NIC given to a running guest, told the
/// device's own MAC (`Guest::add_nic`).
pub type ConnectPort<'a> = dyn FnMut(
        provium_netsetup::MacAddr,
    ) -> Result<Arc<provium_netsetup::Port>, Box<dyn std::error::Error + Send + Sync>>
    + 'a;

/// A device given to a running guest; dropping it (or [`DeviceLease::release`])
/// takes it back from the guest.
pub struct DeviceLease {
    release: Option<Box<dyn FnOnce() + Send + Sync>>,
}

impl DeviceLease {
    pub fn new(release: impl FnOnce() + Send + Sync + 'static) -> DeviceLease {
        DeviceLease {
            release: Some(Box::new(release)),
        }
    }

    /// Takes the device back now.
    pub fn release(mut self) {
        if let Some(f) = self.release.take() {
            f();
        }
    }
}

impl Drop for DeviceLease {
    fn drop(&mut self) {
        if let Some(f) = self.release.take() {
            f();
        }
    }
}

impl std::fmt::Debug for DeviceLease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("DeviceLease")
    }
}

/// A disk given to a running guest.
#[derive(Debug)]
pub struct AddedDisk {
    /// What the guest calls it (`/dev/vdc`).
    pub guest_device: String,
    /// Its slot (what a snapshot records, for a restore to put it back).
    pub slot: usize,
    pub lease: DeviceLease,
}

/// A NIC given to a running guest.
#[derive(Debug)]
pub struct AddedNic {
    /// Its NIC slot (what a snapshot records, for a restore to plug it
    /// back).
    pub slot: usize,
    /// The guest interface (`eth2`).
    pub ifname: String,
    /// Its MAC: its port's on the bridge, which the guest interface has.
    pub mac: provium_netsetup::MacAddr,
    /// The MAC the device was made with (a kvm NIC slot's, fixed at boot);
    /// when it differs from `mac`, the backend set the interface's address.
    pub slot_mac: provium_netsetup::MacAddr,
    pub lease: DeviceLease,
}

/// The backend the user chose, fresh (with its own CID allocator): call it
/// once per run and share the value.
pub fn for_kind(kind: BackendKind) -> Arc<dyn Backend> {
    match kind {
        BackendKind::Local => Arc::new(local::guest::LocalBackend),
        BackendKind::Kvm => Arc::new(kvm::guest::KvmBackend::new(CidAllocator::new())),
    }
}

/// The local backend's agent locator, for the start-up checks.
pub use local::locate_agent as locate_local_agent;

/// The kvm backend's agent locator (the static agent it injects into a
/// guest's initrd), for reports that say whether a boot will have one.
pub use kvm::config::locate_guest_agent;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_kind_gets_its_own_backend() {
        assert_eq!(for_kind(BackendKind::Local).capabilities().backend, "local");
        assert_eq!(for_kind(BackendKind::Kvm).capabilities().backend, "kvm");
        assert_eq!(BackendKind::Kvm.as_str(), "kvm");
    }

    #[test]
    fn the_local_backend_refuses_kernel_options_before_it_starts_anything() {
        let spec = MachineSpec {
            vm_name: "v".into(),
            kernel_cmdline: Some("quiet".into()),
            ..MachineSpec::default()
        };
        let e = for_kind(BackendKind::Local).boot(&spec).err().unwrap();
        assert_eq!(
            e.to_string(),
            "kernel_cmdline needs the kvm backend (the local sandbox has no kernel)"
        );
    }

    #[test]
    fn the_kvm_backend_names_a_missing_profile() {
        let spec = MachineSpec {
            vm_name: "v".into(),
            profile_name: "gone".into(),
            ..MachineSpec::default()
        };
        let kvm = for_kind(BackendKind::Kvm);
        let e = kvm.boot(&spec).err().unwrap().to_string();
        assert!(e.contains("profile `gone` is not in provium.toml"), "{e}");
        let e = kvm
            .restore(&spec, Path::new("/x.snap"))
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("restores into profile `gone`"), "{e}");
        let e = kvm.boot_source(&spec).err().unwrap().to_string();
        assert!(e.contains("profile `gone` is not in provium.toml"), "{e}");
    }

    #[test]
    fn a_sandbox_boots_no_kernel_to_report() {
        let spec = MachineSpec::for_profile("v", "p", None, 64 << 20, 1);
        let local = for_kind(BackendKind::Local);
        assert!(local.boot_source(&spec).unwrap().is_none());
    }
}
