//! Virtio state for snapshots (style guide §1, "the persist pattern"):
//! a serde mirror of virtio-queue's `QueueState`, the state a device hands
//! its transport (`DeviceSnapshot`), and the errors a restore refuses with.
//!
//! Every device implements `VirtioDevice::save` / `VirtioDevice::restore`
//! with its own plain `<Dev>State` (in the device's `persist.rs`), encoded as
//! msgpack inside `DeviceSnapshot::state`, so the transport and the VM's
//! snapshot code never name a concrete device and a new device (virtio-net)
//! only implements the two methods.
//!
//! Everything here comes back from a file: queues are rebuilt through
//! virtio-queue's checked `TryFrom<QueueState>` and then checked against
//! guest memory; device state decodes strictly and is validated by the
//! device.

use std::sync::Arc;

use serde::{de::DeserializeOwned, Deserialize, Serialize};
use virtio_queue::{Queue, QueueState, QueueT};

use super::VirtioInterrupt;
use crate::guest_memory::GuestMemoryMmap;

/// virtio-queue's `QueueState`, as a snapshot stores it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueueSnapshot {
    /// Largest size the device offers.
    pub max_size: u16,
    /// The driver's chosen size.
    pub size: u16,
    /// QueueReady.
    pub ready: bool,
    /// Descriptor table GPA.
    pub desc_table: u64,
    /// Available ring GPA.
    pub avail_ring: u64,
    /// Used ring GPA.
    pub used_ring: u64,
    /// Next available-ring entry the device will read.
    pub next_avail: u16,
    /// Next used-ring entry the device will write.
    pub next_used: u16,
    /// VIRTIO_F_RING_EVENT_IDX negotiated.
    pub event_idx_enabled: bool,
}

impl From<QueueState> for QueueSnapshot {
    fn from(q: QueueState) -> QueueSnapshot {
        QueueSnapshot {
            max_size: q.max_size,
            size: q.size,
            ready: q.ready,
            desc_table: q.desc_table,
            avail_ring: q.avail_ring,
            used_ring: q.used_ring,
            next_avail: q.next_avail,
            next_used: q.next_used,
            event_idx_enabled: q.event_idx_enabled,
        }
    }
}

impl QueueSnapshot {
    /// The state of `q`.
    pub fn of(q: &Queue) -> QueueSnapshot {
        q.state().into()
    }

    /// Rebuilds queue `index` (of a device whose queue `index` offers
    /// `max_size`): sizes and alignment through virtio-queue's checks and,
    /// for a ready queue, its rings inside `mem`.
    pub fn to_queue(
        &self,
        index: usize,
        max_size: u16,
        mem: &GuestMemoryMmap,
    ) -> Result<Queue, VirtioPersistError> {
        let bad = |detail: String| VirtioPersistError::Queue { index, detail };
        if self.max_size != max_size {
            return Err(bad(format!(
                "max size {} where the device offers {max_size}",
                self.max_size
            )));
        }
        let state = QueueState {
            max_size: self.max_size,
            next_avail: self.next_avail,
            next_used: self.next_used,
            event_idx_enabled: self.event_idx_enabled,
            size: self.size,
            ready: self.ready,
            desc_table: self.desc_table,
            avail_ring: self.avail_ring,
            used_ring: self.used_ring,
        };
        let q = Queue::try_from(state).map_err(|e| bad(e.to_string()))?;
        if q.ready() && !q.is_valid(mem) {
            return Err(bad(
                "its rings lie outside guest memory or are misaligned".into()
            ));
        }
        Ok(q)
    }
}

/// What a device's `save` returns.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceSnapshot {
    /// The queues the device owns (activated devices), in queue order;
    /// empty when it is not activated.
    pub queues: Vec<QueueSnapshot>,
    /// The device's own `<Dev>State`, msgpack ([`encode_state`]).
    pub state: Vec<u8>,
}

/// What an activated device is restored with (the `activate` arguments).
pub struct ActiveArgs {
    /// Guest memory.
    pub mem: GuestMemoryMmap,
    /// Its queues, rebuilt and checked from the file.
    pub queues: Vec<Queue>,
    /// Its interrupt.
    pub interrupt: Arc<dyn VirtioInterrupt>,
}

/// Why a virtio device's state was refused.
#[derive(Debug, thiserror::Error)]
pub enum VirtioPersistError {
    /// The snapshot's device at this slot is another kind of device.
    #[error("the snapshot has a device of type {found} where this VM has type {expected} (restore into a VM with the same devices, in the same order)")]
    DeviceType {
        /// Type in the file.
        found: u32,
        /// Type here.
        expected: u32,
    },
    /// A queue's state is unusable.
    #[error("queue {index}: {detail}")]
    Queue {
        /// Queue index.
        index: usize,
        /// What is wrong.
        detail: String,
    },
    /// The transport's or device's state is inconsistent.
    #[error("invalid {what} state: {detail}")]
    State {
        /// Whose state ("virtio-mmio", "virtio-blk", ...).
        what: &'static str,
        /// What is wrong.
        detail: String,
    },
    /// A device worker could not restart.
    #[error("cannot restart the device")]
    Activate(#[from] super::ActivateError),
}

/// A device's `Persist::restore` rebuilds its worker's resources (eventfds,
/// the worker thread); when the host refuses one, the restore fails as an
/// activation would, under "cannot restart the device". So each device's
/// impl maps state only and passes such errors on with `?`.
impl From<std::io::Error> for VirtioPersistError {
    fn from(e: std::io::Error) -> Self {
        VirtioPersistError::Activate(super::ActivateError::Worker(e))
    }
}

/// Encodes a device's plain state (cannot fail for the plain data devices
/// keep: no maps with non-string keys, no unsized sequences).
pub fn encode_state<T: Serialize>(state: &T) -> Vec<u8> {
    rmp_serde::to_vec(state).expect("plain device state always encodes")
}

/// Decodes `what`'s state from a file (msgpack, untrusted).
pub fn decode_state<T: DeserializeOwned>(
    what: &'static str,
    bytes: &[u8],
) -> Result<T, VirtioPersistError> {
    rmp_serde::from_slice(bytes).map_err(|e| VirtioPersistError::State {
        what,
        detail: format!("does not decode: {e}"),
    })
}

/// Checks that `queues` is exactly `expected` long (an activated device's
/// queue count is fixed).
pub fn check_queue_count(
    what: &'static str,
    queues: &[Queue],
    expected: usize,
) -> Result<(), VirtioPersistError> {
    if queues.len() == expected {
        return Ok(());
    }
    Err(VirtioPersistError::State {
        what,
        detail: format!("{} queues, the device has {expected}", queues.len()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::devices::virtio::test_utils::guest_memory;
    use virtio_queue::mock::MockSplitQueue;
    use vm_memory::GuestAddress;

    #[test]
    fn a_host_refusal_on_restore_reads_as_a_failed_restart() {
        let e = VirtioPersistError::from(std::io::Error::other("no eventfd"));
        let mut chain = vec![e.to_string()];
        let mut cause = std::error::Error::source(&e);
        while let Some(c) = cause {
            chain.push(c.to_string());
            cause = c.source();
        }
        assert_eq!(
            chain,
            [
                "cannot restart the device",
                "cannot start the device worker thread",
                "no eventfd"
            ]
        );
    }

    #[test]
    fn queue_state_round_trips_and_is_checked() {
        let mem = guest_memory();
        let mock = MockSplitQueue::create(&mem, GuestAddress(0), 16);
        let mut q: Queue = mock.create_queue().expect("queue");
        q.set_next_avail(3);
        let snap = QueueSnapshot::of(&q);
        let bytes = encode_state(&snap);
        let back: QueueSnapshot = decode_state("queue", &bytes).expect("decodes");
        let q2 = back.to_queue(0, 16, &mem).expect("valid");
        assert_eq!(q2.state(), q.state());

        let e = back.to_queue(0, 256, &mem).unwrap_err().to_string();
        assert!(e.contains("max size 16"), "{e}");
        let mut far = back;
        far.used_ring = 0xffff_0000_0000;
        let e = far.to_queue(1, 16, &mem).unwrap_err().to_string();
        assert!(e.starts_with("queue 1:"), "{e}");
        let mut odd = back;
        odd.size = 3;
        assert!(
            odd.to_queue(0, 16, &mem).is_err(),
            "size not a power of two"
        );
        assert!(decode_state::<QueueSnapshot>("queue", &[0xc1]).is_err());
    }
}
