//! The VMM's plain models that the backend boundary shares with a running
//! machine by `Arc`, named once here so the rest of the harness names no
//! `provium_vmm` type (`harness/tests/workspace_edges.rs` holds that).
//!
//! Each is a model in vm-superio's style (STYLE.md §4): state and rules, no
//! KVM object, no thread, no fd. They live in `provium-vmm` because its
//! devices consume them, and a backend without a VMM can use them as well:
//! - [`Console`] (with [`ConsoleRead`], [`ConsoleSubscriber`]): a guest's
//!   console log and input queue, which every [`super::Guest`] may return;
//! - [`DiskFaults`]: one disk's fault modes, shared by the `Disk` userdata
//!   and the block device that honours them (with the sector size and the
//!   `slow` delay they are defined in);
//! - [`BootTimer`]: the boot-phase marks `provium bench boot` reads;
//! - [`BootSource`]: what a boot would run (kernel, initrd, command line),
//!   for [`super::Backend::boot_source`]'s report.
//!
//! Anything that configures or drives the VMM itself (`VmConfig`,
//! `NetConfig`, `DriveConfig`, `Vm`) stays inside `backend/kvm/`.

pub use provium_vmm::boot_timer::BootTimer;
pub use provium_vmm::devices::virtio::block::defs::{SECTOR_BYTES, SLOW_COMPLETION_MS};
pub use provium_vmm::devices::virtio::block::BlockFaults as DiskFaults;
pub use provium_vmm::{BootSource, Console, ConsoleRead, ConsoleSubscriber};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_disks_fault_set_is_shared_not_copied() {
        let faults = std::sync::Arc::new(DiskFaults::default());
        let held = faults.clone();
        assert!(faults.set("eio_read", true));
        assert!(held.eio_read.load(std::sync::atomic::Ordering::SeqCst));
        assert_eq!(SECTOR_BYTES, 512);
    }
}
