//! The public [`Port`] handle of an in-process switch port.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::counters::PortCounters;
use super::forward::Sender;
use super::{Inner, PortId, SendError};
use crate::mac::MacAddr;
use crate::offload::{Offloads, VnetHdr};
use crate::port::{DirectWriter, LinkWatcher, RxQueue, RxWaker};

/// An in-process switch port: the VMM's virtio-net backend, or a test's
/// endpoint. Dropping it detaches it.
pub struct Port {
    pub(super) inner: Arc<Inner>,
    pub(super) id: PortId,
    pub(super) name: String,
    pub(super) mac: MacAddr,
    pub(super) rx: Arc<RxQueue>,
    /// This port's sending side; only its own senders lock it.
    pub(super) sender: Mutex<Sender>,
}

impl std::fmt::Debug for Port {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Port")
            .field("bridge", &self.inner.name)
            .field("name", &self.name)
            .field("mac", &self.mac)
            .finish()
    }
}

impl Port {
    /// The port's name (the VM name).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The MAC the port was attached with (the guest NIC's address).
    pub fn mac(&self) -> MacAddr {
        self.mac
    }

    /// The bridge this port is on.
    pub fn bridge(&self) -> &str {
        &self.inner.name
    }

    /// Hands a frame the guest transmitted to the switch. The frame is
    /// untrusted: malformed or oversized frames are refused and counted, and
    /// nothing the guest sends allocates beyond the switch's bounds.
    pub fn send(&self, frame: &[u8]) -> Result<(), SendError> {
        self.send_offload(VnetHdr::default(), frame)
    }

    /// Hands over a frame with its virtio-net offload header (a guest NIC
    /// with CSUM/HOST_TSO negotiated, a TAP with `IFF_VNET_HDR`). The header
    /// is untrusted: an invalid one refuses the frame
    /// ([`SendError::BadOffload`], counted in `offload_errors`).
    pub fn send_offload(&self, hdr: VnetHdr, frame: &[u8]) -> Result<(), SendError> {
        match self
            .inner
            .send_batch(self.id, &self.sender, std::iter::once((hdr, frame)))
        {
            (_, Some(e)) => Err(e),
            _ => Ok(()),
        }
    }

    /// Hands over several frames at once; each destination is woken once
    /// for the batch. Returns how many were accepted (refusals are counted
    /// as for [`Port::send`]).
    pub fn send_batch<'a>(&self, frames: impl IntoIterator<Item = (VnetHdr, &'a [u8])>) -> usize {
        self.inner.send_batch(self.id, &self.sender, frames).0
    }

    /// Declares what this port takes whole (a guest's negotiated features,
    /// a TAP's offloads). Frames it cannot take reach it as wire packets,
    /// checksums filled. Ports start with none.
    pub fn set_offloads(&self, offloads: Offloads) {
        self.inner.update(|c| {
            if let Some(slot) = c.ports.get_mut(&self.id) {
                slot.offloads = offloads;
            }
        });
    }

    /// What this port takes whole ([`Port::set_offloads`]).
    pub fn offloads(&self) -> Offloads {
        self.inner
            .lock()
            .ports
            .get(&self.id)
            .map(|p| p.offloads)
            .unwrap_or_default()
    }

    /// The next frame for the guest, without waiting. A port with offloads
    /// set reads with [`Port::try_recv_offload`] instead, or loses headers.
    pub fn try_recv(&self) -> Option<Vec<u8>> {
        self.rx.try_pop().map(|f| f.1)
    }

    /// The next frame with the offload header it still carries (all zero
    /// unless [`Port::set_offloads`] allowed it), without waiting.
    pub fn try_recv_offload(&self) -> Option<(VnetHdr, Vec<u8>)> {
        self.rx.try_pop()
    }

    /// The next frame for the guest, waiting up to `timeout`.
    pub fn recv_timeout(&self, timeout: Duration) -> Option<Vec<u8>> {
        self.rx.pop_timeout(timeout).map(|f| f.1)
    }

    /// [`Port::recv_timeout`] with the offload header.
    pub fn recv_offload_timeout(&self, timeout: Duration) -> Option<(VnetHdr, Vec<u8>)> {
        self.rx.pop_timeout(timeout)
    }

    /// The next frame, waiting as long as it takes; `None` once the port is
    /// detached (or the switch dropped) and its queue drained.
    pub fn recv(&self) -> Option<Vec<u8>> {
        self.rx.pop_until(None).map(|f| f.1)
    }

    /// [`Port::recv`] with the offload header.
    pub fn recv_offload(&self) -> Option<(VnetHdr, Vec<u8>)> {
        self.rx.pop_until(None)
    }

    /// Gives a received frame's buffer back for reuse, so that steady-state
    /// forwarding allocates nothing.
    pub fn recycle(&self, buf: Vec<u8>) {
        self.rx.recycle(buf);
    }

    /// Frames waiting for the guest.
    pub fn pending(&self) -> usize {
        self.rx.len()
    }

    /// Installs the callback run after frames are queued for this port.
    pub fn set_rx_waker(&self, waker: Option<RxWaker>) {
        self.rx.set_waker(waker);
    }

    /// Installs (or removes) the writer the switch hands this port's
    /// unimpaired frames to, in the sender's thread, while its receive
    /// queue is idle (see [`DirectWriter`]). A consumer of such a port pops
    /// with [`Port::try_recv_or_idle`] once it has written what it popped.
    pub fn set_direct_writer(&self, writer: Option<DirectWriter>) {
        self.rx.set_direct(writer);
    }

    /// The next frame; when there is none, marks this port's consumer idle
    /// so that the direct path may write again.
    pub fn try_recv_or_idle(&self) -> Option<(VnetHdr, Vec<u8>)> {
        self.rx.pop_or_idle()
    }

    /// Installs the callback told about link changes ([`Switch::disconnect`](super::Switch::disconnect)).
    pub fn set_link_watcher(&self, watcher: Option<LinkWatcher>) {
        if let Some(slot) = self.inner.lock().ports.get_mut(&self.id) {
            slot.link_watcher = watcher;
        }
    }

    /// True while the port is attached and its link is up.
    pub fn is_link_up(&self) -> bool {
        self.inner
            .lock()
            .ports
            .get(&self.id)
            .is_some_and(|p| p.shared.link_up.load(Ordering::Acquire))
    }

    /// This port's counters (zeros once detached).
    pub fn counters(&self) -> PortCounters {
        self.inner.port_counters(self.id)
    }

    /// Gives this port a kernel NIC: from now on the kernel forwards its
    /// plain directions to the other ports with one (see
    /// [`crate::kernel_path`]). The first error building a path is printed
    /// once, and the bridge then stays on the switch. A detached port
    /// ignores it.
    pub fn set_kernel_nic(&self, nic: crate::KernelNic) {
        self.inner.update(|c| {
            if let Some(slot) = c.ports.get_mut(&self.id) {
                slot.kernel_nic = Some(nic);
            }
        });
        if self.inner.config.kernel_path {
            self.inner.requests.start(&self.inner);
        }
    }

    /// Detaches now (idempotent; drop does the same).
    pub fn detach(&self) {
        // A port the switch already let go of (a closing bridge detaches
        // all its ports in one change first) has its queue closed: its
        // drop need not wait for the control lock, which the wire builder
        // may hold while it takes that bridge's wires down. A closing
        // bridge drops 100 TAP ports from 24 threads, and each waited up to
        // 14 ms for that lock here.
        if !self.rx.is_closed() {
            self.inner.detach_id(self.id);
        }
    }
}

impl Drop for Port {
    fn drop(&mut self) {
        self.detach();
    }
}
