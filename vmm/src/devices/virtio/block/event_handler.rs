//! The block worker's events: the notify eventfd goes to
//! `handle_queue_notify`, the `slow` completion timer to
//! `handle_slow_deadline`; anything else is counted
//! (`worker::unexpected_event`).

use std::os::fd::AsRawFd;

use super::active::ActiveBlock;
use crate::devices::virtio::worker::{ready_subscriber, ReadyHandler, ReadyHandlers};
use crate::devices::virtio::worker_slot::SlotWorker;

impl ReadyHandlers<2> for ActiveBlock {
    const DEVICE: &'static str = "virtio-blk";

    fn ready_handlers(&self) -> [ReadyHandler<Self>; 2] {
        [
            (self.notify.as_raw_fd(), Self::handle_queue_notify),
            (self.slow_timer.as_raw_fd(), Self::handle_slow_deadline),
        ]
    }

    fn unexpected_events(&mut self) -> &mut u64 {
        &mut self.unexpected_events
    }

    fn after_watch(&mut self) {
        // Completions held across a save or restore may be due already:
        // the timer fires for them as soon as the worker runs.
        self.arm_slow_timer();
    }
}

ready_subscriber!(ActiveBlock, 2);

impl SlotWorker for ActiveBlock {
    fn notify_fd(&self) -> &vmm_sys_util::eventfd::EventFd {
        &self.notify
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::devices::virtio::test_utils::{
        assert_stray_fd_is_counted, guest_memory, CountingInterrupt,
    };
    use event_manager::{EventManager, SubscriberOps};
    use std::sync::Arc;
    use virtio_queue::{Queue, QueueT};

    #[test]
    fn events_reach_their_handlers_and_strays_are_counted() {
        let f = tempfile::NamedTempFile::new().expect("tempfile");
        std::fs::write(f.path(), vec![0u8; 4096]).expect("write");
        let disk =
            Arc::new(super::super::DiskImage::open(f.path(), false, "id").expect("open disk"));
        let cfg = super::super::BlockConfig {
            disk,
            faults: Arc::default(),
        };
        let a = ActiveBlock::for_test(
            guest_memory(),
            Queue::new(16).expect("queue"),
            cfg,
            Arc::new(CountingInterrupt::default()),
        );
        let notify = a.notify.try_clone().expect("clone");
        let mut em = EventManager::<ActiveBlock>::new().expect("event manager");
        let id = em.add_subscriber(a);
        notify.write(1).expect("kick");
        assert_eq!(em.run_with_timeout(1000).expect("run"), 1);
        // The notify was consumed: nothing more to dispatch.
        assert_eq!(em.run_with_timeout(0).expect("run"), 0);
        assert_stray_fd_is_counted(&mut em, id, |a| a.unexpected_events);
    }
}
