//! Virtio devices (virtio 1.2) and their transports.
//!
//! A device implements `VirtioDevice` and knows no transport. Two transports
//! carry it: `mmio::MmioTransport` (a virtio-mmio version 2 register window
//! on the MMIO bus) and `pci::VirtioPciDevice` (a modern virtio-pci function
//! with MSI-X). Both map their registers onto one `transport::VirtioCommon`,
//! which holds what they share (features, queue setup, the status machine,
//! reset, snapshots) and, when the driver sets DRIVER_OK, hands the device
//! its validated queues, the guest memory and a `VirtioInterrupt`. Queues
//! are virtio-queue's `Queue`; chain walking, loop and length limits are
//! virtio-queue's.
//!
//! Devices that work off the vCPU threads (block, net, vsock, console) all
//! use `worker::DeviceWorker`: an event-manager loop over the device's
//! `event_handler.rs` subscriber, woken only by its fds (no polling), held
//! in a `worker_slot::WorkerSlot` that runs the lifecycle around it (start,
//! notify, stop, park on save, resume after save). A device's worker-side
//! state lives in its own file (`active.rs`; vsock's `muxer.rs`), which its
//! `device.rs` and `persist.rs` both use and which uses neither.

pub mod block;
pub mod console;
pub mod mmio;
pub mod net;
pub mod pci;
pub mod persist;
pub mod rng;
#[cfg(test)]
pub mod test_utils;
pub mod transport;
pub mod vsock;
pub mod worker;
pub mod worker_slot;

use std::sync::Arc;

use virtio_queue::Queue;

use crate::guest_memory::GuestMemoryMmap;
pub use persist::{ActiveArgs, DeviceSnapshot, VirtioPersistError};

/// Raises the device's interrupt: the one boundary between a device model
/// and its transport's interrupt delivery. virtio-mmio has one line for
/// everything (InterruptStatus says which); virtio-pci has an MSI-X vector
/// per queue and one for configuration changes, so a device names the queue.
pub trait VirtioInterrupt: Send + Sync {
    /// Queue `queue`'s used ring has new entries.
    fn signal_used_queue(&self, queue: u16);
    /// The configuration space changed.
    fn signal_config(&self);
}

/// A device activation failure.
#[derive(Debug, thiserror::Error)]
pub enum ActivateError {
    /// The driver set up a different number of queues.
    #[error("device expects {expected} queue(s), driver enabled {got}")]
    QueueCount {
        /// Expected.
        expected: usize,
        /// Given.
        got: usize,
    },
    /// A worker thread could not start.
    #[error("cannot start the device worker thread")]
    Worker(#[source] std::io::Error),
}

impl ActivateError {
    /// `Ok` when the driver enabled exactly the `expected` number of queues.
    pub fn check_queue_count<T>(queues: &[T], expected: usize) -> Result<(), ActivateError> {
        if queues.len() == expected {
            Ok(())
        } else {
            Err(ActivateError::QueueCount {
                expected,
                got: queues.len(),
            })
        }
    }
}

/// A virtio device model, independent of transport.
pub trait VirtioDevice: Send {
    /// Virtio device ID (5.x: 2 = block).
    fn device_type(&self) -> u32;
    /// Maximum size of each queue; the length is the queue count.
    fn queue_max_sizes(&self) -> &[u16];
    /// Feature bits offered.
    fn avail_features(&self) -> u64;
    /// Records the features the driver accepted (a subset of `avail_features`).
    fn set_acked_features(&mut self, features: u64);
    /// Reads the device configuration space; out-of-range bytes read as 0.
    fn read_config(&self, offset: u64, data: &mut [u8]);
    /// Writes the device configuration space; the device may ignore it.
    fn write_config(&mut self, offset: u64, data: &[u8]);
    /// Starts the device with the driver's queues.
    fn activate(
        &mut self,
        mem: GuestMemoryMmap,
        queues: Vec<Queue>,
        interrupt: Arc<dyn VirtioInterrupt>,
    ) -> Result<(), ActivateError>;
    /// The driver notified queue `index` (any value: the guest chooses it).
    fn queue_notify(&mut self, index: u32);
    /// Stops the device and forgets the queues (driver wrote status 0).
    fn reset(&mut self);
    /// Snapshot: the device's own state and, when activated, the state of
    /// the queues it owns. Called with every vCPU paused. A device with a
    /// worker thread stops it to take its queues (and in-flight work) back
    /// and stays quiesced (writing no guest memory) until
    /// `resume_after_save`, so guest memory saved meanwhile matches.
    fn save(&mut self) -> DeviceSnapshot;
    /// Restarts what `save` quiesced: the VM runs on unchanged.
    fn resume_after_save(&mut self);
    /// Restore into a freshly built device (acked features already set).
    /// `active` carries the queues rebuilt and checked from the file when
    /// the device was activated at snapshot time; `state` is the device's
    /// own `save` output, from a file: validate it.
    fn restore(
        &mut self,
        active: Option<ActiveArgs>,
        state: &[u8],
    ) -> Result<(), VirtioPersistError>;
}

/// Copies `src` bytes at `offset` into `data`, zero-filling what lies outside.
pub fn read_config_bytes(src: &[u8], offset: u64, data: &mut [u8]) {
    for (i, b) in data.iter_mut().enumerate() {
        *b = offset
            .checked_add(i as u64)
            .and_then(|o| usize::try_from(o).ok())
            .and_then(|o| src.get(o))
            .copied()
            .unwrap_or(0);
    }
}

#[cfg(test)]
mod activate_tests {
    use super::ActivateError;

    #[test]
    fn queue_count_must_match_exactly() {
        assert!(ActivateError::check_queue_count(&[1, 2, 3], 3).is_ok());
        let err = ActivateError::check_queue_count(&[1], 3).unwrap_err();
        assert_eq!(
            err.to_string(),
            "device expects 3 queue(s), driver enabled 1"
        );
    }
}
