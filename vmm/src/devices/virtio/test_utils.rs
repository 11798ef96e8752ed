//! Test doubles for virtio devices: guest memory and a device that records calls.

use std::sync::{Arc, Mutex};

use event_manager::{EventManager, Events, MutEventSubscriber, SubscriberId, SubscriberOps};
use vmm_sys_util::epoll::EventSet;
use vmm_sys_util::eventfd::EventFd;

use virtio_queue::Queue;
use vm_memory::GuestAddress;

use super::{ActivateError, VirtioDevice, VirtioInterrupt};
use crate::guest_memory::GuestMemoryMmap;

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

/// Registers a stray eventfd with subscriber `id` of `em`, makes it
/// readable, and checks the subscriber counts one unexpected event (read
/// with `count`) and stops watching the fd (no second event).
pub fn assert_stray_fd_is_counted<S: MutEventSubscriber>(
    em: &mut EventManager<S>,
    id: SubscriberId,
    count: impl Fn(&mut S) -> u64,
) {
    let before = count(em.subscriber_mut(id).expect("subscriber"));
    let stray = EventFd::new(libc::EFD_NONBLOCK).expect("eventfd");
    em.event_ops(id)
        .expect("ops")
        .add(Events::new(&stray, EventSet::IN))
        .expect("add stray");
    stray.write(1).expect("write");
    assert_eq!(em.run_with_timeout(1000).expect("run"), 1);
    // Still readable, but no longer watched: no second event.
    assert_eq!(em.run_with_timeout(0).expect("run"), 0);
    let after = count(em.subscriber_mut(id).expect("subscriber"));
    assert_eq!(after, before + 1, "one unexpected event counted");
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
    fn signal_used_queue(&self, _queue: u16) {
        self.used.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }
    fn signal_config(&self) {
        self.config
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }
}
