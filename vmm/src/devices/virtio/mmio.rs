//! The virtio-mmio transport, version 2 (virtio 1.2, 4.2.2).
//!
//! Every register access comes from the guest: wrong widths, unknown offsets,
//! queue selectors out of range and writes after DRIVER_OK are ignored (reads
//! give 0), never a panic. Queue addresses are validated against guest memory
//! (`Queue::is_valid`) before the device is activated; a bad layout sets
//! DEVICE_NEEDS_RESET instead of activating.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use virtio_bindings::virtio_config::{
    VIRTIO_CONFIG_S_ACKNOWLEDGE, VIRTIO_CONFIG_S_DRIVER, VIRTIO_CONFIG_S_DRIVER_OK,
    VIRTIO_CONFIG_S_FAILED, VIRTIO_CONFIG_S_FEATURES_OK, VIRTIO_CONFIG_S_NEEDS_RESET,
};
use virtio_bindings::virtio_mmio::{VIRTIO_MMIO_INT_CONFIG, VIRTIO_MMIO_INT_VRING};
use virtio_queue::{Queue, QueueT};

use serde::{Deserialize, Serialize};

use super::persist::{ActiveArgs, QueueSnapshot, VirtioPersistError};
use super::{VirtioDevice, VirtioInterrupt};
use crate::devices::bus::BusDevice;
use crate::devices::legacy::EventFdTrigger;
use crate::vstate::memory::GuestMemoryMmap;

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

/// One virtio device behind a virtio-mmio register window.
pub struct MmioTransport {
    device: Box<dyn VirtioDevice>,
    mem: GuestMemoryMmap,
    interrupt: Arc<MmioInterrupt>,
    queues: Vec<Queue>,
    queue_select: u32,
    device_features_select: u32,
    driver_features_select: u32,
    driver_features: u64,
    status: u32,
    activated: bool,
    config_generation: u32,
}

impl MmioTransport {
    /// Wraps `device`; its queues live in `mem`.
    pub fn new(
        device: Box<dyn VirtioDevice>,
        mem: GuestMemoryMmap,
        interrupt: Arc<MmioInterrupt>,
    ) -> MmioTransport {
        let queues = Self::fresh_queues(device.as_ref());
        MmioTransport {
            device,
            mem,
            interrupt,
            queues,
            queue_select: 0,
            device_features_select: 0,
            driver_features_select: 0,
            driver_features: 0,
            status: 0,
            activated: false,
            config_generation: 0,
        }
    }

    fn fresh_queues(device: &dyn VirtioDevice) -> Vec<Queue> {
        device
            .queue_max_sizes()
            .iter()
            .map(|&max| Queue::new(max).expect("device queue sizes are powers of two <= 32768"))
            .collect()
    }

    /// Restarts the device `save` quiesced.
    pub fn resume_after_save(&mut self) {
        self.device.resume_after_save();
    }

    /// Saves the registers and the device (see `VirtioDevice::save`). Call
    /// with every vCPU paused; the device stays quiesced until
    /// `resume_after_save`.
    pub fn save(&mut self) -> MmioTransportState {
        let dev = self.device.save();
        let queues = if self.activated {
            dev.queues
        } else {
            self.queues.iter().map(QueueSnapshot::of).collect()
        };
        MmioTransportState {
            device_type: self.device.device_type(),
            queue_select: self.queue_select,
            device_features_select: self.device_features_select,
            driver_features_select: self.driver_features_select,
            driver_features: self.driver_features,
            status: self.status,
            activated: self.activated,
            config_generation: self.config_generation,
            interrupt_status: self.interrupt.status(),
            queues,
            device: dev.state,
        }
    }

    /// Rebuilds a transport around a fresh `device` from `state` (a file):
    /// the device type, queue count and sizes must be this device's, the
    /// features ones it offers, and an activated device's rings must lie in
    /// `mem`; then the device restores its own state.
    pub fn restore(
        device: Box<dyn VirtioDevice>,
        mem: GuestMemoryMmap,
        interrupt: Arc<MmioInterrupt>,
        state: &MmioTransportState,
    ) -> Result<MmioTransport, VirtioPersistError> {
        let bad = |detail: String| VirtioPersistError::State {
            what: "virtio-mmio",
            detail,
        };
        if state.device_type != device.device_type() {
            return Err(VirtioPersistError::DeviceType {
                found: state.device_type,
                expected: device.device_type(),
            });
        }
        let max_sizes = device.queue_max_sizes().to_vec();
        if state.queues.len() != max_sizes.len() {
            return Err(bad(format!(
                "{} queues, the device has {}",
                state.queues.len(),
                max_sizes.len()
            )));
        }
        if state.driver_features & !device.avail_features() != 0 {
            return Err(bad(format!(
                "driver features {:#x} include some the device does not offer ({:#x})",
                state.driver_features,
                device.avail_features()
            )));
        }
        let queues = state
            .queues
            .iter()
            .zip(&max_sizes)
            .enumerate()
            .map(|(i, (q, max))| q.to_queue(i, *max, &mem))
            .collect::<Result<Vec<_>, _>>()?;
        interrupt
            .status
            .store(state.interrupt_status, Ordering::SeqCst);
        let mut t = MmioTransport::new(device, mem, interrupt);
        t.queue_select = state.queue_select;
        t.device_features_select = state.device_features_select;
        t.driver_features_select = state.driver_features_select;
        t.driver_features = state.driver_features;
        t.status = state.status;
        t.config_generation = state.config_generation;
        if state.activated {
            if queues.iter().any(|q| !q.ready()) {
                return Err(bad(
                    "an activated device has a queue that is not ready".into()
                ));
            }
            t.device.set_acked_features(state.driver_features);
            let active = ActiveArgs {
                mem: t.mem.clone(),
                queues,
                interrupt: t.interrupt.clone(),
            };
            t.device.restore(Some(active), &state.device)?;
            t.activated = true;
        } else {
            t.device.restore(None, &state.device)?;
            t.queues = queues;
        }
        Ok(t)
    }

    /// The device status register.
    pub fn status(&self) -> u32 {
        self.status
    }

    /// Whether the device was activated.
    pub fn is_activated(&self) -> bool {
        self.activated
    }

    fn selected_queue(&mut self) -> Option<&mut Queue> {
        if self.status & VIRTIO_CONFIG_S_DRIVER_OK != 0 {
            return None; // queue setup is frozen once the driver is up
        }
        let i = usize::try_from(self.queue_select).ok()?;
        self.queues.get_mut(i)
    }

    fn reset(&mut self) {
        if self.activated {
            self.device.reset();
        }
        self.activated = false;
        self.queues = Self::fresh_queues(self.device.as_ref());
        self.queue_select = 0;
        self.device_features_select = 0;
        self.driver_features_select = 0;
        self.driver_features = 0;
        self.status = 0;
        self.interrupt.status.store(0, Ordering::SeqCst);
    }

    fn try_activate(&mut self) {
        let ok = self
            .queues
            .iter()
            .all(|q| !q.ready() || q.is_valid(&self.mem));
        let all_ready = self.queues.iter().all(|q| q.ready());
        if !ok || !all_ready {
            self.status |= VIRTIO_CONFIG_S_NEEDS_RESET;
            return;
        }
        self.device.set_acked_features(self.driver_features);
        // The device owns the queues from here on; queue registers are frozen
        // after DRIVER_OK and a reset builds fresh ones.
        let queues = std::mem::take(&mut self.queues);
        match self
            .device
            .activate(self.mem.clone(), queues, self.interrupt.clone())
        {
            Ok(()) => self.activated = true,
            Err(_) => self.status |= VIRTIO_CONFIG_S_NEEDS_RESET,
        }
    }

    fn set_status(&mut self, v: u32) {
        if v == 0 {
            self.reset();
            return;
        }
        let allowed = VIRTIO_CONFIG_S_ACKNOWLEDGE
            | VIRTIO_CONFIG_S_DRIVER
            | VIRTIO_CONFIG_S_FEATURES_OK
            | VIRTIO_CONFIG_S_DRIVER_OK
            | VIRTIO_CONFIG_S_FAILED;
        let old = self.status;
        self.status = (old & VIRTIO_CONFIG_S_NEEDS_RESET) | (v & allowed);
        if self.status & VIRTIO_CONFIG_S_FEATURES_OK != 0
            && old & VIRTIO_CONFIG_S_FEATURES_OK == 0
            && self.driver_features & !self.device.avail_features() != 0
        {
            // The driver accepted features we never offered: refuse FEATURES_OK.
            self.status &= !VIRTIO_CONFIG_S_FEATURES_OK;
        }
        let driver_ok_now =
            self.status & VIRTIO_CONFIG_S_DRIVER_OK != 0 && old & VIRTIO_CONFIG_S_DRIVER_OK == 0;
        if driver_ok_now
            && !self.activated
            && self.status & VIRTIO_CONFIG_S_FEATURES_OK != 0
            && self.status & VIRTIO_CONFIG_S_NEEDS_RESET == 0
        {
            self.try_activate();
        }
    }

    fn read_reg(&mut self, offset: u64) -> u32 {
        match offset {
            0x000 => MMIO_MAGIC,
            0x004 => MMIO_VERSION,
            0x008 => self.device.device_type(),
            0x00c => MMIO_VENDOR_ID,
            0x010 => {
                let f = self.device.avail_features();
                match self.device_features_select {
                    0 => f as u32,
                    1 => (f >> 32) as u32,
                    _ => 0,
                }
            }
            0x034 => self.selected_queue().map_or(0, |q| u32::from(q.max_size())),
            0x044 => self.selected_queue().map_or(0, |q| u32::from(q.ready())),
            0x060 => self.interrupt.status(),
            0x070 => self.status,
            0x0fc => self.config_generation,
            _ => 0,
        }
    }

    fn write_reg(&mut self, offset: u64, v: u32) {
        match offset {
            0x014 => self.device_features_select = v,
            0x020 => {
                let frozen = self.status & VIRTIO_CONFIG_S_FEATURES_OK != 0;
                if !frozen {
                    match self.driver_features_select {
                        0 => {
                            self.driver_features =
                                (self.driver_features & !0xffff_ffff) | u64::from(v)
                        }
                        1 => {
                            self.driver_features =
                                (self.driver_features & 0xffff_ffff) | (u64::from(v) << 32)
                        }
                        _ => {}
                    }
                }
            }
            0x024 => self.driver_features_select = v,
            0x030 => self.queue_select = v,
            0x038 => {
                if let Some(q) = self.selected_queue() {
                    // Queue::set_size ignores sizes that are not a power of two or exceed the max.
                    q.set_size(u16::try_from(v).unwrap_or(0));
                }
            }
            0x044 => {
                if let Some(q) = self.selected_queue() {
                    q.set_ready(v == 1);
                }
            }
            0x050 if self.activated => self.device.queue_notify(v),
            0x064 => {
                self.interrupt.status.fetch_and(!v, Ordering::SeqCst);
            }
            0x070 => self.set_status(v),
            0x080 => self.with_queue(|q| q.set_desc_table_address(Some(v), None)),
            0x084 => self.with_queue(|q| q.set_desc_table_address(None, Some(v))),
            0x090 => self.with_queue(|q| q.set_avail_ring_address(Some(v), None)),
            0x094 => self.with_queue(|q| q.set_avail_ring_address(None, Some(v))),
            0x0a0 => self.with_queue(|q| q.set_used_ring_address(Some(v), None)),
            0x0a4 => self.with_queue(|q| q.set_used_ring_address(None, Some(v))),
            _ => {}
        }
    }

    fn with_queue(&mut self, f: impl FnOnce(&mut Queue)) {
        if let Some(q) = self.selected_queue() {
            f(q);
        }
    }
}

impl BusDevice for MmioTransport {
    fn read(&mut self, offset: u64, data: &mut [u8]) {
        if offset >= CONFIG_OFFSET {
            self.device.read_config(offset - CONFIG_OFFSET, data);
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
            self.device.write_config(offset - CONFIG_OFFSET, data);
            self.config_generation = self.config_generation.wrapping_add(1);
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
        t.interrupt.signal_used_queue(0);
        t.interrupt.signal_config();
        assert_eq!(rd(&mut t, 0x060), 3);
        wr(&mut t, 0x064, 1);
        assert_eq!(rd(&mut t, 0x060), 2);
    }
}
