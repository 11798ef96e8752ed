//! The activated console: the worker's half. It owns the four queues, the
//! port's state as the control messages made it, and the host stream of the
//! current session, and moves bytes between them.
//!
//! Every event (`event_handler.rs`: a queue notify, a host connect, the
//! host stream ready) ends in `after_event`: take a new host connect; read
//! the guest's control messages; read the port's transmitq into the host
//! stream; read the host stream into the port's receiveq; send the control
//! messages owed; interrupt once. The worker sleeps in epoll until one of
//! those can make progress: the host stream is watched only for what the
//! session can act on now (no busy wake-ups on a hung-up socket).

use std::collections::VecDeque;
use std::io::{ErrorKind, Read, Write};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use virtio_queue::{Queue, QueueT};
use vm_memory::{Bytes, GuestAddress};
use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};
use vmm_sys_util::eventfd::EventFd;

use super::defs::*;
use super::host::ConsoleHost;
use crate::devices::virtio::VirtioInterrupt;
use crate::guest_memory::GuestMemoryMmap;

/// Counters, for tests and diagnostics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ConsoleMetrics {
    /// Control messages shorter than their header (ignored).
    pub bad_control: u64,
    /// Control messages for another port or with an unknown event (ignored).
    pub ignored_control: u64,
    /// Control messages owed to the guest but dropped: it left no buffers
    /// while `MAX_PENDING_CONTROL` were waiting.
    pub dropped_control: u64,
    /// Guest bytes dropped: written with no session (no host, or a stale
    /// open), or beyond `MAX_CHAIN_BYTES` in one buffer.
    pub dropped_guest_bytes: u64,
    /// Sessions started (PORT_OPEN 1 sent).
    pub sessions: u64,
    /// Events the worker handled.
    pub wakeups: u64,
    /// Events for fds the handler does not know (a VMM bug; see `worker`).
    pub unexpected_events: u64,
}

/// A control message the device owes the guest.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ControlOut {
    /// Event (`defs::DEVICE_ADD`, `PORT_NAME`, `PORT_OPEN`).
    pub event: u16,
    /// Value.
    pub value: u16,
}

/// What the control messages told the device about the port, and what it
/// told the guest (saved in snapshots).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PortState {
    /// The driver said DEVICE_READY (the port was announced).
    pub driver_ready: bool,
    /// The driver said PORT_READY for the port (its name was sent).
    pub port_ready: bool,
    /// The guest has the port open.
    pub guest_open: bool,
    /// That open was made after the last host session ended: a new session
    /// may use it.
    pub guest_open_fresh: bool,
    /// The last PORT_OPEN sent to the guest said 1 (host connected).
    pub host_open_sent: bool,
}

/// The host stream of a connect.
struct Attached {
    seq: u64,
    stream: UnixStream,
    /// The session runs: PORT_OPEN 1 was sent for it.
    live: bool,
}

/// What happened on the host stream.
enum HostIo {
    Ok,
    Closed,
}

/// The activated device.
pub struct ActiveConsole {
    host: ConsoleHost,
    mem: GuestMemoryMmap,
    /// receiveq, transmitq, control receiveq, control transmitq.
    pub(super) queues: Vec<Queue>,
    interrupt: Arc<dyn VirtioInterrupt>,
    kick: Arc<EventFd>,
    pub(super) port: PortState,
    pub(super) control_out: VecDeque<ControlOut>,
    attached: Option<Attached>,
    /// The host stream's readiness (an epoll set of at most that one fd).
    host_set: Epoll,
    /// What the stream is registered for in `host_set`.
    host_interest: Option<(RawFd, EventSet)>,
    /// Host bytes read, not yet in receiveq buffers.
    to_guest: Vec<u8>,
    to_guest_off: usize,
    /// Guest bytes taken from the transmitq, not yet written to the host.
    to_host: Vec<u8>,
    to_host_off: usize,
    /// Counters.
    pub metrics: ConsoleMetrics,
}

impl ActiveConsole {
    /// The device over activated `queues` (exactly `QUEUE_COUNT`, checked
    /// by the caller), in port state `port` with `control_out` owed.
    pub fn new(
        host: ConsoleHost,
        mem: GuestMemoryMmap,
        queues: Vec<Queue>,
        interrupt: Arc<dyn VirtioInterrupt>,
        port: PortState,
        control_out: VecDeque<ControlOut>,
    ) -> std::io::Result<ActiveConsole> {
        Ok(ActiveConsole {
            host,
            mem,
            queues,
            interrupt,
            kick: Arc::new(EventFd::new(libc::EFD_NONBLOCK)?),
            port,
            control_out,
            attached: None,
            host_set: Epoll::new()?,
            host_interest: None,
            to_guest: Vec::new(),
            to_guest_off: 0,
            to_host: Vec::new(),
            to_host_off: 0,
            metrics: ConsoleMetrics::default(),
        })
    }

    /// The eventfd a notify writes.
    pub fn kick(&self) -> &Arc<EventFd> {
        &self.kick
    }

    /// The queues (for a snapshot's queue state).
    pub fn queues(&self) -> &[Queue] {
        &self.queues
    }

    pub(super) fn host_wake_fd(&self) -> RawFd {
        self.host.wake_fd()
    }

    pub(super) fn host_set_fd(&self) -> RawFd {
        self.host_set.as_raw_fd()
    }

    /// The guest notified a queue.
    pub(super) fn handle_queue_notify(&mut self) {
        let _ = self.kick.read();
        self.after_event();
    }

    /// A host connect waits.
    pub(super) fn handle_host_connect(&mut self) {
        self.host.clear_wake();
        self.after_event();
    }

    /// The host stream is ready (or hung up).
    pub(super) fn handle_host_stream(&mut self) {
        let mut events = [EpollEvent::default(); 1];
        // Zero timeout: the set is readable, so this does not wait.
        let n = self.host_set.wait(0, &mut events).unwrap_or(0);
        let hup = EventSet::HANG_UP | EventSet::ERROR | EventSet::READ_HANG_UP;
        if n == 1 && events[0].event_set().intersects(hup) {
            if let Some(a) = &self.attached {
                // A stream not live is watched for its hang-up alone: the
                // connect's caller gave up.
                if !a.live {
                    self.detach();
                }
            }
        }
        self.after_event();
    }

    /// Everything ready, then the host stream's interest, then one
    /// interrupt for whatever queues moved.
    pub fn after_event(&mut self) {
        self.metrics.wakeups += 1;
        if let Some((seq, stream)) = self.host.take_pending() {
            self.attach(seq, stream);
        }
        let mut used = [false; QUEUE_COUNT];
        used[CTRL_TXQ] = self.process_control_tx();
        used[TXQ] = self.process_tx();
        self.read_host();
        used[RXQ] = self.fill_rx();
        used[CTRL_RXQ] = self.fill_control_rx();
        self.sync_host_interest();
        for (i, moved) in used.iter().enumerate() {
            // needs_notification updates each queue's state: run it for
            // every queue that moved; each queue has its own vector on
            // virtio-pci (one shared line on virtio-mmio).
            if *moved && self.queues[i].needs_notification(&self.mem).unwrap_or(true) {
                let queue = u16::try_from(i).expect("QUEUE_COUNT fits u16");
                self.interrupt.signal_used_queue(queue);
            }
        }
    }

    /// Owes the guest control message `event`/`value` (dropped, counted,
    /// when `MAX_PENDING_CONTROL` already wait).
    fn push_control(&mut self, event: u16, value: u16) {
        if self.control_out.len() >= MAX_PENDING_CONTROL {
            self.metrics.dropped_control += 1;
            return;
        }
        self.control_out.push_back(ControlOut { event, value });
    }

    /// Tells the guest whether the host is there, if that changes what it
    /// was last told.
    fn tell_host_open(&mut self, open: bool) {
        if self.port.host_open_sent != open {
            self.port.host_open_sent = open;
            self.push_control(PORT_OPEN, u16::from(open));
        }
    }

    /// A new connect: the previous session (if any) ends.
    fn attach(&mut self, seq: u64, stream: UnixStream) {
        self.detach();
        if stream.set_nonblocking(true).is_err() {
            // Dropped: the caller's end reads EOF and its connect times out.
            return;
        }
        self.attached = Some(Attached {
            seq,
            stream,
            live: false,
        });
        self.maybe_go_live();
    }

    /// Ends the current session, if any: the host end reads EOF, the guest
    /// is told PORT_OPEN 0, and its open (if it was this session's) goes
    /// stale.
    fn detach(&mut self) {
        let Some(a) = self.attached.take() else {
            return;
        };
        if let Some((fd, _)) = self.host_interest.take() {
            let _ = self
                .host_set
                .ctl(ControlOperation::Delete, fd, EpollEvent::default());
        }
        if a.live {
            self.host.set_live(None);
            self.port.guest_open_fresh = false;
        }
        self.tell_host_open(false);
        self.to_guest.clear();
        self.to_guest_off = 0;
        self.to_host.clear();
        self.to_host_off = 0;
    }

    /// Starts the attached session when the guest has a fresh open.
    fn maybe_go_live(&mut self) {
        let ready = self.port.port_ready && self.port.guest_open && self.port.guest_open_fresh;
        let Some(a) = self.attached.as_mut() else {
            return;
        };
        if a.live || !ready {
            return;
        }
        a.live = true;
        let seq = a.seq;
        self.metrics.sessions += 1;
        self.tell_host_open(true);
        self.host.set_live(Some(seq));
    }

    fn live(&self) -> bool {
        self.attached.as_ref().is_some_and(|a| a.live)
    }

    /// Reads the guest's control messages; returns whether any was used.
    fn process_control_tx(&mut self) -> bool {
        let mut used = false;
        let mem = self.mem.clone();
        while let Some(chain) = self.queues[CTRL_TXQ].pop_descriptor_chain(&mem) {
            let head = chain.head_index();
            let mut msg = [0u8; MAX_CONTROL_BYTES];
            let mut len = 0;
            for d in chain.readable() {
                let want = (d.len() as usize).min(MAX_CONTROL_BYTES - len);
                if want == 0 || mem.read_slice(&mut msg[len..len + want], d.addr()).is_err() {
                    break;
                }
                len += want;
            }
            // add_used only fails for a head out of range, which a popped
            // chain cannot have.
            used |= self.queues[CTRL_TXQ].add_used(&mem, head, 0).is_ok();
            if len < CONTROL_HEADER_BYTES {
                self.metrics.bad_control += 1;
                continue;
            }
            let id = u32::from_le_bytes([msg[0], msg[1], msg[2], msg[3]]);
            let event = u16::from_le_bytes([msg[4], msg[5]]);
            let value = u16::from_le_bytes([msg[6], msg[7]]);
            self.on_control(id, event, value);
        }
        used
    }

    fn on_control(&mut self, id: u32, event: u16, value: u16) {
        match event {
            DEVICE_READY if value == 1 => {
                self.port.driver_ready = true;
                self.push_control(DEVICE_ADD, 0);
            }
            PORT_READY if id == PORT_ID && value == 1 => {
                self.port.port_ready = true;
                self.push_control(PORT_NAME, 0);
                self.maybe_go_live();
            }
            PORT_OPEN if id == PORT_ID && value == 1 => {
                self.port.guest_open = true;
                self.port.guest_open_fresh = true;
                self.maybe_go_live();
            }
            PORT_OPEN if id == PORT_ID => {
                // The guest closed the port: a running session ends.
                self.port.guest_open = false;
                self.port.guest_open_fresh = false;
                if self.live() {
                    self.detach();
                }
            }
            // DEVICE_READY 0 / PORT_READY 0 (the driver failed to set up
            // the port) leave the port unusable; nothing to answer.
            DEVICE_READY | PORT_READY if value == 0 => {}
            _ => self.metrics.ignored_control += 1,
        }
    }

    /// Takes the port's transmitq buffers while the host can take their
    /// bytes; returns whether any was used.
    fn process_tx(&mut self) -> bool {
        let mut used = false;
        let mem = self.mem.clone();
        loop {
            if self.flush_to_host() {
                self.detach();
            }
            if self.to_host_off < self.to_host.len() {
                // The host is slow: the guest waits (backpressure).
                break;
            }
            let Some(chain) = self.queues[TXQ].pop_descriptor_chain(&mem) else {
                break;
            };
            let head = chain.head_index();
            let keep = self.live();
            self.to_host.clear();
            self.to_host_off = 0;
            let mut dropped: u64 = 0;
            for d in chain.readable() {
                let len = d.len() as usize;
                let room = if keep {
                    MAX_CHAIN_BYTES - self.to_host.len()
                } else {
                    0
                };
                let take = len.min(room);
                dropped += (len - take) as u64;
                if take == 0 {
                    continue;
                }
                let at = self.to_host.len();
                self.to_host.resize(at + take, 0);
                if mem.read_slice(&mut self.to_host[at..], d.addr()).is_err() {
                    // A buffer outside guest memory: its bytes are dropped.
                    self.to_host.truncate(at);
                    dropped += take as u64;
                }
            }
            self.metrics.dropped_guest_bytes += dropped;
            used |= self.queues[TXQ].add_used(&mem, head, 0).is_ok();
        }
        used
    }

    /// Writes what `to_host` holds; true when the host closed its end.
    fn flush_to_host(&mut self) -> bool {
        let Some(a) = self.attached.as_mut() else {
            self.to_host.clear();
            self.to_host_off = 0;
            return false;
        };
        while self.to_host_off < self.to_host.len() {
            match a.stream.write(&self.to_host[self.to_host_off..]) {
                Ok(0) => return true,
                Ok(n) => self.to_host_off += n,
                Err(e) if e.kind() == ErrorKind::WouldBlock => return false,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(_) => return true,
            }
        }
        self.to_host.clear();
        self.to_host_off = 0;
        false
    }

    /// Reads the host stream when the session runs and nothing waits for
    /// receiveq buffers.
    fn read_host(&mut self) {
        if !self.live() || self.to_guest_off < self.to_guest.len() {
            return;
        }
        let Some(a) = self.attached.as_mut() else {
            return;
        };
        self.to_guest.resize(HOST_READ_BYTES, 0);
        self.to_guest_off = 0;
        let r = loop {
            match a.stream.read(&mut self.to_guest) {
                Ok(0) => break HostIo::Closed,
                Ok(n) => {
                    self.to_guest.truncate(n);
                    break HostIo::Ok;
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) if e.kind() == ErrorKind::WouldBlock => {
                    self.to_guest.clear();
                    break HostIo::Ok;
                }
                Err(_) => break HostIo::Closed,
            }
        };
        if matches!(r, HostIo::Closed) {
            self.detach();
        }
    }

    /// Puts staged host bytes into receiveq buffers; returns whether any
    /// was used.
    fn fill_rx(&mut self) -> bool {
        let mut used = false;
        let mem = self.mem.clone();
        while self.to_guest_off < self.to_guest.len() {
            let Some(chain) = self.queues[RXQ].pop_descriptor_chain(&mem) else {
                break;
            };
            let head = chain.head_index();
            let mut written: u32 = 0;
            for d in chain.writable() {
                let rest = &self.to_guest[self.to_guest_off..];
                let n = (d.len() as usize).min(rest.len());
                if n == 0 || mem.write_slice(&rest[..n], d.addr()).is_err() {
                    break;
                }
                self.to_guest_off += n;
                // n <= HOST_READ_BYTES, and the sum stays under it too.
                written += u32::try_from(n).expect("at most HOST_READ_BYTES");
            }
            used |= self.queues[RXQ].add_used(&mem, head, written).is_ok();
        }
        if self.to_guest_off >= self.to_guest.len() {
            self.to_guest.clear();
            self.to_guest_off = 0;
        }
        used
    }

    /// Sends the control messages owed; returns whether any buffer was used.
    fn fill_control_rx(&mut self) -> bool {
        let mut used = false;
        let mem = self.mem.clone();
        while let Some(msg) = self.control_out.front().copied() {
            let Some(chain) = self.queues[CTRL_RXQ].pop_descriptor_chain(&mem) else {
                break;
            };
            let head = chain.head_index();
            self.control_out.pop_front();
            let mut bytes = Vec::with_capacity(CONTROL_HEADER_BYTES + AGENT_PORT_NAME.len());
            bytes.extend_from_slice(&PORT_ID.to_le_bytes());
            bytes.extend_from_slice(&msg.event.to_le_bytes());
            bytes.extend_from_slice(&msg.value.to_le_bytes());
            if msg.event == PORT_NAME {
                bytes.extend_from_slice(AGENT_PORT_NAME.as_bytes());
            }
            let written = write_chain(&mem, chain.writable().map(|d| (d.addr(), d.len())), &bytes);
            // A buffer too short for the header carries nothing (Linux
            // drops a short message).
            used |= self.queues[CTRL_RXQ].add_used(&mem, head, written).is_ok();
        }
        used
    }

    /// Registers the host stream for what the session can act on now.
    ///
    /// Not live: the hang-up alone (epoll reports it for an empty set), so
    /// a connect whose caller gave up is let go. Live: readable while
    /// nothing waits for receiveq buffers, writable while guest bytes wait
    /// for the host. A live stream with neither is taken out of the set, so
    /// a hung-up socket does not spin the worker; the next guest kick reads
    /// it again and finds the hang-up.
    fn sync_host_interest(&mut self) {
        let want = match &self.attached {
            None => None,
            Some(a) if !a.live => Some((a.stream.as_raw_fd(), EventSet::empty())),
            Some(a) => {
                let mut set = EventSet::empty();
                if self.to_guest_off >= self.to_guest.len() {
                    set |= EventSet::IN;
                }
                if self.to_host_off < self.to_host.len() {
                    set |= EventSet::OUT;
                }
                (!set.is_empty()).then(|| (a.stream.as_raw_fd(), set))
            }
        };
        if want == self.host_interest {
            return;
        }
        if let Some((fd, _)) = self.host_interest.take() {
            let _ = self
                .host_set
                .ctl(ControlOperation::Delete, fd, EpollEvent::default());
        }
        if let Some((fd, set)) = want {
            // Add fails only when the kernel is out of memory; the stream is
            // then not watched and the next guest kick moves its bytes.
            if self
                .host_set
                .ctl(ControlOperation::Add, fd, EpollEvent::new(set, 0))
                .is_ok()
            {
                self.host_interest = Some((fd, set));
            }
        }
    }

    /// Ends the session for good (the device stops or resets): the host end
    /// reads EOF and connects waiting are told.
    pub(super) fn shut_down(&mut self) {
        self.detach();
    }
}

/// Writes `bytes` over the buffers `descs` (address, length) in order;
/// returns how many were written.
fn write_chain(
    mem: &GuestMemoryMmap,
    descs: impl Iterator<Item = (GuestAddress, u32)>,
    bytes: &[u8],
) -> u32 {
    let mut off = 0;
    for (addr, len) in descs {
        let n = (len as usize).min(bytes.len() - off);
        if n == 0 || mem.write_slice(&bytes[off..off + n], addr).is_err() {
            break;
        }
        off += n;
    }
    // `bytes` is a control message: a few dozen bytes.
    u32::try_from(off).expect("a control message is short")
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::devices::virtio::test_utils::{guest_memory, CountingInterrupt};
    use std::time::Duration;
    use virtio_bindings::virtio_ring::{VRING_DESC_F_NEXT, VRING_DESC_F_WRITE};
    use virtio_queue::desc::{split::Descriptor as SplitDescriptor, RawDescriptor};
    use virtio_queue::mock::MockSplitQueue;
    use vm_memory::Address;

    const W: u16 = VRING_DESC_F_WRITE as u16;
    const NEXT: u16 = VRING_DESC_F_NEXT as u16;

    /// Queue `i`'s rings at 64 KiB * i; buffers from 1 MiB up.
    fn queue_base(i: usize) -> GuestAddress {
        GuestAddress(0x1_0000 * i as u64)
    }

    /// An activated console over four mock queues, driven by hand.
    pub(crate) struct Rig<'a> {
        pub mem: &'a GuestMemoryMmap,
        pub q: Vec<MockSplitQueue<'a, GuestMemoryMmap>>,
        pub dev: ActiveConsole,
        pub host: ConsoleHost,
        pub irq: Arc<CountingInterrupt>,
        /// Next free buffer GPA.
        next_buf: u64,
        /// Next free descriptor per queue.
        next_desc: [u16; QUEUE_COUNT],
        /// Used-ring entries already read per queue.
        seen: [u16; QUEUE_COUNT],
    }

    impl<'a> Rig<'a> {
        pub(crate) fn new(mem: &'a GuestMemoryMmap) -> Rig<'a> {
            let q: Vec<_> = (0..QUEUE_COUNT)
                .map(|i| MockSplitQueue::create(mem, queue_base(i), 64))
                .collect();
            let host = ConsoleHost::new().expect("host");
            host.set_active(true);
            let irq = Arc::new(CountingInterrupt::default());
            let queues = q.iter().map(|m| m.create_queue().expect("queue")).collect();
            let dev = ActiveConsole::new(
                host.clone(),
                mem.clone(),
                queues,
                irq.clone(),
                PortState::default(),
                VecDeque::new(),
            )
            .expect("device");
            Rig {
                mem,
                q,
                dev,
                host,
                irq,
                next_buf: 0x10_0000,
                next_desc: [0; QUEUE_COUNT],
                seen: [0; QUEUE_COUNT],
            }
        }

        fn buf(&mut self, len: u32) -> u64 {
            let at = self.next_buf;
            self.next_buf += u64::from(len).max(1).next_multiple_of(16);
            at
        }

        /// Offers raw descriptors as chains on queue `qi`.
        pub(crate) fn add_raw(&mut self, qi: usize, descs: &[RawDescriptor]) {
            let start = self.next_desc[qi];
            self.q[qi]
                .add_desc_chains(descs, start)
                .expect("room in the mock queue");
            self.next_desc[qi] += u16::try_from(descs.len()).expect("few");
        }

        /// Sends a control message (header plus `extra`) from the guest.
        pub(crate) fn guest_control(&mut self, id: u32, event: u16, value: u16) {
            let mut m = id.to_le_bytes().to_vec();
            m.extend_from_slice(&event.to_le_bytes());
            m.extend_from_slice(&value.to_le_bytes());
            let at = self.buf(8);
            self.mem.write_slice(&m, GuestAddress(at)).expect("write");
            self.add_raw(CTRL_TXQ, &[d(at, 8, 0, 0)]);
            self.dev.after_event();
        }

        /// Offers `n` control receive buffers of 4 KiB.
        pub(crate) fn control_buffers(&mut self, n: usize) {
            let descs: Vec<_> = (0..n).map(|_| d(self.buf(4096), 4096, W, 0)).collect();
            self.add_raw(CTRL_RXQ, &descs);
        }

        /// Offers `n` port receive buffers of `len` bytes.
        pub(crate) fn rx_buffers(&mut self, n: usize, len: u32) {
            let descs: Vec<_> = (0..n).map(|_| d(self.buf(len), len, W, 0)).collect();
            self.add_raw(RXQ, &descs);
        }

        /// The guest writes `bytes` on the port.
        pub(crate) fn guest_write(&mut self, bytes: &[u8]) {
            let len = u32::try_from(bytes.len()).expect("small");
            let at = self.buf(len);
            self.mem
                .write_slice(bytes, GuestAddress(at))
                .expect("write");
            self.add_raw(TXQ, &[d(at, len, 0, 0)]);
            self.dev.after_event();
        }

        /// New used entries of queue `qi`: (descriptor address of the head, length).
        fn take_used(&mut self, qi: usize) -> Vec<(u64, u32)> {
            let used = self.q[qi].used_addr();
            let idx: u16 = self.mem.read_obj(used.unchecked_add(2)).expect("idx");
            let mut out = Vec::new();
            while self.seen[qi] != idx {
                let slot = u64::from(self.seen[qi] % 64);
                let e = used.unchecked_add(4 + 8 * slot);
                let id: u32 = self.mem.read_obj(e).expect("id");
                let len: u32 = self.mem.read_obj(e.unchecked_add(4)).expect("len");
                let desc = self.q[qi]
                    .desc_table_addr()
                    .unchecked_add(16 * u64::from(id));
                let addr: u64 = self.mem.read_obj(desc).expect("addr");
                out.push((addr, len));
                self.seen[qi] = self.seen[qi].wrapping_add(1);
            }
            out
        }

        /// Control messages the device sent: (id, event, value, trailing bytes).
        pub(crate) fn controls(&mut self) -> Vec<(u32, u16, u16, Vec<u8>)> {
            self.take_used(CTRL_RXQ)
                .into_iter()
                .map(|(addr, len)| {
                    let mut b = vec![0u8; len as usize];
                    self.mem
                        .read_slice(&mut b, GuestAddress(addr))
                        .expect("read");
                    assert!(b.len() >= 8, "a control message has its header");
                    let id = u32::from_le_bytes(b[0..4].try_into().expect("4"));
                    let ev = u16::from_le_bytes(b[4..6].try_into().expect("2"));
                    let val = u16::from_le_bytes(b[6..8].try_into().expect("2"));
                    (id, ev, val, b[8..].to_vec())
                })
                .collect()
        }

        /// Bytes the guest received on the port.
        pub(crate) fn received(&mut self) -> Vec<u8> {
            let mut all = Vec::new();
            for (addr, len) in self.take_used(RXQ) {
                let mut b = vec![0u8; len as usize];
                self.mem
                    .read_slice(&mut b, GuestAddress(addr))
                    .expect("read");
                all.extend_from_slice(&b);
            }
            all
        }

        /// Brings the port up as Linux does: DEVICE_READY, PORT_READY.
        pub(crate) fn bring_up(&mut self) {
            self.control_buffers(8);
            self.guest_control(0, DEVICE_READY, 1);
            assert_eq!(self.controls(), [(0, DEVICE_ADD, 0, vec![])]);
            self.guest_control(PORT_ID, PORT_READY, 1);
            assert_eq!(
                self.controls(),
                [(0, PORT_NAME, 0, AGENT_PORT_NAME.as_bytes().to_vec())]
            );
        }

        /// A connect on another thread (it returns when the session runs).
        pub(crate) fn connect(&self) -> std::thread::JoinHandle<UnixStream> {
            let h = self.host.clone();
            std::thread::spawn(move || h.connect(Duration::from_secs(10)).expect("connects"))
        }

        /// Runs the device until it took a new connect.
        pub(crate) fn take_connect(&mut self) {
            let before = self.dev.attached.as_ref().map(|a| a.seq);
            let deadline = std::time::Instant::now() + Duration::from_secs(10);
            loop {
                self.dev.after_event();
                let now = self.dev.attached.as_ref().map(|a| a.seq);
                if now.is_some() && now != before {
                    return;
                }
                assert!(std::time::Instant::now() < deadline, "no connect came");
                std::thread::yield_now();
            }
        }
    }

    pub(crate) fn d(addr: u64, len: u32, flags: u16, next: u16) -> RawDescriptor {
        RawDescriptor::from(SplitDescriptor::new(addr, len, flags, next))
    }

    /// Reads what the host end got, waiting up to 10 s for `n` bytes.
    pub(crate) fn host_read(s: &mut UnixStream, n: usize) -> Vec<u8> {
        s.set_read_timeout(Some(Duration::from_secs(10)))
            .expect("timeout");
        let mut b = vec![0u8; n];
        s.read_exact(&mut b).expect("the host end gets the bytes");
        b
    }

    #[test]
    fn the_port_is_announced_named_and_a_session_runs_both_ways() {
        let mem = guest_memory();
        let mut r = Rig::new(&mem);
        r.bring_up();
        let t = r.connect();
        r.take_connect();
        // The guest has not opened the port: no session yet.
        assert!(!r.host.is_live());
        assert!(r.controls().is_empty());
        r.guest_control(PORT_ID, PORT_OPEN, 1);
        assert_eq!(r.controls(), [(0, PORT_OPEN, 1, vec![])]);
        let mut s = t.join().expect("connect thread");
        assert_eq!(r.dev.metrics.sessions, 1);

        r.guest_write(b"hello host");
        assert_eq!(host_read(&mut s, 10), b"hello host");

        s.write_all(b"hello guest, in two buffers").expect("write");
        r.rx_buffers(2, 16);
        // The bytes are in the socket; a host-stream event moves them.
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        let mut got = Vec::new();
        while got.len() < 27 {
            assert!(std::time::Instant::now() < deadline, "bytes never came");
            r.dev.after_event();
            got.extend(r.received());
        }
        assert_eq!(got, b"hello guest, in two buffers");
        assert!(r.irq.used.load(std::sync::atomic::Ordering::SeqCst) > 0);

        // The host closes: the guest hears PORT_OPEN 0.
        drop(s);
        r.rx_buffers(1, 16);
        r.dev.after_event();
        assert_eq!(r.controls(), [(0, PORT_OPEN, 0, vec![])]);
        assert!(!r.host.is_live());
    }

    /// The fresh-session rule: after a session ends, a new connect does
    /// not start until the guest has closed and reopened the port, and
    /// what the guest writes on its stale open never reaches the new host.
    #[test]
    fn a_new_session_waits_for_the_guest_to_reopen() {
        let mem = guest_memory();
        let mut r = Rig::new(&mem);
        r.bring_up();
        r.guest_control(PORT_ID, PORT_OPEN, 1);
        let t = r.connect();
        r.take_connect();
        let first = t.join().expect("first session");
        assert_eq!(r.controls(), [(0, PORT_OPEN, 1, vec![])]);

        // A second connect replaces the first: the first reads EOF.
        let t = r.connect();
        r.take_connect();
        let mut first = first;
        first
            .set_read_timeout(Some(Duration::from_secs(10)))
            .expect("timeout");
        let mut rest = Vec::new();
        first.read_to_end(&mut rest).expect("EOF");
        assert_eq!(r.controls(), [(0, PORT_OPEN, 0, vec![])]);
        assert!(!r.host.is_live(), "the guest's open is stale");

        // Half a frame the guest wrote for the old session: dropped.
        r.guest_write(b"old half frame");
        assert_eq!(r.dev.metrics.dropped_guest_bytes, 14);
        // The guest closes and reopens: now the session starts.
        r.guest_control(PORT_ID, PORT_OPEN, 0);
        assert!(!r.host.is_live());
        r.guest_control(PORT_ID, PORT_OPEN, 1);
        let mut second = t.join().expect("second session");
        assert_eq!(r.controls(), [(0, PORT_OPEN, 1, vec![])]);
        r.guest_write(b"new");
        assert_eq!(host_read(&mut second, 3), b"new");

        // The guest closing the port ends the session: the host reads EOF.
        r.guest_control(PORT_ID, PORT_OPEN, 0);
        let mut rest = Vec::new();
        second
            .set_read_timeout(Some(Duration::from_secs(10)))
            .expect("timeout");
        second.read_to_end(&mut rest).expect("EOF");
        assert!(rest.is_empty());
        assert_eq!(r.controls(), [(0, PORT_OPEN, 0, vec![])]);
    }

    #[test]
    fn hostile_control_messages_and_buffers_are_bounded_and_harmless() {
        let mem = guest_memory();
        let mut r = Rig::new(&mem);
        // Too short, another port, unknown event: counted, ignored.
        let at = r.buf(4);
        r.add_raw(CTRL_TXQ, &[d(at, 4, 0, 0)]);
        r.guest_control(7, PORT_OPEN, 1);
        r.guest_control(PORT_ID, 999, 1);
        r.guest_control(PORT_ID, RESIZE, 1);
        assert_eq!(r.dev.metrics.bad_control, 1);
        assert_eq!(r.dev.metrics.ignored_control, 3);
        // A buffer outside guest memory, a write-only one: nothing read.
        r.add_raw(CTRL_TXQ, &[d(0xffff_0000, 8, 0, 0), d(0x20_0000, 8, W, 0)]);
        r.dev.after_event();
        assert_eq!(r.dev.metrics.bad_control, 3);
        // DEVICE_READY in a loop without control buffers: the owed
        // messages stop at the cap.
        for _ in 0..(MAX_PENDING_CONTROL + 5) {
            r.guest_control(0, DEVICE_READY, 1);
        }
        assert_eq!(r.dev.control_out.len(), MAX_PENDING_CONTROL);
        assert_eq!(r.dev.metrics.dropped_control, 5);
        // A control buffer too short for the header gets what fits.
        let at = r.buf(4);
        r.add_raw(CTRL_RXQ, &[d(at, 4, W, 0)]);
        r.dev.after_event();
        assert_eq!(r.take_used(CTRL_RXQ), [(at, 4)]);
        // A looping chain and a huge buffer on the transmitq, no session:
        // consumed, dropped, bounded.
        r.add_raw(TXQ, &[d(0x10_0000, u32::MAX, 0, 0)]);
        r.add_raw(TXQ, &[d(0x10_0000, 16, NEXT, 2), d(0x10_0100, 16, NEXT, 1)]);
        r.dev.after_event();
        assert_eq!(r.take_used(TXQ).len(), 2);
        // A huge transmit buffer in a session: capped at MAX_CHAIN_BYTES.
        let mut r = Rig::new(&mem);
        r.bring_up();
        r.guest_control(PORT_ID, PORT_OPEN, 1);
        let t = r.connect();
        r.take_connect();
        let mut s = t.join().expect("session");
        r.add_raw(TXQ, &[d(0x10_0000, 0x20_0000, 0, 0)]);
        r.dev.after_event();
        let got = host_read(&mut s, MAX_CHAIN_BYTES);
        assert_eq!(got.len(), MAX_CHAIN_BYTES);
        assert_eq!(
            r.dev.metrics.dropped_guest_bytes,
            (0x20_0000 - MAX_CHAIN_BYTES) as u64
        );
    }
}
