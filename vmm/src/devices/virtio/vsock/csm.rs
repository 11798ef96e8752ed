//! One stream connection: its host socket, buffers and credit accounting
//! (virtio 1.2, 5.10.6.3). Counters are the spec's wrapping u32s.
//!
//! Guest → host: the device advertises `CONN_BUF_BYTES` of buffer and the
//! bytes it has forwarded to the host socket (`fwd_cnt`). Bytes the host
//! socket does not take at once wait in `to_host`, never more than the
//! advertised buffer: a guest sending past its credit gets the connection reset.
//!
//! Host → guest: the device reads the host socket only while the guest's
//! advertised buffer (`peer_buf_alloc`, `peer_fwd_cnt`) has room, at most that
//! many bytes, staged in `to_guest` until RX buffers take them.

use std::collections::VecDeque;
use std::io::{ErrorKind, Read, Write};
use std::os::unix::net::UnixStream;
use std::sync::mpsc::Sender;
use std::time::Instant;

use super::defs::{CONN_BUF_BYTES, MAX_PKT_DATA_BYTES};
use super::VsockConnectError;

/// Where a connection is in its life.
#[derive(Debug)]
pub enum ConnState {
    /// Host-initiated, REQUEST sent (or queued); waiting for RESPONSE or RST.
    Connecting {
        /// Tells the `connect` caller the outcome.
        reply: Sender<Result<(), VsockConnectError>>,
        /// When to give up.
        deadline: Instant,
    },
    /// Data flows.
    Established,
    /// SHUTDOWN sent to the guest; waiting for its RST until the deadline.
    Closing {
        /// When to drop the connection anyway.
        deadline: Instant,
    },
}

/// What happened to the host socket while moving bytes.
#[derive(Debug, PartialEq, Eq)]
pub enum HostIo {
    /// Bytes moved, or nothing to do.
    Ok,
    /// The host closed its end (EOF on read, EPIPE on write).
    Closed,
}

/// A connection.
pub struct Conn {
    /// Host end (nonblocking).
    pub stream: UnixStream,
    /// Life-cycle state.
    pub state: ConnState,
    /// Guest → host bytes the host socket has not taken yet.
    pub to_host: VecDeque<u8>,
    /// Guest → host bytes written to the host socket (advertised to the guest).
    pub fwd_cnt: u32,
    /// `fwd_cnt` as last told to the guest.
    pub fwd_cnt_sent: u32,
    /// Host → guest bytes read from the host socket, not yet in RX buffers.
    pub to_guest: Vec<u8>,
    /// Host → guest bytes put in RX buffers.
    pub rx_cnt: u32,
    /// The guest's receive buffer size.
    pub peer_buf_alloc: u32,
    /// Bytes the guest has consumed.
    pub peer_fwd_cnt: u32,
    /// The host closed its end: tell the guest once `to_guest` is empty.
    pub host_eof: bool,
    /// The guest will send no more: shut the host socket's write side once
    /// `to_host` is empty.
    pub guest_shut_send: bool,
}

impl Conn {
    /// A connection over the host end `stream` (made nonblocking here).
    pub fn new(stream: UnixStream, state: ConnState) -> std::io::Result<Conn> {
        stream.set_nonblocking(true)?;
        Ok(Conn {
            stream,
            state,
            to_host: VecDeque::new(),
            fwd_cnt: 0,
            fwd_cnt_sent: 0,
            to_guest: Vec::new(),
            rx_cnt: 0,
            peer_buf_alloc: 0,
            peer_fwd_cnt: 0,
            host_eof: false,
            guest_shut_send: false,
        })
    }

    /// Records the guest's credit from a packet header.
    pub fn update_peer_credit(&mut self, buf_alloc: u32, fwd_cnt: u32) {
        self.peer_buf_alloc = buf_alloc;
        self.peer_fwd_cnt = fwd_cnt;
    }

    /// Bytes the guest can still take. A hostile `fwd_cnt` ahead of `rx_cnt`
    /// gives at most `peer_buf_alloc`, never more.
    pub fn peer_credit(&self) -> u32 {
        let in_flight = self.rx_cnt.wrapping_sub(self.peer_fwd_cnt);
        self.peer_buf_alloc.saturating_sub(in_flight)
    }

    /// Room left in the buffer advertised to the guest.
    pub fn host_buf_free(&self) -> u32 {
        CONN_BUF_BYTES.saturating_sub(u32::try_from(self.to_host.len()).unwrap_or(u32::MAX))
    }

    /// Takes guest data. Returns false when it overruns the advertised
    /// buffer (the caller resets the connection).
    pub fn push_guest_data(&mut self, data: &[u8]) -> bool {
        if u32::try_from(data.len()).map_or(true, |n| n > self.host_buf_free()) {
            return false;
        }
        self.to_host.extend(data);
        true
    }

    /// Writes what the host socket takes of `to_host`.
    pub fn flush_to_host(&mut self) -> HostIo {
        while !self.to_host.is_empty() {
            let (a, _) = self.to_host.as_slices();
            match self.stream.write(a) {
                Ok(0) => return HostIo::Closed,
                Ok(n) => {
                    self.to_host.drain(..n);
                    self.fwd_cnt = self
                        .fwd_cnt
                        .wrapping_add(u32::try_from(n).expect("at most the buffer's size"));
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(_) => return HostIo::Closed,
            }
        }
        if self.to_host.is_empty() && self.guest_shut_send {
            let _ = self.stream.shutdown(std::net::Shutdown::Write);
        }
        HostIo::Ok
    }

    /// Whether the guest should hear about freed buffer space: half the
    /// buffer forwarded since it last heard.
    pub fn credit_update_due(&self) -> bool {
        self.fwd_cnt.wrapping_sub(self.fwd_cnt_sent) >= CONN_BUF_BYTES / 2
    }

    /// Whether the muxer should poll the host socket for reading.
    pub fn wants_host_read(&self) -> bool {
        matches!(self.state, ConnState::Established)
            && !self.host_eof
            && self.to_guest.is_empty()
            && self.peer_credit() > 0
    }

    /// Reads from the host socket into `to_guest`, within the guest's credit.
    pub fn read_from_host(&mut self) -> HostIo {
        let want = self.peer_credit().min(MAX_PKT_DATA_BYTES);
        if want == 0 || !self.to_guest.is_empty() {
            return HostIo::Ok;
        }
        self.to_guest.resize(want as usize, 0);
        loop {
            match self.stream.read(&mut self.to_guest) {
                Ok(0) => {
                    self.to_guest.clear();
                    self.host_eof = true;
                    return HostIo::Closed;
                }
                Ok(n) => {
                    self.to_guest.truncate(n);
                    return HostIo::Ok;
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) if e.kind() == ErrorKind::WouldBlock => {
                    self.to_guest.clear();
                    return HostIo::Ok;
                }
                Err(_) => {
                    self.to_guest.clear();
                    self.host_eof = true;
                    return HostIo::Closed;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn conn() -> (Conn, UnixStream) {
        let (a, b) = UnixStream::pair().expect("pair");
        (Conn::new(a, ConnState::Established).expect("conn"), b)
    }

    #[test]
    fn credit_follows_the_spec_arithmetic() {
        let (mut c, _b) = conn();
        assert_eq!(c.peer_credit(), 0, "no credit before the guest says");
        c.update_peer_credit(4096, 0);
        assert_eq!(c.peer_credit(), 4096);
        c.rx_cnt = 1000;
        assert_eq!(c.peer_credit(), 3096);
        c.update_peer_credit(4096, 1000);
        assert_eq!(c.peer_credit(), 4096);
        // Wrapping counters.
        c.rx_cnt = 5;
        c.update_peer_credit(4096, u32::MAX - 10);
        assert_eq!(c.peer_credit(), 4096 - 16);
        // A hostile fwd_cnt ahead of rx_cnt never gives more than buf_alloc.
        c.rx_cnt = 0;
        c.update_peer_credit(100, 50);
        assert!(c.peer_credit() <= 100);
    }

    #[test]
    fn guest_data_is_bounded_by_the_advertised_buffer() {
        let (mut c, _b) = conn();
        assert!(c.push_guest_data(&vec![1; CONN_BUF_BYTES as usize]));
        assert!(!c.push_guest_data(&[1]), "overrun refused");
        assert_eq!(c.to_host.len(), CONN_BUF_BYTES as usize);
    }

    #[test]
    fn host_reads_stay_within_credit() {
        let (mut c, mut b) = conn();
        b.write_all(&[9; 5000]).expect("write");
        c.update_peer_credit(1000, 0);
        assert_eq!(c.read_from_host(), HostIo::Ok);
        assert_eq!(c.to_guest.len(), 1000);
        drop(b);
        c.to_guest.clear();
        c.update_peer_credit(100_000, 0);
        assert_eq!(c.read_from_host(), HostIo::Ok);
        assert_eq!(c.to_guest.len(), 4000);
        c.to_guest.clear();
        assert_eq!(c.read_from_host(), HostIo::Closed);
        assert!(c.host_eof);
    }

    #[test]
    fn flush_counts_forwarded_bytes_and_shuts_down_after_guest_shutdown() {
        let (mut c, mut b) = conn();
        assert!(c.push_guest_data(b"hello"));
        c.guest_shut_send = true;
        assert_eq!(c.flush_to_host(), HostIo::Ok);
        assert_eq!(c.fwd_cnt, 5);
        let mut got = Vec::new();
        b.read_to_end(&mut got).expect("read to EOF");
        assert_eq!(got, b"hello");
    }
}
