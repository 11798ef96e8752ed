//! Test doubles for virtio devices: guest memory and a device that records calls.

use std::sync::{Arc, Mutex};

use virtio_queue::Queue;
use vm_memory::GuestAddress;

use super::{ActivateError, VirtioDevice, VirtioInterrupt};
use crate::vstate::memory::GuestMemoryMmap;

/// 4 MiB of anonymous guest memory at GPA 0.
pub fn guest_memory() -> GuestMemoryMmap {
    GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 4 << 20)]).expect("anonymous test memory")
}

/// A device with one 16-entry queue that logs what the transport does to it.
pub struct CountingDevice {
    log: Arc<Mutex<Vec<String>>>,
}

impl CountingDevice {
    /// The device and its log.
    pub fn new() -> (CountingDevice, Arc<Mutex<Vec<String>>>) {
        let log = Arc::new(Mutex::new(Vec::new()));
        (CountingDevice { log: log.clone() }, log)
    }

    fn push(&self, s: String) {
        self.log.lock().expect("not poisoned").push(s);
    }
}

impl VirtioDevice for CountingDevice {
    fn device_type(&self) -> u32 {
        42
    }
    fn queue_max_sizes(&self) -> &[u16] {
        &[16]
    }
    fn avail_features(&self) -> u64 {
        1 << 32
    }
    fn set_acked_features(&mut self, features: u64) {
        self.push(format!("acked {features:x}"));
    }
    fn read_config(&self, offset: u64, data: &mut [u8]) {
        super::read_config_bytes(&[1, 2, 3, 4], offset, data);
    }
    fn write_config(&mut self, _offset: u64, _data: &[u8]) {}
    fn activate(
        &mut self,
        _mem: GuestMemoryMmap,
        queues: Vec<Queue>,
        _interrupt: Arc<dyn VirtioInterrupt>,
    ) -> Result<(), ActivateError> {
        self.push(format!("activate {}", queues.len()));
        Ok(())
    }
    fn queue_notify(&mut self, index: u32) {
        self.push(format!("notify {index}"));
    }
    fn reset(&mut self) {
        self.push("reset".into());
    }
    fn save(&mut self) -> super::DeviceSnapshot {
        self.push("save".into());
        super::DeviceSnapshot::default()
    }
    fn resume_after_save(&mut self) {
        self.push("resume".into());
    }
    fn restore(
        &mut self,
        active: Option<super::ActiveArgs>,
        _state: &[u8],
    ) -> Result<(), super::VirtioPersistError> {
        self.push(format!("restore {}", active.map_or(0, |a| a.queues.len())));
        Ok(())
    }
}

/// An interrupt that counts signals.
#[derive(Default)]
pub struct CountingInterrupt {
    /// Used-queue signals.
    pub used: std::sync::atomic::AtomicUsize,
    /// Configuration-change signals.
    pub config: std::sync::atomic::AtomicUsize,
}

impl VirtioInterrupt for CountingInterrupt {
    fn signal_used_queue(&self) {
        self.used.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }
    fn signal_config(&self) {
        self.config
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }
}
