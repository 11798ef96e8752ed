//! x86_64 machine description: memory layout, GDT, page tables, boot
//! parameters, the MP table (processors and interrupt routing), CPUID
//! templates, boot MSRs and LAPIC setup.
//!
//! Everything here computes plain data (kvm-bindings structs, byte images) and
//! writes guest memory; nothing calls a KVM ioctl (that is `vstate/`), so all of
//! it is unit-tested without /dev/kvm.

pub mod boot_params;
pub mod cpuid;
pub mod gdt;
pub mod interrupts;
pub mod layout;
pub mod mptable;
pub mod msr;
pub mod regs;
