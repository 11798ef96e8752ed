//! Offload metadata: the virtio-net header (virtio 1.2, 5.1.6) that rides
//! with a frame from a guest NIC or a TAP opened with `IFF_VNET_HDR`, its
//! validation, and the software fallback (checksum fill and segmentation)
//! for ports that cannot take the offload.
//!
//! A header says one of three things: nothing to do; "fill in the checksum at
//! `csum_start + csum_offset` over `csum_start..`" (`NEEDS_CSUM`); or "this is
//! one TCP (or UDP, USO) super-frame to cut into `gso_size`-byte segments".
//! The header is untrusted: [`OffloadMeta::parse`] refuses unknown flags and
//! GSO types (UFO included: never offered), a `gso_size` of 0, an `hdr_len`
//! beyond the frame, checksum offsets outside it, and GSO frames whose
//! Ethernet/IP/L4 headers do not say what the header claims. A refused frame
//! is dropped and counted by the switch; nothing here panics or writes
//! outside a buffer, whatever the bytes.
//!
//! [`segment`] turns a validated frame into wire packets with every checksum
//! computed from scratch (the guest's partial sums are not trusted), writing
//! them into a caller-owned [`Segments`] buffer that is reused frame after
//! frame: no allocation once it has grown to the largest frame seen.

use crate::mac::ETH_HEADER_BYTES;

/// Bytes of `struct virtio_net_hdr` (no `num_buffers`): what a TAP with
/// `IFF_VNET_HDR` exchanges by default.
pub const VNET_HDR_BYTES: usize = 10;

/// `VIRTIO_NET_HDR_F_NEEDS_CSUM`.
pub const F_NEEDS_CSUM: u8 = 1;
/// `VIRTIO_NET_HDR_F_DATA_VALID`.
pub const F_DATA_VALID: u8 = 2;
/// `VIRTIO_NET_HDR_GSO_NONE`.
pub const GSO_NONE: u8 = 0;
/// `VIRTIO_NET_HDR_GSO_TCPV4`.
pub const GSO_TCPV4: u8 = 1;
/// `VIRTIO_NET_HDR_GSO_UDP` (UFO: refused, never offered).
pub const GSO_UDP: u8 = 3;
/// `VIRTIO_NET_HDR_GSO_TCPV6`.
pub const GSO_TCPV6: u8 = 4;
/// `VIRTIO_NET_HDR_GSO_UDP_L4` (USO).
pub const GSO_UDP_L4: u8 = 5;
/// `VIRTIO_NET_HDR_GSO_ECN`, or'ed into the type.
pub const GSO_ECN: u8 = 0x80;

/// Most segments one GSO frame may be cut into. 64 KiB at the smallest sane
/// MSS (536) is 123; a `gso_size` that would need more is refused.
pub const MAX_SEGMENTS: usize = 1024;

const ETHERTYPE_IPV4: u16 = 0x0800;
const ETHERTYPE_IPV6: u16 = 0x86dd;
const PROTO_TCP: u8 = 6;
const PROTO_UDP: u8 = 17;
const TCP_FIN: u8 = 0x01;
const TCP_PSH: u8 = 0x08;
const TCP_CWR: u8 = 0x80;

/// The raw fields of a `struct virtio_net_hdr` (little-endian on the wire).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct VnetHdr {
    /// `NEEDS_CSUM` / `DATA_VALID`.
    pub flags: u8,
    /// One of the `GSO_*` types, possibly with [`GSO_ECN`].
    pub gso_type: u8,
    /// Length of the headers before the payload (a hint).
    pub hdr_len: u16,
    /// Payload bytes per segment.
    pub gso_size: u16,
    /// Where checksumming starts.
    pub csum_start: u16,
    /// Where, after `csum_start`, the checksum goes.
    pub csum_offset: u16,
}

impl VnetHdr {
    /// Decodes the first [`VNET_HDR_BYTES`] of `b`; `None` when shorter.
    pub fn from_bytes(b: &[u8]) -> Option<VnetHdr> {
        let b = b.get(..VNET_HDR_BYTES)?;
        let u16le = |i: usize| u16::from_le_bytes([b[i], b[i + 1]]);
        Some(VnetHdr {
            flags: b[0],
            gso_type: b[1],
            hdr_len: u16le(2),
            gso_size: u16le(4),
            csum_start: u16le(6),
            csum_offset: u16le(8),
        })
    }

    /// Encodes the header.
    pub fn to_bytes(&self) -> [u8; VNET_HDR_BYTES] {
        let mut b = [0u8; VNET_HDR_BYTES];
        b[0] = self.flags;
        b[1] = self.gso_type;
        b[2..4].copy_from_slice(&self.hdr_len.to_le_bytes());
        b[4..6].copy_from_slice(&self.gso_size.to_le_bytes());
        b[6..8].copy_from_slice(&self.csum_start.to_le_bytes());
        b[8..10].copy_from_slice(&self.csum_offset.to_le_bytes());
        b
    }
}

/// Why a frame's offload header was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum OffloadError {
    /// Flags other than NEEDS_CSUM and DATA_VALID.
    #[error(
        "virtio-net header has unknown flags {0:#04x} (only NEEDS_CSUM and DATA_VALID are defined)"
    )]
    BadFlags(u8),
    /// A GSO type that is not TCPv4, TCPv6 or UDP_L4.
    #[error(
        "virtio-net header has gso_type {0:#04x}, not one the switch offers (TCPV4, TCPV6, UDP_L4)"
    )]
    BadGsoType(u8),
    /// GSO with a segment size of 0.
    #[error("virtio-net header asks for segmentation with gso_size 0")]
    ZeroGsoSize,
    /// GSO without NEEDS_CSUM.
    #[error("virtio-net header asks for segmentation without NEEDS_CSUM")]
    GsoWithoutCsum,
    /// `hdr_len` points past the frame.
    #[error("virtio-net header hdr_len {hdr_len} is beyond the {len}-byte frame")]
    HdrLenBeyondFrame {
        /// The claimed header length.
        hdr_len: u16,
        /// The frame length.
        len: usize,
    },
    /// The checksum field or its start lies outside the frame.
    #[error("checksum at {start}+{offset} lies outside the {len}-byte frame")]
    CsumOutside {
        /// `csum_start`.
        start: u16,
        /// `csum_offset`.
        offset: u16,
        /// The frame length.
        len: usize,
    },
    /// The frame's headers do not match what the GSO type claims.
    #[error("gso frame's headers do not match its gso_type: {0}")]
    Malformed(&'static str),
    /// Segmenting would produce more than [`MAX_SEGMENTS`] packets.
    #[error("gso frame would be cut into {0} segments (at most {MAX_SEGMENTS})")]
    TooManySegments(usize),
}

/// What a validated header asks for.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Work {
    /// Nothing: the frame is as on the wire.
    #[default]
    None,
    /// Fill one checksum.
    Csum,
    /// Cut into TCP segments over IPv4.
    Tcp4,
    /// Cut into TCP segments over IPv6.
    Tcp6,
    /// Cut into UDP datagrams (USO).
    Udp,
}

/// A validated header together with the facts segmentation needs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OffloadMeta {
    /// The header passed on to a port that takes the offload: as received,
    /// less DATA_VALID; all zero for a frame that needs no work.
    pub hdr: VnetHdr,
    /// What it asks for.
    pub work: Work,
    l3: usize,
    l4: usize,
    /// First payload byte (after the L4 header).
    payload: usize,
    /// One past the last IP byte (Ethernet padding after it is dropped).
    end: usize,
}

/// What a port can take without software help. A TAP with `IFF_VNET_HDR`
/// takes all of it; a guest NIC takes what its driver negotiated.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Offloads {
    /// Frames with a checksum still to fill (NEEDS_CSUM).
    pub csum: bool,
    /// TCP over IPv4 super-frames.
    pub tso4: bool,
    /// TCP over IPv6 super-frames.
    pub tso6: bool,
    /// UDP super-frames (USO).
    pub uso: bool,
}

impl Offloads {
    /// Everything on.
    pub const ALL: Offloads = Offloads {
        csum: true,
        tso4: true,
        tso6: true,
        uso: true,
    };

    /// True when a frame needing `work` may be handed over as it is.
    pub fn accepts(&self, work: Work) -> bool {
        match work {
            Work::None => true,
            Work::Csum => self.csum,
            Work::Tcp4 => self.csum && self.tso4,
            Work::Tcp6 => self.csum && self.tso6,
            Work::Udp => self.csum && self.uso,
        }
    }
}

fn be16(f: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_be_bytes([*f.get(at)?, *f.get(at + 1)?]))
}

impl OffloadMeta {
    /// A plain frame: nothing to do.
    pub const NONE: OffloadMeta = OffloadMeta {
        hdr: VnetHdr {
            flags: 0,
            gso_type: 0,
            hdr_len: 0,
            gso_size: 0,
            csum_start: 0,
            csum_offset: 0,
        },
        work: Work::None,
        l3: 0,
        l4: 0,
        payload: 0,
        end: 0,
    };

    /// Validates `hdr` against `frame` (an Ethernet frame, header excluded).
    pub fn parse(hdr: VnetHdr, frame: &[u8]) -> Result<OffloadMeta, OffloadError> {
        let len = frame.len();
        if hdr.flags & !(F_NEEDS_CSUM | F_DATA_VALID) != 0 {
            return Err(OffloadError::BadFlags(hdr.flags));
        }
        if usize::from(hdr.hdr_len) > len {
            return Err(OffloadError::HdrLenBeyondFrame {
                hdr_len: hdr.hdr_len,
                len,
            });
        }
        let needs_csum = hdr.flags & F_NEEDS_CSUM != 0;
        if needs_csum {
            let start = usize::from(hdr.csum_start);
            let field = start + usize::from(hdr.csum_offset);
            if start < ETH_HEADER_BYTES || field + 2 > len {
                return Err(OffloadError::CsumOutside {
                    start: hdr.csum_start,
                    offset: hdr.csum_offset,
                    len,
                });
            }
        }
        let work = match hdr.gso_type & !GSO_ECN {
            GSO_NONE if needs_csum => Work::Csum,
            GSO_NONE => Work::None,
            GSO_TCPV4 => Work::Tcp4,
            GSO_TCPV6 => Work::Tcp6,
            GSO_UDP_L4 => Work::Udp,
            _ => return Err(OffloadError::BadGsoType(hdr.gso_type)),
        };
        // What is passed on: only the flag that asks for work (a sender's
        // DATA_VALID vouches for nothing), and nothing at all for a frame
        // that needs none.
        let passed = match work {
            Work::None => VnetHdr::default(),
            _ => VnetHdr {
                flags: hdr.flags & F_NEEDS_CSUM,
                ..hdr
            },
        };
        let mut meta = OffloadMeta {
            hdr: passed,
            work,
            ..OffloadMeta::NONE
        };
        if matches!(work, Work::None | Work::Csum) {
            return Ok(meta);
        }
        if hdr.gso_size == 0 {
            return Err(OffloadError::ZeroGsoSize);
        }
        if !needs_csum {
            return Err(OffloadError::GsoWithoutCsum);
        }
        let bad = OffloadError::Malformed;
        let ethertype = be16(frame, 12).ok_or(bad("no ethertype"))?;
        let l3 = ETH_HEADER_BYTES;
        let (proto, l4, end) = match (work, ethertype) {
            (Work::Tcp4 | Work::Udp, ETHERTYPE_IPV4) => {
                let vihl = *frame.get(l3).ok_or(bad("no ipv4 header"))?;
                let ihl = usize::from(vihl & 0x0f) * 4;
                if vihl >> 4 != 4 || ihl < 20 || l3 + ihl > len {
                    return Err(bad("bad ipv4 version or header length"));
                }
                let frag = be16(frame, l3 + 6).ok_or(bad("no ipv4 header"))?;
                if frag & 0x3fff != 0 {
                    return Err(bad("ipv4 fragment"));
                }
                let total = usize::from(be16(frame, l3 + 2).ok_or(bad("no ipv4 header"))?);
                (frame[l3 + 9], l3 + ihl, l3 + total)
            }
            (Work::Tcp6 | Work::Udp, ETHERTYPE_IPV6) => {
                if frame.get(l3).is_none_or(|v| v >> 4 != 6) || l3 + 40 > len {
                    return Err(bad("bad ipv6 header"));
                }
                let plen = usize::from(be16(frame, l3 + 4).ok_or(bad("no ipv6 header"))?);
                (frame[l3 + 6], l3 + 40, l3 + 40 + plen)
            }
            _ => return Err(bad("ethertype does not match the gso type")),
        };
        if end > len || end < l4 {
            return Err(bad("ip length disagrees with the frame"));
        }
        let (want_proto, field, l4_hlen) = if work == Work::Udp {
            (PROTO_UDP, 6, 8)
        } else {
            let off = frame.get(l4 + 12).ok_or(bad("no tcp header"))?;
            (PROTO_TCP, 16, usize::from(off >> 4) * 4)
        };
        if proto != want_proto {
            return Err(bad("ip protocol does not match the gso type"));
        }
        if l4_hlen < 8 || (work != Work::Udp && l4_hlen < 20) || l4 + l4_hlen > end {
            return Err(bad("bad l4 header length"));
        }
        if usize::from(hdr.csum_start) != l4 || usize::from(hdr.csum_offset) != field {
            return Err(bad("checksum offsets are not the l4 checksum"));
        }
        let payload = l4 + l4_hlen;
        let segs = (end - payload).div_ceil(usize::from(hdr.gso_size)).max(1);
        if segs > MAX_SEGMENTS {
            return Err(OffloadError::TooManySegments(segs));
        }
        meta.l3 = l3;
        meta.l4 = l4;
        meta.payload = payload;
        meta.end = end;
        Ok(meta)
    }

    /// How many wire packets [`segment`] cuts this frame into: the GSO
    /// segments of a super-frame, else one.
    pub fn wire_packets(&self) -> usize {
        match self.work {
            Work::Tcp4 | Work::Tcp6 | Work::Udp => self
                .end
                .saturating_sub(self.payload)
                .div_ceil(usize::from(self.hdr.gso_size).max(1))
                .max(1),
            Work::None | Work::Csum => 1,
        }
    }

    /// True when the frame is not yet as on the wire.
    pub fn needs_work(&self) -> bool {
        self.work != Work::None
    }
}

/// Wire packets cut from one frame, in one reused buffer.
#[derive(Debug, Default)]
pub struct Segments {
    buf: Vec<u8>,
    ends: Vec<usize>,
}

impl Segments {
    /// An empty set.
    pub fn new() -> Segments {
        Segments::default()
    }

    /// Forgets the packets, keeping the memory.
    pub fn clear(&mut self) {
        self.buf.clear();
        self.ends.clear();
    }

    /// How many packets.
    pub fn len(&self) -> usize {
        self.ends.len()
    }

    /// True when there are none.
    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    /// Packet `i`.
    pub fn get(&self, i: usize) -> Option<&[u8]> {
        let end = *self.ends.get(i)?;
        let start = if i == 0 { 0 } else { self.ends[i - 1] };
        self.buf.get(start..end)
    }

    /// The packets in order.
    pub fn iter(&self) -> impl Iterator<Item = &[u8]> {
        (0..self.len()).filter_map(|i| self.get(i))
    }

    fn push(&mut self, parts: &[&[u8]]) -> usize {
        let start = self.buf.len();
        for p in parts {
            self.buf.extend_from_slice(p);
        }
        self.ends.push(self.buf.len());
        start
    }
}

/// Adds `data` to a running one's-complement sum (RFC 1071).
fn sum(mut acc: u32, data: &[u8]) -> u32 {
    let mut chunks = data.chunks_exact(2);
    for c in &mut chunks {
        acc = acc.wrapping_add(u32::from(u16::from_be_bytes([c[0], c[1]])));
        acc = (acc & 0xffff) + (acc >> 16);
    }
    if let [b] = chunks.remainder() {
        acc = acc.wrapping_add(u32::from(*b) << 8);
        acc = (acc & 0xffff) + (acc >> 16);
    }
    acc
}

fn fold(mut acc: u32) -> u16 {
    while acc >> 16 != 0 {
        acc = (acc & 0xffff) + (acc >> 16);
    }
    !(acc as u16)
}

/// The IPv4 header checksum field computed over `h` (with the field zeroed).
fn ipv4_csum(h: &mut [u8]) {
    h[10..12].fill(0);
    let c = fold(sum(0, h));
    h[10..12].copy_from_slice(&c.to_be_bytes());
}

/// Writes the L4 checksum of `f[l4..]` (IPv4 or IPv6 pseudo-header from
/// `f[l3..l4]`) into `f[l4 + field..]`.
fn l4_csum(f: &mut [u8], l3: usize, l4: usize, field: usize, proto: u8) {
    f[l4 + field..l4 + field + 2].fill(0);
    let l4_len = f.len() - l4;
    let mut acc = if f[l3] >> 4 == 4 {
        sum(0, &f[l3 + 12..l3 + 20])
    } else {
        sum(0, &f[l3 + 8..l3 + 40])
    };
    acc = sum(acc, &[0, proto]);
    acc = sum(acc, &(l4_len as u32).to_be_bytes());
    acc = sum(acc, &f[l4..]);
    let c = match fold(acc) {
        0 if proto == PROTO_UDP => 0xffff,
        c => c,
    };
    f[l4 + field..l4 + field + 2].copy_from_slice(&c.to_be_bytes());
}

/// Completes a NEEDS_CSUM frame in place, as Linux's `skb_checksum_help`
/// does: the field already holds the pseudo-header sum; the one's-complement
/// of the sum from `csum_start` to the end goes into it. `meta` must come
/// from [`OffloadMeta::parse`] of this frame (offsets are re-checked anyway).
pub fn fill_csum(meta: &OffloadMeta, frame: &mut [u8]) {
    let start = usize::from(meta.hdr.csum_start);
    let field = start + usize::from(meta.hdr.csum_offset);
    if field + 2 > frame.len() || start > frame.len() {
        return;
    }
    let c = match fold(sum(0, &frame[start..])) {
        0 => 0xffff,
        c => c,
    };
    frame[field..field + 2].copy_from_slice(&c.to_be_bytes());
}

/// Writes the wire packets of `frame` (validated as `meta`) into `out`
/// (cleared first): one packet with its checksum filled for
/// [`Work::Csum`], the segments for GSO, the frame itself for
/// [`Work::None`]. Every IP length, IPv4 id and header checksum, TCP
/// sequence number and flags, UDP length and L4 checksum is recomputed.
pub fn segment(meta: &OffloadMeta, frame: &[u8], out: &mut Segments) {
    out.clear();
    match meta.work {
        Work::None => {
            out.push(&[frame]);
        }
        Work::Csum => {
            let start = out.push(&[frame]);
            fill_csum(meta, &mut out.buf[start..]);
        }
        Work::Tcp4 | Work::Tcp6 | Work::Udp => segment_gso(meta, frame, out),
    }
}

fn segment_gso(meta: &OffloadMeta, frame: &[u8], out: &mut Segments) {
    let (l3, l4, pay, end) = (meta.l3, meta.l4, meta.payload, meta.end);
    // parse() checked these; a meta built any other way yields nothing.
    if !(l3 < l4 && l4 < pay && pay <= end && end <= frame.len()) {
        return;
    }
    let headers = &frame[..pay];
    let payload = &frame[pay..end];
    let mss = usize::from(meta.hdr.gso_size).max(1);
    let v4 = frame[l3] >> 4 == 4;
    let udp = meta.work == Work::Udp;
    let ip_id = be16(frame, l3 + 4).unwrap_or(0);
    let seq0 = if udp {
        0
    } else {
        u32::from_be_bytes([frame[l4 + 4], frame[l4 + 5], frame[l4 + 6], frame[l4 + 7]])
    };
    // An empty payload still makes one packet (a bare ACK with the flags).
    let n = payload.len().div_ceil(mss).max(1);
    for i in 0..n {
        let chunk = &payload[(i * mss).min(payload.len())..((i + 1) * mss).min(payload.len())];
        let start = out.push(&[headers, chunk]);
        let f = &mut out.buf[start..];
        let seg_len = f.len();
        if v4 {
            let total = (seg_len - l3) as u16;
            f[l3 + 2..l3 + 4].copy_from_slice(&total.to_be_bytes());
            f[l3 + 4..l3 + 6].copy_from_slice(&ip_id.wrapping_add(i as u16).to_be_bytes());
            ipv4_csum(&mut f[l3..l4]);
        } else {
            let plen = (seg_len - l4) as u16;
            f[l3 + 4..l3 + 6].copy_from_slice(&plen.to_be_bytes());
        }
        if udp {
            let ulen = (seg_len - l4) as u16;
            f[l4 + 4..l4 + 6].copy_from_slice(&ulen.to_be_bytes());
            l4_csum(f, l3, l4, 6, PROTO_UDP);
        } else {
            let seq = seq0.wrapping_add((i * mss) as u32);
            f[l4 + 4..l4 + 8].copy_from_slice(&seq.to_be_bytes());
            if i + 1 < n {
                f[l4 + 13] &= !(TCP_FIN | TCP_PSH);
            }
            if i > 0 {
                f[l4 + 13] &= !TCP_CWR;
            }
            l4_csum(f, l3, l4, 16, PROTO_TCP);
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use etherparse::{PacketBuilder, SlicedPacket, TransportSlice};

    /// A TCP super-frame as a Linux guest hands it over with TSO: headers
    /// for the whole payload, the checksum field holding the pseudo-header
    /// sum only. `v6` picks IPv6.
    pub(crate) fn tso_frame(v6: bool, payload: usize, mss: u16) -> (VnetHdr, Vec<u8>) {
        let body: Vec<u8> = (0..payload).map(|i| (i * 7 % 251) as u8).collect();
        let b = PacketBuilder::ethernet2([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2]);
        let b = if v6 {
            b.ipv6([0xfd; 16], [0xfe; 16], 64)
        } else {
            b.ipv4([10, 0, 0, 1], [10, 0, 0, 2], 64)
        };
        let b = b.tcp(40000, 5201, 1_000_000, 64240).ack(77).psh().fin();
        let mut f = Vec::new();
        b.write(&mut f, &body).unwrap();
        let l4 = if v6 { 54 } else { 34 };
        // Replace the full checksum by the pseudo-header sum, as a guest does.
        f[l4 + 16..l4 + 18].fill(0);
        let mut acc = if v6 {
            sum(0, &f[22..54])
        } else {
            sum(0, &f[26..34])
        };
        acc = sum(acc, &[0, PROTO_TCP]);
        acc = sum(acc, &((f.len() - l4) as u32).to_be_bytes());
        let partial = !fold(acc);
        f[l4 + 16..l4 + 18].copy_from_slice(&partial.to_be_bytes());
        let hdr = VnetHdr {
            flags: F_NEEDS_CSUM,
            gso_type: if v6 { GSO_TCPV6 } else { GSO_TCPV4 },
            hdr_len: (l4 + 20) as u16,
            gso_size: mss,
            csum_start: l4 as u16,
            csum_offset: 16,
        };
        (hdr, f)
    }

    /// Parses `seg` with etherparse, checks the IPv4 header checksum and the
    /// TCP/UDP checksum, and returns (payload length, tcp seq, fin, psh).
    pub(crate) fn check_wire(seg: &[u8]) -> (usize, u32, bool, bool) {
        use etherparse::NetSlice;
        let p = SlicedPacket::from_ethernet(seg).expect("etherparse parses the segment");
        let (v4, v6) = match p.net.expect("an ip header") {
            NetSlice::Ipv4(s) => {
                let h = s.header().to_header();
                assert_eq!(h.header_checksum, h.calc_header_checksum(), "ipv4 checksum");
                (Some(h), None)
            }
            NetSlice::Ipv6(s) => (None, Some(s.header().to_header())),
            _ => panic!("not ip"),
        };
        match p.transport.expect("a transport header") {
            TransportSlice::Tcp(t) => {
                let h = t.to_header();
                let want = match (&v4, &v6) {
                    (Some(ip), _) => h.calc_checksum_ipv4(ip, t.payload()).unwrap(),
                    (_, Some(ip)) => h.calc_checksum_ipv6(ip, t.payload()).unwrap(),
                    _ => unreachable!(),
                };
                assert_eq!(h.checksum, want, "tcp checksum");
                (t.payload().len(), h.sequence_number, h.fin, h.psh)
            }
            TransportSlice::Udp(u) => {
                let h = u.to_header();
                let want = match (&v4, &v6) {
                    (Some(ip), _) => h.calc_checksum_ipv4(ip, u.payload()).unwrap(),
                    (_, Some(ip)) => h.calc_checksum_ipv6(ip, u.payload()).unwrap(),
                    _ => unreachable!(),
                };
                assert_eq!(h.checksum, want, "udp checksum");
                (u.payload().len(), 0, false, false)
            }
            _ => panic!("not tcp/udp"),
        }
    }

    #[test]
    fn wire_packets_counts_what_segment_cuts() {
        // The switch draws one drop per wire packet without cutting, so
        // the count must be segment()'s, payload edges included.
        let mut out = Segments::new();
        for v6 in [false, true] {
            for payload in [0, 1, 1447, 1448, 1449, 2896, 10_000, 65_000] {
                let (hdr, f) = tso_frame(v6, payload, 1448);
                let meta = OffloadMeta::parse(hdr, &f).expect("valid tso frame");
                segment(&meta, &f, &mut out);
                assert_eq!(meta.wire_packets(), out.len(), "v6 {v6} payload {payload}");
            }
        }
        let plain = OffloadMeta::parse(VnetHdr::default(), &[0u8; 60]).expect("plain frame");
        assert_eq!(plain.wire_packets(), 1);
    }

    #[test]
    fn header_round_trips() {
        let h = VnetHdr {
            flags: 1,
            gso_type: 4,
            hdr_len: 74,
            gso_size: 1440,
            csum_start: 54,
            csum_offset: 16,
        };
        assert_eq!(VnetHdr::from_bytes(&h.to_bytes()), Some(h));
        assert_eq!(VnetHdr::from_bytes(&[0; 9]), None);
    }

    #[test]
    fn tcp4_and_tcp6_segment_into_valid_wire_packets() {
        for v6 in [false, true] {
            let (hdr, f) = tso_frame(v6, 10_000, 1448);
            let meta = OffloadMeta::parse(hdr, &f).unwrap();
            assert_eq!(meta.work, if v6 { Work::Tcp6 } else { Work::Tcp4 });
            let mut out = Segments::new();
            segment(&meta, &f, &mut out);
            assert_eq!(out.len(), 7, "10000 / 1448 rounded up");
            let mut total = 0;
            for (i, s) in out.iter().enumerate() {
                let (n, seq, fin, psh) = check_wire(s);
                assert_eq!(seq, 1_000_000 + (i * 1448) as u32);
                let last = i == 6;
                assert_eq!((fin, psh), (last, last), "fin/psh only on the last");
                assert_eq!(n, if last { 10_000 - 6 * 1448 } else { 1448 });
                total += n;
            }
            assert_eq!(total, 10_000);
        }
    }

    #[test]
    fn csum_only_is_filled() {
        let (mut hdr, f) = tso_frame(false, 500, 1448);
        hdr.gso_type = GSO_NONE;
        hdr.gso_size = 0;
        let meta = OffloadMeta::parse(hdr, &f).unwrap();
        assert_eq!(meta.work, Work::Csum);
        let mut out = Segments::new();
        segment(&meta, &f, &mut out);
        assert_eq!(out.len(), 1);
        assert_eq!(check_wire(out.get(0).unwrap()).0, 500);
    }

    #[test]
    fn udp_l4_segments() {
        let body = vec![0xab; 3000];
        let mut f = Vec::new();
        PacketBuilder::ethernet2([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2])
            .ipv4([10, 0, 0, 1], [10, 0, 0, 2], 64)
            .udp(1000, 2000)
            .write(&mut f, &body)
            .unwrap();
        let hdr = VnetHdr {
            flags: F_NEEDS_CSUM,
            gso_type: GSO_UDP_L4,
            hdr_len: 42,
            gso_size: 1200,
            csum_start: 34,
            csum_offset: 6,
        };
        let meta = OffloadMeta::parse(hdr, &f).unwrap();
        let mut out = Segments::new();
        segment(&meta, &f, &mut out);
        let lens: Vec<usize> = out.iter().map(|s| check_wire(s).0).collect();
        assert_eq!(lens, [1200, 1200, 600]);
    }

    #[test]
    fn bogus_headers_are_refused() {
        let (good, f) = tso_frame(false, 4000, 1448);
        let bad = |h: VnetHdr, f: &[u8]| OffloadMeta::parse(h, f).unwrap_err();
        let with = |m: &dyn Fn(&mut VnetHdr)| {
            let mut h = good;
            m(&mut h);
            h
        };
        assert_eq!(
            bad(with(&|h| h.gso_type = 2), &f),
            OffloadError::BadGsoType(2)
        );
        assert_eq!(
            bad(with(&|h| h.gso_type = GSO_UDP), &f),
            OffloadError::BadGsoType(3)
        );
        assert_eq!(
            bad(with(&|h| h.gso_size = 0), &f),
            OffloadError::ZeroGsoSize
        );
        assert_eq!(
            bad(with(&|h| h.flags = 0x40), &f),
            OffloadError::BadFlags(0x40)
        );
        assert_eq!(
            bad(with(&|h| h.flags = 0), &f),
            OffloadError::GsoWithoutCsum
        );
        assert!(matches!(
            bad(with(&|h| h.hdr_len = 9000), &f),
            OffloadError::HdrLenBeyondFrame { hdr_len: 9000, .. }
        ));
        assert!(matches!(
            bad(with(&|h| h.csum_start = 4090), &f),
            OffloadError::CsumOutside { .. }
        ));
        assert!(matches!(
            bad(with(&|h| h.csum_offset = 0xffff), &f),
            OffloadError::CsumOutside { .. }
        ));
        assert!(matches!(
            bad(with(&|h| h.csum_start = 2), &f),
            OffloadError::CsumOutside { .. }
        ));
        assert!(matches!(
            bad(with(&|h| h.gso_type = GSO_TCPV6), &f),
            OffloadError::Malformed(_)
        ));
        assert!(matches!(
            bad(with(&|h| h.gso_size = 1), &f),
            OffloadError::TooManySegments(4000)
        ));
        // A truncated frame: the IP length now exceeds it.
        assert!(matches!(
            bad(good, &f[..f.len() - 1]),
            OffloadError::Malformed(_)
        ));
    }

    /// Every header over every truncation of a frame: parse never panics,
    /// and whatever it accepts segments into parseable packets or nothing.
    #[test]
    fn no_header_or_length_panics() {
        let (good, f) = tso_frame(false, 3000, 1000);
        let mut out = Segments::new();
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        for _ in 0..20_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let b = x.to_le_bytes();
            let mut h = good;
            match b[0] % 6 {
                0 => h.gso_type = b[1],
                1 => h.gso_size = u16::from_le_bytes([b[1], b[2]]),
                2 => h.hdr_len = u16::from_le_bytes([b[1], b[2]]),
                3 => h.csum_start = u16::from_le_bytes([b[1], b[2]]),
                4 => h.csum_offset = u16::from_le_bytes([b[1], b[2]]),
                _ => h.flags = b[1],
            }
            let cut = usize::from(u16::from_le_bytes([b[3], b[4]])) % (f.len() + 1);
            let mut g = f[..cut].to_vec();
            if b[5] % 3 == 0 && cut > 20 {
                g[usize::from(b[6]) % cut] = b[7];
            }
            if let Ok(m) = OffloadMeta::parse(h, &g) {
                segment(&m, &g, &mut out);
            }
        }
    }
}
