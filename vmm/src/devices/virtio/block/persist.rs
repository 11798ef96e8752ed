//! virtio-blk snapshot state.
//!
//! Saved: the completions a `slow` device still holds (their requests ran;
//! only the used-ring entry is owed), so a restored guest gets them. The
//! queue itself is saved by the transport. Not saved: the disk image (the
//! restoring VM's drive config names it; its contents are the host file's)
//! and the fault modes (the restoring host sets its own).

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::defs::SLOW_COMPLETION_MS;
use super::device::Pending;
use crate::devices::virtio::VirtioPersistError;

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
}

impl BlockState {
    pub(super) fn of(pending: &VecDeque<Pending>) -> BlockState {
        BlockState {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::devices::virtio::persist::{decode_state, encode_state};

    #[test]
    fn state_round_trips_and_is_validated() {
        let s = BlockState {
            pending: vec![PendingCompletion {
                head: 3,
                used_len: 513,
            }],
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
        };
        assert!(many.pending(16).is_err());
    }
}
