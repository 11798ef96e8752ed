//! The virtio-mmio transport, version 2 (virtio 1.2, 4.2.2).
//!
//! This file is only the register layout: features, queues, status,
//! activation and snapshots are `transport::VirtioCommon`'s, shared with
//! virtio-pci. What is virtio-mmio's own is the one interrupt line with its
//! InterruptStatus bits ([`MmioInterrupt`]).
//!
//! Every register access comes from the guest: wrong widths, unknown offsets,
//! queue selectors out of range and writes after DRIVER_OK are ignored (reads
//! give 0), never a panic. Queue addresses are validated against guest memory
//! (`Queue::is_valid`) before the device is activated; a bad layout sets
//! DEVICE_NEEDS_RESET instead of activating.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use virtio_bindings::virtio_mmio::{VIRTIO_MMIO_INT_CONFIG, VIRTIO_MMIO_INT_VRING};
use virtio_queue::QueueT;

use serde::{Deserialize, Serialize};

use super::persist::{QueueSnapshot, VirtioPersistError};
use super::transport::{CommonState, Ring, TransportInterrupt, VirtioCommon};
use super::{VirtioDevice, VirtioInterrupt};
use crate::bus::BusDevice;
use crate::devices::legacy::EventFdTrigger;
use crate::guest_memory::GuestMemoryMmap;

/// Size of one device's MMIO window.
pub const MMIO_WINDOW_BYTES: u64 = 0x1000;
/// "virt"
pub const MMIO_MAGIC: u32 = 0x7472_6976;
/// Transport version.
pub const MMIO_VERSION: u32 = 2;
/// Vendor ID reported ("PRVM").
pub const MMIO_VENDOR_ID: u32 = 0x4d56_5250;
const CONFIG_OFFSET: u64 = 0x100;

/// The transport's interrupt: status bits plus an irqfd.
pub struct MmioInterrupt {
    status: AtomicU32,
    irq: EventFdTrigger,
}

impl MmioInterrupt {
    /// An interrupt raising `irq`.
    pub fn new(irq: EventFdTrigger) -> MmioInterrupt {
        MmioInterrupt {
            status: AtomicU32::new(0),
            irq,
        }
    }

    /// The eventfd to register as an irqfd.
    pub fn eventfd(&self) -> &vmm_sys_util::eventfd::EventFd {
        &self.irq.0
    }

    /// Current InterruptStatus.
    pub fn status(&self) -> u32 {
        self.status.load(Ordering::SeqCst)
    }

    fn raise(&self, bit: u32) {
        self.status.fetch_or(bit, Ordering::SeqCst);
        // A full eventfd counter means an interrupt is already pending.
        let _ = self.irq.0.write(1);
    }
}

impl TransportInterrupt for MmioInterrupt {
    fn reset(&self) {
        self.status.store(0, Ordering::SeqCst);
    }
}

impl VirtioInterrupt for MmioInterrupt {
    fn signal_used_queue(&self, _queue: u16) {
        self.raise(VIRTIO_MMIO_INT_VRING);
    }
    fn signal_config(&self) {
        self.raise(VIRTIO_MMIO_INT_CONFIG);
    }
}

/// A transport's registers and its device's state, as a snapshot stores
/// them. Not saved: the eventfd behind the interrupt (a restore wires a new
/// one; a pending interrupt lives on in the restored IOAPIC state).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MmioTransportState {
    /// DeviceID, to refuse a snapshot of another device in this slot.
    pub device_type: u32,
    /// QueueSel.
    pub queue_select: u32,
    /// DeviceFeaturesSel.
    pub device_features_select: u32,
    /// DriverFeaturesSel.
    pub driver_features_select: u32,
    /// The features the driver wrote.
    pub driver_features: u64,
    /// Device status.
    pub status: u32,
    /// Whether the device was activated (DRIVER_OK accepted).
    pub activated: bool,
    /// ConfigGeneration.
    pub config_generation: u32,
    /// InterruptStatus.
    pub interrupt_status: u32,
    /// Before activation the transport's queue registers; after, the live
    /// queues the device owns (their next avail/used indices included).
    pub queues: Vec<QueueSnapshot>,
    /// The device's own state (`VirtioDevice::save`).
    pub device: Vec<u8>,
}

/// One virtio device behind a virtio-mmio register window: the register
/// layout over the transport-neutral [`VirtioCommon`].
pub struct MmioTransport {
    common: VirtioCommon<MmioInterrupt>,
}

impl MmioTransport {
    /// Wraps `device`; its queues live in `mem`.
    pub fn new(
        device: Box<dyn VirtioDevice>,
        mem: GuestMemoryMmap,
        interrupt: Arc<MmioInterrupt>,
    ) -> MmioTransport {
        MmioTransport {
            common: VirtioCommon::new(device, mem, interrupt),
        }
    }

    /// Restarts the device `save` quiesced.
    pub fn resume_after_save(&mut self) {
        self.common.resume_after_save();
    }

    /// Saves the registers and the device (see `VirtioDevice::save`). Call
    /// with every vCPU paused; the device stays quiesced until
    /// `resume_after_save`.
    pub fn save(&mut self) -> MmioTransportState {
        let c = self.common.save();
        MmioTransportState {
            device_type: c.device_type,
            queue_select: c.queue_select,
            device_features_select: c.device_features_select,
            driver_features_select: c.driver_features_select,
            driver_features: c.driver_features,
            status: c.status,
            activated: c.activated,
            config_generation: c.config_generation,
            interrupt_status: self.common.interrupt().status(),
            queues: c.queues,
            device: c.device,
        }
    }

    /// Rebuilds a transport around a fresh `device` from `state` (a file),
    /// with [`VirtioCommon::restore`]'s checks.
    pub fn restore(
        device: Box<dyn VirtioDevice>,
        mem: GuestMemoryMmap,
        interrupt: Arc<MmioInterrupt>,
        state: &MmioTransportState,
    ) -> Result<MmioTransport, VirtioPersistError> {
        let common = CommonState {
            device_type: state.device_type,
            queue_select: state.queue_select,
            device_features_select: state.device_features_select,
            driver_features_select: state.driver_features_select,
            driver_features: state.driver_features,
            status: state.status,
            activated: state.activated,
            config_generation: state.config_generation,
            queues: state.queues.clone(),
            device: state.device.clone(),
        };
        common.check(device.as_ref(), "virtio-mmio")?;
        interrupt
            .status
            .store(state.interrupt_status, Ordering::SeqCst);
        let mut t = MmioTransport::new(device, mem, interrupt);
        t.common.restore(&common, "virtio-mmio")?;
        Ok(t)
    }

    /// The device status register.
    pub fn status(&self) -> u32 {
        self.common.status()
    }

    /// Whether the device was activated.
    pub fn is_activated(&self) -> bool {
        self.common.is_activated()
    }

    fn read_reg(&mut self, offset: u64) -> u32 {
        let c = &mut self.common;
        match offset {
            0x000 => MMIO_MAGIC,
            0x004 => MMIO_VERSION,
            0x008 => c.device().device_type(),
            0x00c => MMIO_VENDOR_ID,
            0x010 => c.device_features_word(),
            0x034 => c.selected_queue().map_or(0, |q| u32::from(q.max_size())),
            0x044 => c.selected_queue().map_or(0, |q| u32::from(q.ready())),
            0x060 => c.interrupt().status(),
            0x070 => c.status(),
            0x0fc => c.config_generation(),
            _ => 0,
        }
    }

    fn write_reg(&mut self, offset: u64, v: u32) {
        let c = &mut self.common;
        match offset {
            0x014 => c.set_device_features_select(v),
            0x020 => c.set_driver_features_word(v),
            0x024 => c.set_driver_features_select(v),
            0x030 => c.set_queue_select(v),
            // Queue::set_size ignores sizes that are not a power of two or exceed the max.
            0x038 => c.with_queue(|q| q.set_size(u16::try_from(v).unwrap_or(0))),
            0x044 => c.with_queue(|q| q.set_ready(v == 1)),
            0x050 => c.queue_notify(v),
            0x064 => {
                c.interrupt().status.fetch_and(!v, Ordering::SeqCst);
            }
            0x070 => c.set_status(v),
            0x080 => c.set_queue_ring(Ring::Desc, Some(v), None),
            0x084 => c.set_queue_ring(Ring::Desc, None, Some(v)),
            0x090 => c.set_queue_ring(Ring::Avail, Some(v), None),
            0x094 => c.set_queue_ring(Ring::Avail, None, Some(v)),
            0x0a0 => c.set_queue_ring(Ring::Used, Some(v), None),
            0x0a4 => c.set_queue_ring(Ring::Used, None, Some(v)),
            _ => {}
        }
    }
}

impl BusDevice for MmioTransport {
    fn read(&mut self, offset: u64, data: &mut [u8]) {
        if offset >= CONFIG_OFFSET {
            self.common.read_config(offset - CONFIG_OFFSET, data);
            return;
        }
        if data.len() != 4 {
            data.fill(0);
            return;
        }
        data.copy_from_slice(&self.read_reg(offset).to_le_bytes());
    }

    fn write(&mut self, offset: u64, data: &[u8]) {
        if offset >= CONFIG_OFFSET {
            self.common.write_config(offset - CONFIG_OFFSET, data);
            return;
        }
        let Ok(b) = <[u8; 4]>::try_from(data) else {
            return;
        };
        self.write_reg(offset, u32::from_le_bytes(b));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::devices::virtio::test_utils::{guest_memory, CountingDevice};
    use virtio_bindings::virtio_config::{
        VIRTIO_CONFIG_S_ACKNOWLEDGE, VIRTIO_CONFIG_S_DRIVER, VIRTIO_CONFIG_S_DRIVER_OK,
        VIRTIO_CONFIG_S_FEATURES_OK, VIRTIO_CONFIG_S_NEEDS_RESET,
    };

    fn transport() -> (MmioTransport, Arc<std::sync::Mutex<Vec<String>>>) {
        let (dev, log) = CountingDevice::new();
        let irq = Arc::new(MmioInterrupt::new(EventFdTrigger::new().expect("eventfd")));
        (MmioTransport::new(Box::new(dev), guest_memory(), irq), log)
    }

    fn rd(t: &mut MmioTransport, off: u64) -> u32 {
        let mut b = [0u8; 4];
        t.read(off, &mut b);
        u32::from_le_bytes(b)
    }

    fn wr(t: &mut MmioTransport, off: u64, v: u32) {
        t.write(off, &v.to_le_bytes());
    }

    fn setup_queue(t: &mut MmioTransport) {
        wr(t, 0x030, 0);
        wr(t, 0x038, 16);
        wr(t, 0x080, 0x1_0000);
        wr(t, 0x090, 0x2_0000);
        wr(t, 0x0a0, 0x3_0000);
        wr(t, 0x044, 1);
    }

    #[test]
    fn identification_registers() {
        let (mut t, _) = transport();
        assert_eq!(rd(&mut t, 0), MMIO_MAGIC);
        assert_eq!(rd(&mut t, 4), 2);
        assert_eq!(rd(&mut t, 8), 42);
        wr(&mut t, 0x014, 1);
        assert_eq!(rd(&mut t, 0x010), 1, "VERSION_1 in the high word");
        assert_eq!(rd(&mut t, 0x034), 16);
    }

    #[test]
    fn driver_ok_activates_with_valid_queues() {
        let (mut t, log) = transport();
        wr(
            &mut t,
            0x070,
            VIRTIO_CONFIG_S_ACKNOWLEDGE | VIRTIO_CONFIG_S_DRIVER,
        );
        wr(&mut t, 0x024, 1);
        wr(&mut t, 0x020, 1);
        wr(&mut t, 0x070, 0x3 | VIRTIO_CONFIG_S_FEATURES_OK);
        assert_ne!(rd(&mut t, 0x070) & VIRTIO_CONFIG_S_FEATURES_OK, 0);
        setup_queue(&mut t);
        wr(
            &mut t,
            0x070,
            0x3 | VIRTIO_CONFIG_S_FEATURES_OK | VIRTIO_CONFIG_S_DRIVER_OK,
        );
        assert!(t.is_activated());
        wr(&mut t, 0x050, 0);
        wr(&mut t, 0x050, 77);
        assert_eq!(
            *log.lock().expect("ok"),
            vec!["acked 100000000", "activate 1", "notify 0", "notify 77"]
        );
        wr(&mut t, 0x070, 0);
        assert!(!t.is_activated());
        assert_eq!(
            log.lock().expect("ok").last().map(String::as_str),
            Some("reset")
        );
    }

    #[test]
    fn unoffered_features_refuse_features_ok() {
        let (mut t, _) = transport();
        wr(&mut t, 0x024, 0);
        wr(&mut t, 0x020, 1 << 5);
        wr(&mut t, 0x070, 0x3 | VIRTIO_CONFIG_S_FEATURES_OK);
        assert_eq!(rd(&mut t, 0x070) & VIRTIO_CONFIG_S_FEATURES_OK, 0);
    }

    #[test]
    fn queue_outside_memory_needs_reset() {
        let (mut t, _) = transport();
        wr(&mut t, 0x024, 1);
        wr(&mut t, 0x020, 1);
        wr(&mut t, 0x070, 0x3 | VIRTIO_CONFIG_S_FEATURES_OK);
        setup_queue(&mut t);
        wr(&mut t, 0x0a4, 0xffff_ffff); // used ring far outside RAM
        wr(
            &mut t,
            0x070,
            0x3 | VIRTIO_CONFIG_S_FEATURES_OK | VIRTIO_CONFIG_S_DRIVER_OK,
        );
        assert!(!t.is_activated());
        assert_ne!(rd(&mut t, 0x070) & VIRTIO_CONFIG_S_NEEDS_RESET, 0);
    }

    #[test]
    fn hostile_accesses_are_ignored() {
        let (mut t, _) = transport();
        for off in (0..0x200).step_by(2) {
            t.write(off, &[0xff; 3]);
            t.write(off, &[0xff; 4]);
            let mut b = [0u8; 8];
            t.read(off, &mut b);
        }
        wr(&mut t, 0x030, u32::MAX);
        wr(&mut t, 0x038, 8);
        assert_eq!(rd(&mut t, 0x034), 0);
        t.read(u64::MAX, &mut [0u8; 4]);
        t.write(u64::MAX, &[1, 2, 3, 4]);
    }

    #[test]
    fn interrupt_ack_clears_status() {
        let (mut t, _) = transport();
        t.common.interrupt().signal_used_queue(0);
        t.common.interrupt().signal_config();
        assert_eq!(rd(&mut t, 0x060), 3);
        wr(&mut t, 0x064, 1);
        assert_eq!(rd(&mut t, 0x060), 2);
    }
}
