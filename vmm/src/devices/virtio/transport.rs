//! What every virtio transport shares, whatever its register layout: the
//! state behind virtio 1.2's common configuration (2.1 status, 2.2 feature
//! bits, 2.6 virtqueues) and the device lifecycle it drives.
//!
//! [`VirtioCommon`] holds the feature words and their selectors, the queue
//! selector and the queues the driver sets up (size, readiness, ring
//! addresses), the device status state machine, reset, activation on
//! DRIVER_OK, the configuration generation, and the save and restore of all
//! of it. virtio-mmio (`mmio.rs`) and virtio-pci (`pci.rs`) only map their
//! own registers onto it and keep what is theirs: mmio's InterruptStatus;
//! pci's configuration space, capabilities, MSI-X vectors and ISR byte. A
//! device model sees neither transport: it gets memory, queues and a
//! `VirtioInterrupt` when activated.
//!
//! Every value here comes from the guest or from a file: a queue selector
//! out of range reads 0 and drops writes, queue setup after DRIVER_OK and
//! feature writes after FEATURES_OK are ignored, features never offered
//! refuse FEATURES_OK, queue rings are checked against guest memory before
//! the device is activated (a bad layout sets DEVICE_NEEDS_RESET), and a
//! restore re-checks the device type, queue sizes, features and rings.

use std::sync::Arc;

use virtio_bindings::virtio_config::{
    VIRTIO_CONFIG_S_ACKNOWLEDGE, VIRTIO_CONFIG_S_DRIVER, VIRTIO_CONFIG_S_DRIVER_OK,
    VIRTIO_CONFIG_S_FAILED, VIRTIO_CONFIG_S_FEATURES_OK, VIRTIO_CONFIG_S_NEEDS_RESET,
};
use virtio_queue::{Queue, QueueT};

use super::persist::{ActiveArgs, QueueSnapshot, VirtioPersistError};
use super::{VirtioDevice, VirtioInterrupt};
use crate::guest_memory::GuestMemoryMmap;

/// A transport's interrupt: what a device signals through, plus what a
/// device reset clears (mmio's InterruptStatus; pci's vectors and ISR).
pub trait TransportInterrupt: VirtioInterrupt + 'static {
    /// Forgets what the driver set up or has not acknowledged yet.
    fn reset(&self);
}

/// One of a queue's three ring addresses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ring {
    /// The descriptor table.
    Desc,
    /// The available (driver) ring.
    Avail,
    /// The used (device) ring.
    Used,
}

/// The common state as a transport's snapshot stores it (each transport
/// copies these into its own serde struct, whose layout is the file's).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CommonState {
    /// The device's virtio ID, to refuse a snapshot of another device.
    pub device_type: u32,
    /// Queue selector.
    pub queue_select: u32,
    /// Device feature word selector.
    pub device_features_select: u32,
    /// Driver feature word selector.
    pub driver_features_select: u32,
    /// The features the driver wrote.
    pub driver_features: u64,
    /// Device status.
    pub status: u32,
    /// Whether the device was activated (DRIVER_OK accepted).
    pub activated: bool,
    /// Configuration generation.
    pub config_generation: u32,
    /// Before activation the transport's queue registers; after, the live
    /// queues the device owns (their next avail/used indices included).
    pub queues: Vec<QueueSnapshot>,
    /// The device's own state (`VirtioDevice::save`).
    pub device: Vec<u8>,
}

impl CommonState {
    /// Checks what a file says against the `device` it is restored into:
    /// `what` names the transport in the error. [`VirtioCommon::restore`]
    /// checks this too; a transport calls it first to refuse another device
    /// before its own checks.
    pub fn check(
        &self,
        device: &dyn VirtioDevice,
        what: &'static str,
    ) -> Result<(), VirtioPersistError> {
        if self.device_type != device.device_type() {
            return Err(VirtioPersistError::DeviceType {
                found: self.device_type,
                expected: device.device_type(),
            });
        }
        let bad = |detail: String| VirtioPersistError::State { what, detail };
        let queues = device.queue_max_sizes().len();
        if self.queues.len() != queues {
            return Err(bad(format!(
                "{} queues, the device has {queues}",
                self.queues.len()
            )));
        }
        if self.driver_features & !device.avail_features() != 0 {
            return Err(bad(format!(
                "driver features {:#x} include some the device does not offer ({:#x})",
                self.driver_features,
                device.avail_features()
            )));
        }
        Ok(())
    }
}

/// The transport-neutral half of a transport: one device, its queues and
/// its common configuration registers.
pub struct VirtioCommon<I: TransportInterrupt> {
    device: Box<dyn VirtioDevice>,
    mem: GuestMemoryMmap,
    interrupt: Arc<I>,
    /// The driver's queues until activation; empty while the device owns them.
    queues: Vec<Queue>,
    queue_select: u32,
    device_features_select: u32,
    driver_features_select: u32,
    driver_features: u64,
    status: u32,
    activated: bool,
    config_generation: u32,
}

fn fresh_queues(device: &dyn VirtioDevice) -> Vec<Queue> {
    device
        .queue_max_sizes()
        .iter()
        .map(|&max| Queue::new(max).expect("device queue sizes are powers of two <= 32768"))
        .collect()
}

/// Replaces the low (`word` 0) or high (1) half of `v`; other words are
/// not there and leave it alone.
fn set_word(v: u64, word: u32, bits: u32) -> u64 {
    match word {
        0 => (v & !0xffff_ffff) | u64::from(bits),
        1 => (v & 0xffff_ffff) | (u64::from(bits) << 32),
        _ => v,
    }
}

/// The low (`word` 0) or high (1) half of `v`; 0 for other words.
fn word_of(v: u64, word: u32) -> u32 {
    match word {
        0 => (v & 0xffff_ffff) as u32,
        1 => (v >> 32) as u32,
        _ => 0,
    }
}

impl<I: TransportInterrupt> VirtioCommon<I> {
    /// `device`, reset, with its queues in `mem` and its interrupt `interrupt`.
    pub fn new(device: Box<dyn VirtioDevice>, mem: GuestMemoryMmap, interrupt: Arc<I>) -> Self {
        let queues = fresh_queues(device.as_ref());
        VirtioCommon {
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

    /// The device model.
    pub fn device(&self) -> &dyn VirtioDevice {
        self.device.as_ref()
    }

    /// The transport's interrupt.
    pub fn interrupt(&self) -> &Arc<I> {
        &self.interrupt
    }

    /// The device status.
    pub fn status(&self) -> u32 {
        self.status
    }

    /// Whether the device was activated.
    pub fn is_activated(&self) -> bool {
        self.activated
    }

    /// The configuration generation (bumped by every config-space write).
    pub fn config_generation(&self) -> u32 {
        self.config_generation
    }

    /// The queue selector.
    pub fn queue_select(&self) -> u32 {
        self.queue_select
    }

    /// Selects the queue the queue registers act on (any value: one out of
    /// range selects nothing).
    pub fn set_queue_select(&mut self, v: u32) {
        self.queue_select = v;
    }

    /// The device feature word selector.
    pub fn device_features_select(&self) -> u32 {
        self.device_features_select
    }

    /// Selects the device feature word to read.
    pub fn set_device_features_select(&mut self, v: u32) {
        self.device_features_select = v;
    }

    /// The driver feature word selector.
    pub fn driver_features_select(&self) -> u32 {
        self.driver_features_select
    }

    /// Selects the driver feature word to read or write.
    pub fn set_driver_features_select(&mut self, v: u32) {
        self.driver_features_select = v;
    }

    /// The selected word of the features the device offers.
    pub fn device_features_word(&self) -> u32 {
        word_of(self.device.avail_features(), self.device_features_select)
    }

    /// The selected word of the features the driver wrote.
    pub fn driver_features_word(&self) -> u32 {
        word_of(self.driver_features, self.driver_features_select)
    }

    /// Writes the selected word of the driver's features; ignored once
    /// FEATURES_OK is set (the features are negotiated then).
    pub fn set_driver_features_word(&mut self, v: u32) {
        if self.status & VIRTIO_CONFIG_S_FEATURES_OK == 0 {
            self.driver_features = set_word(self.driver_features, self.driver_features_select, v);
        }
    }

    /// How many queues the device has.
    pub fn num_queues(&self) -> usize {
        self.device.queue_max_sizes().len()
    }

    /// The selected queue, while the driver may still set it up: `None`
    /// after DRIVER_OK (queue setup is frozen) or for a selector out of range.
    pub fn selected_queue(&mut self) -> Option<&mut Queue> {
        if self.status & VIRTIO_CONFIG_S_DRIVER_OK != 0 {
            return None;
        }
        let i = usize::try_from(self.queue_select).ok()?;
        self.queues.get_mut(i)
    }

    /// Runs `f` on the selected queue, if there is one to set up.
    pub fn with_queue(&mut self, f: impl FnOnce(&mut Queue)) {
        if let Some(q) = self.selected_queue() {
            f(q);
        }
    }

    /// The selected queue's `ring` address (0 when none is selected).
    pub fn queue_ring(&mut self, ring: Ring) -> u64 {
        self.selected_queue().map_or(0, |q| match ring {
            Ring::Desc => q.desc_table(),
            Ring::Avail => q.avail_ring(),
            Ring::Used => q.used_ring(),
        })
    }

    /// Sets the low and/or high half of the selected queue's `ring` address.
    pub fn set_queue_ring(&mut self, ring: Ring, lo: Option<u32>, hi: Option<u32>) {
        self.with_queue(|q| match ring {
            Ring::Desc => q.set_desc_table_address(lo, hi),
            Ring::Avail => q.set_avail_ring_address(lo, hi),
            Ring::Used => q.set_used_ring_address(lo, hi),
        });
    }

    /// The driver notified queue `index` (any value: the guest chooses it);
    /// dropped before activation.
    pub fn queue_notify(&mut self, index: u32) {
        if self.activated {
            self.device.queue_notify(index);
        }
    }

    /// Reads the device's configuration space.
    pub fn read_config(&self, offset: u64, data: &mut [u8]) {
        self.device.read_config(offset, data);
    }

    /// Writes the device's configuration space and bumps the generation.
    pub fn write_config(&mut self, offset: u64, data: &[u8]) {
        self.device.write_config(offset, data);
        self.config_generation = self.config_generation.wrapping_add(1);
    }

    /// The driver wrote the device status: 0 resets the device; otherwise
    /// the bits a driver may set are taken (DEVICE_NEEDS_RESET stays the
    /// device's), FEATURES_OK is refused for features never offered, and
    /// DRIVER_OK after FEATURES_OK activates the device.
    pub fn set_status(&mut self, v: u32) {
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

    fn reset(&mut self) {
        if self.activated {
            self.device.reset();
        }
        self.activated = false;
        self.queues = fresh_queues(self.device.as_ref());
        self.queue_select = 0;
        self.device_features_select = 0;
        self.driver_features_select = 0;
        self.driver_features = 0;
        self.status = 0;
        self.interrupt.reset();
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
        let interrupt: Arc<dyn VirtioInterrupt> = self.interrupt.clone();
        match self.device.activate(self.mem.clone(), queues, interrupt) {
            Ok(()) => self.activated = true,
            Err(_) => self.status |= VIRTIO_CONFIG_S_NEEDS_RESET,
        }
    }

    /// Saves the registers and the device (see `VirtioDevice::save`). Call
    /// with every vCPU paused; the device stays quiesced until
    /// [`Self::resume_after_save`].
    pub fn save(&mut self) -> CommonState {
        let dev = self.device.save();
        let queues = if self.activated {
            dev.queues
        } else {
            self.queues.iter().map(QueueSnapshot::of).collect()
        };
        CommonState {
            device_type: self.device.device_type(),
            queue_select: self.queue_select,
            device_features_select: self.device_features_select,
            driver_features_select: self.driver_features_select,
            driver_features: self.driver_features,
            status: self.status,
            activated: self.activated,
            config_generation: self.config_generation,
            queues,
            device: dev.state,
        }
    }

    /// Restarts the device `save` quiesced.
    pub fn resume_after_save(&mut self) {
        self.device.resume_after_save();
    }

    /// Takes `state` (a file) into this freshly built transport: the device
    /// type, queue count and sizes must be this device's, the features ones
    /// it offers, and an activated device's rings must lie in guest memory;
    /// then the device restores its own state (an activated one starts
    /// running, so the transport restores its interrupt state first).
    /// `what` names the transport in errors.
    pub fn restore(
        &mut self,
        state: &CommonState,
        what: &'static str,
    ) -> Result<(), VirtioPersistError> {
        state.check(self.device.as_ref(), what)?;
        let queues = state
            .queues
            .iter()
            .zip(self.device.queue_max_sizes())
            .enumerate()
            .map(|(i, (q, max))| q.to_queue(i, *max, &self.mem))
            .collect::<Result<Vec<_>, _>>()?;
        self.queue_select = state.queue_select;
        self.device_features_select = state.device_features_select;
        self.driver_features_select = state.driver_features_select;
        self.driver_features = state.driver_features;
        self.status = state.status;
        self.config_generation = state.config_generation;
        if state.activated {
            if queues.iter().any(|q| !q.ready()) {
                return Err(VirtioPersistError::State {
                    what,
                    detail: "an activated device has a queue that is not ready".into(),
                });
            }
            self.device.set_acked_features(state.driver_features);
            let active = ActiveArgs {
                mem: self.mem.clone(),
                queues,
                interrupt: self.interrupt.clone(),
            };
            self.queues = Vec::new();
            self.device.restore(Some(active), &state.device)?;
            self.activated = true;
        } else {
            self.device.restore(None, &state.device)?;
            self.queues = queues;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::devices::virtio::test_utils::{guest_memory, CountingDevice, CountingInterrupt};
    use std::sync::atomic::Ordering;

    impl TransportInterrupt for CountingInterrupt {
        fn reset(&self) {
            self.used.store(0, Ordering::SeqCst);
            self.config.store(0, Ordering::SeqCst);
        }
    }

    fn common() -> (
        VirtioCommon<CountingInterrupt>,
        Arc<std::sync::Mutex<Vec<String>>>,
    ) {
        let (dev, log) = CountingDevice::new();
        let irq = Arc::new(CountingInterrupt::default());
        (VirtioCommon::new(Box::new(dev), guest_memory(), irq), log)
    }

    fn set_up_queue(c: &mut VirtioCommon<CountingInterrupt>) {
        c.set_queue_select(0);
        c.with_queue(|q| q.set_size(16));
        c.set_queue_ring(Ring::Desc, Some(0x1_0000), Some(0));
        c.set_queue_ring(Ring::Avail, Some(0x2_0000), None);
        c.set_queue_ring(Ring::Used, Some(0x3_0000), None);
        c.with_queue(|q| q.set_ready(true));
    }

    const UP: u32 = VIRTIO_CONFIG_S_ACKNOWLEDGE | VIRTIO_CONFIG_S_DRIVER;

    #[test]
    fn feature_words_are_negotiated_then_frozen() {
        let (mut c, _) = common();
        c.set_device_features_select(1);
        assert_eq!(c.device_features_word(), 1, "VERSION_1 in the high word");
        c.set_device_features_select(2);
        assert_eq!(c.device_features_word(), 0, "no third word");
        c.set_driver_features_select(1);
        c.set_driver_features_word(1);
        c.set_driver_features_select(7);
        c.set_driver_features_word(0xffff_ffff); // no such word: ignored
        assert_eq!(c.driver_features_word(), 0);
        c.set_status(UP | VIRTIO_CONFIG_S_FEATURES_OK);
        assert_ne!(c.status() & VIRTIO_CONFIG_S_FEATURES_OK, 0);
        c.set_driver_features_select(0);
        c.set_driver_features_word(0xff);
        assert_eq!(c.driver_features_word(), 0, "frozen after FEATURES_OK");
        c.set_driver_features_select(1);
        assert_eq!(c.driver_features_word(), 1);
    }

    #[test]
    fn driver_ok_activates_and_zero_resets_everything() {
        let (mut c, log) = common();
        c.set_driver_features_select(1);
        c.set_driver_features_word(1);
        c.set_status(UP | VIRTIO_CONFIG_S_FEATURES_OK);
        set_up_queue(&mut c);
        assert_eq!(c.queue_ring(Ring::Avail), 0x2_0000);
        c.queue_notify(0); // before activation: dropped
        c.set_status(UP | VIRTIO_CONFIG_S_FEATURES_OK | VIRTIO_CONFIG_S_DRIVER_OK);
        assert!(c.is_activated());
        assert!(c.selected_queue().is_none(), "queue setup frozen");
        c.queue_notify(3);
        c.interrupt().signal_config();
        c.set_status(0);
        assert!(!c.is_activated());
        assert_eq!((c.status(), c.driver_features_select()), (0, 0));
        assert_eq!(c.interrupt().config.load(Ordering::SeqCst), 0);
        assert_eq!(c.selected_queue().map(|q| q.ready()), Some(false));
        assert_eq!(
            *log.lock().expect("ok"),
            vec!["acked 100000000", "activate 1", "notify 3", "reset"]
        );
    }

    #[test]
    fn a_bad_ring_or_unready_queue_needs_reset() {
        let (mut c, _) = common();
        c.set_driver_features_select(1);
        c.set_driver_features_word(1);
        c.set_status(UP | VIRTIO_CONFIG_S_FEATURES_OK);
        c.set_status(UP | VIRTIO_CONFIG_S_FEATURES_OK | VIRTIO_CONFIG_S_DRIVER_OK);
        assert!(!c.is_activated(), "queue 0 not ready");
        assert_ne!(c.status() & VIRTIO_CONFIG_S_NEEDS_RESET, 0);
        c.set_status(0);
        c.set_status(UP | VIRTIO_CONFIG_S_FEATURES_OK);
        set_up_queue(&mut c);
        c.set_queue_ring(Ring::Used, None, Some(0xffff_ffff));
        c.set_status(UP | VIRTIO_CONFIG_S_FEATURES_OK | VIRTIO_CONFIG_S_DRIVER_OK);
        assert!(!c.is_activated(), "used ring outside memory");
        // DEVICE_NEEDS_RESET is the device's: a driver cannot clear it.
        c.set_status(UP);
        assert_ne!(c.status() & VIRTIO_CONFIG_S_NEEDS_RESET, 0);
    }

    #[test]
    fn state_round_trips_and_a_file_is_checked() {
        let (mut c, _) = common();
        c.set_driver_features_select(1);
        c.set_driver_features_word(1);
        c.set_status(UP | VIRTIO_CONFIG_S_FEATURES_OK);
        set_up_queue(&mut c);
        c.write_config(0, &[1]);
        let s = c.save();
        assert_eq!(s.config_generation, 1);
        let (mut r, _) = common();
        r.restore(&s, "test").expect("restores");
        assert_eq!(r.save(), s);
        let (mut wrong, _) = common();
        let mut other = s.clone();
        other.device_type = 1;
        assert!(matches!(
            wrong.restore(&other, "test"),
            Err(VirtioPersistError::DeviceType { .. })
        ));
        let mut unoffered = s.clone();
        unoffered.driver_features = 1 << 5;
        let e = wrong.restore(&unoffered, "test").unwrap_err().to_string();
        assert!(e.contains("does not offer"), "{e}");
        let mut unready = s;
        unready.activated = true;
        unready.queues[0].ready = false;
        assert!(wrong.restore(&unready, "test").is_err());
    }
}
