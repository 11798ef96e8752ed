//! Packet captures: the classic pcap format, streamed from the switch.
//!
//! Format (libpcap "savefile", native little-endian on every host we run on):
//! a 24-byte global header (magic `0xa1b2c3d4`, version 2.4, thiszone 0,
//! sigfigs 0, snaplen 65535, linktype 1 = `LINKTYPE_ETHERNET`), then per frame
//! a 16-byte record header (`ts_sec`, `ts_usec`, `incl_len`, `orig_len`) and
//! `incl_len` bytes of the frame (frames longer than the snaplen are cut).
//!
//! A [`Capture`] is the consumer's end: it reads bytes incrementally. The buffer
//! between the switch and the consumer is bounded (`capacity_bytes`): when a
//! slow consumer falls behind, whole records are dropped and counted
//! ([`Capture::dropped_records`]), so the stream stays a valid pcap and memory
//! stays bounded. A capture is *live* until closed (explicitly or by drop);
//! a snapshot must refuse while one is live, naming its [`Capture::label`].

use std::collections::VecDeque;
use std::io::{self, Read};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// The pcap magic for microsecond timestamps.
pub const PCAP_MAGIC: u32 = 0xa1b2_c3d4;
/// The snapshot length written in the global header, in bytes.
pub const PCAP_SNAPLEN: u32 = 65_535;
/// `LINKTYPE_ETHERNET`.
pub const PCAP_LINKTYPE_ETHERNET: u32 = 1;
/// Size of the global header, in bytes.
pub const PCAP_GLOBAL_HEADER_BYTES: usize = 24;
/// Size of a record header, in bytes.
pub const PCAP_RECORD_HEADER_BYTES: usize = 16;

/// The 24-byte global header.
pub fn global_header() -> [u8; PCAP_GLOBAL_HEADER_BYTES] {
    let mut h = [0u8; PCAP_GLOBAL_HEADER_BYTES];
    h[0..4].copy_from_slice(&PCAP_MAGIC.to_le_bytes());
    h[4..6].copy_from_slice(&2u16.to_le_bytes());
    h[6..8].copy_from_slice(&4u16.to_le_bytes());
    // thiszone (i32) and sigfigs (u32) stay 0.
    h[16..20].copy_from_slice(&PCAP_SNAPLEN.to_le_bytes());
    h[20..24].copy_from_slice(&PCAP_LINKTYPE_ETHERNET.to_le_bytes());
    h
}

/// Appends one record (header + frame, cut at the snaplen) to `out`.
/// `ts` is the Unix time of the frame.
pub fn write_record(out: &mut impl Extend<u8>, ts: Duration, frame: &[u8]) {
    let incl = frame.len().min(PCAP_SNAPLEN as usize);
    let ts_sec = u32::try_from(ts.as_secs()).unwrap_or(u32::MAX);
    let mut hdr = [0u8; PCAP_RECORD_HEADER_BYTES];
    hdr[0..4].copy_from_slice(&ts_sec.to_le_bytes());
    hdr[4..8].copy_from_slice(&ts.subsec_micros().to_le_bytes());
    hdr[8..12].copy_from_slice(&u32::try_from(incl).unwrap_or(u32::MAX).to_le_bytes());
    hdr[12..16].copy_from_slice(&u32::try_from(frame.len()).unwrap_or(u32::MAX).to_le_bytes());
    out.extend(hdr);
    out.extend(frame[..incl].iter().copied());
}

/// The size of the record [`write_record`] writes for a frame of `len` bytes.
pub fn record_bytes(len: usize) -> usize {
    PCAP_RECORD_HEADER_BYTES + len.min(PCAP_SNAPLEN as usize)
}

/// What a capture sees.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CaptureScope {
    /// Every frame a port hands to the bridge, once, at ingress (before
    /// partitions and impairments), like `tcpdump -i <bridge>`.
    Bridge,
    /// One port's view, like `tcpdump -i <tap>`: frames the port sent (at
    /// ingress) and frames delivered to it (after impairments, at delivery).
    Port(String),
}

#[derive(Debug)]
struct Buffer {
    bytes: VecDeque<u8>,
    closed: bool,
    records: u64,
    dropped_records: u64,
}

/// The switch's end of a capture.
#[derive(Debug)]
pub(crate) struct CaptureShared {
    label: String,
    scope: CaptureScope,
    capacity_bytes: usize,
    buf: Mutex<Buffer>,
    ready: Condvar,
}

impl CaptureShared {
    fn lock(&self) -> MutexGuard<'_, Buffer> {
        // A panic while holding this lock leaves plain bytes behind; keep going.
        self.buf.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn scope(&self) -> &CaptureScope {
        &self.scope
    }

    pub(crate) fn is_closed(&self) -> bool {
        self.lock().closed
    }

    pub(crate) fn label(&self) -> &str {
        &self.label
    }

    /// Appends a record unless closed; drops it (counted) if it would not fit.
    pub(crate) fn record(&self, ts: Duration, frame: &[u8]) {
        let mut b = self.lock();
        if b.closed {
            return;
        }
        if b.bytes.len() + record_bytes(frame.len()) > self.capacity_bytes {
            b.dropped_records += 1;
            return;
        }
        write_record(&mut b.bytes, ts, frame);
        b.records += 1;
        drop(b);
        self.ready.notify_all();
    }
}

/// A live pcap stream from a switch. Read it with [`Capture::read_available`],
/// [`Capture::read_timeout`] or [`std::io::Read`] (which blocks until bytes
/// arrive and returns 0 once the capture is closed and drained).
#[derive(Debug)]
pub struct Capture {
    shared: Arc<CaptureShared>,
}

impl Capture {
    /// A capture whose buffer already holds the global header (which does not
    /// count against `capacity_bytes`).
    pub(crate) fn new(label: String, scope: CaptureScope, capacity_bytes: usize) -> Capture {
        let mut bytes = VecDeque::with_capacity(PCAP_GLOBAL_HEADER_BYTES);
        bytes.extend(global_header());
        Capture {
            shared: Arc::new(CaptureShared {
                label,
                scope,
                capacity_bytes: capacity_bytes.saturating_add(PCAP_GLOBAL_HEADER_BYTES),
                buf: Mutex::new(Buffer {
                    bytes,
                    closed: false,
                    records: 0,
                    dropped_records: 0,
                }),
                ready: Condvar::new(),
            }),
        }
    }

    pub(crate) fn shared(&self) -> Arc<CaptureShared> {
        Arc::clone(&self.shared)
    }

    /// The label given at creation (for example the Lua call site), used by
    /// snapshot refusal messages.
    pub fn label(&self) -> &str {
        &self.shared.label
    }

    /// What this capture sees.
    pub fn scope(&self) -> &CaptureScope {
        &self.shared.scope
    }

    /// True until [`Capture::close`] (or drop).
    pub fn is_live(&self) -> bool {
        !self.shared.is_closed()
    }

    /// Stops capturing. Bytes already buffered can still be read.
    pub fn close(&self) {
        self.shared.lock().closed = true;
        self.shared.ready.notify_all();
    }

    /// Records written so far (not counting dropped ones).
    pub fn records(&self) -> u64 {
        self.shared.lock().records
    }

    /// Records dropped because the consumer fell behind.
    pub fn dropped_records(&self) -> u64 {
        self.shared.lock().dropped_records
    }

    /// Takes every buffered byte without waiting.
    pub fn read_available(&self) -> Vec<u8> {
        self.shared.lock().bytes.drain(..).collect()
    }

    /// Waits up to `timeout` for bytes, then takes every buffered byte (empty
    /// on timeout, or when closed and drained).
    pub fn read_timeout(&self, timeout: Duration) -> Vec<u8> {
        let deadline = Instant::now() + timeout;
        let mut b = self.shared.lock();
        while b.bytes.is_empty() && !b.closed {
            let now = Instant::now();
            if now >= deadline {
                break;
            }
            b = self
                .shared
                .ready
                .wait_timeout(b, deadline - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        b.bytes.drain(..).collect()
    }
}

impl Read for Capture {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        if out.is_empty() {
            return Ok(0);
        }
        let mut b = self.shared.lock();
        while b.bytes.is_empty() {
            if b.closed {
                return Ok(0);
            }
            b = self.shared.ready.wait(b).unwrap_or_else(|e| e.into_inner());
        }
        let n = out.len().min(b.bytes.len());
        for (dst, src) in out.iter_mut().zip(b.bytes.drain(..n)) {
            *dst = src;
        }
        Ok(n)
    }
}

impl Drop for Capture {
    fn drop(&mut self) {
        self.close();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_bytes_pinned() {
        assert_eq!(
            global_header(),
            [
                0xd4, 0xc3, 0xb2, 0xa1, 2, 0, 4, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0, 0, 1, 0,
                0, 0
            ]
        );
    }

    #[test]
    fn record_bytes_pinned_and_snaplen_cuts() {
        let mut out = Vec::new();
        write_record(&mut out, Duration::new(3, 4_000), &[0xaa, 0xbb]);
        assert_eq!(
            out,
            [3, 0, 0, 0, 4, 0, 0, 0, 2, 0, 0, 0, 2, 0, 0, 0, 0xaa, 0xbb]
        );
        let big = vec![0u8; 70_000];
        let mut out = Vec::new();
        write_record(&mut out, Duration::ZERO, &big);
        assert_eq!(out.len(), 16 + 65_535);
        assert_eq!(&out[8..12], &65_535u32.to_le_bytes());
        assert_eq!(&out[12..16], &70_000u32.to_le_bytes());
        assert_eq!(record_bytes(70_000), out.len());
    }

    #[test]
    fn bounded_buffer_drops_whole_records() {
        let cap = Capture::new("t".into(), CaptureScope::Bridge, 100);
        let s = cap.shared();
        for _ in 0..10 {
            s.record(Duration::ZERO, &[0u8; 30]); // 46 bytes each
        }
        assert_eq!(cap.records(), 2);
        assert_eq!(cap.dropped_records(), 8);
        let bytes = cap.read_available();
        assert_eq!(bytes.len(), 24 + 2 * 46);
        // Drained: room again.
        s.record(Duration::ZERO, &[0u8; 30]);
        assert_eq!(cap.records(), 3);
    }

    #[test]
    fn close_ends_the_stream() {
        let mut cap = Capture::new("site.lua:3".into(), CaptureScope::Bridge, 1 << 20);
        assert!(cap.is_live());
        assert_eq!(cap.label(), "site.lua:3");
        cap.close();
        assert!(!cap.is_live());
        cap.shared().record(Duration::ZERO, &[1, 2, 3]);
        let mut all = Vec::new();
        cap.read_to_end(&mut all).unwrap();
        assert_eq!(all, global_header());
        assert!(cap.read_timeout(Duration::from_millis(1)).is_empty());
    }
}
