//! The virtio-vsock `VirtioDevice`: config space (the guest CID), three
//! queues (rx, tx, event), and a worker thread per activation that runs the
//! muxer. A notify from a vCPU only writes the worker's kick eventfd.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use virtio_bindings::virtio_config::VIRTIO_F_VERSION_1;
use virtio_bindings::virtio_ids::VIRTIO_ID_VSOCK;
use virtio_queue::Queue;
use vmm_sys_util::eventfd::EventFd;

use super::defs::{EVQ, QUEUE_SIZE, RXQ, TXQ};
use super::host::VsockHost;
use super::muxer::Muxer;
use crate::devices::virtio::{read_config_bytes, ActivateError, VirtioDevice, VirtioInterrupt};
use crate::vstate::memory::GuestMemoryMmap;

/// How long the worker sleeps between checks of its stop flag when idle.
const IDLE_WAIT: Duration = Duration::from_millis(200);

struct Worker {
    stop: Arc<AtomicBool>,
    kick: Arc<EventFd>,
    thread: JoinHandle<()>,
}

/// A virtio-vsock device.
pub struct Vsock {
    host: VsockHost,
    config_space: [u8; 8],
    acked_features: u64,
    worker: Option<Worker>,
}

impl Vsock {
    /// A device whose host side is `host` (which carries the guest CID).
    pub fn new(host: VsockHost) -> Vsock {
        let config_space = host.guest_cid().to_le_bytes();
        Vsock {
            host,
            config_space,
            acked_features: 0,
            worker: None,
        }
    }

    fn stop_worker(&mut self) {
        if let Some(w) = self.worker.take() {
            w.stop.store(true, Ordering::SeqCst);
            let _ = w.kick.write(1);
            let _ = w.thread.join();
        }
        // Dropping the muxer closed every connection's host end (EOF for
        // the host); pending connects learn that the device went away.
        let mut st = self.host.state();
        st.active = false;
        st.connects.clear();
    }
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
        let _evq = queues.remove(EVQ);
        let txq = queues.remove(TXQ);
        let rxq = queues.remove(RXQ);
        let kick = Arc::new(EventFd::new(libc::EFD_NONBLOCK).map_err(ActivateError::Worker)?);
        let stop = Arc::new(AtomicBool::new(false));
        let mut muxer = Muxer::new(self.host.clone(), mem, rxq, txq, interrupt, kick.clone());
        let s = stop.clone();
        let thread = std::thread::Builder::new()
            .name("virtio-vsock".into())
            .spawn(move || {
                while !s.load(Ordering::SeqCst) {
                    muxer.run_once(IDLE_WAIT);
                }
            })
            .map_err(ActivateError::Worker)?;
        self.host.state().active = true;
        self.worker = Some(Worker { stop, kick, thread });
        Ok(())
    }

    fn queue_notify(&mut self, _index: u32) {
        if let Some(w) = &self.worker {
            let _ = w.kick.write(1);
        }
    }

    fn reset(&mut self) {
        self.stop_worker();
        self.acked_features = 0;
    }
}
