//! The ACPI platform devices of one boot: the GED (power button) on the
//! MMIO bus with its irqfd on GSI 23, and the sleep registers (power-off)
//! on the PIO bus. They hold no state a snapshot needs: an event the guest
//! has not read yet is the only thing lost across a restore (docs/vmm.md,
//! "ACPI"), and the guest's side (whether its GED driver took the
//! interrupt) lives in the IOAPIC state the snapshot already keeps.

use std::sync::{Arc, Mutex};

use crate::arch::layout::{ACPI_GED_MMIO_BASE, ACPI_GED_MMIO_BYTES};
use crate::bus::{Bus, BusError};
use crate::devices::acpi::ged::{Ged, GED_IRQ};
use crate::devices::acpi::sleep::{SleepRegisters, SLEEP_CONTROL_PORT, SLEEP_PORTS_LEN};
use crate::devices::legacy::EventFdTrigger;
use crate::devices::GuestRequestSink;
use crate::vstate::vm::{KvmVm, KvmVmError};

/// An error attaching the ACPI devices.
#[derive(Debug, thiserror::Error)]
pub enum AcpiDevicesError {
    /// Creating the GED's interrupt eventfd failed.
    #[error("cannot create the ACPI GED's interrupt eventfd")]
    EventFd(#[source] std::io::Error),
    /// Wiring the GED's interrupt failed.
    #[error("cannot route the ACPI GED's interrupt to GSI {GED_IRQ}")]
    Irq(#[source] KvmVmError),
    /// A bus range clashed.
    #[error("cannot place an ACPI device on its bus")]
    Bus(#[source] BusError),
}

/// The ACPI devices of one boot.
pub struct AcpiDevices {
    /// The Generic Event Device (the power button's event).
    pub ged: Arc<Mutex<Ged<EventFdTrigger>>>,
    /// The hardware-reduced sleep registers (power-off).
    pub sleep: Arc<Mutex<SleepRegisters>>,
}

/// Creates the GED and the sleep registers and puts them on `mmio` and `pio`.
pub fn attach_acpi_devices(
    vm: &KvmVm,
    pio: &mut Bus,
    mmio: &mut Bus,
    requests: Arc<dyn GuestRequestSink>,
) -> Result<AcpiDevices, AcpiDevicesError> {
    let irq = EventFdTrigger::new().map_err(AcpiDevicesError::EventFd)?;
    vm.register_irqfd(&irq.0, GED_IRQ)
        .map_err(AcpiDevicesError::Irq)?;
    let ged = Arc::new(Mutex::new(Ged::new(irq)));
    mmio.insert(ACPI_GED_MMIO_BASE, ACPI_GED_MMIO_BYTES, ged.clone())
        .map_err(AcpiDevicesError::Bus)?;
    let sleep = Arc::new(Mutex::new(SleepRegisters::new(requests)));
    pio.insert(SLEEP_CONTROL_PORT, SLEEP_PORTS_LEN, sleep.clone())
        .map_err(AcpiDevicesError::Bus)?;
    Ok(AcpiDevices { ged, sleep })
}
