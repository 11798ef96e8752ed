//! The delay queue: frames held for latency or a bandwidth backlog, and
//! the timer that releases them.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::{Arc, MutexGuard};
use std::time::Duration;

use super::forward::{After, Direct};
use super::topology::Topology;
use super::{Inner, PortId};
use crate::offload::VnetHdr;

pub(super) struct Delayed {
    pub(super) release: Duration,
    pub(super) seq: u64,
    pub(super) to: PortId,
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

/// Frames held for latency or a bandwidth backlog, whole switch (bounded by
/// [`SwitchConfig::delay_queue_bytes`](super::SwitchConfig::delay_queue_bytes)).
#[derive(Default)]
pub(super) struct DelayQueue {
    pub(super) heap: BinaryHeap<Reverse<Delayed>>,
    pub(super) bytes: usize,
    pub(super) seq: u64,
    pub(super) closed: bool,
}

impl DelayQueue {
    pub(super) fn pop_due(&mut self, now: Duration) -> Option<Delayed> {
        if self.heap.peek().is_none_or(|d| d.0.release > now) {
            return None;
        }
        let Reverse(d) = self.heap.pop()?;
        self.bytes -= d.frame.len();
        Some(d)
    }
}

impl Inner {
    pub(super) fn delay_lock(&self) -> MutexGuard<'_, DelayQueue> {
        self.delay.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(super) fn release_due(&self, now: Duration, after: &mut After) -> usize {
        let mut topo: Option<Arc<Topology>> = None;
        let mut n = 0;
        loop {
            let Some(d) = self.delay_lock().pop_due(now) else {
                break;
            };
            let t = topo.get_or_insert_with(|| self.snapshot());
            let hdr = VnetHdr::default();
            self.deliver(t, d.to, hdr, &d.frame, d.release, Direct::Never, after);
            n += 1;
        }
        n
    }

    pub(super) fn timer_loop(&self) {
        let mut q = self.delay_lock();
        loop {
            if q.closed {
                return;
            }
            let now = self.clock.now();
            if q.heap.peek().is_some_and(|d| d.0.release <= now) {
                drop(q);
                let mut after = After::default();
                self.release_due(now, &mut after);
                after.run();
                q = self.delay_lock();
                continue;
            }
            q = match q.heap.peek().map(|d| d.0.release) {
                Some(release) => {
                    self.timer_cv
                        .wait_timeout(q, release.saturating_sub(now))
                        .unwrap_or_else(|e| e.into_inner())
                        .0
                }
                None => self.timer_cv.wait(q).unwrap_or_else(|e| e.into_inner()),
            };
        }
    }
}
