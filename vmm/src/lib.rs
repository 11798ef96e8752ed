//! Provium's in-process microVMM on the rust-vmm crates.
//!
//! Layout (after Firecracker's `src/vmm`): `vmm_config/` is the validated user
//! config; `builder` turns it into a running `Machine` (memory, KVM VM, kernel,
//! boot params, devices, vCPUs); `vstate/` owns every KVM object and is the only
//! module issuing KVM ioctls; `device_manager/` places devices on buses and wires
//! interrupts; `devices/` holds the models (they know no KVM); `arch/` is the
//! x86_64 boot data; `lifecycle` is the public `Vm` with its state machine;
//! `console` is the serial console log/stream/input; `initrd` writes newc cpio
//! archives and injects the agent; `tiny_guest` is the test guest built at
//! compile time; `boot_timer` records boot phases for `provium bench`; `persist` is
//! whole-VM snapshot and restore. `bus`, `guest_memory` and `msi` are the
//! ground floor that `vstate/` and `devices/` both stand on (the I/O bus, the
//! guest-memory type, MSI messages and their router), so neither folder
//! imports the other. See
//! docs/vmm.md and docs/benchmarking.md.

pub mod acpi;
pub mod arch;
pub mod boot_timer;
pub mod builder;
pub mod bus;
pub mod console;
pub mod device_manager;
pub mod devices;
pub mod guest_memory;
pub mod initrd;
pub mod lifecycle;
pub mod msi;
pub mod persist;
pub mod tiny_guest;
pub mod vmm_config;
pub mod vstate;

pub use boot_timer::{BootMark, BootMarks, BootTimer};
pub use console::{Console, ConsoleRead, ConsoleSubscriber};
pub use lifecycle::{PowerButton, StopReason, Vm, VmError, VmState};
pub use provium_netsetup as netsetup;
pub use provium_snapshot as snapshot;
pub use vmm_config::{BootSource, KernelImage, MachineConfig, VmConfig};
pub use vstate::prepared::{PrepareError, PreparedVms};
