//! The console worker's events, handled by `ActiveConsole`: the kick
//! eventfd (queue notify) goes to `handle_queue_notify`, the host handle's
//! eventfd to `handle_host_connect`, the host stream's epoll set to
//! `handle_host_stream`; anything else is counted
//! (`worker::unexpected_event`).

use std::os::fd::AsRawFd;

use super::active::ActiveConsole;
use crate::devices::virtio::worker::{ready_subscriber, ReadyHandler, ReadyHandlers};
use crate::devices::virtio::worker_slot::SlotWorker;

impl ReadyHandlers<3> for ActiveConsole {
    const DEVICE: &'static str = "virtio-console";

    fn ready_handlers(&self) -> [ReadyHandler<Self>; 3] {
        [
            (self.kick().as_raw_fd(), Self::handle_queue_notify),
            (self.host_wake_fd(), Self::handle_host_connect),
            (self.host_set_fd(), Self::handle_host_stream),
        ]
    }

    fn unexpected_events(&mut self) -> &mut u64 {
        &mut self.metrics.unexpected_events
    }

    fn after_watch(&mut self) {
        // A restored device owes the guest PORT_OPEN 0, and a worker taking
        // a device over may have missed kicks: do what is ready now.
        self.after_event();
    }
}

ready_subscriber!(ActiveConsole, 3);

impl SlotWorker for ActiveConsole {
    fn notify_fd(&self) -> &vmm_sys_util::eventfd::EventFd {
        self.kick()
    }
}
