//! The KVM objects: the `/dev/kvm` handle, the VM (memory slots, irqchip, PIT,
//! irqfds), guest memory and the vCPUs with their threads. This is the only
//! module that issues KVM ioctls.

pub mod emulation_fixup;
pub mod internal_error;
pub mod kvm;
pub mod memory;
pub mod prepared;
pub mod vcpu;
pub mod vm;
