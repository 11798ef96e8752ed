//! The modern virtio PCI transport (virtio 1.2, 4.1): a device as a PCI
//! function with vendor 0x1af4, device 0x1040 + its virtio ID, and one
//! 32-bit memory BAR holding every structure the vendor capabilities point
//! at, plus the MSI-X table and PBA.
//!
//! ```text
//! BAR 0   0x0000 common configuration      0x1000 ISR status (1 byte)
//!         0x2000 device configuration      0x3000 notifications (4 bytes a queue)
//!         0x4000 MSI-X table               0x5000 MSI-X PBA
//! ```
//!
//! Interrupts are MSI-X only (no INTx): one vector per queue plus one for
//! configuration changes, each an irqfd with its own KVM MSI route
//! (`devices::pci::msix`). A device model sees only `VirtioInterrupt`; the
//! queue-to-vector map the driver programs lives in [`PciInterrupt`].
//! A queue notification is a write in the notify region, dispatched on the
//! vCPU exit to `VirtioDevice::queue_notify`, as virtio-mmio's QueueNotify.
//!
//! Everything in the BAR and configuration space is guest input: a field
//! accessed with the wrong width, a register that does not exist, a vector
//! out of range (it reads back as NO_VECTOR, which a driver checks) and
//! writes after DRIVER_OK are refused and counted, never a panic. Features,
//! queues, the device status machine, activation and snapshots of the
//! common state are `transport::VirtioCommon`'s, shared with virtio-mmio:
//! this file maps the common configuration structure onto it and keeps only
//! what is PCI's own (configuration space, capabilities, MSI-X, ISR).
//!
//! Not offered: the VIRTIO_PCI_CAP_PCI_CFG window (Linux does not use it)
//! and legacy (0.9.5) registers.

use std::sync::atomic::{AtomicU16, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};
use virtio_bindings::virtio_config::VIRTIO_CONFIG_S_DRIVER_OK;
use virtio_queue::QueueT;

use super::persist::{QueueSnapshot, VirtioPersistError};
use super::transport::{CommonState, Ring, TransportInterrupt, VirtioCommon};
use super::{VirtioDevice, VirtioInterrupt};
use crate::devices::pci::config::{PciConfigState, PciHeader};
use crate::devices::pci::msix::{
    MsixState, MsixVectors, CONTROL_ENABLE, CONTROL_FUNCTION_MASK, MSIX_CAP_ID,
};
use crate::devices::pci::{AccessRefused, PciConfig, PciConfigError, PciDevice};
use crate::guest_memory::GuestMemoryMmap;

/// Virtio's PCI vendor ID.
pub const VIRTIO_PCI_VENDOR_ID: u16 = 0x1af4;
/// Modern device IDs are this plus the virtio device ID.
pub const VIRTIO_PCI_DEVICE_ID_BASE: u16 = 0x1040;
/// "No vector" in the MSI-X vector registers.
pub const NO_VECTOR: u16 = 0xffff;
/// Size of the one BAR.
pub const BAR_BYTES: u64 = 0x8000;
/// The BAR's index.
pub const BAR_INDEX: usize = 0;
const COMMON_OFFSET: u64 = 0x0000;
const COMMON_BYTES: u64 = 0x38;
const ISR_OFFSET: u64 = 0x1000;
const ISR_BYTES: u64 = 1;
const DEVICE_OFFSET: u64 = 0x2000;
const DEVICE_BYTES: u64 = 0x1000;
const NOTIFY_OFFSET: u64 = 0x3000;
/// Bytes between two queues' notify addresses.
const NOTIFY_MULTIPLIER: u32 = 4;
const MSIX_TABLE_OFFSET: u64 = 0x4000;
const MSIX_PBA_OFFSET: u64 = 0x5000;
/// The most queues a device may have here: their notify addresses and
/// MSI-X table must fit their regions.
pub const MAX_QUEUES: usize = 127;

/// Vendor-specific capability types (virtio 1.2, 4.1.4).
const CAP_COMMON: u8 = 1;
const CAP_NOTIFY: u8 = 2;
const CAP_ISR: u8 = 3;
const CAP_DEVICE: u8 = 4;
const CAP_VENDOR: u8 = 0x09;

/// MSI-X vectors a device needs: one per queue and one for configuration.
pub fn vectors_needed(device: &dyn VirtioDevice) -> u16 {
    u16::try_from(device.queue_max_sizes().len().min(MAX_QUEUES) + 1).expect("at most 128")
}

/// The transport's interrupt: the driver's queue-to-vector map and the ISR
/// byte, over the function's MSI-X vectors.
pub struct PciInterrupt {
    msix: Arc<MsixVectors>,
    config_vector: AtomicU16,
    queue_vectors: Vec<AtomicU16>,
    isr: AtomicU8,
}

impl PciInterrupt {
    /// An interrupt for `queues` queues over `msix`; no vector assigned.
    pub fn new(msix: Arc<MsixVectors>, queues: usize) -> PciInterrupt {
        PciInterrupt {
            msix,
            config_vector: AtomicU16::new(NO_VECTOR),
            queue_vectors: (0..queues).map(|_| AtomicU16::new(NO_VECTOR)).collect(),
            isr: AtomicU8::new(0),
        }
    }

    fn raise(&self, isr_bit: u8, vector: u16) {
        self.isr.fetch_or(isr_bit, Ordering::SeqCst);
        if vector != NO_VECTOR {
            self.msix.signal(vector);
        }
    }
}

impl TransportInterrupt for PciInterrupt {
    fn reset(&self) {
        self.config_vector.store(NO_VECTOR, Ordering::SeqCst);
        for v in &self.queue_vectors {
            v.store(NO_VECTOR, Ordering::SeqCst);
        }
        self.isr.store(0, Ordering::SeqCst);
    }
}

impl VirtioInterrupt for PciInterrupt {
    fn signal_used_queue(&self, queue: u16) {
        let v = self
            .queue_vectors
            .get(usize::from(queue))
            .map_or(NO_VECTOR, |v| v.load(Ordering::SeqCst));
        self.raise(1, v);
    }
    fn signal_config(&self) {
        self.raise(2, self.config_vector.load(Ordering::SeqCst));
    }
}

/// Counters of refused guest accesses.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct VirtioPciCounters {
    /// BAR accesses with a wrong width, to no register, or to a read-only one.
    pub refused_accesses: u64,
    /// Vector numbers the function does not have, written as a queue's or
    /// the configuration's vector.
    pub bogus_vectors: u64,
}

/// The transport's registers and its device's state, as a snapshot stores
/// them. Not saved: the irqfds and GSIs (a restore wires new ones and routes
/// them from the saved MSI-X table).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PciTransportState {
    /// Virtio device ID, to refuse a snapshot of another device in this slot.
    pub device_type: u32,
    /// Configuration space (its writable bits are taken: BARs, command).
    pub config: PciConfigState,
    /// MSI-X table, PBA and control bits.
    pub msix: MsixState,
    /// device_feature_select.
    pub device_features_select: u32,
    /// driver_feature_select.
    pub driver_features_select: u32,
    /// The features the driver wrote.
    pub driver_features: u64,
    /// Device status.
    pub status: u8,
    /// Whether the device was activated.
    pub activated: bool,
    /// config_generation.
    pub config_generation: u8,
    /// queue_select.
    pub queue_select: u16,
    /// config_msix_vector.
    pub config_vector: u16,
    /// queue_msix_vector of each queue.
    pub queue_vectors: Vec<u16>,
    /// ISR status.
    pub isr: u8,
    /// Before activation the transport's queue registers; after, the live
    /// queues the device owns.
    pub queues: Vec<QueueSnapshot>,
    /// The device's own state (`VirtioDevice::save`).
    pub device: Vec<u8>,
}

/// One virtio device as a PCI function.
pub struct VirtioPciDevice {
    config: PciConfig,
    msix_cap: usize,
    common: VirtioCommon<PciInterrupt>,
    counters: VirtioPciCounters,
}

fn vendor_cap(cfg_type: u8, offset: u64, len: u64, extra: &[u8]) -> Vec<u8> {
    let cap_len = 16 + extra.len();
    let mut c = vec![
        CAP_VENDOR,
        0,
        u8::try_from(cap_len).expect("small"),
        cfg_type,
        u8::try_from(BAR_INDEX).expect("0"),
        0,
        0,
        0,
    ];
    c.extend_from_slice(&u32::try_from(offset).expect("inside the BAR").to_le_bytes());
    c.extend_from_slice(&u32::try_from(len).expect("inside the BAR").to_le_bytes());
    c.extend_from_slice(extra);
    c
}

impl VirtioPciDevice {
    /// Wraps `device` as a function whose BAR sits at `bar_gpa` (from the
    /// root's window) and whose MSI-X vectors are `msix` (at least
    /// [`vectors_needed`] of them).
    pub fn new(
        device: Box<dyn VirtioDevice>,
        mem: GuestMemoryMmap,
        bar_gpa: u64,
        msix: Arc<MsixVectors>,
    ) -> Result<VirtioPciDevice, PciConfigError> {
        let ty = device.device_type();
        let class = match ty {
            1 => [0x02, 0x00, 0x00], // network controller
            2 => [0x01, 0x80, 0x00], // other mass storage
            _ => [0xff, 0x00, 0x00],
        };
        let id = VIRTIO_PCI_DEVICE_ID_BASE.saturating_add(u16::try_from(ty).unwrap_or(0));
        let mut config = PciConfig::new(&PciHeader {
            vendor_id: VIRTIO_PCI_VENDOR_ID,
            device_id: id,
            revision_id: 1,
            class,
            subsystem_vendor_id: VIRTIO_PCI_VENDOR_ID,
            subsystem_id: 0x1100,
        });
        config.add_bar(BAR_INDEX, BAR_BYTES, bar_gpa)?;
        let nq = device.queue_max_sizes().len();
        if nq > MAX_QUEUES || usize::from(msix.len()) > MAX_QUEUES + 1 || msix.is_empty() {
            return Err(PciConfigError::CapabilitySpace { len_bytes: nq });
        }
        let notify_bytes = u64::try_from(nq).expect("small") * u64::from(NOTIFY_MULTIPLIER);
        config.add_capability(
            &vendor_cap(CAP_COMMON, COMMON_OFFSET, COMMON_BYTES, &[]),
            &[],
        )?;
        config.add_capability(
            &vendor_cap(
                CAP_NOTIFY,
                NOTIFY_OFFSET,
                notify_bytes.max(4),
                &NOTIFY_MULTIPLIER.to_le_bytes(),
            ),
            &[],
        )?;
        config.add_capability(&vendor_cap(CAP_ISR, ISR_OFFSET, ISR_BYTES, &[]), &[])?;
        config.add_capability(
            &vendor_cap(CAP_DEVICE, DEVICE_OFFSET, DEVICE_BYTES, &[]),
            &[],
        )?;
        let control = msix.len() - 1;
        let mut cap = vec![MSIX_CAP_ID, 0];
        cap.extend_from_slice(&control.to_le_bytes());
        let bir = u32::try_from(BAR_INDEX).expect("0");
        let table = u32::try_from(MSIX_TABLE_OFFSET).expect("small") | bir;
        let pba = u32::try_from(MSIX_PBA_OFFSET).expect("small") | bir;
        cap.extend_from_slice(&table.to_le_bytes());
        cap.extend_from_slice(&pba.to_le_bytes());
        let msix_cap = config.add_capability(&cap, &[0, 0, 0, 0xc0])?;
        let interrupt = Arc::new(PciInterrupt::new(msix, nq));
        Ok(VirtioPciDevice {
            config,
            msix_cap,
            common: VirtioCommon::new(device, mem, interrupt),
            counters: VirtioPciCounters::default(),
        })
    }

    fn interrupt(&self) -> &PciInterrupt {
        self.common.interrupt()
    }

    /// The device status register.
    pub fn status(&self) -> u32 {
        self.common.status()
    }

    /// Whether the device was activated.
    pub fn is_activated(&self) -> bool {
        self.common.is_activated()
    }

    /// Refused-access counters (the transport's and its MSI-X table's).
    pub fn counters(&self) -> (VirtioPciCounters, crate::devices::pci::msix::MsixCounters) {
        (self.counters, self.interrupt().msix.counters())
    }

    fn msix_control(&self) -> u16 {
        let b = self.config.bytes();
        u16::from_le_bytes([b[self.msix_cap + 2], b[self.msix_cap + 3]])
    }

    /// The common configuration register at `offset`, or `None` for no
    /// register or a wrong width.
    fn common_read(&mut self, offset: u64, len: usize) -> Option<u64> {
        let width_ok = |w: usize| len == w;
        let c = &mut self.common;
        let v = match offset {
            0x00 if width_ok(4) => u64::from(c.device_features_select()),
            0x04 if width_ok(4) => u64::from(c.device_features_word()),
            0x08 if width_ok(4) => u64::from(c.driver_features_select()),
            0x0c if width_ok(4) => u64::from(c.driver_features_word()),
            0x10 if width_ok(2) => u64::from(c.interrupt().config_vector.load(Ordering::SeqCst)),
            0x12 if width_ok(2) => u64::try_from(c.num_queues()).ok()?,
            // The status and generation are a byte here: the status's bits
            // all fit, and the generation's low byte changes as it does.
            0x14 if width_ok(1) => u64::from(c.status() & 0xff),
            0x15 if width_ok(1) => u64::from(c.config_generation() & 0xff),
            // queue_select only ever holds a u16 written here.
            0x16 | 0x1e if width_ok(2) => u64::from(c.queue_select()),
            0x18 if width_ok(2) => c.selected_queue().map_or(0, |q| u64::from(q.size())),
            0x1a if width_ok(2) => {
                let i = usize::try_from(c.queue_select()).ok()?;
                c.interrupt()
                    .queue_vectors
                    .get(i)
                    .map_or(u64::from(NO_VECTOR), |v| {
                        u64::from(v.load(Ordering::SeqCst))
                    })
            }
            0x1c if width_ok(2) => c.selected_queue().map_or(0, |q| u64::from(q.ready())),
            0x20..=0x37 if (len == 4 || len == 8) && offset % len as u64 == 0 => {
                let addr = c.queue_ring(ring_at(offset));
                if len == 8 {
                    addr
                } else if offset % 8 == 0 {
                    addr & 0xffff_ffff
                } else {
                    addr >> 32
                }
            }
            _ => return None,
        };
        Some(v)
    }

    fn set_vector(&mut self, v: u16) -> u16 {
        if v == NO_VECTOR || v < self.interrupt().msix.len() {
            v
        } else {
            self.counters.bogus_vectors += 1;
            NO_VECTOR
        }
    }

    /// Writes the common configuration register at `offset`; `false` for
    /// no register, a read-only one or a wrong width.
    fn common_write(&mut self, offset: u64, len: usize, v: u64) -> bool {
        let width_ok = |w: usize| len == w;
        // Each arm narrows `v` to the register's width, which the width
        // check guarantees it fits.
        let v32 = v as u32;
        let v16 = v as u16;
        match offset {
            0x00 if width_ok(4) => self.common.set_device_features_select(v32),
            0x08 if width_ok(4) => self.common.set_driver_features_select(v32),
            0x0c if width_ok(4) => self.common.set_driver_features_word(v32),
            0x10 if width_ok(2) => {
                let v = self.set_vector(v16);
                self.interrupt().config_vector.store(v, Ordering::SeqCst);
            }
            0x14 if width_ok(1) => self.common.set_status(u32::from(v as u8)),
            0x16 if width_ok(2) => self.common.set_queue_select(u32::from(v16)),
            // Queue::set_size ignores sizes that are not a power of two or exceed the max.
            0x18 if width_ok(2) => self.common.with_queue(|q| q.set_size(v16)),
            0x1a if width_ok(2) => {
                let vec = self.set_vector(v16);
                let frozen = self.common.status() & VIRTIO_CONFIG_S_DRIVER_OK != 0;
                let i = usize::try_from(self.common.queue_select()).unwrap_or(usize::MAX);
                match self.interrupt().queue_vectors.get(i) {
                    Some(slot) if !frozen => slot.store(vec, Ordering::SeqCst),
                    _ => return false,
                }
            }
            0x1c if width_ok(2) => self.common.with_queue(|q| q.set_ready(v16 == 1)),
            0x20..=0x37 if (len == 4 || len == 8) && offset % len as u64 == 0 => {
                let (lo, hi) = if len == 8 {
                    (Some(v as u32), Some((v >> 32) as u32))
                } else if offset % 8 == 0 {
                    (Some(v32), None)
                } else {
                    (None, Some(v32))
                };
                self.common.set_queue_ring(ring_at(offset), lo, hi);
            }
            _ => return false,
        }
        true
    }

    /// Saves the function and the device (see `VirtioDevice::save`). Call
    /// with every vCPU paused; the device stays quiesced until
    /// [`Self::resume_after_save`].
    pub fn save(&mut self) -> PciTransportState {
        let c = self.common.save();
        let irq = self.interrupt();
        PciTransportState {
            device_type: c.device_type,
            config: self.config.save(),
            msix: irq.msix.save(),
            device_features_select: c.device_features_select,
            driver_features_select: c.driver_features_select,
            driver_features: c.driver_features,
            // Written here as a byte, so it fits (see `common_read`).
            status: (c.status & 0xff) as u8,
            activated: c.activated,
            config_generation: (c.config_generation & 0xff) as u8,
            queue_select: u16::try_from(c.queue_select).unwrap_or(u16::MAX),
            config_vector: irq.config_vector.load(Ordering::SeqCst),
            queue_vectors: irq
                .queue_vectors
                .iter()
                .map(|v| v.load(Ordering::SeqCst))
                .collect(),
            isr: irq.isr.load(Ordering::SeqCst),
            queues: c.queues,
            device: c.device,
        }
    }

    /// Delivers the interrupts a restore raised before the vCPUs existed
    /// (see `MsixVectors::hold`).
    pub fn release_interrupts(&self) {
        self.interrupt().msix.release();
    }

    /// Restarts the device `save` quiesced.
    pub fn resume_after_save(&mut self) {
        self.common.resume_after_save();
    }

    /// Rebuilds a function around a fresh `device` from `state` (a file),
    /// with the same checks as virtio-mmio's restore plus the function's:
    /// configuration space through its write masks, MSI-X sizes, vectors in
    /// range.
    pub fn restore(
        device: Box<dyn VirtioDevice>,
        mem: GuestMemoryMmap,
        bar_gpa: u64,
        msix: Arc<MsixVectors>,
        state: &PciTransportState,
    ) -> Result<VirtioPciDevice, VirtioPersistError> {
        let bad = |detail: String| VirtioPersistError::State {
            what: "virtio-pci",
            detail,
        };
        let common = CommonState {
            device_type: state.device_type,
            queue_select: u32::from(state.queue_select),
            device_features_select: state.device_features_select,
            driver_features_select: state.driver_features_select,
            driver_features: state.driver_features,
            status: u32::from(state.status),
            activated: state.activated,
            config_generation: u32::from(state.config_generation),
            queues: state.queues.clone(),
            device: state.device.clone(),
        };
        common.check(device.as_ref(), "virtio-pci")?;
        let nq = device.queue_max_sizes().len();
        if state.queue_vectors.len() != nq {
            return Err(bad(format!(
                "{} queue vectors, the device has {nq} queues",
                state.queue_vectors.len(),
            )));
        }
        let n = msix.len();
        let vector_ok = |v: u16| v == NO_VECTOR || v < n;
        if !vector_ok(state.config_vector) || !state.queue_vectors.iter().all(|&v| vector_ok(v)) {
            return Err(bad(format!("an MSI-X vector beyond the function's {n}")));
        }
        let mut t =
            VirtioPciDevice::new(device, mem, bar_gpa, msix).map_err(|e| bad(e.to_string()))?;
        t.config
            .restore(&state.config)
            .map_err(|_| bad("configuration space is not 256 bytes".into()))?;
        // The interrupt state goes back before the device runs again.
        let irq = t.interrupt();
        irq.msix.restore(&state.msix).map_err(bad)?;
        irq.config_vector
            .store(state.config_vector, Ordering::SeqCst);
        for (slot, v) in irq.queue_vectors.iter().zip(&state.queue_vectors) {
            slot.store(*v, Ordering::SeqCst);
        }
        irq.isr.store(state.isr, Ordering::SeqCst);
        t.common.restore(&common, "virtio-pci")?;
        Ok(t)
    }

    fn refuse(&mut self, data: Option<&mut [u8]>) {
        self.counters.refused_accesses += 1;
        if let Some(d) = data {
            d.fill(0);
        }
    }
}

/// The queue ring whose 64-bit address field holds common-configuration
/// byte `offset` (0x20..0x38: desc, driver (avail), device (used)).
fn ring_at(offset: u64) -> Ring {
    match offset & !7 {
        0x20 => Ring::Desc,
        0x28 => Ring::Avail,
        _ => Ring::Used,
    }
}

fn le_value(data: &[u8]) -> Option<u64> {
    if !matches!(data.len(), 1 | 2 | 4 | 8) {
        return None;
    }
    let mut b = [0u8; 8];
    b[..data.len()].copy_from_slice(data);
    Some(u64::from_le_bytes(b))
}

impl PciDevice for VirtioPciDevice {
    fn config(&self) -> &PciConfig {
        &self.config
    }

    fn write_config(&mut self, offset: u64, data: &[u8]) -> Result<(), AccessRefused> {
        let before = self.msix_control();
        self.config.write(offset, data)?;
        let after = self.msix_control();
        if before != after {
            self.interrupt()
                .msix
                .set_control(after & (CONTROL_ENABLE | CONTROL_FUNCTION_MASK));
        }
        Ok(())
    }

    fn read_bar(&mut self, bar: usize, offset: u64, data: &mut [u8]) {
        if bar != BAR_INDEX {
            return self.refuse(Some(data));
        }
        let len = data.len() as u64;
        let within = |base: u64, size: u64| {
            offset >= base && offset.checked_add(len).is_some_and(|e| e <= base + size)
        };
        if within(COMMON_OFFSET, COMMON_BYTES) {
            match self.common_read(offset - COMMON_OFFSET, data.len()) {
                Some(v) => data.copy_from_slice(&v.to_le_bytes()[..data.len()]),
                None => self.refuse(Some(data)),
            }
        } else if within(ISR_OFFSET, ISR_BYTES) {
            // Reading the ISR acknowledges it.
            data[0] = self.interrupt().isr.swap(0, Ordering::SeqCst);
        } else if within(DEVICE_OFFSET, DEVICE_BYTES) {
            self.common.read_config(offset - DEVICE_OFFSET, data);
        } else if within(MSIX_TABLE_OFFSET, MSIX_PBA_OFFSET - MSIX_TABLE_OFFSET) {
            self.interrupt()
                .msix
                .read_table(offset - MSIX_TABLE_OFFSET, data);
        } else if within(MSIX_PBA_OFFSET, BAR_BYTES - MSIX_PBA_OFFSET) {
            self.interrupt()
                .msix
                .read_pba(offset - MSIX_PBA_OFFSET, data);
        } else {
            // The notify region is write-only; the gaps hold nothing.
            self.refuse(Some(data));
        }
    }

    fn write_bar(&mut self, bar: usize, offset: u64, data: &[u8]) {
        if bar != BAR_INDEX {
            return self.refuse(None);
        }
        let len = data.len() as u64;
        let within = |base: u64, size: u64| {
            offset >= base && offset.checked_add(len).is_some_and(|e| e <= base + size)
        };
        if within(COMMON_OFFSET, COMMON_BYTES) {
            let ok = le_value(data)
                .is_some_and(|v| self.common_write(offset - COMMON_OFFSET, data.len(), v));
            if !ok {
                self.refuse(None);
            }
        } else if within(DEVICE_OFFSET, DEVICE_BYTES) {
            self.common.write_config(offset - DEVICE_OFFSET, data);
        } else if within(NOTIFY_OFFSET, 0x1000) {
            let rel = offset - NOTIFY_OFFSET;
            let queue = rel / u64::from(NOTIFY_MULTIPLIER);
            let nq = self.common.num_queues() as u64;
            let ok = rel % u64::from(NOTIFY_MULTIPLIER) == 0 && matches!(data.len(), 2 | 4);
            if !ok || queue >= nq {
                return self.refuse(None);
            }
            self.common
                .queue_notify(u32::try_from(queue).expect("below the queue count"));
        } else if within(MSIX_TABLE_OFFSET, MSIX_PBA_OFFSET - MSIX_TABLE_OFFSET) {
            self.interrupt()
                .msix
                .write_table(offset - MSIX_TABLE_OFFSET, data);
        } else if within(MSIX_PBA_OFFSET, BAR_BYTES - MSIX_PBA_OFFSET) {
            self.interrupt()
                .msix
                .write_pba(offset - MSIX_PBA_OFFSET, data);
        } else {
            self.refuse(None);
        }
    }
}

/// A shared handle, as the builder keeps it for snapshots.
pub type SharedVirtioPci = Arc<Mutex<VirtioPciDevice>>;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::devices::pci::msix::tests::vectors;
    use crate::devices::virtio::test_utils::{guest_memory, CountingDevice};

    const BAR: u64 = 0xc000_0000;

    fn transport() -> (VirtioPciDevice, Arc<Mutex<Vec<String>>>) {
        let (dev, log) = CountingDevice::new();
        let (msix, _) = vectors(2);
        let t = VirtioPciDevice::new(Box::new(dev), guest_memory(), BAR, Arc::new(msix))
            .expect("valid");
        (t, log)
    }

    fn rd(t: &mut VirtioPciDevice, off: u64, len: usize) -> u64 {
        let mut b = [0u8; 8];
        t.read_bar(0, off, &mut b[..len]);
        u64::from_le_bytes(b)
    }

    fn wr(t: &mut VirtioPciDevice, off: u64, len: usize, v: u64) {
        t.write_bar(0, off, &v.to_le_bytes()[..len]);
    }

    fn cfg8(t: &VirtioPciDevice, off: usize) -> u8 {
        t.config().bytes()[off]
    }

    #[test]
    fn identity_and_capability_walk() {
        let (t, _) = transport();
        let b = t.config().bytes();
        assert_eq!(u16::from_le_bytes([b[0], b[1]]), 0x1af4);
        assert_eq!(u16::from_le_bytes([b[2], b[3]]), 0x1040 + 42);
        assert_eq!(t.config().bar(0), Some((BAR, BAR_BYTES)));
        let caps = t.config().capabilities();
        let ids: Vec<u8> = caps.iter().map(|c| c.0).collect();
        assert_eq!(ids, vec![9, 9, 9, 9, 0x11]);
        let types: Vec<u8> = caps[..4].iter().map(|c| cfg8(&t, c.1 + 3)).collect();
        assert_eq!(types, vec![CAP_COMMON, CAP_NOTIFY, CAP_ISR, CAP_DEVICE]);
        // The notify capability carries its multiplier.
        let n = caps[1].1;
        assert_eq!(cfg8(&t, n + 2), 20);
        assert_eq!(cfg8(&t, n + 16), 4);
        // MSI-X: table size 2 (encoded N-1), table and PBA in BAR 0.
        let m = caps[4].1;
        assert_eq!(cfg8(&t, m + 2), 1);
        assert_eq!(cfg8(&t, m + 5), 0x40);
    }

    #[test]
    fn common_cfg_queue_setup_activates() {
        let (mut t, log) = transport();
        assert_eq!(rd(&mut t, 0x12, 2), 1, "num_queues");
        wr(&mut t, 0x14, 1, 3);
        wr(&mut t, 0x00, 4, 1);
        assert_eq!(rd(&mut t, 0x04, 4), 1, "VERSION_1 in the high word");
        wr(&mut t, 0x08, 4, 1);
        wr(&mut t, 0x0c, 4, 1);
        wr(&mut t, 0x14, 1, 0xb);
        assert_eq!(rd(&mut t, 0x14, 1), 0xb, "FEATURES_OK kept");
        wr(&mut t, 0x16, 2, 0);
        assert_eq!(rd(&mut t, 0x18, 2), 16);
        wr(&mut t, 0x18, 2, 8);
        wr(&mut t, 0x1a, 2, 1);
        assert_eq!(rd(&mut t, 0x1a, 2), 1, "vector accepted");
        wr(&mut t, 0x10, 2, 7);
        assert_eq!(rd(&mut t, 0x10, 2), u64::from(NO_VECTOR), "no vector 7");
        wr(&mut t, 0x20, 8, 0x1_0000);
        wr(&mut t, 0x28, 4, 0x2_0000);
        wr(&mut t, 0x2c, 4, 0);
        wr(&mut t, 0x30, 4, 0x3_0000);
        assert_eq!(rd(&mut t, 0x28, 8), 0x2_0000);
        wr(&mut t, 0x1c, 2, 1);
        assert_eq!(rd(&mut t, 0x1c, 2), 1);
        wr(&mut t, 0x14, 1, 0xf);
        assert!(t.is_activated());
        wr(&mut t, NOTIFY_OFFSET, 2, 0);
        assert_eq!(
            *log.lock().expect("ok"),
            vec!["acked 100000000", "activate 1", "notify 0"]
        );
        wr(&mut t, 0x14, 1, 0);
        assert!(!t.is_activated());
        assert_eq!(
            rd(&mut t, 0x1a, 2),
            u64::from(NO_VECTOR),
            "reset clears vectors"
        );
    }

    /// A disk slot on virtio-pci (the transport a modular distro kernel
    /// uses): an insert while the driver runs reads back as the new
    /// capacity with the configuration bit in the ISR (what Linux's
    /// vp_interrupt turns into virtio_config_changed), and a hostile
    /// guest's device-config writes change nothing.
    #[test]
    fn a_disk_slot_signals_its_medium_through_the_config_vector() {
        use crate::devices::virtio::block::{
            Block, BlockConfig, BlockFaults, BlockSlot, DiskImage,
        };
        let slot = BlockSlot::empty();
        let (msix, _) = vectors(2);
        let mut t = VirtioPciDevice::new(
            Box::new(Block::in_slot(slot.clone())),
            guest_memory(),
            BAR,
            Arc::new(msix),
        )
        .expect("valid");
        // The driver's setup: status, features, queue 0, config vector 0.
        wr(&mut t, 0x14, 1, 3);
        wr(&mut t, 0x08, 4, 1);
        wr(&mut t, 0x0c, 4, 1);
        wr(&mut t, 0x14, 1, 0xb);
        wr(&mut t, 0x10, 2, 0);
        wr(&mut t, 0x16, 2, 0);
        wr(&mut t, 0x18, 2, 16);
        wr(&mut t, 0x20, 8, 0x1_0000);
        wr(&mut t, 0x28, 8, 0x2_0000);
        wr(&mut t, 0x30, 8, 0x3_0000);
        wr(&mut t, 0x1c, 2, 1);
        wr(&mut t, 0x14, 1, 0xf);
        assert!(t.is_activated());
        assert_eq!(rd(&mut t, DEVICE_OFFSET, 8), 0, "an empty slot: size 0");
        assert_eq!(rd(&mut t, ISR_OFFSET, 1), 0);
        let f = tempfile::NamedTempFile::new().expect("tempfile");
        f.as_file().set_len(16 * 512).expect("size");
        slot.insert(BlockConfig {
            disk: Arc::new(DiskImage::open(f.path(), false, "late").expect("open")),
            faults: Arc::new(BlockFaults::default()),
        })
        .expect("insert");
        assert_eq!(rd(&mut t, ISR_OFFSET, 1), 2, "the configuration bit");
        assert_eq!(rd(&mut t, DEVICE_OFFSET, 8), 16);
        wr(&mut t, DEVICE_OFFSET, 8, 0);
        wr(&mut t, DEVICE_OFFSET + 4, 4, u64::MAX);
        assert_eq!(
            rd(&mut t, DEVICE_OFFSET, 8),
            16,
            "config writes resize nothing"
        );
        slot.eject().expect("held a medium");
        assert_eq!(rd(&mut t, ISR_OFFSET, 1), 2);
        assert_eq!(rd(&mut t, DEVICE_OFFSET, 8), 0);
        wr(&mut t, 0x14, 1, 0);
    }

    #[test]
    fn msix_enable_goes_through_config_space() {
        let (mut t, _) = transport();
        let m = t.config().capabilities()[4].1 as u64;
        t.write_config(m + 2, &[0x01, 0x80]).expect("aligned");
        assert!(t.interrupt().msix.enabled());
        t.write_config(m, &[0, 0, 0, 0]).expect("aligned");
        assert!(!t.interrupt().msix.enabled());
    }

    #[test]
    fn isr_read_acknowledges() {
        let (mut t, _) = transport();
        t.interrupt().signal_used_queue(0);
        t.interrupt().signal_config();
        t.interrupt().signal_used_queue(9); // no such queue: no vector
        assert_eq!(rd(&mut t, ISR_OFFSET, 1), 3);
        assert_eq!(rd(&mut t, ISR_OFFSET, 1), 0);
    }

    #[test]
    fn hostile_accesses_are_refused_and_counted() {
        let (mut t, _) = transport();
        wr(&mut t, 0x14, 2, 1); // status is a byte
        wr(&mut t, 0x04, 4, 1); // device_feature is read-only
        wr(&mut t, 0x12, 2, 9); // num_queues is read-only
        wr(&mut t, 0x22, 4, 1); // unaligned address half
        rd(&mut t, 0x01, 1);
        rd(&mut t, 0x36, 4); // straddles the end of common cfg
        wr(&mut t, NOTIFY_OFFSET + 4, 2, 1); // queue 1 does not exist
        wr(&mut t, NOTIFY_OFFSET + 1, 2, 0); // unaligned notify
        rd(&mut t, NOTIFY_OFFSET, 4); // write-only
        rd(&mut t, 0x7ffc, 8); // past the BAR
        t.read_bar(1, 0, &mut [0u8; 4]);
        t.write_bar(0, 0, &[0u8; 3]);
        wr(&mut t, MSIX_TABLE_OFFSET + 2, 4, 0);
        wr(&mut t, 0x1a, 2, 0x7fff);
        let (c, m) = t.counters();
        assert_eq!(c.refused_accesses, 12);
        assert_eq!(c.bogus_vectors, 1);
        assert_eq!(m.refused_accesses, 1);
        wr(&mut t, 0x16, 2, 0xffff);
        wr(&mut t, 0x18, 2, 8);
        wr(&mut t, 0x1c, 2, 1);
        assert_eq!(rd(&mut t, 0x18, 2), 0, "no queue 0xffff");
    }

    #[test]
    fn state_round_trips() {
        let (mut t, _) = transport();
        let m = t.config().capabilities()[4].1 as u64;
        t.write_config(4, &[0x06, 0]).expect("aligned");
        t.write_config(m + 2, &[0x01, 0x80]).expect("aligned");
        wr(&mut t, MSIX_TABLE_OFFSET + 16, 4, 0xfee0_0000);
        wr(&mut t, 0x16, 2, 0);
        wr(&mut t, 0x1a, 2, 1);
        wr(&mut t, 0x14, 1, 3);
        let s = t.save();
        let bytes = rmp_serde::to_vec(&s).expect("encodes");
        let back: PciTransportState = rmp_serde::from_slice(&bytes).expect("decodes");
        let (dev, _) = CountingDevice::new();
        let (msix, _) = vectors(2);
        let mut r =
            VirtioPciDevice::restore(Box::new(dev), guest_memory(), BAR, Arc::new(msix), &back)
                .expect("restores");
        assert_eq!(r.save(), s);
        assert!(r.interrupt().msix.enabled());
        let mut wrong = s.clone();
        wrong.queue_vectors = vec![5];
        let (dev, _) = CountingDevice::new();
        let (msix, _) = vectors(2);
        assert!(VirtioPciDevice::restore(
            Box::new(dev),
            guest_memory(),
            BAR,
            Arc::new(msix),
            &wrong
        )
        .is_err());
    }
}
