//! The vsock worker's events, handled by the muxer. The kick eventfd
//! (queue notify) goes to `handle_queue_notify`, the host handle's eventfd to
//! `handle_host_connects`, the epoll set of host sockets to
//! `handle_host_sockets`, the deadline timer to `handle_deadline`; anything
//! else is counted (`worker::unexpected_event`).

use std::os::fd::AsRawFd;

use super::muxer::Muxer;
use crate::devices::virtio::worker::{ready_subscriber, ReadyHandler, ReadyHandlers};
use crate::devices::virtio::worker_slot::SlotWorker;

impl ReadyHandlers<4> for Muxer {
    const DEVICE: &'static str = "virtio-vsock";

    fn ready_handlers(&self) -> [ReadyHandler<Self>; 4] {
        [
            (self.kick().as_raw_fd(), Self::handle_queue_notify),
            (self.host_wake_fd(), Self::handle_host_connects),
            (self.host_sockets_fd(), Self::handle_host_sockets),
            (self.deadline_fd(), Self::handle_deadline),
        ]
    }

    fn unexpected_events(&mut self) -> &mut u64 {
        &mut self.metrics.unexpected_events
    }

    fn after_watch(&mut self) {
        // A muxer taken over from a stopped worker may hold deadlines.
        self.arm_deadline();
    }
}

ready_subscriber!(Muxer, 4);

impl SlotWorker for Muxer {
    fn notify_fd(&self) -> &vmm_sys_util::eventfd::EventFd {
        self.kick()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::devices::virtio::test_utils::{
        assert_stray_fd_is_counted, guest_memory, CountingInterrupt,
    };
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
        assert_stray_fd_is_counted(&mut em, id, |m| m.metrics.unexpected_events);
        assert_eq!(em.subscriber_mut(id).expect("there").metrics.wakeups, 1);
    }
}
