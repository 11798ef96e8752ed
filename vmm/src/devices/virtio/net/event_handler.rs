//! The net worker's events: the notify eventfd goes to
//! `handle_queue_notify`, the port's RX eventfd to `handle_port_rx`; anything
//! else is counted (`worker::unexpected_event`).

use std::os::fd::AsRawFd;

use super::active::ActiveNet;
use crate::devices::virtio::worker::{ready_subscriber, ReadyHandler, ReadyHandlers};
use crate::devices::virtio::worker_slot::SlotWorker;

impl ReadyHandlers<2> for ActiveNet {
    const DEVICE: &'static str = "virtio-net";

    fn ready_handlers(&self) -> [ReadyHandler<Self>; 2] {
        [
            (self.notify.as_raw_fd(), Self::handle_queue_notify),
            (self.port_rx.as_raw_fd(), Self::handle_port_rx),
        ]
    }

    fn unexpected_events(&mut self) -> &mut u64 {
        &mut self.unexpected_events
    }
}

ready_subscriber!(ActiveNet, 2);

impl SlotWorker for ActiveNet {
    fn notify_fd(&self) -> &vmm_sys_util::eventfd::EventFd {
        &self.notify
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::devices::virtio::net::packet::{NetMetrics, NetQueues};
    use crate::devices::virtio::test_utils::{
        assert_stray_fd_is_counted, guest_memory, CountingInterrupt,
    };
    use event_manager::{EventManager, SubscriberOps};
    use provium_netsetup::{MacAddr, Switch, SwitchConfig};
    use std::sync::Arc;
    use virtio_queue::{Queue, QueueT};

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
        assert_stray_fd_is_counted(&mut em, id, |a| a.unexpected_events);
    }
}
