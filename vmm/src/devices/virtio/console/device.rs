//! The virtio-console `VirtioDevice`: feature bits, the config space
//! (`max_nr_ports` 1), four queues, and a device worker per activation
//! (`worker_slot::WorkerSlot`) that runs `ActiveConsole`. A notify from a
//! vCPU only writes the worker's kick eventfd.

use std::collections::VecDeque;
use std::sync::Arc;

use virtio_bindings::virtio_config::VIRTIO_F_VERSION_1;
use virtio_bindings::virtio_ids::VIRTIO_ID_CONSOLE;
use virtio_queue::Queue;

use super::active::{ActiveConsole, PortState};
use super::defs::{F_MULTIPORT, MAX_NR_PORTS, QUEUE_COUNT, QUEUE_SIZE};
use super::host::ConsoleHost;
use super::persist::{ConsoleConstructorArgs, ConsoleState};
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

/// A virtio-console device with one named port.
pub struct VirtioConsole {
    host: ConsoleHost,
    acked_features: u64,
    /// The activated device, on its worker or parked by a save.
    worker: WorkerSlot<ActiveConsole>,
}

/// cols (le16), rows (le16), max_nr_ports (le32), emerg_wr (le32).
fn config_space() -> [u8; 12] {
    let mut c = [0u8; 12];
    c[4..8].copy_from_slice(&MAX_NR_PORTS.to_le_bytes());
    c
}

impl VirtioConsole {
    /// A device whose port's host side is `host`.
    pub fn new(host: ConsoleHost) -> VirtioConsole {
        VirtioConsole {
            host,
            acked_features: 0,
            worker: WorkerSlot::new("virtio-console"),
        }
    }

    /// Stops the worker (if any) and ends the session: the host end reads
    /// EOF, connects waiting are told.
    fn stop_worker(&mut self) {
        if let Some(mut active) = self.worker.stop() {
            active.shut_down();
        }
        self.host.set_active(false);
    }

    fn start_worker(&mut self, active: ActiveConsole) -> Result<(), ActivateError> {
        self.worker.start(active)?;
        self.host.set_active(true);
        Ok(())
    }
}

impl Drop for VirtioConsole {
    fn drop(&mut self) {
        self.stop_worker();
    }
}

impl VirtioDevice for VirtioConsole {
    fn device_type(&self) -> u32 {
        VIRTIO_ID_CONSOLE
    }

    fn queue_max_sizes(&self) -> &[u16] {
        &[QUEUE_SIZE; QUEUE_COUNT]
    }

    fn avail_features(&self) -> u64 {
        (1u64 << VIRTIO_F_VERSION_1) | (1u64 << F_MULTIPORT)
    }

    fn set_acked_features(&mut self, features: u64) {
        self.acked_features = features & self.avail_features();
    }

    fn read_config(&self, offset: u64, data: &mut [u8]) {
        read_config_bytes(&config_space(), offset, data);
    }

    fn write_config(&mut self, _offset: u64, _data: &[u8]) {
        // emerg_wr is not offered (no VIRTIO_CONSOLE_F_EMERG_WRITE).
    }

    fn activate(
        &mut self,
        mem: GuestMemoryMmap,
        queues: Vec<Queue>,
        interrupt: Arc<dyn VirtioInterrupt>,
    ) -> Result<(), ActivateError> {
        // Without MULTIPORT a driver uses two queues and no names: the
        // agent could not find the port, so it is not served.
        ActivateError::check_queue_count(&queues, QUEUE_COUNT)?;
        self.stop_worker();
        let active = ActiveConsole::new(
            self.host.clone(),
            mem,
            queues,
            interrupt,
            PortState::default(),
            VecDeque::new(),
        )
        .map_err(ActivateError::Worker)?;
        self.start_worker(active)
    }

    fn queue_notify(&mut self, _index: u32) {
        self.worker.notify();
    }

    fn reset(&mut self) {
        self.stop_worker();
        self.acked_features = 0;
    }

    fn save(&mut self) -> DeviceSnapshot {
        let Some(active) = self.worker.park() else {
            return DeviceSnapshot {
                queues: Vec::new(),
                state: encode_state(&ConsoleState::default()),
            };
        };
        let state = encode_state(&active.save());
        let queues = active.queues().iter().map(QueueSnapshot::of).collect();
        DeviceSnapshot { queues, state }
    }

    fn resume_after_save(&mut self) {
        // The same session goes on in a new worker.
        if self.worker.resume().is_err() {
            self.stop_worker();
        }
    }

    fn restore(
        &mut self,
        active: Option<ActiveArgs>,
        state: &[u8],
    ) -> Result<(), VirtioPersistError> {
        let state: ConsoleState = decode_state("virtio-console", state)?;
        let Some(a) = active else {
            return Ok(());
        };
        check_queue_count("virtio-console", &a.queues, QUEUE_COUNT)?;
        let args = ConsoleConstructorArgs {
            host: self.host.clone(),
            mem: a.mem,
            queues: a.queues,
            interrupt: a.interrupt,
        };
        let active = ActiveConsole::restore(args, &state)?;
        Ok(self.start_worker(active)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::devices::virtio::console::ConsoleConnectError;
    use crate::devices::virtio::test_utils::{guest_memory, CountingInterrupt};
    use std::time::Duration;
    use virtio_queue::QueueT;

    #[test]
    fn config_features_activation_and_reset_drive_the_host_side() {
        let host = ConsoleHost::new().expect("host");
        let mut dev = VirtioConsole::new(host.clone());
        assert_eq!(dev.device_type(), 3);
        assert_eq!(dev.queue_max_sizes().len(), 4);
        assert_eq!(dev.avail_features(), (1 << 32) | (1 << 1));
        let mut cfg = [0xffu8; 12];
        dev.read_config(0, &mut cfg);
        assert_eq!(cfg, [0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0], "max_nr_ports 1");
        assert!(matches!(
            host.connect(Duration::from_millis(1)),
            Err(ConsoleConnectError::NotActive)
        ));
        let irq = Arc::new(CountingInterrupt::default());
        // A driver without MULTIPORT sets up two queues: refused.
        let two = (0..2)
            .map(|_| Queue::new(QUEUE_SIZE).expect("queue"))
            .collect();
        assert!(dev.activate(guest_memory(), two, irq.clone()).is_err());
        let four = (0..4)
            .map(|_| Queue::new(QUEUE_SIZE).expect("queue"))
            .collect();
        dev.activate(guest_memory(), four, irq).expect("activates");
        // Active, but the guest never opened the port: a connect times out.
        assert!(matches!(
            host.connect(Duration::from_millis(20)),
            Err(ConsoleConnectError::Timeout { .. })
        ));
        // A snapshot quiesces and resumes the worker.
        let snap = dev.save();
        assert_eq!(snap.queues.len(), 4);
        dev.resume_after_save();
        dev.reset();
        assert!(matches!(
            host.connect(Duration::from_millis(1)),
            Err(ConsoleConnectError::NotActive)
        ));
    }
}
