//! One destination port's delay queue ([`PortDelay`]): the frames held
//! for it in (release time, sequence) order behind its own lock, and its
//! published earliest release, which the timer reads without the lock.
//! A leaf of the switch: the port table (`topology`) holds one per port,
//! and the delay machinery (`delay`: the shared bound, the timer, the
//! releases) drives them; neither is imported here, so the three do not
//! import each other in a circle.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use super::PortId;
use crate::clock::duration_ns;
use crate::offload::VnetHdr;

/// A published release time meaning "nothing pending" (a queue's earliest
/// release) or "scanning, wake me for anything" (the timer's deadline).
pub(super) const NOTHING_PENDING_NS: u64 = u64::MAX;

/// Which frames a release hands over.
#[derive(Clone, Copy)]
pub(super) enum Release {
    /// Those due at this time, each stamped (in captures) with its release
    /// time: the timer and [`Switch::release_due`](super::Switch::release_due).
    Due(Duration),
    /// All of them, stamped `now`: [`Switch::reset`](super::Switch::reset).
    All {
        /// The switch clock's time of the reset.
        now: Duration,
    },
}

/// One held frame. Ordered by (release, seq); `seq` is unique switch-wide.
pub(super) struct Delayed {
    pub(super) release: Duration,
    pub(super) seq: u64,
    /// The offload the frame still carries (a super-frame held whole for
    /// a port that takes it); all zero for a wire packet.
    pub(super) hdr: VnetHdr,
    pub(super) frame: Vec<u8>,
}

impl PartialEq for Delayed {
    fn eq(&self, o: &Self) -> bool {
        (self.release, self.seq) == (o.release, o.seq)
    }
}
impl Eq for Delayed {}
impl PartialOrd for Delayed {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Delayed {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        (self.release, self.seq).cmp(&(o.release, o.seq))
    }
}

/// The frames held for one destination port, behind that port's delay lock.
#[derive(Default)]
pub(super) struct DelayQueue {
    /// A min-heap by (release, seq).
    heap: BinaryHeap<Reverse<Delayed>>,
    /// This queue's share of [`DelayShared::held_bytes`].
    bytes: usize,
    /// Set by detach: nothing may be queued any more.
    closed: bool,
}

/// One destination port's delay queue and its published earliest release.
pub(super) struct PortDelay {
    queue: Mutex<DelayQueue>,
    /// The earliest release in `queue` in nanoseconds on the switch clock,
    /// [`NOTHING_PENDING_NS`] when empty. Written under the queue's lock
    /// after every change; the timer reads it without the lock.
    pub(super) next_release_ns: AtomicU64,
}

impl PortDelay {
    pub(super) fn new() -> PortDelay {
        PortDelay {
            queue: Mutex::new(DelayQueue::default()),
            next_release_ns: AtomicU64::new(NOTHING_PENDING_NS),
        }
    }

    /// The queue's lock (also taken by a test that holds one port's lock
    /// while another port's frames must still flow).
    pub(super) fn lock(&self) -> MutexGuard<'_, DelayQueue> {
        // The queue stays consistent between statements; a panicking
        // holder leaves it usable.
        self.queue.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Publishes `q`'s earliest release for the timer; call under the lock.
    fn publish(&self, q: &DelayQueue) {
        let next = q
            .heap
            .peek()
            .map_or(NOTHING_PENDING_NS, |d| duration_ns(d.0.release));
        // SeqCst: one of the three atomics of the wake-up protocol (see
        // `DelayShared`).
        self.next_release_ns.store(next, Ordering::SeqCst);
    }

    /// Queues `d` (whose bytes the caller reserved); gives it back when the
    /// port was detached meanwhile.
    pub(super) fn push(&self, d: Delayed) -> Result<(), Delayed> {
        let mut q = self.lock();
        if q.closed {
            return Err(d);
        }
        q.bytes += d.frame.len();
        q.heap.push(Reverse(d));
        self.publish(&q);
        Ok(())
    }

    /// Moves the frames `which` names into `out`, tagged with this port's
    /// id; returns their bytes.
    pub(super) fn take(
        &self,
        which: Release,
        to: PortId,
        out: &mut Vec<(Delayed, PortId)>,
    ) -> usize {
        let now = match which {
            Release::Due(now) => Some(now),
            Release::All { .. } => None,
        };
        // An idle or not yet due queue is skipped without its lock, so the
        // timer does not contend with senders to ports it has nothing for.
        // A push racing with this load is found by the next release.
        if let Some(now) = now {
            if self.next_release_ns.load(Ordering::SeqCst) > duration_ns(now) {
                return 0;
            }
        }
        let mut q = self.lock();
        let mut bytes = 0;
        while q
            .heap
            .peek()
            .is_some_and(|d| now.is_none_or(|n| d.0.release <= n))
        {
            let Some(Reverse(d)) = q.heap.pop() else {
                break;
            };
            bytes += d.frame.len();
            out.push((d, to));
        }
        q.bytes -= bytes;
        self.publish(&q);
        bytes
    }

    /// Closes the queue for good and drops its frames; returns their
    /// bytes and how many there were.
    pub(super) fn close(&self) -> (usize, usize) {
        let mut q = self.lock();
        q.closed = true;
        let frames = q.heap.len();
        q.heap.clear();
        let bytes = std::mem::take(&mut q.bytes);
        self.publish(&q);
        (bytes, frames)
    }

    pub(super) fn next_release(&self) -> Option<Duration> {
        self.lock().heap.peek().map(|d| d.0.release)
    }

    pub(super) fn len(&self) -> usize {
        self.lock().heap.len()
    }
}
