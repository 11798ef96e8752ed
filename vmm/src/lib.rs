//! The in-process microVMM (KVM, guest memory, loader, vCPUs, virtio-mmio devices).
//!
//! Not built yet: the VMM issue fills this crate in. The crate edges to
//! `provium-snapshot` (save/restore) and `provium-netsetup` (virtio-net's switch
//! port) are part of the design and are referenced here so they are real.
pub use provium_netsetup as netsetup;
pub use provium_snapshot as snapshot;
