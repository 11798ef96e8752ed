//! The net worker's event-manager subscriber: the notify eventfd goes to
//! `handle_queue_notify`, the port's RX eventfd to `handle_port_rx`; anything
//! else is counted (`worker::unexpected_event`).

use std::os::fd::AsRawFd;

use event_manager::{EventOps, Events, MutEventSubscriber};
use vmm_sys_util::epoll::EventSet;

use super::device::ActiveNet;
use crate::devices::virtio::worker::unexpected_event;

impl MutEventSubscriber for ActiveNet {
    fn process(&mut self, events: Events, ops: &mut EventOps) {
        let fd = events.fd();
        if fd == self.notify.as_raw_fd() {
            self.handle_queue_notify();
        } else if fd == self.port_rx.as_raw_fd() {
            self.handle_port_rx();
        } else {
            unexpected_event("virtio-net", &mut self.unexpected_events, events, ops);
        }
    }

    fn init(&mut self, ops: &mut EventOps) {
        for fd in [self.notify.as_raw_fd(), self.port_rx.as_raw_fd()] {
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
    use crate::devices::virtio::net::packet::{NetMetrics, NetQueues};
    use crate::devices::virtio::test_utils::{guest_memory, CountingInterrupt};
    use event_manager::{EventManager, SubscriberOps};
    use provium_netsetup::{MacAddr, Switch, SwitchConfig};
    use std::sync::Arc;
    use virtio_queue::{Queue, QueueT};
    use vmm_sys_util::eventfd::EventFd;

    #[test]
    fn events_reach_their_handlers_and_strays_are_counted() {
        let switch = Switch::new("lan", SwitchConfig::default());
        let port = Arc::new(
            switch
                .attach("vm", MacAddr([2, 0, 0, 0, 0, 9]))
                .expect("attach"),
        );
        let queues = NetQueues::new(
            guest_memory(),
            Queue::new(16).expect("queue"),
            Queue::new(16).expect("queue"),
            port,
            12,
            Arc::new(NetMetrics::default()),
        );
        let active = ActiveNet::for_test(queues, Arc::new(CountingInterrupt::default()));
        let (notify, port_rx) = (
            active.notify.try_clone().expect("clone"),
            active.port_rx.try_clone().expect("clone"),
        );
        let mut em = EventManager::<ActiveNet>::new().expect("event manager");
        let id = em.add_subscriber(active);
        notify.write(1).expect("kick");
        port_rx.write(1).expect("wake");
        assert_eq!(em.run_with_timeout(1000).expect("run"), 2);
        // Both were consumed: nothing more to dispatch.
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
