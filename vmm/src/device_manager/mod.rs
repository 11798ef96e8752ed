//! Places devices on buses, wires their interrupts (irqfd) and, for virtio-mmio,
//! writes their `virtio_mmio.device=` command-line entries. The only module
//! besides `builder` that names concrete devices.

pub mod acpi;
pub mod legacy;
pub mod mmio;
