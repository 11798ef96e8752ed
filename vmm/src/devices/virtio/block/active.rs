//! The virtio-blk worker's half: the activated device's queue and
//! in-flight work ([`ActiveBlock`]), which the worker owns (its events are
//! mapped in `event_handler.rs`) and hands back when stopped, and the
//! request loop. The device (`device.rs`) and its snapshot state
//! (`persist.rs`) both build on it.
//!
//! A notify (MMIO write on a vCPU thread) only writes the notify eventfd,
//! so vCPUs never do disk I/O or wait for `slow` completions. With `slow`
//! set, each completion is held for 50 ms in a deadline queue (a timerfd
//! fires for the nearest one) while the worker keeps accepting requests;
//! in-flight completions are capped at the queue size, and beyond that
//! requests stay in the avail ring until earlier ones complete
//! (backpressure, no unbounded growth whatever the guest does).

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use virtio_queue::{Queue, QueueT};
use vmm_sys_util::eventfd::EventFd;

use super::defs::SLOW_COMPLETION_MS;
use super::request::Request;
use super::slot::Media;
use crate::devices::virtio::worker::DeadlineTimer;
use crate::devices::virtio::VirtioInterrupt;
use crate::guest_memory::GuestMemoryMmap;

/// An activated device's queue and in-flight work: what the worker owns
/// (its event handler is in `event_handler.rs`) and hands back when stopped.
pub struct ActiveBlock {
    pub(super) queue: Queue,
    pub(super) pending: VecDeque<Pending>,
    pub(super) mem: GuestMemoryMmap,
    pub(super) cfg: Media,
    pub(super) interrupt: Arc<dyn VirtioInterrupt>,
    /// Written by `queue_notify`.
    pub(super) notify: EventFd,
    /// Fires for the nearest `slow` completion.
    pub(super) slow_timer: DeadlineTimer,
    /// Events for fds the handler does not know (a VMM bug; see `worker`).
    pub(super) unexpected_events: u64,
}

impl ActiveBlock {
    pub(super) fn new(
        mem: GuestMemoryMmap,
        queue: Queue,
        pending: VecDeque<Pending>,
        cfg: Media,
        interrupt: Arc<dyn VirtioInterrupt>,
    ) -> std::io::Result<ActiveBlock> {
        Ok(ActiveBlock {
            queue,
            pending,
            mem,
            cfg,
            interrupt,
            notify: EventFd::new(libc::EFD_NONBLOCK)?,
            slow_timer: DeadlineTimer::new()?,
            unexpected_events: 0,
        })
    }

    #[cfg(test)]
    pub(super) fn for_test(
        mem: GuestMemoryMmap,
        queue: Queue,
        cfg: super::io::BlockConfig,
        interrupt: Arc<dyn VirtioInterrupt>,
    ) -> ActiveBlock {
        ActiveBlock::new(mem, queue, VecDeque::new(), cfg.into(), interrupt)
            .expect("eventfd and timerfd")
    }

    /// The guest notified the queue: run what it made available.
    pub(super) fn handle_queue_notify(&mut self) {
        let _ = self.notify.read();
        let signal = process(&mut self.queue, &self.mem, &self.cfg, &mut self.pending);
        self.finish_turn(signal);
    }

    /// The nearest `slow` completion may be due.
    pub(super) fn handle_slow_deadline(&mut self) {
        self.slow_timer.acknowledge();
        self.finish_turn(false);
    }

    /// Completes what is due, runs what the in-flight cap held back,
    /// interrupts the guest if the used ring moved, and re-arms the timer.
    fn finish_turn(&mut self, mut signal: bool) {
        let now = Instant::now();
        let mut freed = false;
        while let Some(p) = self.pending.front() {
            if p.due > now {
                break;
            }
            let (head, used_len) = (p.head, p.used_len);
            self.pending.pop_front();
            signal |= complete(&mut self.queue, &self.mem, head, used_len);
            freed = true;
        }
        if freed {
            // Requests held back by the in-flight cap can go now.
            signal |= process(&mut self.queue, &self.mem, &self.cfg, &mut self.pending);
        }
        if signal && self.queue.needs_notification(&self.mem).unwrap_or(true) {
            self.interrupt.signal_used_queue(0);
        }
        self.arm_slow_timer();
    }

    /// Arms the timer for the nearest held completion (disarms it for none).
    pub(super) fn arm_slow_timer(&mut self) {
        self.slow_timer.arm(self.pending.front().map(|p| p.due));
    }
}

#[derive(Debug)]
pub(super) struct Pending {
    pub(super) due: Instant,
    pub(super) head: u16,
    pub(super) used_len: u32,
}

fn complete(queue: &mut Queue, mem: &GuestMemoryMmap, head: u16, len: u32) -> bool {
    // add_used rejects an out-of-range head; the chain came from this queue so
    // that cannot happen, and if memory went bad there is no one to tell.
    queue.add_used(mem, head, len).is_ok()
}

/// Pops and executes every available request. Returns whether any completed now.
fn process(
    queue: &mut Queue,
    mem: &GuestMemoryMmap,
    cfg: &Media,
    pending: &mut VecDeque<Pending>,
) -> bool {
    // One look at the slot per batch: a medium inserted or ejected meanwhile
    // serves (or fails) the next batch.
    let medium = cfg.current();
    let slow = medium.as_ref().is_some_and(|m| m.faults.is_slow());
    let mut completed = false;
    while pending.len() < usize::from(queue.size()) {
        let Some(chain) = queue.pop_descriptor_chain(mem) else {
            break;
        };
        let head = chain.head_index();
        let used_len = match Request::parse(chain, mem) {
            Ok(req) => match &medium {
                Some(m) => m.disk.execute(&req, mem, &m.faults).used_len,
                None => super::io::fail_no_medium(&req, mem).used_len,
            },
            Err(_) => 0,
        };
        if slow {
            pending.push_back(Pending {
                due: Instant::now() + Duration::from_millis(SLOW_COMPLETION_MS),
                head,
                used_len,
            });
        } else {
            completed |= complete(queue, mem, head, used_len);
        }
    }
    completed
}
