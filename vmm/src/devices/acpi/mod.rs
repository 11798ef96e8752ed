//! The ACPI platform registers the DSDT and FADT point a guest at (one
//! module per device, vm-superio style: plain register models that know no
//! KVM): the Generic Event Device that carries the power button
//! (`ged`), and the hardware-reduced sleep control/status registers a guest
//! powers itself off through (`sleep`). `crate::acpi` builds the tables
//! that describe them.
//!
//! Both are guest-facing register files: any offset and width a guest
//! sends is accepted without a panic; an access that is not the register's
//! own (wrong width, outside the registers) is refused and counted.

pub mod ged;
pub mod sleep;
