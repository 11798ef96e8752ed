//! MAC addresses and the few Ethernet header facts the switch needs.
//!
//! The switch reads only the destination and source addresses (bytes 0..12 of
//! an Ethernet II frame, IEEE 802.3 clause 3.2); everything after them is
//! opaque payload. Frames come from untrusted guests, so every accessor here is
//! total: a frame shorter than a header yields `None`, never a panic.

use std::fmt;
use std::str::FromStr;

use crate::fnv1a::fnv1a;

/// Length of an Ethernet header (destination, source, EtherType), in bytes.
pub const ETH_HEADER_BYTES: usize = 14;

/// The largest frame the switch accepts, in bytes: a 65535-byte payload plus
/// the Ethernet header. Anything longer is dropped and counted as an error on
/// the port that sent it.
pub const MAX_FRAME_BYTES: usize = 65_535 + ETH_HEADER_BYTES;

/// A 48-bit IEEE 802 MAC address.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MacAddr(pub [u8; 6]);

impl MacAddr {
    /// ff:ff:ff:ff:ff:ff.
    pub const BROADCAST: MacAddr = MacAddr([0xff; 6]);

    /// True for group addresses (the I/G bit, bit 0 of the first octet),
    /// which includes broadcast. The switch floods these.
    pub fn is_multicast(self) -> bool {
        self.0[0] & 1 == 1
    }

    /// True for ff:ff:ff:ff:ff:ff.
    pub fn is_broadcast(self) -> bool {
        self == Self::BROADCAST
    }

    /// True for 00:00:00:00:00:00, which no station may use as a source.
    pub fn is_zero(self) -> bool {
        self.0 == [0; 6]
    }

    /// A locally administered unicast address derived from `n`
    /// (`02:00:` + the four bytes of `n`, big-endian): handy for tests and
    /// for callers that number their ports.
    pub fn local(n: u32) -> MacAddr {
        let b = n.to_be_bytes();
        MacAddr([0x02, 0x00, b[0], b[1], b[2], b[3]])
    }
}

impl fmt::Display for MacAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let b = self.0;
        write!(
            f,
            "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
            b[0], b[1], b[2], b[3], b[4], b[5]
        )
    }
}

/// A deterministic, locally administered unicast MAC for the NIC of VM
/// `vm` on bridge `bridge`, salted until it differs from every MAC in
/// `taken`. The harness gives its NICs (and its kvm NIC slots) these, so a
/// VM's MAC on a bridge is the same in every run.
pub fn nic_mac(vm: &str, bridge: &str, taken: &[MacAddr]) -> MacAddr {
    let mut salt: u32 = 0;
    loop {
        let h = fnv1a(&[
            b"provium-nic",
            vm.as_bytes(),
            b"\0",
            bridge.as_bytes(),
            &salt.to_le_bytes(),
        ])
        .to_le_bytes();
        let mac = MacAddr([0x02, h[0], h[1], h[2], h[3], h[4]]);
        if !taken.contains(&mac) {
            return mac;
        }
        salt += 1;
    }
}

/// Why a string is not a MAC address.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("`{0}` is not a MAC address (expected six hex octets like 02:00:00:00:00:01)")]
pub struct MacParseError(pub String);

impl FromStr for MacAddr {
    type Err = MacParseError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let mut out = [0u8; 6];
        let mut parts = s.split(':');
        for byte in &mut out {
            let part = parts.next().ok_or_else(|| MacParseError(s.to_owned()))?;
            if part.len() != 2 {
                return Err(MacParseError(s.to_owned()));
            }
            *byte = u8::from_str_radix(part, 16).map_err(|_| MacParseError(s.to_owned()))?;
        }
        if parts.next().is_some() {
            return Err(MacParseError(s.to_owned()));
        }
        Ok(MacAddr(out))
    }
}

/// The destination address of `frame`, or `None` when it is shorter than a header.
pub fn dst_mac(frame: &[u8]) -> Option<MacAddr> {
    if frame.len() < ETH_HEADER_BYTES {
        return None;
    }
    let mut m = [0u8; 6];
    m.copy_from_slice(&frame[0..6]);
    Some(MacAddr(m))
}

/// The source address of `frame`, or `None` when it is shorter than a header.
pub fn src_mac(frame: &[u8]) -> Option<MacAddr> {
    if frame.len() < ETH_HEADER_BYTES {
        return None;
    }
    let mut m = [0u8; 6];
    m.copy_from_slice(&frame[6..12]);
    Some(MacAddr(m))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn macs_are_deterministic_local_unicast_and_distinct() {
        let a = nic_mac("a", "lan", &[]);
        assert_eq!(a, nic_mac("a", "lan", &[]));
        assert_eq!(a.0[0], 0x02, "locally administered, unicast");
        assert_ne!(a, nic_mac("b", "lan", &[]));
        assert_ne!(a, nic_mac("a", "wan", &[]));
        let salted = nic_mac("a", "lan", &[a]);
        assert_ne!(salted, a);
        assert_eq!(salted.0[0], 0x02);
    }

    #[test]
    fn parse_and_display_round_trip() {
        let m: MacAddr = "02:00:0a:ff:00:01".parse().unwrap();
        assert_eq!(m.0, [2, 0, 10, 255, 0, 1]);
        assert_eq!(m.to_string(), "02:00:0a:ff:00:01");
        assert!("02:00:0a:ff:00".parse::<MacAddr>().is_err());
        assert!("02:00:0a:ff:00:01:02".parse::<MacAddr>().is_err());
        assert!("02:00:0a:ff:00:zz".parse::<MacAddr>().is_err());
        assert!("2:00:0a:ff:00:01".parse::<MacAddr>().is_err());
    }

    #[test]
    fn group_bits() {
        assert!(MacAddr::BROADCAST.is_multicast());
        assert!(MacAddr::BROADCAST.is_broadcast());
        assert!(MacAddr([0x01, 0, 0x5e, 0, 0, 1]).is_multicast());
        assert!(!MacAddr::local(7).is_multicast());
        assert!(MacAddr([0; 6]).is_zero());
    }

    #[test]
    fn header_accessors_are_total() {
        assert_eq!(dst_mac(&[0u8; 13]), None);
        assert_eq!(src_mac(&[]), None);
        let mut f = vec![0u8; 14];
        f[0..6].copy_from_slice(&MacAddr::local(1).0);
        f[6..12].copy_from_slice(&MacAddr::local(2).0);
        assert_eq!(dst_mac(&f), Some(MacAddr::local(1)));
        assert_eq!(src_mac(&f), Some(MacAddr::local(2)));
    }
}
