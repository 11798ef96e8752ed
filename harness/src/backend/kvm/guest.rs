//! The kvm backend behind the boundary: [`KvmBackend`] builds a
//! [`KvmMachine`] from a [`MachineSpec`] (its config made once, in
//! `config.rs`) with the next guest CID of the run, and [`KvmMachine`] is
//! its [`Guest`] handle.

use std::os::fd::OwnedFd;
use std::path::Path;
use std::sync::Arc;

use super::{KvmError, KvmMachine};
use provium_vmm::vstate::memory::RestoreRamCache;
use provium_vmm::{BootSource, VmState};

use crate::backend::{
    AddedDisk, AddedNic, Backend, BackendError, Capabilities, CidAllocator, ConnectPort, Guest,
    MachineSpec, NicKind, Stopped, Support,
};
use crate::client::AgentClient;

/// What a guest on the microVMM can do: everything the harness asks of a
/// VM, with NICs as virtio-net devices given at boot.
pub const KVM_CAPABILITIES: Capabilities = Capabilities {
    backend: "kvm",
    disks: Support::Yes,
    nics: NicKind::VmmDevices,
    disks_after_boot: Support::Yes,
    nics_after_boot: Support::Yes,
    reset: Support::Yes,
    power_button: Support::Yes,
    console: Support::Yes,
    seeded_rng: true,
    device_snapshots: true,
};

/// Boots guests on the microVMM, each with the next CID of the run, and
/// restores them with guest RAM from the run's [`RestoreRamCache`]: the
/// run's restores of one fixture image share one sealed copy of its pages.
pub struct KvmBackend {
    cids: CidAllocator,
    ram_cache: RestoreRamCache,
    /// The run's prepared KVM VMs: each boot takes one ready-made and the
    /// next is prepared while its guest runs (`provium_vmm::PreparedVms`).
    prepared: provium_vmm::PreparedVms,
}

impl KvmBackend {
    pub fn new(cids: CidAllocator) -> KvmBackend {
        KvmBackend {
            cids,
            ram_cache: RestoreRamCache::new(),
            prepared: provium_vmm::PreparedVms::new(),
        }
    }

    /// The run's restore images' RAM copies (how many were made: one per
    /// image restored, whatever the number of restores).
    pub fn ram_cache(&self) -> &RestoreRamCache {
        &self.ram_cache
    }
}

impl Backend for KvmBackend {
    fn capabilities(&self) -> Capabilities {
        KVM_CAPABILITIES
    }

    fn create(&self, spec: &MachineSpec) -> Result<Box<dyn Guest>, BackendError> {
        let profile = profile_of(spec, |profile| KvmError::NoProfileToBoot { profile })?;
        Ok(Box::new(KvmMachine::build(
            spec,
            profile,
            self.cids.allocate(),
            Some(&self.prepared),
        )?))
    }

    fn restore(&self, spec: &MachineSpec, path: &Path) -> Result<Box<dyn Guest>, BackendError> {
        let profile = profile_of(spec, |profile| KvmError::NoProfileToRestore { profile })?;
        // The snapshot carries RAM and device state; the config has the
        // same shape and devices, and the boot a later `vm:reset()` makes:
        // so the agent is injected as at boot (without it, a reset restored
        // VM booted no agent). Boot-only options do not apply.
        let spec = MachineSpec {
            kernel_cmdline: None,
            files: Vec::new(),
            initial_time: None,
            ..spec.clone()
        };
        // No prepared VM: a restore maps its image as RAM (and a later
        // reset of it boots without the pool too).
        let machine = KvmMachine::build(&spec, profile, self.cids.allocate(), None)?;
        machine.restore_from(path, &self.ram_cache)?;
        Ok(Box::new(machine))
    }

    fn forget_restore_image(&self, path: &Path) {
        self.ram_cache.forget(path);
    }

    /// The config [`Backend::create`] would build, made with the run's
    /// first CID (no CID is spent: nothing boots from it).
    fn boot_source(&self, spec: &MachineSpec) -> Result<Option<BootSource>, BackendError> {
        let profile = profile_of(spec, |profile| KvmError::NoProfileToBoot { profile })?;
        let (cfg, _vsock) =
            super::vm_config(profile, spec, CidAllocator::FIRST).map_err(KvmError::from)?;
        Ok(Some(cfg.boot))
    }
}

/// The profile whose kernel the guest runs, or `missing` of its name.
fn profile_of(
    spec: &MachineSpec,
    missing: impl FnOnce(String) -> KvmError,
) -> Result<&crate::config::Profile, KvmError> {
    spec.profile
        .as_ref()
        .ok_or_else(|| missing(spec.profile_name.clone()))
}

impl Guest for KvmMachine {
    fn capabilities(&self) -> Capabilities {
        KVM_CAPABILITIES
    }

    fn start(&self) -> Result<(), BackendError> {
        Ok(KvmMachine::start(self)?)
    }

    fn stopped(&self) -> Option<Stopped> {
        let state = self.vm().state();
        if matches!(state, VmState::Booted | VmState::Paused) {
            return None;
        }
        Some(Stopped {
            why: self
                .vm()
                .stop_reason()
                .map_or_else(|| state.to_string(), |r| r.to_string()),
            clean: state == VmState::Shutdown,
        })
    }

    fn connect(&self) -> Result<AgentClient, BackendError> {
        Ok(KvmMachine::connect(self)?)
    }

    fn cid(&self) -> Option<u32> {
        Some(KvmMachine::cid(self))
    }

    /// The guest RAM mappings (the VMM runs in this process, whose own
    /// heap is not the VM's).
    fn resident_memory(&self) -> (u64, u64) {
        crate::host_memory::mapping_memory(&self.vm().ram_host_ranges())
    }

    fn kill(&self) {
        KvmMachine::kill(self)
    }

    fn pause(&self) -> Result<(), BackendError> {
        Ok(KvmMachine::pause(self)?)
    }

    fn resume(&self) -> Result<(), BackendError> {
        Ok(KvmMachine::resume(self)?)
    }

    fn reset(&self) -> Result<AgentClient, BackendError> {
        Ok(KvmMachine::reset(self)?)
    }

    fn power_button(&self) -> Result<(), BackendError> {
        Ok(KvmMachine::power_button(self)?)
    }

    fn open_nic(
        &self,
        ifname: &str,
        _mac: provium_netsetup::MacAddr,
    ) -> Result<OwnedFd, BackendError> {
        Err(KvmError::NicAfterBoot {
            ifname: ifname.to_string(),
        }
        .into())
    }

    fn add_disk(&self, disk: &crate::backend::DiskSpec) -> Result<AddedDisk, BackendError> {
        Ok(self.slots().add_disk(disk).map_err(KvmError::from)?)
    }

    fn take_restored_disks(&self) -> Vec<AddedDisk> {
        self.slots().take_restored()
    }

    fn take_restored_nics(&self) -> Vec<(String, AddedNic)> {
        self.slots().take_restored_nics()
    }

    fn add_nic(&self, want: &str, connect: &mut ConnectPort<'_>) -> Result<AddedNic, BackendError> {
        let added = self
            .slots()
            .add_nic(want, connect)
            .map_err(KvmError::from)?;
        if added.mac != added.slot_mac {
            // The guest read the slot's MAC at probe (config space is read
            // once): it takes the port's now, through its agent.
            if let Err(e) = self.set_guest_mac(&added.ifname, added.mac) {
                added.lease.release();
                return Err(e.into());
            }
        }
        Ok(added)
    }

    /// The VMM records its own shape (memory, vCPUs), the same sizing the
    /// spec gave.
    fn snapshot_to(&self, path: &Path, extra: &[(&str, Vec<u8>)]) -> Result<u64, BackendError> {
        Ok(KvmMachine::snapshot_to(self, path, extra)?)
    }

    fn console(&self) -> Option<Arc<provium_vmm::Console>> {
        Some(KvmMachine::console(self))
    }

    fn console_tail(&self, max: usize) -> Option<String> {
        Some(KvmMachine::console_tail(self, max))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kvm_vm_opens_no_tap_and_says_what_instead() {
        let e = BackendError::from(KvmError::NicAfterBoot {
            ifname: "eth2".into(),
        });
        let m = e.to_string();
        assert!(
            m.starts_with("NIC eth2: a kvm VM's NICs are virtio-net devices, not host TAPs"),
            "{m}"
        );
        assert!(m.ends_with("attach the bridge before vm:boot()"), "{m}");
    }

    #[test]
    fn restore_drops_the_boot_only_options_before_building() {
        // No profile: refused by name before anything is built, and no CID
        // is spent on it.
        let backend = KvmBackend::new(CidAllocator::new());
        let spec = MachineSpec {
            profile_name: "p".into(),
            ..MachineSpec::default()
        };
        assert!(backend.restore(&spec, Path::new("/x")).is_err());
        assert!(backend.boot_source(&spec).is_err());
        assert_eq!(backend.cids.allocate(), CidAllocator::FIRST);
    }
}
