//! The vsock worker's event-manager subscriber: the muxer. The kick eventfd
//! (queue notify) goes to `handle_queue_notify`, the host handle's eventfd to
//! `handle_host_connects`, the epoll set of host sockets to
//! `handle_host_sockets`, the deadline timer to `handle_deadline`; anything
//! else is counted (`worker::unexpected_event`).

use std::os::fd::AsRawFd;

use event_manager::{EventOps, Events, MutEventSubscriber};
use vmm_sys_util::epoll::EventSet;

use super::muxer::Muxer;
use crate::devices::virtio::worker::unexpected_event;

impl MutEventSubscriber for Muxer {
    fn process(&mut self, events: Events, ops: &mut EventOps) {
        let fd = events.fd();
        if fd == self.kick().as_raw_fd() {
            self.handle_queue_notify();
        } else if fd == self.host_wake_fd() {
            self.handle_host_connects();
        } else if fd == self.host_sockets_fd() {
            self.handle_host_sockets();
        } else if fd == self.deadline_fd() {
            self.handle_deadline();
        } else {
            unexpected_event(
                "virtio-vsock",
                &mut self.metrics.unexpected_events,
                events,
                ops,
            );
        }
    }

    fn init(&mut self, ops: &mut EventOps) {
        let fds = [
            self.kick().as_raw_fd(),
            self.host_wake_fd(),
            self.host_sockets_fd(),
            self.deadline_fd(),
        ];
        for fd in fds {
            // Adding a fresh fd to a fresh epoll set only fails when the
            // kernel is out of memory; the device then stays quiet, as it
            // would with a worker that could not start.
            let _ = ops.add(Events::new_raw(fd, EventSet::IN));
        }
        // A muxer taken over from a stopped worker may hold deadlines.
        self.arm_deadline();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::devices::virtio::test_utils::{guest_memory, CountingInterrupt};
    use crate::devices::virtio::vsock::VsockHost;
    use event_manager::{EventManager, SubscriberOps};
    use std::sync::Arc;
    use virtio_queue::{Queue, QueueT};
    use vmm_sys_util::eventfd::EventFd;

    #[test]
    fn events_reach_their_handlers_and_strays_are_counted() {
        let kick = Arc::new(EventFd::new(libc::EFD_NONBLOCK).expect("eventfd"));
        let muxer = Muxer::new(
            Arc::new(VsockHost::new(3).expect("host")),
            guest_memory(),
            Queue::new(16).expect("queue"),
            Queue::new(16).expect("queue"),
            Arc::new(CountingInterrupt::default()),
            kick.clone(),
        )
        .expect("muxer");
        let mut em = EventManager::<Muxer>::new().expect("event manager");
        let id = em.add_subscriber(muxer);
        // Nothing is ready: an idle muxer is not woken.
        assert_eq!(em.run_with_timeout(0).expect("run"), 0);
        kick.write(1).expect("kick");
        assert_eq!(em.run_with_timeout(1000).expect("run"), 1);
        assert_eq!(em.run_with_timeout(0).expect("run"), 0);
        let stray = EventFd::new(libc::EFD_NONBLOCK).expect("eventfd");
        em.event_ops(id)
            .expect("ops")
            .add(Events::new(&stray, EventSet::IN))
            .expect("add");
        stray.write(1).expect("write");
        assert_eq!(em.run_with_timeout(1000).expect("run"), 1);
        assert_eq!(em.run_with_timeout(0).expect("run"), 0);
        let m = &em.subscriber_mut(id).expect("there").metrics;
        assert_eq!((m.wakeups, m.unexpected_events), (1, 1));
    }
}
