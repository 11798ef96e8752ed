//! The block worker's event-manager subscriber: the notify eventfd goes to
//! `handle_queue_notify`, the `slow` completion timer to
//! `handle_slow_deadline`; anything else is counted (`worker::unexpected_event`).

use std::os::fd::AsRawFd;

use event_manager::{EventOps, Events, MutEventSubscriber};
use vmm_sys_util::epoll::EventSet;

use super::device::ActiveBlock;
use crate::devices::virtio::worker::unexpected_event;

impl MutEventSubscriber for ActiveBlock {
    fn process(&mut self, events: Events, ops: &mut EventOps) {
        let fd = events.fd();
        if fd == self.notify.as_raw_fd() {
            self.handle_queue_notify();
        } else if fd == self.slow_timer.as_raw_fd() {
            self.handle_slow_deadline();
        } else {
            unexpected_event("virtio-blk", &mut self.unexpected_events, events, ops);
        }
    }

    fn init(&mut self, ops: &mut EventOps) {
        for fd in [self.notify.as_raw_fd(), self.slow_timer.as_raw_fd()] {
            // Adding a fresh fd to a fresh epoll set only fails when the
            // kernel is out of memory; the device then stays quiet, as it
            // would with a worker that could not start.
            let _ = ops.add(Events::new_raw(fd, EventSet::IN));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::devices::virtio::test_utils::{guest_memory, CountingInterrupt};
    use event_manager::{EventManager, SubscriberOps};
    use std::sync::Arc;
    use virtio_queue::{Queue, QueueT};
    use vmm_sys_util::eventfd::EventFd;

    fn active() -> (ActiveBlock, tempfile::NamedTempFile) {
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
        (a, f)
    }

    #[test]
    fn events_reach_their_handlers_and_strays_are_counted() {
        let (a, _f) = active();
        let notify = a.notify.try_clone().expect("clone");
        let mut em = EventManager::<ActiveBlock>::new().expect("event manager");
        let id = em.add_subscriber(a);
        notify.write(1).expect("kick");
        assert_eq!(em.run_with_timeout(1000).expect("run"), 1);
        // The notify was consumed: nothing more to dispatch.
        assert_eq!(em.run_with_timeout(0).expect("run"), 0);
        let stray = EventFd::new(libc::EFD_NONBLOCK).expect("eventfd");
        em.event_ops(id)
            .expect("ops")
            .add(Events::new(&stray, EventSet::IN))
            .expect("add");
        stray.write(1).expect("write");
        assert_eq!(em.run_with_timeout(1000).expect("run"), 1);
        assert_eq!(em.run_with_timeout(0).expect("run"), 0);
        assert_eq!(em.subscriber_mut(id).expect("there").unexpected_events, 1);
    }
}
