//! Moves packets between the three queues and the connections.
//!
//! The muxer is the vsock worker's event subscriber (`event_handler.rs` maps
//! its fds to the `handle_*` methods here): the kick eventfd (queue notify),
//! the host handle's eventfd (new host connects), an epoll set of the
//! connections' host sockets, and a timerfd for the nearest connection
//! deadline. Every event ends in `after_event`: take new host connects; read
//! the TX queue (guest packets); move bytes to and from host sockets; fill RX
//! buffers with the replies and data owed to the guest. Tests drive it through
//! an `EventManager`, with queues laid out in guest memory.
//!
//! The worker sleeps in epoll until there is something to do: a kick, a host
//! connect, a host socket the connection can act on, or the nearest
//! connection deadline. No fd may keep epoll returning without work to do
//! (`sync_host_interest` says how hung-up sockets are kept out), and nothing
//! depends on a periodic wake-up.

use std::collections::{HashMap, VecDeque};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::Arc;
use std::time::{Duration, Instant};

use virtio_queue::{Queue, QueueT};
use virtio_vsock::packet::{VsockPacket, PKT_HEADER_SIZE};
use vm_memory::Bytes;
use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};
use vmm_sys_util::eventfd::EventFd;

use super::csm::{Conn, ConnState, HostIo};
use super::defs::*;
use super::{VsockBackend, VsockConnectError};
use crate::devices::virtio::worker::DeadlineTimer;
use crate::devices::virtio::VirtioInterrupt;
use crate::guest_memory::GuestMemoryMmap;

/// (host port, guest port).
type Key = (u32, u32);

/// Host-socket events taken from the connection epoll set per wake-up;
/// more stay ready (level-triggered) for the next one.
const HOST_EVENTS_PER_WAKEUP: usize = 64;

/// A key as epoll user data, and back.
fn key_to_data(key: Key) -> u64 {
    (u64::from(key.0) << 32) | u64::from(key.1)
}

fn key_from_data(data: u64) -> Key {
    let host_port = u32::try_from(data >> 32).expect("shifted down to 32 bits");
    let guest_port = u32::try_from(data & u64::from(u32::MAX)).expect("masked to 32 bits");
    (host_port, guest_port)
}

/// A header-only packet the device owes the guest.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Reply {
    key: Key,
    op: u16,
    flags: u32,
}

/// Counters, for tests and diagnostics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct VsockMetrics {
    /// TX packets that failed to parse or had wrong CIDs (dropped).
    pub bad_packets: u64,
    /// Connections reset because the guest sent past its credit.
    pub credit_overruns: u64,
    /// RSTs sent.
    pub rsts_sent: u64,
    /// Host connects withdrawn because their caller gave up waiting.
    pub abandoned_connects: u64,
    /// Events the worker handled. An idle device should not wake at all;
    /// a count that grows while nothing happens is a busy worker.
    pub wakeups: u64,
    /// Events for fds the handler does not know (a VMM bug; see `worker`).
    pub unexpected_events: u64,
}

/// The muxer of one activated device.
pub struct Muxer {
    guest_cid: u64,
    host: Arc<dyn VsockBackend>,
    mem: GuestMemoryMmap,
    rxq: Queue,
    txq: Queue,
    interrupt: Arc<dyn VirtioInterrupt>,
    kick: Arc<EventFd>,
    conns: HashMap<Key, Conn>,
    /// The host sockets worth waking for, keyed by `key_to_data`.
    host_sockets: Epoll,
    /// What each connection is registered for in `host_sockets`.
    host_interest: HashMap<Key, (RawFd, EventSet)>,
    /// Scratch buffer for `host_sockets` events.
    host_events: Vec<EpollEvent>,
    /// Fires for the nearest connection deadline.
    deadline_timer: DeadlineTimer,
    replies: VecDeque<Reply>,
    next_port: u32,
    /// Payload bounce buffer (one packet).
    buf: Vec<u8>,
    /// Counters.
    pub metrics: VsockMetrics,
}

impl Muxer {
    /// A muxer over the activated queues (rx, tx; the event queue is
    /// unused). Fails when the host is out of epoll or timer fds.
    pub fn new(
        host: Arc<dyn VsockBackend>,
        mem: GuestMemoryMmap,
        rxq: Queue,
        txq: Queue,
        interrupt: Arc<dyn VirtioInterrupt>,
        kick: Arc<EventFd>,
    ) -> std::io::Result<Muxer> {
        Ok(Muxer {
            guest_cid: host.guest_cid(),
            host,
            mem,
            rxq,
            txq,
            interrupt,
            kick,
            conns: HashMap::new(),
            host_sockets: Epoll::new()?,
            host_interest: HashMap::new(),
            host_events: vec![EpollEvent::default(); HOST_EVENTS_PER_WAKEUP],
            deadline_timer: DeadlineTimer::new()?,
            replies: VecDeque::new(),
            next_port: FIRST_EPHEMERAL_PORT,
            buf: vec![0; MAX_PKT_DATA_BYTES as usize],
            metrics: VsockMetrics::default(),
        })
    }

    /// The guest's CID (from the host handle this muxer was built with).
    pub fn guest_cid(&self) -> u64 {
        self.guest_cid
    }

    /// The RX and TX queues (for a snapshot's queue state).
    pub fn queues(&self) -> (&Queue, &Queue) {
        (&self.rxq, &self.txq)
    }

    /// The eventfd a notify writes to wake this muxer.
    pub fn kick(&self) -> &Arc<EventFd> {
        &self.kick
    }

    /// Open connections.
    pub fn connection_count(&self) -> usize {
        self.conns.len()
    }

    /// The host handle's eventfd (readable when host connects wait).
    pub(super) fn host_wake_fd(&self) -> RawFd {
        self.host.wake_fd()
    }

    /// The epoll set of host sockets (readable when one of them is ready).
    pub(super) fn host_sockets_fd(&self) -> RawFd {
        self.host_sockets.as_raw_fd()
    }

    /// The connection-deadline timer's fd.
    pub(super) fn deadline_fd(&self) -> RawFd {
        self.deadline_timer.as_raw_fd()
    }

    /// Re-arms the deadline timer (a worker taking this muxer over calls
    /// it: deadlines may have come due while none ran).
    pub(super) fn arm_deadline(&mut self) {
        self.deadline_timer.arm(self.next_deadline());
    }

    /// The guest notified a queue (any index).
    pub(super) fn handle_queue_notify(&mut self) {
        let _ = self.kick.read();
        self.after_event();
    }

    /// The host asked for connections (`VsockHost::connect`).
    pub(super) fn handle_host_connects(&mut self) {
        self.host.clear_wake();
        self.after_event();
    }

    /// Host sockets are ready: move their bytes.
    pub(super) fn handle_host_sockets(&mut self) {
        // Zero timeout: the set is readable, so this does not wait.
        let n = self
            .host_sockets
            .wait(0, &mut self.host_events)
            .unwrap_or(0);
        let ready: Vec<(Key, EventSet)> = self.host_events[..n]
            .iter()
            .map(|e| (key_from_data(e.data()), e.event_set()))
            .collect();
        for (key, events) in ready {
            self.host_ready(key, events);
        }
        self.after_event();
    }

    /// The nearest connection deadline may have passed.
    pub(super) fn handle_deadline(&mut self) {
        self.deadline_timer.acknowledge();
        self.after_event();
    }

    /// What every event ends with: all the work that is ready, then the
    /// host sockets and the timer set up for what can happen next.
    fn after_event(&mut self) {
        self.metrics.wakeups += 1;
        self.take_host_connects();
        self.work();
        self.sync_host_interest();
        self.arm_deadline();
    }

    /// Registers each host socket for what the connection can act on now
    /// (reading within the guest's credit, flushing `to_host`), so an idle
    /// device sleeps.
    ///
    /// Linux reports EPOLLHUP/EPOLLERR even for an empty event set, so a
    /// hung-up socket the connection has nothing to do with stays out of the
    /// set (it is read or flushed once there is credit or data again, which
    /// a guest packet brings, and the guest packet kicks us). The one
    /// exception is a connect still waiting for the guest: its socket is
    /// watched for the hang-up alone, which means the caller gave up, and the
    /// connection is withdrawn then (`abandon`).
    fn sync_host_interest(&mut self) {
        // Connections removed since the last sync were deregistered by
        // `remove_conn`; what remains is adds and changes.
        for (key, c) in &self.conns {
            let mut want = EventSet::empty();
            if c.wants_host_read() {
                want |= EventSet::IN;
            }
            if !c.to_host.is_empty() {
                want |= EventSet::OUT;
            }
            let connecting = matches!(c.state, ConnState::Connecting { .. });
            let watch = !want.is_empty() || connecting;
            let fd = c.stream.as_raw_fd();
            let event = EpollEvent::new(want, key_to_data(*key));
            let op = match self.host_interest.get(key) {
                Some(_) if !watch => ControlOperation::Delete,
                Some(&(was_fd, was)) if was_fd == fd && was == want => continue,
                Some(&(was_fd, _)) if was_fd == fd => ControlOperation::Modify,
                Some(_) => ControlOperation::Add,
                None if watch => ControlOperation::Add,
                None => continue,
            };
            // Add and Modify only fail when the kernel is out of memory;
            // the socket is then not watched, and the next guest packet
            // (which kicks us) moves its bytes.
            let delete = matches!(op, ControlOperation::Delete);
            let ok = self.host_sockets.ctl(op, fd, event).is_ok();
            if delete || !ok {
                self.host_interest.remove(key);
            } else {
                self.host_interest.insert(*key, (fd, want));
            }
        }
    }

    /// Takes a connection out, first out of the host-socket set (its fd
    /// closes when the connection drops, and a later socket may reuse it).
    fn remove_conn(&mut self, key: &Key) -> Option<Conn> {
        let c = self.conns.remove(key)?;
        if self.host_interest.remove(key).is_some() {
            let _ = self.host_sockets.ctl(
                ControlOperation::Delete,
                c.stream.as_raw_fd(),
                EpollEvent::default(),
            );
        }
        Some(c)
    }

    /// Everything but waiting: TX, host EOFs, credit updates, RX, deadlines.
    pub fn work(&mut self) {
        let tx_used = self.process_tx();
        self.expire(Instant::now());
        let keys: Vec<Key> = self.conns.keys().copied().collect();
        for k in keys {
            self.after_io(k);
        }
        let rx_used = self.fill_rx();
        // needs_notification must run for each queue that moved (it updates
        // the queue's notification state); each queue that needs one gets
        // its own interrupt (one vector per queue on virtio-pci).
        let tx_notify = tx_used && self.txq.needs_notification(&self.mem).unwrap_or(true);
        let rx_notify = rx_used && self.rxq.needs_notification(&self.mem).unwrap_or(true);
        if rx_notify {
            self.interrupt.signal_used_queue(super::defs::RXQ as u16);
        }
        if tx_notify {
            self.interrupt.signal_used_queue(super::defs::TXQ as u16);
        }
    }

    fn next_deadline(&self) -> Option<Instant> {
        self.conns
            .values()
            .filter_map(|c| match c.state {
                ConnState::Connecting { deadline, .. } | ConnState::Closing { deadline } => {
                    Some(deadline)
                }
                ConnState::Established => None,
            })
            .min()
    }

    fn reply(&mut self, key: Key, op: u16, flags: u32) {
        if op == OP_RST {
            self.metrics.rsts_sent += 1;
        }
        self.replies.push_back(Reply { key, op, flags });
    }

    /// Drops a connection and tells the guest.
    fn reset(&mut self, key: Key) {
        if let Some(c) = self.remove_conn(&key) {
            if let ConnState::Connecting { reply, .. } = c.state {
                let _ = reply.send(Err(VsockConnectError::Dropped { port: key.1 }));
            }
        }
        self.reply(key, OP_RST, 0);
    }

    /// Withdraws a host connect whose caller stopped waiting (its end of
    /// the socketpair closed). A REQUEST still queued for the guest is taken
    /// back, and then the guest never heard of the connection; one it has
    /// seen gets an RST, so it drops its half and a late RESPONSE is not
    /// needed.
    fn abandon(&mut self, key: Key) {
        if self.remove_conn(&key).is_none() {
            return;
        }
        self.metrics.abandoned_connects += 1;
        let queued = self.replies.len();
        self.replies
            .retain(|r| !(r.key == key && r.op == OP_REQUEST));
        if self.replies.len() == queued {
            self.reply(key, OP_RST, 0);
        }
    }

    fn take_host_connects(&mut self) {
        let reqs = self.host.take_connects();
        for r in reqs {
            if self.conns.len() >= MAX_CONNECTIONS {
                let _ = r
                    .reply
                    .send(Err(VsockConnectError::Dropped { port: r.port }));
                continue;
            }
            let Some(local) = self.free_port(r.port) else {
                let _ = r
                    .reply
                    .send(Err(VsockConnectError::Dropped { port: r.port }));
                continue;
            };
            let state = ConnState::Connecting {
                reply: r.reply.clone(),
                deadline: Instant::now() + Duration::from_millis(CONNECT_TIMEOUT_MS),
            };
            match Conn::new(r.stream, state) {
                Ok(c) => {
                    self.conns.insert((local, r.port), c);
                    self.reply((local, r.port), OP_REQUEST, 0);
                }
                Err(e) => {
                    let _ = r.reply.send(Err(VsockConnectError::Host(e.to_string())));
                }
            }
        }
    }

    fn free_port(&mut self, guest_port: u32) -> Option<u32> {
        for _ in 0..=MAX_CONNECTIONS {
            let p = self.next_port;
            self.next_port = self
                .next_port
                .checked_add(1)
                .unwrap_or(FIRST_EPHEMERAL_PORT);
            if !self.conns.contains_key(&(p, guest_port)) {
                return Some(p);
            }
        }
        None
    }

    fn host_ready(&mut self, key: Key, revents: EventSet) {
        let Some(c) = self.conns.get_mut(&key) else {
            return;
        };
        let hung_up = revents.intersects(EventSet::HANG_UP | EventSet::ERROR);
        if hung_up && matches!(c.state, ConnState::Connecting { .. }) {
            self.abandon(key);
            return;
        }
        let mut closed = false;
        if !c.to_host.is_empty() {
            closed |= c.flush_to_host() == HostIo::Closed;
        }
        if revents.intersects(EventSet::IN | EventSet::HANG_UP | EventSet::ERROR)
            && c.wants_host_read()
        {
            closed |= c.read_from_host() == HostIo::Closed;
        }
        if closed {
            c.host_eof = true;
        }
    }

    /// Host-side follow-ups of one connection: flushes, EOF → SHUTDOWN, a
    /// guest that closed and whose bytes are all forwarded → RST, credit updates.
    fn after_io(&mut self, key: Key) {
        let Some(c) = self.conns.get_mut(&key) else {
            return;
        };
        if !c.to_host.is_empty() && c.flush_to_host() == HostIo::Closed {
            c.host_eof = true;
            c.to_host.clear();
        }
        if !matches!(c.state, ConnState::Established) {
            return;
        }
        if c.host_eof && c.to_guest.is_empty() {
            c.state = ConnState::Closing {
                deadline: Instant::now() + Duration::from_millis(CLOSE_TIMEOUT_MS),
            };
            self.reply(key, OP_SHUTDOWN, SHUTDOWN_RCV | SHUTDOWN_SEND);
            return;
        }
        if c.credit_update_due() && !self.replies.iter().any(|r| r.key == key) {
            self.reply(key, OP_CREDIT_UPDATE, 0);
        }
    }

    fn expire(&mut self, now: Instant) {
        let expired: Vec<Key> = self
            .conns
            .iter()
            .filter(|(_, c)| match c.state {
                ConnState::Connecting { deadline, .. } | ConnState::Closing { deadline } => {
                    deadline <= now
                }
                ConnState::Established => false,
            })
            .map(|(k, _)| *k)
            .collect();
        for k in expired {
            self.reset(k);
        }
    }

    /// Reads guest packets until the TX queue is empty or the replies are
    /// backed up. Returns whether any chain was used.
    fn process_tx(&mut self) -> bool {
        let mut used = false;
        while self.replies.len() < MAX_PENDING_REPLIES {
            let Some(mut chain) = self.txq.pop_descriptor_chain(&self.mem) else {
                break;
            };
            let head = chain.head_index();
            let parsed =
                match VsockPacket::from_tx_virtq_chain(&self.mem, &mut chain, MAX_PKT_DATA_BYTES) {
                    Ok(pkt) => {
                        let mut len = 0usize;
                        if let Some(d) = pkt.data_slice() {
                            let n = d.len().min(pkt.len() as usize).min(self.buf.len());
                            len = d.copy_to(&mut self.buf[..n]);
                        }
                        Some((
                            TxHeader {
                                src_cid: pkt.src_cid(),
                                dst_cid: pkt.dst_cid(),
                                src_port: pkt.src_port(),
                                dst_port: pkt.dst_port(),
                                type_: pkt.type_(),
                                op: pkt.op(),
                                flags: pkt.flags(),
                                buf_alloc: pkt.buf_alloc(),
                                fwd_cnt: pkt.fwd_cnt(),
                            },
                            len,
                        ))
                    }
                    Err(_) => None,
                };
            // add_used fails only for an out-of-range head, impossible for a
            // popped chain.
            used |= self.txq.add_used(&self.mem, head, 0).is_ok();
            match parsed {
                Some((h, len)) => self.handle_tx(h, len),
                None => self.metrics.bad_packets += 1,
            }
        }
        used
    }

    fn handle_tx(&mut self, h: TxHeader, data_len: usize) {
        if h.src_cid != self.guest_cid || h.dst_cid != HOST_CID {
            self.metrics.bad_packets += 1;
            return;
        }
        let key = (h.dst_port, h.src_port);
        if h.type_ != TYPE_STREAM {
            if h.op != OP_RST {
                self.reply(key, OP_RST, 0);
            }
            return;
        }
        if h.op == OP_REQUEST {
            self.guest_connect(key, &h);
            return;
        }
        let Some(c) = self.conns.get_mut(&key) else {
            if h.op != OP_RST {
                self.reply(key, OP_RST, 0);
            }
            return;
        };
        c.update_peer_credit(h.buf_alloc, h.fwd_cnt);
        match h.op {
            OP_RESPONSE => {
                let state = std::mem::replace(&mut c.state, ConnState::Established);
                match state {
                    ConnState::Connecting { reply, .. } => {
                        if reply.send(Ok(())).is_err() {
                            // The caller gave up waiting.
                            self.reset(key);
                        }
                    }
                    _ => self.reset(key),
                }
            }
            OP_RST => {
                if let Some(c) = self.remove_conn(&key) {
                    if let ConnState::Connecting { reply, .. } = c.state {
                        let _ = reply.send(Err(VsockConnectError::Refused {
                            cid: self.guest_cid,
                            port: key.1,
                        }));
                    }
                }
            }
            OP_SHUTDOWN => {
                if h.flags & SHUTDOWN_SEND != 0 {
                    c.guest_shut_send = true;
                }
                let _ = c.flush_to_host();
                if h.flags & (SHUTDOWN_SEND | SHUTDOWN_RCV) == SHUTDOWN_SEND | SHUTDOWN_RCV {
                    // The guest closed: forward what the host socket takes
                    // now, then confirm with RST (its close() waits for it).
                    self.reset(key);
                }
            }
            OP_RW => {
                if !matches!(c.state, ConnState::Established) {
                    self.reset(key);
                    return;
                }
                if !c.push_guest_data(&self.buf[..data_len]) {
                    self.metrics.credit_overruns += 1;
                    self.reset(key);
                    return;
                }
                if c.flush_to_host() == HostIo::Closed {
                    c.host_eof = true;
                    c.to_host.clear();
                }
            }
            OP_CREDIT_UPDATE => {}
            OP_CREDIT_REQUEST => self.reply(key, OP_CREDIT_UPDATE, 0),
            _ => self.reset(key),
        }
    }

    fn guest_connect(&mut self, key: Key, h: &TxHeader) {
        if self.conns.contains_key(&key) || self.conns.len() >= MAX_CONNECTIONS {
            self.reply(key, OP_RST, 0);
            return;
        }
        let Some(mine) = self.host.accept_guest_connect(key.0) else {
            self.reply(key, OP_RST, 0);
            return;
        };
        // Fails only if the socket cannot be made nonblocking; the host's
        // end then reads EOF as soon as `mine` drops.
        let Ok(mut c) = Conn::new(mine, ConnState::Established) else {
            self.reply(key, OP_RST, 0);
            return;
        };
        c.update_peer_credit(h.buf_alloc, h.fwd_cnt);
        self.conns.insert(key, c);
        self.reply(key, OP_RESPONSE, 0);
    }

    /// Whether there is a packet to put in an RX buffer.
    fn has_rx_work(&self) -> bool {
        !self.replies.is_empty() || self.conns.values().any(|c| !c.to_guest.is_empty())
    }

    /// Fills RX buffers: replies first, then data. Returns whether any was used.
    fn fill_rx(&mut self) -> bool {
        let mut used = false;
        // A clone (regions are shared) so packets can borrow it while `self` changes.
        let mem = self.mem.clone();
        while self.has_rx_work() {
            let Some(mut chain) = self.rxq.pop_descriptor_chain(&mem) else {
                break;
            };
            let head = chain.head_index();
            let len = match VsockPacket::from_rx_virtq_chain(&mem, &mut chain, MAX_PKT_DATA_BYTES) {
                Ok(mut pkt) => self.write_rx(&mut pkt),
                Err(_) => {
                    self.metrics.bad_packets += 1;
                    0
                }
            };
            used |= self.rxq.add_used(&mem, head, len).is_ok();
        }
        used
    }

    /// Writes the next reply or data packet into `pkt`; returns the used length.
    fn write_rx(&mut self, pkt: &mut VsockPacket<'_, ()>) -> u32 {
        let hdr = PKT_HEADER_SIZE as u32;
        if pkt
            .header_slice()
            .write_slice(&[0u8; PKT_HEADER_SIZE], 0)
            .is_err()
        {
            return 0;
        }
        let (key, op, flags, data_len) = if let Some(r) = self.replies.pop_front() {
            (r.key, r.op, r.flags, 0)
        } else {
            let Some((&key, c)) = self.conns.iter_mut().find(|(_, c)| !c.to_guest.is_empty())
            else {
                return 0;
            };
            let cap = pkt.data_slice().map_or(0, |d| d.len());
            let n = cap.min(c.to_guest.len());
            if n == 0 {
                return 0;
            }
            let Some(d) = pkt.data_slice() else {
                return 0;
            };
            if d.write_slice(&c.to_guest[..n], 0).is_err() {
                return 0;
            }
            c.to_guest.drain(..n);
            let n32 = u32::try_from(n).expect("at most MAX_PKT_DATA_BYTES");
            c.rx_cnt = c.rx_cnt.wrapping_add(n32);
            (key, OP_RW, 0, n32)
        };
        let (buf_alloc, fwd_cnt) = match self.conns.get_mut(&key) {
            Some(c) => {
                c.fwd_cnt_sent = c.fwd_cnt;
                (CONN_BUF_BYTES, c.fwd_cnt)
            }
            None => (0, 0),
        };
        pkt.set_src_cid(HOST_CID)
            .set_dst_cid(self.guest_cid)
            .set_src_port(key.0)
            .set_dst_port(key.1)
            .set_type(TYPE_STREAM)
            .set_op(op)
            .set_flags(flags)
            .set_len(data_len)
            .set_buf_alloc(buf_alloc)
            .set_fwd_cnt(fwd_cnt);
        hdr + data_len
    }
}

#[derive(Clone, Copy, Debug)]
struct TxHeader {
    src_cid: u64,
    dst_cid: u64,
    src_port: u32,
    dst_port: u32,
    type_: u16,
    op: u16,
    flags: u32,
    buf_alloc: u32,
    fwd_cnt: u32,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::devices::virtio::test_utils::{guest_memory, CountingInterrupt};
    use crate::devices::virtio::vsock::test_utils::TestBackend;
    use crate::devices::virtio::vsock::VsockHost;
    use event_manager::{EventManager, SubscriberId, SubscriberOps};
    use std::io::{Read, Write};
    use std::os::unix::net::UnixStream;
    use virtio_bindings::virtio_ring::{VRING_DESC_F_NEXT, VRING_DESC_F_WRITE};
    use vm_memory::GuestAddress;

    const CID: u64 = 3;
    const QSIZE: u16 = 512;
    const RXQ_GPA: u64 = 0;
    const TXQ_GPA: u64 = 0x4000;
    const RX_BUF_GPA: u64 = 0x10_0000;
    const TX_HDR_GPA: u64 = 0x30_0000;
    const TX_DATA_GPA: u64 = 0x31_0000;
    const HDR: u64 = PKT_HEADER_SIZE as u64;
    const RX_DATA_BYTES: u32 = 4096;

    /// A split ring the test drives by hand (same layout as MockSplitQueue).
    struct Ring {
        base: u64,
        next_desc: u16,
        avail_idx: u16,
        used_seen: u16,
    }

    impl Ring {
        fn new(base: u64) -> Ring {
            Ring {
                base,
                next_desc: 0,
                avail_idx: 0,
                used_seen: 0,
            }
        }
        /// A ready queue over this ring. (MockSplitQueue's layout overlaps
        /// its rings for sizes over 256, so the test lays them out itself.)
        fn queue(&self, mem: &GuestMemoryMmap) -> Queue {
            for gpa in [self.avail(), self.used()] {
                mem.write_slice(&[0u8; 4], GuestAddress(gpa))
                    .expect("zero ring");
            }
            let mut q = Queue::new(QSIZE).expect("queue");
            q.set_size(QSIZE);
            q.set_desc_table_address(Some(self.base as u32), Some(0));
            q.set_avail_ring_address(Some(self.avail() as u32), Some(0));
            q.set_used_ring_address(Some(self.used() as u32), Some(0));
            q.set_ready(true);
            assert!(q.is_valid(mem));
            q
        }
        fn avail(&self) -> u64 {
            self.base + 16 * u64::from(QSIZE)
        }
        fn used(&self) -> u64 {
            (self.avail() + 4 + 2 * u64::from(QSIZE) + 2 + 3) & !3
        }
        /// Adds one chain of (addr, len, flags) descriptors.
        fn add(&mut self, mem: &GuestMemoryMmap, descs: &[(u64, u32, u16)]) -> u16 {
            let head = self.next_desc;
            for (i, &(addr, len, flags)) in descs.iter().enumerate() {
                let idx = self.next_desc;
                self.next_desc = (self.next_desc + 1) % QSIZE;
                let last = i + 1 == descs.len();
                let flags = if last {
                    flags
                } else {
                    flags | VRING_DESC_F_NEXT as u16
                };
                let at = GuestAddress(self.base + 16 * u64::from(idx));
                mem.write_obj(addr, at).expect("desc");
                mem.write_obj(len, GuestAddress(at.0 + 8)).expect("desc");
                mem.write_obj(flags, GuestAddress(at.0 + 12)).expect("desc");
                mem.write_obj(self.next_desc, GuestAddress(at.0 + 14))
                    .expect("desc");
            }
            let slot = self.avail() + 4 + 2 * u64::from(self.avail_idx % QSIZE);
            mem.write_obj(head, GuestAddress(slot)).expect("avail");
            self.avail_idx = self.avail_idx.wrapping_add(1);
            mem.write_obj(self.avail_idx, GuestAddress(self.avail() + 2))
                .expect("avail idx");
            head
        }
        /// New used entries (id, len) since the last call.
        fn take_used(&mut self, mem: &GuestMemoryMmap) -> Vec<(u32, u32)> {
            let idx: u16 = mem
                .read_obj(GuestAddress(self.used() + 2))
                .expect("used idx");
            let mut out = Vec::new();
            while self.used_seen != idx {
                let e = self.used() + 4 + 8 * u64::from(self.used_seen % QSIZE);
                out.push((
                    mem.read_obj(GuestAddress(e)).expect("id"),
                    mem.read_obj(GuestAddress(e + 4)).expect("len"),
                ));
                self.used_seen = self.used_seen.wrapping_add(1);
            }
            out
        }
    }

    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    struct Pkt {
        src_cid: u64,
        dst_cid: u64,
        src_port: u32,
        dst_port: u32,
        len: u32,
        op: u16,
        flags: u32,
        buf_alloc: u32,
        fwd_cnt: u32,
    }

    fn encode(p: &Pkt) -> [u8; PKT_HEADER_SIZE] {
        let mut b = [0u8; PKT_HEADER_SIZE];
        b[0..8].copy_from_slice(&p.src_cid.to_le_bytes());
        b[8..16].copy_from_slice(&p.dst_cid.to_le_bytes());
        b[16..20].copy_from_slice(&p.src_port.to_le_bytes());
        b[20..24].copy_from_slice(&p.dst_port.to_le_bytes());
        b[24..28].copy_from_slice(&p.len.to_le_bytes());
        b[28..30].copy_from_slice(&TYPE_STREAM.to_le_bytes());
        b[30..32].copy_from_slice(&p.op.to_le_bytes());
        b[32..36].copy_from_slice(&p.flags.to_le_bytes());
        b[36..40].copy_from_slice(&p.buf_alloc.to_le_bytes());
        b[40..44].copy_from_slice(&p.fwd_cnt.to_le_bytes());
        b
    }

    fn decode(b: &[u8]) -> Pkt {
        let u32_at = |o: usize| u32::from_le_bytes(b[o..o + 4].try_into().expect("4"));
        let u64_at = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().expect("8"));
        Pkt {
            src_cid: u64_at(0),
            dst_cid: u64_at(8),
            src_port: u32_at(16),
            dst_port: u32_at(20),
            len: u32_at(24),
            op: u16::from_le_bytes([b[30], b[31]]),
            flags: u32_at(32),
            buf_alloc: u32_at(36),
            fwd_cnt: u32_at(40),
        }
    }

    /// `timeout` as epoll_wait's argument: rounded up to whole milliseconds (a
    /// deadline 0.4 ms away must not become a zero timeout, which would return
    /// at once, over and over, until the deadline passes), and -1 (no limit) for
    /// a wait longer than a `c_int` of milliseconds (`Duration::MAX`).
    fn poll_timeout_ms(timeout: Duration) -> libc::c_int {
        let ms = timeout.as_nanos().div_ceil(1_000_000);
        libc::c_int::try_from(ms).unwrap_or(-1)
    }

    struct Rig {
        mem: GuestMemoryMmap,
        host: VsockHost,
        /// Runs the muxer's events, as the device worker does.
        em: EventManager<Muxer>,
        id: SubscriberId,
        /// The muxer's kick: the guest's notify.
        kick: Arc<EventFd>,
        rx: Ring,
        tx: Ring,
        tx_slot: u64,
    }

    impl Rig {
        fn new() -> Rig {
            let host = VsockHost::new(CID).expect("host");
            host.set_active(true);
            Rig::with_backend(host.clone(), Arc::new(host))
        }

        /// A rig whose muxer talks to `backend` (`host` is what the test
        /// connects and listens through when the backend is the real one).
        fn with_backend(host: VsockHost, backend: Arc<dyn VsockBackend>) -> Rig {
            let mem = guest_memory();
            let rx = Ring::new(RXQ_GPA);
            let tx = Ring::new(TXQ_GPA);
            let (rxq, txq) = (rx.queue(&mem), tx.queue(&mem));
            let kick = Arc::new(EventFd::new(libc::EFD_NONBLOCK).expect("eventfd"));
            let mux = Muxer::new(
                backend,
                mem.clone(),
                rxq,
                txq,
                Arc::new(CountingInterrupt::default()),
                kick.clone(),
            )
            .expect("muxer");
            let mut em = EventManager::new().expect("event manager");
            let id = em.add_subscriber(mux);
            Rig {
                mem,
                host,
                em,
                id,
                kick,
                rx,
                tx,
                tx_slot: 0,
            }
        }

        /// Gives the device `n` RX buffers (header + 4 KiB data, like Linux 6.1).
        fn rx_buffers(&mut self, n: u16) {
            let w = VRING_DESC_F_WRITE as u16;
            for _ in 0..n {
                let slot = u64::from(self.rx.next_desc / 2);
                let at = RX_BUF_GPA + slot * 0x2000;
                self.rx.add(
                    &self.mem,
                    &[(at, HDR as u32, w), (at + 0x1000, RX_DATA_BYTES, w)],
                );
            }
            self.notify();
        }

        /// Packets the device put in RX buffers since the last call, with data.
        fn received(&mut self) -> Vec<(Pkt, Vec<u8>)> {
            self.rx
                .take_used(&self.mem)
                .into_iter()
                .map(|(id, len)| {
                    let at = RX_BUF_GPA + u64::from(id / 2) * 0x2000;
                    let mut h = [0u8; PKT_HEADER_SIZE];
                    self.mem.read_slice(&mut h, GuestAddress(at)).expect("hdr");
                    let p = decode(&h);
                    assert_eq!(len, HDR as u32 + p.len, "used length is header + data");
                    let mut d = vec![0u8; p.len as usize];
                    self.mem
                        .read_slice(&mut d, GuestAddress(at + 0x1000))
                        .expect("data");
                    (p, d)
                })
                .collect()
        }

        /// The guest sends a packet (header + optional data).
        fn send(&mut self, p: Pkt, data: &[u8]) {
            let slot = self.tx_slot % 8;
            self.tx_slot += 1;
            let h = TX_HDR_GPA + slot * 0x100;
            let d = TX_DATA_GPA + slot * 0x1_0000;
            self.mem
                .write_slice(&encode(&p), GuestAddress(h))
                .expect("hdr");
            if data.is_empty() {
                self.tx.add(&self.mem, &[(h, HDR as u32, 0)]);
            } else {
                self.mem.write_slice(data, GuestAddress(d)).expect("data");
                let len = u32::try_from(data.len()).expect("small");
                self.tx.add(&self.mem, &[(h, HDR as u32, 0), (d, len, 0)]);
            }
            self.notify();
        }

        fn mux(&mut self) -> &mut Muxer {
            self.em.subscriber_mut(self.id).expect("the rig's muxer")
        }

        /// The guest notifies the device (after adding buffers).
        fn notify(&self) {
            self.kick.write(1).expect("kick");
        }

        /// Handles the events that arrive within `timeout`.
        fn run_for(&mut self, timeout: Duration) {
            self.em
                .run_with_timeout(poll_timeout_ms(timeout))
                .expect("epoll_wait");
        }

        fn turn(&mut self) {
            self.run_for(Duration::from_millis(5));
        }

        /// Runs turns until the guest received something.
        fn until_received(&mut self) -> Vec<(Pkt, Vec<u8>)> {
            let deadline = Instant::now() + Duration::from_secs(10);
            loop {
                self.turn();
                let got = self.received();
                if !got.is_empty() {
                    return got;
                }
                assert!(Instant::now() < deadline, "guest received nothing");
            }
        }
    }

    fn from_guest(src_port: u32, dst_port: u32, op: u16) -> Pkt {
        Pkt {
            src_cid: CID,
            dst_cid: HOST_CID,
            src_port,
            dst_port,
            len: 0,
            op,
            flags: 0,
            buf_alloc: 65536,
            fwd_cnt: 0,
        }
    }

    fn read_exactly(s: &mut UnixStream, n: usize) -> Vec<u8> {
        s.set_read_timeout(Some(Duration::from_secs(10)))
            .expect("timeout");
        let mut b = vec![0u8; n];
        s.read_exact(&mut b).expect("host read");
        b
    }

    /// Host connects to guest port 1234; the guest accepts. Returns the
    /// host stream and the (host port, guest port) pair.
    fn host_connect(r: &mut Rig) -> (UnixStream, u32) {
        r.rx_buffers(8);
        let host = r.host.clone();
        let t = std::thread::spawn(move || host.connect(1234, Duration::from_secs(10)));
        let got = r.until_received();
        assert_eq!(got.len(), 1);
        let req = got[0].0;
        assert_eq!(req.op, OP_REQUEST);
        assert_eq!(
            (req.src_cid, req.dst_cid, req.dst_port),
            (HOST_CID, CID, 1234)
        );
        assert_eq!(req.buf_alloc, CONN_BUF_BYTES);
        let mut resp = from_guest(1234, req.src_port, OP_RESPONSE);
        resp.buf_alloc = 8;
        r.send(resp, &[]);
        r.turn();
        let s = t.join().expect("thread").expect("connected");
        (s, req.src_port)
    }

    #[test]
    fn host_initiated_connection_carries_data_both_ways_within_credit() {
        let mut r = Rig::new();
        let (mut s, hport) = host_connect(&mut r);
        // Host → guest: the guest advertised 8 bytes of buffer.
        s.write_all(b"0123456789abcdef").expect("host write");
        let got = r.until_received();
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].0.op, OP_RW);
        assert_eq!((got[0].0.src_port, got[0].0.dst_port), (hport, 1234));
        assert_eq!(got[0].1, b"01234567", "no more than the guest's credit");
        for _ in 0..5 {
            r.turn();
        }
        assert!(r.received().is_empty(), "credit exhausted: nothing more");
        // The guest consumed 8 bytes and says so.
        let mut upd = from_guest(1234, hport, OP_CREDIT_UPDATE);
        upd.buf_alloc = 8;
        upd.fwd_cnt = 8;
        r.send(upd, &[]);
        let got = r.until_received();
        assert_eq!(got[0].1, b"89abcdef");
        // Guest → host.
        let mut rw = from_guest(1234, hport, OP_RW);
        rw.len = 4;
        rw.buf_alloc = 8;
        rw.fwd_cnt = 16;
        r.send(rw, b"pong");
        r.turn();
        assert_eq!(read_exactly(&mut s, 4), b"pong");
        assert_eq!(r.tx.take_used(&r.mem).len(), 3, "every TX chain returned");
        // A credit request is answered with our fwd_cnt.
        let mut cr = from_guest(1234, hport, OP_CREDIT_REQUEST);
        cr.buf_alloc = 8;
        cr.fwd_cnt = 16;
        r.send(cr, &[]);
        let got = r.until_received();
        assert_eq!(got[0].0.op, OP_CREDIT_UPDATE);
        assert_eq!(got[0].0.fwd_cnt, 4);
    }

    #[test]
    fn refused_connect_and_guest_close() {
        let mut r = Rig::new();
        r.rx_buffers(8);
        let host = r.host.clone();
        let t = std::thread::spawn(move || host.connect(99, Duration::from_secs(10)));
        let req = r.until_received()[0].0;
        r.send(from_guest(99, req.src_port, OP_RST), &[]);
        r.turn();
        assert_eq!(
            t.join().expect("thread").expect_err("refused"),
            VsockConnectError::Refused { cid: CID, port: 99 }
        );
        assert_eq!(r.mux().connection_count(), 0);

        // The guest closes an open connection: RST back, host sees EOF.
        let (mut s, hport) = host_connect(&mut r);
        let mut shut = from_guest(1234, hport, OP_SHUTDOWN);
        shut.flags = SHUTDOWN_RCV | SHUTDOWN_SEND;
        r.send(shut, &[]);
        let got = r.until_received();
        assert_eq!(got[0].0.op, OP_RST);
        let mut rest = Vec::new();
        s.read_to_end(&mut rest).expect("EOF");
        assert!(rest.is_empty());
        assert_eq!(r.mux().connection_count(), 0);
    }

    #[test]
    fn host_close_shuts_the_guest_side_down() {
        let mut r = Rig::new();
        let (s, hport) = host_connect(&mut r);
        drop(s);
        let got = r.until_received();
        assert_eq!(got[0].0.op, OP_SHUTDOWN);
        assert_eq!(got[0].0.flags, SHUTDOWN_RCV | SHUTDOWN_SEND);
        r.send(from_guest(1234, hport, OP_RST), &[]);
        r.turn();
        assert_eq!(r.mux().connection_count(), 0);
    }

    #[test]
    fn guest_initiated_connection_to_a_listener() {
        let mut r = Rig::new();
        r.rx_buffers(8);
        let l = r.host.listen(5000).expect("listen");
        assert!(matches!(
            r.host.listen(5000),
            Err(VsockConnectError::PortInUse(5000))
        ));
        r.send(from_guest(40000, 5000, OP_REQUEST), &[]);
        let got = r.until_received();
        assert_eq!(got[0].0.op, OP_RESPONSE);
        assert_eq!((got[0].0.src_port, got[0].0.dst_port), (5000, 40000));
        let mut s = l.accept_timeout(Duration::from_secs(5)).expect("accepted");
        let mut rw = from_guest(40000, 5000, OP_RW);
        rw.len = 5;
        r.send(rw, b"hello");
        r.turn();
        assert_eq!(read_exactly(&mut s, 5), b"hello");
        s.write_all(b"world").expect("write");
        let got = r.until_received();
        assert_eq!((got[0].0.op, got[0].1.as_slice()), (OP_RW, &b"world"[..]));
        // No listener: RST. A second REQUEST for the same pair: RST.
        r.send(from_guest(40001, 5001, OP_REQUEST), &[]);
        r.send(from_guest(40000, 5000, OP_REQUEST), &[]);
        let got = r.until_received();
        let ops: Vec<u16> = got.iter().map(|(p, _)| p.op).collect();
        assert_eq!(ops, [OP_RST, OP_RST]);
        // After the listener drops, requests are refused.
        drop(l);
        r.send(from_guest(40002, 5000, OP_REQUEST), &[]);
        assert_eq!(r.until_received()[0].0.op, OP_RST);
    }

    #[test]
    fn packets_for_unknown_connections_get_rst_and_bad_ones_are_dropped() {
        let mut r = Rig::new();
        r.rx_buffers(8);
        let mut rw = from_guest(1, 2, OP_RW);
        rw.len = 3;
        r.send(rw, b"abc");
        let got = r.until_received();
        assert_eq!(got[0].0.op, OP_RST);
        assert_eq!((got[0].0.src_port, got[0].0.dst_port), (2, 1));
        // An RST for an unknown connection is not answered.
        r.send(from_guest(1, 2, OP_RST), &[]);
        // Wrong source CID, wrong destination CID: dropped.
        let mut spoof = from_guest(1, 2, OP_REQUEST);
        spoof.src_cid = 7;
        r.send(spoof, &[]);
        let mut other = from_guest(1, 2, OP_REQUEST);
        other.dst_cid = 9;
        r.send(other, &[]);
        // Malformed chains: header too short, write-only header, len over
        // the payload cap, a buffer outside guest memory.
        r.tx.add(&r.mem, &[(TX_HDR_GPA, 8, 0)]);
        r.tx.add(
            &r.mem,
            &[(TX_HDR_GPA, HDR as u32, VRING_DESC_F_WRITE as u16)],
        );
        let mut huge = from_guest(1, 2, OP_RW);
        huge.len = u32::MAX;
        r.mem
            .write_slice(&encode(&huge), GuestAddress(TX_HDR_GPA + 0x3f00))
            .expect("hdr");
        r.tx.add(
            &r.mem,
            &[
                (TX_HDR_GPA + 0x3f00, HDR as u32, 0),
                (TX_DATA_GPA, u32::MAX, 0),
            ],
        );
        r.tx.add(&r.mem, &[(0xffff_ffff_0000, HDR as u32, 0)]);
        for _ in 0..5 {
            r.turn();
        }
        assert!(r.received().is_empty(), "nothing answered");
        assert_eq!(r.mux().metrics.bad_packets, 6);
        assert_eq!(r.tx.take_used(&r.mem).len(), 8, "every TX chain returned");
    }

    #[test]
    fn a_guest_overrunning_its_credit_is_reset() {
        let mut r = Rig::new();
        let (_s, hport) = host_connect(&mut r);
        // The host never reads: its socket buffer fills, then ours. 16 x 64 KiB
        // is past both.
        let chunk = vec![0x5au8; MAX_PKT_DATA_BYTES as usize];
        for _ in 0..16 {
            let mut rw = from_guest(1234, hport, OP_RW);
            rw.len = MAX_PKT_DATA_BYTES;
            r.send(rw, &chunk);
            r.turn();
        }
        assert_eq!(r.mux().metrics.credit_overruns, 1);
        let got = r.received();
        assert!(got.iter().any(|(p, _)| p.op == OP_RST), "{got:?}");
        assert_eq!(r.mux().connection_count(), 0);
    }

    #[test]
    fn replies_are_capped_when_the_guest_gives_no_rx_buffers() {
        let mut r = Rig::new();
        for port in 0..400 {
            r.send(from_guest(port, 7, OP_REQUEST), &[]);
        }
        r.turn();
        assert_eq!(r.mux().replies.len(), MAX_PENDING_REPLIES);
        assert_eq!(r.tx.take_used(&r.mem).len(), MAX_PENDING_REPLIES);
        // RX buffers drain the replies, and the rest of TX is read.
        r.rx_buffers(200);
        r.turn();
        r.rx_buffers(200);
        r.turn();
        r.turn();
        assert_eq!(r.received().len(), 400);
        assert_eq!(r.tx.take_used(&r.mem).len(), 400 - MAX_PENDING_REPLIES);
    }

    /// CPU time (user + system) the calling thread has used.
    fn thread_cpu() -> Duration {
        // SAFETY: `rusage` is plain integers, for which all-zero is valid.
        let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
        // SAFETY: `ru` is a valid, exclusively borrowed rusage to fill.
        let rc = unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut ru) };
        assert_eq!(rc, 0, "getrusage(RUSAGE_THREAD)");
        let tv = |t: libc::timeval| {
            Duration::from_secs(u64::try_from(t.tv_sec).unwrap_or(0))
                + Duration::from_micros(u64::try_from(t.tv_usec).unwrap_or(0))
        };
        tv(ru.ru_utime) + tv(ru.ru_stime)
    }

    /// The state gdb found a booting guest's worker spinning in: host
    /// connects whose callers gave up waiting (their socket ends closed),
    /// one the guest refused, an open connection whose host end hung up
    /// while the guest has no credit to take the EOF, and one waiting for
    /// the guest's RST after SHUTDOWN. Hung-up sockets report POLLHUP even
    /// with no events asked for; none of them may keep poll from sleeping.
    #[test]
    fn dead_connections_let_the_worker_sleep() {
        let mut r = Rig::new();
        r.rx_buffers(16);
        let gave_up: Vec<_> = (0..3)
            .map(|i| {
                let h = r.host.clone();
                std::thread::spawn(move || h.connect(2000 + i, Duration::from_millis(50)))
            })
            .collect();
        let mut requested = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(10);
        while requested.len() < 3 {
            assert!(
                Instant::now() < deadline,
                "REQUESTs reached the guest: {requested:?}"
            );
            r.turn();
            requested.extend(
                r.received()
                    .into_iter()
                    .filter(|(p, _)| p.op == OP_REQUEST)
                    .map(|(p, _)| p.dst_port),
            );
        }
        for t in gave_up {
            let e = t.join().expect("thread").expect_err("nobody answers");
            assert!(matches!(e, VsockConnectError::Timeout { .. }), "{e}");
        }
        for _ in 0..3 {
            r.turn();
        }
        let mut settled = r.received();
        // Refused by the guest.
        let h = r.host.clone();
        let t = std::thread::spawn(move || h.connect(99, Duration::from_secs(10)));
        let req = r.until_received()[0].0;
        r.send(from_guest(99, req.src_port, OP_RST), &[]);
        r.turn();
        assert!(t.join().expect("thread").is_err());
        // Open, host wrote the guest's whole credit (8 bytes) and hung up.
        let (mut s, hport) = host_connect(&mut r);
        s.write_all(b"01234567").expect("host write");
        drop(s);
        assert_eq!(r.until_received()[0].1, b"01234567");
        // Host hung up; SHUTDOWN sent; the guest has not answered.
        let (s2, hport2) = host_connect(&mut r);
        drop(s2);
        assert_eq!(r.until_received()[0].0.op, OP_SHUTDOWN);
        for _ in 0..3 {
            r.turn();
        }
        settled.extend(r.received());

        let quiet = Duration::from_secs(1);
        let (wakeups0, cpu0, start) = (r.mux().metrics.wakeups, thread_cpu(), Instant::now());
        while start.elapsed() < quiet {
            r.run_for(quiet.saturating_sub(start.elapsed()));
        }
        let wakeups = r.mux().metrics.wakeups - wakeups0;
        let cpu_ms = (thread_cpu() - cpu0).as_millis();
        eprintln!("quiet second with dead connections: {wakeups} wake-ups, {cpu_ms} ms CPU");
        assert!(
            wakeups < 10,
            "the worker woke {wakeups} times in a quiet second ({cpu_ms} ms CPU)"
        );

        // The given-up connects were torn down, each with an RST to the
        // guest (it had seen their REQUESTs).
        let mut rsts: Vec<u32> = settled
            .iter()
            .chain(r.received().iter())
            .filter(|(p, _)| p.op == OP_RST)
            .map(|(p, _)| p.dst_port)
            .collect();
        rsts.sort_unstable();
        assert_eq!(rsts, [2000, 2001, 2002]);
        assert_eq!(r.mux().connection_count(), 2);
        // The unpolled hung-up connection still ends properly: with credit,
        // the EOF is read and the guest gets SHUTDOWN.
        let mut upd = from_guest(1234, hport, OP_CREDIT_UPDATE);
        upd.buf_alloc = 8;
        upd.fwd_cnt = 8;
        r.send(upd, &[]);
        let got = r.until_received();
        assert_eq!(
            (got[0].0.op, got[0].0.src_port, got[0].0.flags),
            (OP_SHUTDOWN, hport, SHUTDOWN_RCV | SHUTDOWN_SEND)
        );
        r.send(from_guest(1234, hport, OP_RST), &[]);
        r.send(from_guest(1234, hport2, OP_RST), &[]);
        r.turn();
        assert_eq!(r.mux().connection_count(), 0);
    }

    /// A connect whose caller gave up before the guest had RX buffers to
    /// see its REQUEST is withdrawn: the guest never hears of it.
    #[test]
    fn a_connect_abandoned_before_the_guest_saw_it_is_withdrawn() {
        let mut r = Rig::new();
        let h = r.host.clone();
        let t = std::thread::spawn(move || h.connect(2000, Duration::from_millis(20)));
        while !t.is_finished() {
            r.turn();
        }
        assert!(t.join().expect("thread").is_err());
        for _ in 0..3 {
            r.turn();
        }
        assert_eq!(r.mux().connection_count(), 0);
        r.rx_buffers(8);
        for _ in 0..3 {
            r.turn();
        }
        assert_eq!(r.received(), Vec::new(), "no REQUEST, no RST");
    }

    /// The muxer against the mock backend: a guest connect goes to the
    /// backend, which accepts on a port it listens on (RESPONSE, bytes reach
    /// the accepted host end) and refuses elsewhere (RST).
    #[test]
    fn guest_connects_go_through_the_backend() {
        let backend = Arc::new(TestBackend::new(CID));
        backend.listen(80);
        let mut r = Rig::with_backend(VsockHost::new(CID).expect("host"), backend.clone());
        r.rx_buffers(8);
        r.send(from_guest(5000, 80, OP_REQUEST), &[]);
        let got = r.until_received();
        assert_eq!((got[0].0.op, got[0].0.src_port), (OP_RESPONSE, 80));
        let (port, mut host_end) = backend.take_accepted().expect("accepted");
        assert_eq!(port, 80);
        let mut rw = from_guest(5000, 80, OP_RW);
        rw.len = 5;
        r.send(rw, b"hello");
        r.turn();
        assert_eq!(read_exactly(&mut host_end, 5), b"hello");
        r.send(from_guest(5001, 81, OP_REQUEST), &[]);
        let got = r.until_received();
        assert_eq!((got[0].0.op, got[0].0.src_port), (OP_RST, 81));
        assert_eq!(backend.guest_connects(), [80, 81]);
        assert_eq!(r.mux().connection_count(), 1);
    }
}
