//! virtio-blk snapshot state.
//!
//! Saved: the completions a `slow` device still holds (their requests ran;
//! only the used-ring entry is owed), so a restored guest gets them. The
//! queue itself is saved by the transport. Not saved: the disk image (the
//! restoring VM's drive config names it; its contents are the host file's)
//! and the fault modes (the restoring host sets its own). Saved for a check:
//! the capacity the guest was told, which the restoring medium must match
//! (a disk slot's medium, `slot.rs`, is the restoring VM's to give back).
//!
//! `Persist` is implemented by the activated device's worker state
//! (`ActiveBlock`, `active.rs`): a device that was never activated has nothing of its own
//! to save (`BlockState::default()`).

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use provium_snapshot::Persist;
use serde::{Deserialize, Serialize};
use virtio_queue::{Queue, QueueT};

use super::active::{ActiveBlock, Pending};
use super::defs::SLOW_COMPLETION_MS;
use super::slot::Media;
use crate::devices::virtio::{VirtioInterrupt, VirtioPersistError};
use crate::guest_memory::GuestMemoryMmap;

/// One held completion.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PendingCompletion {
    /// Descriptor chain head.
    pub head: u16,
    /// Bytes written into the chain.
    pub used_len: u32,
}

/// The block device's own state.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BlockState {
    /// Completions held by `slow`, oldest first.
    pub pending: Vec<PendingCompletion>,
    /// The capacity the guest was told (0: an empty slot). A restore needs
    /// the same medium size, or the guest's idea of its disk is wrong.
    pub capacity_sectors: u64,
}

impl BlockState {
    /// Refuses a restoring device whose capacity is not the snapshot's.
    pub fn check_capacity(&self, restoring: u64) -> Result<(), VirtioPersistError> {
        if self.capacity_sectors == restoring {
            return Ok(());
        }
        Err(VirtioPersistError::State {
            what: "virtio-blk",
            detail: format!(
                "the snapshot's disk had {} sectors of 512 bytes but the restoring disk has {restoring} \
                 (an empty disk slot has 0); give the restore an image of the snapshot's size",
                self.capacity_sectors
            ),
        })
    }

    pub(super) fn of(pending: &VecDeque<Pending>, capacity_sectors: u64) -> BlockState {
        BlockState {
            capacity_sectors,
            pending: pending
                .iter()
                .map(|p| PendingCompletion {
                    head: p.head,
                    used_len: p.used_len,
                })
                .collect(),
        }
    }

    /// The held completions for a queue of `size`, due one `slow` delay
    /// after the restore. Refuses more completions than the queue has
    /// entries, or heads outside it.
    pub(super) fn pending(&self, size: u16) -> Result<VecDeque<Pending>, VirtioPersistError> {
        let bad = |detail: String| VirtioPersistError::State {
            what: "virtio-blk",
            detail,
        };
        if self.pending.len() > usize::from(size) {
            return Err(bad(format!(
                "{} in-flight completions for a queue of {size}",
                self.pending.len()
            )));
        }
        let due = Instant::now() + Duration::from_millis(SLOW_COMPLETION_MS);
        self.pending
            .iter()
            .map(|p| {
                if p.head >= size {
                    return Err(bad(format!(
                        "completion head {} outside a queue of {size}",
                        p.head
                    )));
                }
                Ok(Pending {
                    due,
                    head: p.head,
                    used_len: p.used_len,
                })
            })
            .collect()
    }
}

/// What an activated block device is rebuilt from besides its state.
pub struct BlockConstructorArgs {
    /// Guest memory.
    pub mem: GuestMemoryMmap,
    /// The request queue, rebuilt and checked from the file.
    pub queue: Queue,
    /// The restoring VM's disk and fault modes (or its slot).
    pub cfg: Media,
    /// The device's interrupt.
    pub interrupt: Arc<dyn VirtioInterrupt>,
}

impl Persist for ActiveBlock {
    type State = BlockState;
    type ConstructorArgs = BlockConstructorArgs;
    type Error = VirtioPersistError;

    fn save(&self) -> BlockState {
        BlockState::of(&self.pending, self.cfg.capacity_sectors())
    }

    fn restore(args: BlockConstructorArgs, state: &BlockState) -> Result<Self, Self::Error> {
        let pending = state.pending(args.queue.size())?;
        Ok(ActiveBlock::new(
            args.mem,
            args.queue,
            pending,
            args.cfg,
            args.interrupt,
        )?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::devices::virtio::block::{BlockConfig, DiskImage};
    use crate::devices::virtio::persist::{decode_state, encode_state};
    use crate::devices::virtio::test_utils::{guest_memory, CountingInterrupt};

    #[test]
    fn an_active_device_round_trips_through_save_encode_decode_restore() {
        let f = tempfile::NamedTempFile::new().expect("tempfile");
        std::fs::write(f.path(), vec![0u8; 4096]).expect("write");
        let cfg = BlockConfig {
            disk: Arc::new(DiskImage::open(f.path(), false, "id").expect("open disk")),
            faults: Arc::default(),
        };
        let args = |cfg: &BlockConfig| BlockConstructorArgs {
            mem: guest_memory(),
            queue: Queue::new(16).expect("queue"),
            cfg: cfg.clone().into(),
            interrupt: Arc::new(CountingInterrupt::default()),
        };
        let held = BlockState {
            pending: vec![
                PendingCompletion {
                    head: 4,
                    used_len: 513,
                },
                PendingCompletion {
                    head: 9,
                    used_len: 1,
                },
            ],
            capacity_sectors: 8,
        };
        let original = ActiveBlock::restore(args(&cfg), &held).expect("restores");
        let bytes = encode_state(&original.save());
        let decoded: BlockState = decode_state("virtio-blk", &bytes).expect("decodes");
        let restored = ActiveBlock::restore(args(&cfg), &decoded).expect("restores");
        assert_eq!(restored.save(), held);
        // The file is untrusted: a head outside the restoring queue is refused.
        let hostile = BlockState {
            pending: vec![PendingCompletion {
                head: 16,
                used_len: 0,
            }],
            capacity_sectors: 8,
        };
        let e = ActiveBlock::restore(args(&cfg), &hostile)
            .err()
            .expect("refused")
            .to_string();
        assert!(e.contains("head 16 outside a queue of 16"), "{e}");
    }

    #[test]
    fn state_round_trips_and_is_validated() {
        let s = BlockState {
            pending: vec![PendingCompletion {
                head: 3,
                used_len: 513,
            }],
            capacity_sectors: 8,
        };
        let back: BlockState = decode_state("virtio-blk", &encode_state(&s)).expect("decodes");
        assert_eq!(back, s);
        let p = back.pending(16).expect("fits");
        assert_eq!((p[0].head, p[0].used_len), (3, 513));
        let e = back.pending(2).unwrap_err().to_string();
        assert!(e.contains("head 3 outside a queue of 2"), "{e}");
        let many = BlockState {
            pending: vec![
                PendingCompletion {
                    head: 0,
                    used_len: 0
                };
                17
            ],
            capacity_sectors: 8,
        };
        assert!(many.pending(16).is_err());
        // A restore onto another medium size (an empty slot: 0) is refused.
        assert!(back.check_capacity(8).is_ok());
        let e = back.check_capacity(0).unwrap_err().to_string();
        assert!(e.contains("had 8 sectors") && e.contains("has 0"), "{e}");
    }
}
