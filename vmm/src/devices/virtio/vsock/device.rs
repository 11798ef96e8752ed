//! The virtio-vsock `VirtioDevice`: config space (the guest CID), three
//! queues (rx, tx, event), and a device worker per activation
//! (`worker_slot::WorkerSlot`) that runs the muxer's events. A notify from a
//! vCPU only writes the muxer's kick eventfd.

use std::sync::Arc;

use virtio_bindings::virtio_config::VIRTIO_F_VERSION_1;
use virtio_bindings::virtio_ids::VIRTIO_ID_VSOCK;
use virtio_queue::{Queue, QueueT};
use vm_memory::Bytes;
use vmm_sys_util::eventfd::EventFd;

use super::defs::{EVENT_TRANSPORT_RESET, EVQ, QUEUE_SIZE, RXQ, TXQ};
use super::muxer::Muxer;
use super::persist::{VsockConstructorArgs, VsockState};
use super::{VsockBackend, VsockHost};
use crate::devices::virtio::persist::{
    check_queue_count, decode_state, encode_state, QueueSnapshot,
};
use crate::devices::virtio::worker_slot::WorkerSlot;
use crate::devices::virtio::{
    read_config_bytes, ActivateError, ActiveArgs, DeviceSnapshot, VirtioDevice, VirtioInterrupt,
    VirtioPersistError,
};
use crate::guest_memory::GuestMemoryMmap;
use provium_snapshot::Persist;

/// A virtio-vsock device.
pub struct Vsock {
    host: Arc<dyn VsockBackend>,
    config_space: [u8; 8],
    acked_features: u64,
    /// The muxer (queues, connections), on its worker or parked by a save.
    worker: WorkerSlot<Muxer>,
    /// The event queue while activated (the muxer does not use it; a
    /// restore posts TRANSPORT_RESET on it).
    evq: Option<Queue>,
}

impl Vsock {
    /// A device whose host side is `host` (which carries the guest CID).
    pub fn new(host: VsockHost) -> Vsock {
        Vsock::with_backend(Arc::new(host))
    }

    /// A device over any host side (unit tests use a mock).
    pub fn with_backend(host: Arc<dyn VsockBackend>) -> Vsock {
        let config_space = host.guest_cid().to_le_bytes();
        Vsock {
            host,
            config_space,
            acked_features: 0,
            worker: WorkerSlot::new("virtio-vsock"),
            evq: None,
        }
    }

    fn stop_worker(&mut self) {
        drop(self.worker.stop());
        self.evq = None;
        // Dropping the muxer closed every connection's host end (EOF for
        // the host); pending connects learn that the device went away.
        self.host.set_active(false);
    }

    fn start_worker(&mut self, muxer: Muxer, evq: Queue) -> Result<(), ActivateError> {
        self.worker.start(muxer)?;
        self.evq = Some(evq);
        self.host.set_active(true);
        Ok(())
    }
}

/// Posts a TRANSPORT_RESET event (virtio 1.2, 5.10.6.6) on `evq`: the guest
/// driver drops every connection and re-reads the CID. Returns false when
/// the driver left no event buffer (then there is nothing to tell it with).
fn post_transport_reset(
    evq: &mut Queue,
    mem: &GuestMemoryMmap,
    interrupt: &dyn VirtioInterrupt,
) -> bool {
    let Some(chain) = evq.pop_descriptor_chain(mem) else {
        return false;
    };
    let head = chain.head_index();
    let mut used = 0;
    if let Some(d) = chain.writable().next() {
        if d.len() >= 4 && mem.write_obj(EVENT_TRANSPORT_RESET, d.addr()).is_ok() {
            used = 4;
        }
    }
    // add_used only fails for a head out of range, which a popped chain
    // cannot have.
    let ok = evq.add_used(mem, head, used).is_ok();
    if ok {
        interrupt.signal_used_queue(EVQ as u16);
    }
    ok && used == 4
}

impl Drop for Vsock {
    fn drop(&mut self) {
        self.stop_worker();
    }
}

impl VirtioDevice for Vsock {
    fn device_type(&self) -> u32 {
        VIRTIO_ID_VSOCK
    }

    fn queue_max_sizes(&self) -> &[u16] {
        &[QUEUE_SIZE; 3]
    }

    fn avail_features(&self) -> u64 {
        1u64 << VIRTIO_F_VERSION_1
    }

    fn set_acked_features(&mut self, features: u64) {
        self.acked_features = features & self.avail_features();
    }

    fn read_config(&self, offset: u64, data: &mut [u8]) {
        read_config_bytes(&self.config_space, offset, data);
    }

    fn write_config(&mut self, _offset: u64, _data: &[u8]) {
        // guest_cid is read-only.
    }

    fn activate(
        &mut self,
        mem: GuestMemoryMmap,
        mut queues: Vec<Queue>,
        interrupt: Arc<dyn VirtioInterrupt>,
    ) -> Result<(), ActivateError> {
        ActivateError::check_queue_count(&queues, 3)?;
        self.stop_worker();
        let evq = queues.remove(EVQ);
        let txq = queues.remove(TXQ);
        let rxq = queues.remove(RXQ);
        let kick = Arc::new(EventFd::new(libc::EFD_NONBLOCK).map_err(ActivateError::Worker)?);
        let muxer = Muxer::new(self.host.clone(), mem, rxq, txq, interrupt, kick)
            .map_err(ActivateError::Worker)?;
        self.start_worker(muxer, evq)
    }

    fn queue_notify(&mut self, _index: u32) {
        self.worker.notify();
    }

    fn reset(&mut self) {
        self.stop_worker();
        self.acked_features = 0;
    }

    fn save(&mut self) -> DeviceSnapshot {
        let (Some(muxer), Some(evq)) = (self.worker.park(), &self.evq) else {
            return DeviceSnapshot {
                queues: Vec::new(),
                state: encode_state(&VsockState {
                    guest_cid: self.host.guest_cid(),
                }),
            };
        };
        let state = encode_state(&muxer.save());
        let (rxq, txq) = muxer.queues();
        let queues = vec![
            QueueSnapshot::of(rxq),
            QueueSnapshot::of(txq),
            QueueSnapshot::of(evq),
        ];
        DeviceSnapshot { queues, state }
    }

    fn resume_after_save(&mut self) {
        // The same muxer, connections included, goes back to a new worker.
        if self.worker.resume().is_err() {
            self.stop_worker();
        }
    }

    fn restore(
        &mut self,
        active: Option<ActiveArgs>,
        state: &[u8],
    ) -> Result<(), VirtioPersistError> {
        let state: VsockState = decode_state("virtio-vsock", state)?;
        let Some(mut a) = active else {
            return Ok(());
        };
        check_queue_count("virtio-vsock", &a.queues, 3)?;
        let mut evq = a.queues.remove(EVQ);
        let txq = a.queues.remove(TXQ);
        let rxq = a.queues.remove(RXQ);
        // Connections are not restored: the host ends of the old ones belong
        // to another process or VM. The guest learns so from
        // TRANSPORT_RESET; host clients connect anew.
        post_transport_reset(&mut evq, &a.mem, a.interrupt.as_ref());
        let args = VsockConstructorArgs {
            host: self.host.clone(),
            mem: a.mem,
            rxq,
            txq,
            interrupt: a.interrupt,
        };
        let muxer = Muxer::restore(args, &state)?;
        Ok(self.start_worker(muxer, evq)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::devices::virtio::test_utils::{guest_memory, CountingInterrupt};
    use crate::devices::virtio::vsock::test_utils::TestBackend;
    use std::time::{Duration, Instant};

    fn activated() -> (Vsock, Arc<TestBackend>) {
        let backend = Arc::new(TestBackend::new(3));
        let mut dev = Vsock::with_backend(backend.clone());
        let queues = (0..3)
            .map(|_| Queue::new(QUEUE_SIZE).expect("queue"))
            .collect();
        dev.activate(
            guest_memory(),
            queues,
            Arc::new(CountingInterrupt::default()),
        )
        .expect("activate");
        (dev, backend)
    }

    /// An activated device with nothing to do does not wake its worker:
    /// stopping it is a kick, not a periodic check of the stop flag.
    #[test]
    fn an_idle_worker_sleeps_until_stopped() {
        let (mut dev, backend) = activated();
        // The quiet second is the measurement, not a wait for something.
        std::thread::sleep(Duration::from_secs(1));
        let _ = dev.save();
        let muxer = dev
            .worker
            .parked()
            .expect("the worker handed its muxer back");
        // The stop request is the worker's own and not counted; the margin
        // is for a stray wake-up, not a periodic one.
        assert!(
            muxer.metrics.wakeups <= 2,
            "an idle worker woke {} times in a second",
            muxer.metrics.wakeups
        );
        // A resumed worker still stops at once when asked.
        dev.resume_after_save();
        assert!(dev.worker.is_running());
        dev.reset();
        assert!(!dev.worker.is_running());
        assert!(!backend.is_active());
    }

    /// Against the mock backend: the device tells it when the driver runs
    /// and when it goes away, its worker takes the host's connects, and a
    /// reset drops a connect the guest never answered (its caller is told).
    #[test]
    fn the_device_drives_its_backend() {
        let (mut dev, backend) = activated();
        // `activate` first stops whatever ran before.
        assert_eq!(backend.activations(), [false, true]);
        let mut buf = [0u8; 8];
        dev.read_config(0, &mut buf);
        assert_eq!(
            u64::from_le_bytes(buf),
            3,
            "config space has the backend's CID"
        );
        let (_host_end, reply) = backend.push_connect(1234);
        let deadline = Instant::now() + Duration::from_secs(10);
        while backend.waiting_connects() > 0 {
            assert!(
                Instant::now() < deadline,
                "the worker never took the connect"
            );
            std::thread::yield_now();
        }
        dev.reset();
        assert_eq!(backend.activations(), [false, true, false]);
        assert!(
            reply.recv_timeout(Duration::from_secs(10)).is_err(),
            "the dropped connect's caller hears of it"
        );
        // Dropping a stopped device says so again (idempotent for the backend).
        drop(dev);
        assert!(!backend.is_active());
    }
}
