//! The virtio-net worker's half: the activated device's queues
//! ([`ActiveNet`]), which the worker owns (its events are mapped in
//! `event_handler.rs`) and hands back when stopped. The device
//! (`device.rs`) and its snapshot state (`persist.rs`) both build on it.

use std::sync::Arc;

use vmm_sys_util::eventfd::EventFd;

use super::defs::{RXQ, TXQ};
use super::packet::NetQueues;
use crate::devices::virtio::VirtioInterrupt;

/// An activated device's queues: what the worker owns (its event handler
/// is in `event_handler.rs`) and hands back when stopped.
pub struct ActiveNet {
    /// The MAC in config space (a snapshot records it).
    pub(super) mac: [u8; 6],
    pub(super) queues: NetQueues,
    pub(super) interrupt: Arc<dyn VirtioInterrupt>,
    /// Written by `queue_notify` (either queue).
    pub(super) notify: EventFd,
    /// Written by the port's RX waker.
    pub(super) port_rx: EventFd,
    /// Events for fds the handler does not know (a VMM bug; see `worker`).
    pub(super) unexpected_events: u64,
}

impl ActiveNet {
    pub(super) fn new(
        mac: [u8; 6],
        queues: NetQueues,
        interrupt: Arc<dyn VirtioInterrupt>,
    ) -> std::io::Result<ActiveNet> {
        Ok(ActiveNet {
            mac,
            queues,
            interrupt,
            notify: EventFd::new(libc::EFD_NONBLOCK)?,
            port_rx: EventFd::new(libc::EFD_NONBLOCK)?,
            unexpected_events: 0,
        })
    }

    #[cfg(test)]
    pub(super) fn for_test(queues: NetQueues, interrupt: Arc<dyn VirtioInterrupt>) -> ActiveNet {
        ActiveNet::new([2, 0, 0, 0, 0, 9], queues, interrupt).expect("eventfds")
    }

    /// The guest notified a queue (any index: both are drained).
    pub(super) fn handle_queue_notify(&mut self) {
        let _ = self.notify.read();
        self.move_frames();
    }

    /// The switch queued frames on our port.
    pub(super) fn handle_port_rx(&mut self) {
        let _ = self.port_rx.read();
        self.move_frames();
    }

    fn move_frames(&mut self) {
        let (rx, tx) = self.queues.run_once_by_queue();
        if rx {
            self.interrupt.signal_used_queue(RXQ as u16);
        }
        if tx {
            self.interrupt.signal_used_queue(TXQ as u16);
        }
    }
}
