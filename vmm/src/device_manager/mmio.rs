//! virtio-mmio slots: each device gets a 4 KiB window from `MMIO_BASE` upward
//! and an IRQ from `FIRST_IRQ` upward (wired by irqfd), and one
//! `virtio_mmio.device=4K@<base>:<irq>` command-line entry, which is how a
//! Linux guest without ACPI/DT discovers them (CONFIG_VIRTIO_MMIO_CMDLINE_DEVICES).

use std::sync::{Arc, Mutex};

use crate::bus::{Bus, BusError};
use crate::devices::legacy::EventFdTrigger;
use crate::devices::virtio::mmio::{
    MmioInterrupt, MmioTransport, MmioTransportState, MMIO_WINDOW_BYTES,
};
use crate::devices::virtio::{VirtioDevice, VirtioPersistError};
use crate::guest_memory::GuestMemoryMmap;
use crate::vstate::vm::{KvmVm, KvmVmError};

/// First virtio-mmio window (inside the 32-bit MMIO gap).
pub const MMIO_BASE: u64 = 0xd000_0000;
/// First IRQ for virtio devices (0-4 are legacy: timer, keyboard, cascade, COM2, COM1).
pub const FIRST_IRQ: u32 = 5;
/// Last IRQ: the IOAPIC has 24 pins and the last one (23) is the ACPI GED's
/// (`devices::acpi::ged::GED_IRQ`).
pub const LAST_IRQ: u32 = 22;

/// An error placing a virtio device.
#[derive(Debug, thiserror::Error)]
pub enum MmioDevicesError {
    /// Out of IRQs.
    #[error("too many virtio devices: at most {} fit (IRQs {FIRST_IRQ}-{LAST_IRQ})", LAST_IRQ - FIRST_IRQ + 1)]
    TooManyDevices,
    /// eventfd creation failed.
    #[error("cannot create a virtio interrupt eventfd")]
    EventFd(#[source] std::io::Error),
    /// irqfd failed.
    #[error("cannot route virtio IRQ {irq}")]
    Irq {
        /// The IRQ.
        irq: u32,
        /// Cause.
        #[source]
        source: KvmVmError,
    },
    /// The snapshot's state for this slot was refused.
    #[error("cannot restore the virtio device at {base:#x}")]
    Restore {
        /// Window base GPA.
        base: u64,
        /// Why.
        #[source]
        source: VirtioPersistError,
    },
    /// The window clashed on the bus.
    #[error("cannot place a virtio-mmio window on the MMIO bus")]
    Bus(#[source] BusError),
}

/// One allocated slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MmioSlot {
    /// Window base GPA.
    pub base: u64,
    /// IRQ (GSI).
    pub irq: u32,
}

impl MmioSlot {
    /// The kernel command-line entry announcing this slot.
    pub fn cmdline_entry(&self) -> String {
        format!(
            "virtio_mmio.device={}K@{:#x}:{}",
            MMIO_WINDOW_BYTES >> 10,
            self.base,
            self.irq
        )
    }
}

/// Hands out slots in order.
#[derive(Debug, Default)]
pub struct MmioSlots {
    next: u32,
}

impl MmioSlots {
    /// The next free slot.
    pub fn allocate(&mut self) -> Result<MmioSlot, MmioDevicesError> {
        let irq = FIRST_IRQ + self.next;
        if irq > LAST_IRQ {
            return Err(MmioDevicesError::TooManyDevices);
        }
        let slot = MmioSlot {
            base: MMIO_BASE + u64::from(self.next) * MMIO_WINDOW_BYTES,
            irq,
        };
        self.next += 1;
        Ok(slot)
    }
}

/// A virtio device placed on the bus.
pub struct AttachedVirtio {
    /// Its window and IRQ.
    pub slot: MmioSlot,
    /// Its transport (the bus holds another reference), for snapshots.
    pub transport: Arc<Mutex<MmioTransport>>,
}

/// Puts `device` behind a transport in the next slot.
pub fn attach_virtio_device(
    slots: &mut MmioSlots,
    vm: &KvmVm,
    bus: &mut Bus,
    mem: &GuestMemoryMmap,
    device: Box<dyn VirtioDevice>,
) -> Result<AttachedVirtio, MmioDevicesError> {
    attach_with(slots, vm, bus, |_, interrupt| {
        Ok(MmioTransport::new(device, mem.clone(), interrupt))
    })
}

/// Puts a fresh `device` in the next slot with the transport and device
/// state `state` from a snapshot (validated by the transport).
pub fn attach_restored_virtio_device(
    slots: &mut MmioSlots,
    vm: &KvmVm,
    bus: &mut Bus,
    mem: &GuestMemoryMmap,
    device: Box<dyn VirtioDevice>,
    state: &MmioTransportState,
) -> Result<AttachedVirtio, MmioDevicesError> {
    attach_with(slots, vm, bus, |slot, interrupt| {
        MmioTransport::restore(device, mem.clone(), interrupt, state).map_err(|source| {
            MmioDevicesError::Restore {
                base: slot.base,
                source,
            }
        })
    })
}

fn attach_with(
    slots: &mut MmioSlots,
    vm: &KvmVm,
    bus: &mut Bus,
    make: impl FnOnce(MmioSlot, Arc<MmioInterrupt>) -> Result<MmioTransport, MmioDevicesError>,
) -> Result<AttachedVirtio, MmioDevicesError> {
    let slot = slots.allocate()?;
    let irq = EventFdTrigger::new().map_err(MmioDevicesError::EventFd)?;
    vm.register_irqfd(&irq.0, slot.irq)
        .map_err(|source| MmioDevicesError::Irq {
            irq: slot.irq,
            source,
        })?;
    let interrupt = Arc::new(MmioInterrupt::new(irq));
    let transport = Arc::new(Mutex::new(make(slot, interrupt)?));
    bus.insert(slot.base, MMIO_WINDOW_BYTES, transport.clone())
        .map_err(MmioDevicesError::Bus)?;
    Ok(AttachedVirtio { slot, transport })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_and_cmdline() {
        let mut s = MmioSlots::default();
        let a = s.allocate().expect("first");
        assert_eq!(a.cmdline_entry(), "virtio_mmio.device=4K@0xd0000000:5");
        let b = s.allocate().expect("second");
        assert_eq!(
            b,
            MmioSlot {
                base: 0xd000_1000,
                irq: 6
            }
        );
        for _ in 0..16 {
            s.allocate().expect("fits");
        }
        assert!(matches!(
            s.allocate(),
            Err(MmioDevicesError::TooManyDevices)
        ));
    }
}
