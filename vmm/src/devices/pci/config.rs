//! One PCI function's configuration space (PCI Local Bus 3.0, 6.1): the
//! 256-byte type-0 header and capability list, with a per-byte mask of the
//! bits a guest may write.
//!
//! Every write goes through the mask (`new = old & !w | value & w`), which is
//! also the whole BAR sizing protocol: a BAR's writable bits are its address
//! bits above its size, so writing all ones reads back `!(size - 1)` plus the
//! read-only type bits, as the driver expects. Read-only registers (IDs,
//! class, status, the capability list) simply have a zero mask. The
//! extended space of an ECAM function (bytes 256..4096) reads as zeros: no
//! extended capabilities.
//!
//! Accesses come from the guest: widths other than 1, 2 and 4, unaligned
//! offsets and offsets past 4 KiB are refused (reads give all ones) and the
//! caller counts them.

use serde::{Deserialize, Serialize};

/// Bytes of the conventional configuration space modelled.
pub const CONFIG_BYTES: usize = 256;
/// Bytes of one function's ECAM window (the extended space reads as 0).
pub const EXTENDED_CONFIG_BYTES: usize = 4096;
/// Number of BARs in a type-0 header.
pub const BAR_COUNT: usize = 6;
/// First byte of the capability area (right after the type-0 header).
const FIRST_CAP_OFFSET: usize = 0x40;

/// Header offsets (PCI 3.0, 6.1).
pub mod reg {
    /// Vendor ID (16 bits).
    pub const VENDOR_ID: usize = 0x00;
    /// Device ID (16 bits).
    pub const DEVICE_ID: usize = 0x02;
    /// Command (16 bits).
    pub const COMMAND: usize = 0x04;
    /// Status (16 bits).
    pub const STATUS: usize = 0x06;
    /// Revision ID (8 bits), then the 24-bit class code.
    pub const REVISION_ID: usize = 0x08;
    /// Cache line size (8 bits).
    pub const CACHE_LINE_SIZE: usize = 0x0c;
    /// Latency timer (8 bits).
    pub const LATENCY_TIMER: usize = 0x0d;
    /// Header type (8 bits).
    pub const HEADER_TYPE: usize = 0x0e;
    /// BAR 0 (32 bits each, six of them).
    pub const BAR0: usize = 0x10;
    /// Subsystem vendor ID (16 bits).
    pub const SUBSYSTEM_VENDOR_ID: usize = 0x2c;
    /// Subsystem ID (16 bits).
    pub const SUBSYSTEM_ID: usize = 0x2e;
    /// Capabilities pointer (8 bits).
    pub const CAPABILITIES: usize = 0x34;
    /// Interrupt line (8 bits, scratch for the OS).
    pub const INTERRUPT_LINE: usize = 0x3c;
}

/// Command register: memory space decoding enabled.
pub const COMMAND_MEMORY: u16 = 1 << 1;
/// Command register: bus master enabled.
pub const COMMAND_BUS_MASTER: u16 = 1 << 2;
/// Command register: INTx disabled.
pub const COMMAND_INTX_DISABLE: u16 = 1 << 10;
/// Status register: the function has a capability list.
pub const STATUS_CAP_LIST: u16 = 1 << 4;

/// What identifies a function.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PciHeader {
    /// Vendor ID.
    pub vendor_id: u16,
    /// Device ID.
    pub device_id: u16,
    /// Revision ID.
    pub revision_id: u8,
    /// Class code: base class, subclass, programming interface.
    pub class: [u8; 3],
    /// Subsystem vendor ID.
    pub subsystem_vendor_id: u16,
    /// Subsystem ID.
    pub subsystem_id: u16,
}

/// A configuration-space setup mistake (VMM bugs, never guest input).
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum PciConfigError {
    /// BAR index out of range or already used.
    #[error("BAR {index} does not exist or is already set up (a function has BARs 0-5)")]
    BarIndex {
        /// The index.
        index: usize,
    },
    /// A BAR size that is not a power of two of at least 16 bytes and below 4 GiB.
    #[error("BAR size {size_bytes:#x} is not a power of two between 16 bytes and 2 GiB")]
    BarSize {
        /// The size.
        size_bytes: u64,
    },
    /// A BAR address not aligned to its size or above 4 GiB.
    #[error(
        "BAR address {gpa:#x} is not aligned to the BAR's size {size_bytes:#x} or is above 4 GiB"
    )]
    BarAddress {
        /// The address.
        gpa: u64,
        /// The BAR's size.
        size_bytes: u64,
    },
    /// The capability area is full or the capability is malformed.
    #[error("a capability of {len_bytes} bytes does not fit in configuration space (or is shorter than 2 bytes)")]
    CapabilitySpace {
        /// The capability's length.
        len_bytes: usize,
    },
}

/// A refused guest access (the caller counts it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AccessRefused;

/// Checks a configuration access: width 1, 2 or 4, naturally aligned,
/// inside one function's 4 KiB.
pub fn check_access(offset: u64, len: usize) -> Result<usize, AccessRefused> {
    let off = usize::try_from(offset).map_err(|_| AccessRefused)?;
    if !matches!(len, 1 | 2 | 4) || off % len != 0 || off + len > EXTENDED_CONFIG_BYTES {
        return Err(AccessRefused);
    }
    Ok(off)
}

/// The state a snapshot keeps: the bytes (masks are rebuilt by the device).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PciConfigState {
    /// The 256 configuration bytes.
    #[serde(with = "serde_bytes")]
    pub bytes: Vec<u8>,
}

/// One function's configuration space.
#[derive(Clone)]
pub struct PciConfig {
    bytes: [u8; CONFIG_BYTES],
    writable: [u8; CONFIG_BYTES],
    bar_sizes: [u64; BAR_COUNT],
    next_cap: usize,
    last_cap: Option<usize>,
}

impl PciConfig {
    /// A type-0 header with `h`'s identity, no BARs, no capabilities.
    pub fn new(h: &PciHeader) -> PciConfig {
        let mut c = PciConfig {
            bytes: [0; CONFIG_BYTES],
            writable: [0; CONFIG_BYTES],
            bar_sizes: [0; BAR_COUNT],
            next_cap: FIRST_CAP_OFFSET,
            last_cap: None,
        };
        c.set16(reg::VENDOR_ID, h.vendor_id);
        c.set16(reg::DEVICE_ID, h.device_id);
        c.bytes[reg::REVISION_ID] = h.revision_id;
        c.bytes[reg::REVISION_ID + 1] = h.class[2];
        c.bytes[reg::REVISION_ID + 2] = h.class[1];
        c.bytes[reg::REVISION_ID + 3] = h.class[0];
        c.set16(reg::SUBSYSTEM_VENDOR_ID, h.subsystem_vendor_id);
        c.set16(reg::SUBSYSTEM_ID, h.subsystem_id);
        let cmd = COMMAND_MEMORY | COMMAND_BUS_MASTER | COMMAND_INTX_DISABLE;
        c.mask16(reg::COMMAND, cmd);
        c.writable[reg::CACHE_LINE_SIZE] = 0xff;
        c.writable[reg::LATENCY_TIMER] = 0xff;
        c.writable[reg::INTERRUPT_LINE] = 0xff;
        c
    }

    fn set16(&mut self, off: usize, v: u16) {
        self.bytes[off..off + 2].copy_from_slice(&v.to_le_bytes());
    }

    fn mask16(&mut self, off: usize, m: u16) {
        self.writable[off..off + 2].copy_from_slice(&m.to_le_bytes());
    }

    fn get16(&self, off: usize) -> u16 {
        u16::from_le_bytes([self.bytes[off], self.bytes[off + 1]])
    }

    fn get32(&self, off: usize) -> u32 {
        u32::from_le_bytes([
            self.bytes[off],
            self.bytes[off + 1],
            self.bytes[off + 2],
            self.bytes[off + 3],
        ])
    }

    /// Declares BAR `index` as 32-bit, non-prefetchable memory of
    /// `size_bytes` (a power of two) at `gpa`.
    pub fn add_bar(
        &mut self,
        index: usize,
        size_bytes: u64,
        gpa: u64,
    ) -> Result<(), PciConfigError> {
        if index >= BAR_COUNT || self.bar_sizes[index] != 0 {
            return Err(PciConfigError::BarIndex { index });
        }
        if !size_bytes.is_power_of_two() || !(16..=1 << 31).contains(&size_bytes) {
            return Err(PciConfigError::BarSize { size_bytes });
        }
        if gpa % size_bytes != 0 || gpa.checked_add(size_bytes).is_none_or(|e| e > 1 << 32) {
            return Err(PciConfigError::BarAddress { gpa, size_bytes });
        }
        self.bar_sizes[index] = size_bytes;
        let off = reg::BAR0 + 4 * index;
        let mask = !(u32::try_from(size_bytes - 1).expect("size checked below 4 GiB"));
        self.writable[off..off + 4].copy_from_slice(&mask.to_le_bytes());
        let addr = u32::try_from(gpa).expect("checked below 4 GiB");
        self.bytes[off..off + 4].copy_from_slice(&addr.to_le_bytes());
        Ok(())
    }

    /// BAR `index`'s (address, size), when it exists.
    pub fn bar(&self, index: usize) -> Option<(u64, u64)> {
        let size = *self.bar_sizes.get(index)?;
        if size == 0 {
            return None;
        }
        let addr = u64::from(self.get32(reg::BAR0 + 4 * index) & !0xf);
        Some((addr, size))
    }

    /// Whether memory decoding is on (the command register's memory bit).
    pub fn memory_enabled(&self) -> bool {
        self.get16(reg::COMMAND) & COMMAND_MEMORY != 0
    }

    /// Appends a capability: `body[0]` is its ID, `body[1]` (the next
    /// pointer) is filled in here; `writable` (same length or shorter) is its
    /// write mask. Returns its offset.
    pub fn add_capability(
        &mut self,
        body: &[u8],
        writable: &[u8],
    ) -> Result<usize, PciConfigError> {
        let len_bytes = body.len();
        let off = self.next_cap;
        if len_bytes < 2 || writable.len() > len_bytes || off + len_bytes > CONFIG_BYTES {
            return Err(PciConfigError::CapabilitySpace { len_bytes });
        }
        self.bytes[off..off + len_bytes].copy_from_slice(body);
        self.bytes[off + 1] = 0;
        self.writable[off..off + writable.len()].copy_from_slice(writable);
        self.writable[off] = 0;
        self.writable[off + 1] = 0;
        let off_u8 = u8::try_from(off).expect("below 256");
        match self.last_cap {
            None => self.bytes[reg::CAPABILITIES] = off_u8,
            Some(prev) => self.bytes[prev + 1] = off_u8,
        }
        self.last_cap = Some(off);
        let status = self.get16(reg::STATUS) | STATUS_CAP_LIST;
        self.set16(reg::STATUS, status);
        self.next_cap = (off + len_bytes + 3) & !3;
        Ok(off)
    }

    /// The capability list as the guest walks it: (ID, offset) pairs, at
    /// most 48 (a loop in the list cannot hang the walker).
    pub fn capabilities(&self) -> Vec<(u8, usize)> {
        let mut caps = Vec::new();
        if self.get16(reg::STATUS) & STATUS_CAP_LIST == 0 {
            return caps;
        }
        let mut p = usize::from(self.bytes[reg::CAPABILITIES] & !3);
        while p != 0 && caps.len() < 48 && p + 1 < CONFIG_BYTES {
            caps.push((self.bytes[p], p));
            p = usize::from(self.bytes[p + 1] & !3);
        }
        caps
    }

    /// Reads `data.len()` bytes at `offset` (a checked access: see
    /// [`check_access`]); refused accesses read all ones.
    pub fn read(&self, offset: u64, data: &mut [u8]) -> Result<(), AccessRefused> {
        let off = match check_access(offset, data.len()) {
            Ok(o) => o,
            Err(e) => {
                data.fill(0xff);
                return Err(e);
            }
        };
        for (i, b) in data.iter_mut().enumerate() {
            *b = self.bytes.get(off + i).copied().unwrap_or(0);
        }
        Ok(())
    }

    /// Writes `data` at `offset` through the write mask (a checked access).
    pub fn write(&mut self, offset: u64, data: &[u8]) -> Result<(), AccessRefused> {
        let off = check_access(offset, data.len())?;
        for (i, v) in data.iter().enumerate() {
            let Some(w) = self.writable.get(off + i).copied() else {
                continue; // the extended space: nothing to write
            };
            let b = &mut self.bytes[off + i];
            *b = (*b & !w) | (v & w);
        }
        Ok(())
    }

    /// Direct access to bytes the device itself maintains (its capability
    /// fields); not through the mask.
    pub fn bytes(&self) -> &[u8; CONFIG_BYTES] {
        &self.bytes
    }

    /// Saves the bytes.
    pub fn save(&self) -> PciConfigState {
        PciConfigState {
            bytes: self.bytes.to_vec(),
        }
    }

    /// Takes the guest-writable bits of `state` (a file) into this freshly
    /// built space; everything read-only stays as this VMM built it, so a
    /// file cannot change IDs, BAR sizes or the capability list.
    pub fn restore(&mut self, state: &PciConfigState) -> Result<(), AccessRefused> {
        if state.bytes.len() != CONFIG_BYTES {
            return Err(AccessRefused);
        }
        for (i, v) in state.bytes.iter().enumerate() {
            let w = self.writable[i];
            self.bytes[i] = (self.bytes[i] & !w) | (v & w);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header() -> PciHeader {
        PciHeader {
            vendor_id: 0x1af4,
            device_id: 0x1042,
            revision_id: 1,
            class: [0x01, 0x80, 0x00],
            subsystem_vendor_id: 0x1af4,
            subsystem_id: 0x40,
        }
    }

    fn rd32(c: &PciConfig, off: u64) -> u32 {
        let mut b = [0u8; 4];
        c.read(off, &mut b).expect("aligned");
        u32::from_le_bytes(b)
    }

    #[test]
    fn identity_is_read_only() {
        let mut c = PciConfig::new(&header());
        assert_eq!(rd32(&c, 0), 0x1042_1af4);
        assert_eq!(rd32(&c, 8), 0x0180_0001);
        c.write(0, &[0; 4]).expect("aligned");
        assert_eq!(rd32(&c, 0), 0x1042_1af4, "IDs ignore writes");
        c.write(0x3c, &[11]).expect("aligned");
        assert_eq!(rd32(&c, 0x3c) & 0xff, 11, "interrupt line is scratch");
    }

    #[test]
    fn bar_sizing_protocol() {
        let mut c = PciConfig::new(&header());
        c.add_bar(0, 0x8000, 0xc000_8000).expect("valid bar");
        assert_eq!(c.bar(0), Some((0xc000_8000, 0x8000)));
        c.write(0x10, &u32::MAX.to_le_bytes()).expect("aligned");
        assert_eq!(rd32(&c, 0x10), 0xffff_8000, "size readback");
        c.write(0x10, &0xc001_0000u32.to_le_bytes())
            .expect("aligned");
        assert_eq!(c.bar(0), Some((0xc001_0000, 0x8000)));
        c.write(0x10, &0xc001_1234u32.to_le_bytes())
            .expect("aligned");
        assert_eq!(c.bar(0), Some((0xc001_0000, 0x8000)), "low bits ignored");
        // Unused BARs and the ROM BAR size to zero: nothing there.
        c.write(0x14, &u32::MAX.to_le_bytes()).expect("aligned");
        assert_eq!(rd32(&c, 0x14), 0);
        c.write(0x30, &u32::MAX.to_le_bytes()).expect("aligned");
        assert_eq!(rd32(&c, 0x30), 0);
        assert!(c.bar(1).is_none());
    }

    #[test]
    fn bad_bars_are_refused() {
        let mut c = PciConfig::new(&header());
        assert!(c.add_bar(6, 0x1000, 0).is_err());
        assert!(c.add_bar(0, 0x1001, 0).is_err());
        assert!(c.add_bar(0, 8, 0).is_err());
        assert!(c.add_bar(0, 0x1000, 0x800).is_err());
        assert!(c.add_bar(0, 0x1000, 0xffff_f000 + 0x1000).is_err());
        c.add_bar(0, 0x1000, 0x1000).expect("valid");
        assert!(c.add_bar(0, 0x1000, 0x1000).is_err(), "used twice");
    }

    #[test]
    fn capability_list_walks() {
        let mut c = PciConfig::new(&header());
        assert!(c.capabilities().is_empty());
        let a = c.add_capability(
            &[0x09, 0xaa, 16, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
            &[],
        );
        let b = c.add_capability(&[0x11, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0], &[0, 0, 0, 0xc0]);
        assert_eq!(a, Ok(0x40));
        assert_eq!(b, Ok(0x50));
        assert_eq!(c.capabilities(), vec![(0x09, 0x40), (0x11, 0x50)]);
        assert_ne!(rd32(&c, 4) >> 16 & u32::from(STATUS_CAP_LIST), 0);
        // Only the masked bits of a capability are writable.
        c.write(0x50, &u32::MAX.to_le_bytes()).expect("aligned");
        assert_eq!(rd32(&c, 0x50), 0xc000_0011);
        assert!(c.add_capability(&[0x09; 200], &[]).is_err(), "no room");
        assert!(c.add_capability(&[0x09], &[]).is_err(), "too short");
    }

    #[test]
    fn hostile_accesses_are_refused() {
        let mut c = PciConfig::new(&header());
        let mut b3 = [0u8; 3];
        assert!(c.read(0, &mut b3).is_err());
        assert_eq!(b3, [0xff; 3]);
        let mut b4 = [0u8; 4];
        assert!(c.read(2, &mut b4).is_err(), "unaligned");
        assert!(c.read(4096, &mut b4).is_err(), "past the function");
        assert!(c.read(u64::MAX, &mut b4).is_err());
        assert!(c.write(1, &[0, 0]).is_err());
        assert!(c.write(0, &[0; 8]).is_err());
        assert!(c.read(0x100, &mut b4).is_ok(), "extended space reads 0");
        assert_eq!(b4, [0; 4]);
        assert!(c.write(0xffc, &[1; 4]).is_ok());
    }

    #[test]
    fn restore_takes_only_writable_bits() {
        let mut c = PciConfig::new(&header());
        c.add_bar(0, 0x1000, 0x1000).expect("valid");
        c.write(4, &[0x06, 0]).expect("aligned");
        c.write(0x10, &0x2000u32.to_le_bytes()).expect("aligned");
        let mut saved = c.save();
        saved.bytes[0] = 0x99; // a tampered vendor ID
        let mut fresh = PciConfig::new(&header());
        fresh.add_bar(0, 0x1000, 0x1000).expect("valid");
        fresh.restore(&saved).expect("right length");
        assert_eq!(fresh.bar(0), Some((0x2000, 0x1000)));
        assert!(fresh.memory_enabled());
        assert_eq!(rd32(&fresh, 0) & 0xffff, 0x1af4);
        assert!(fresh
            .restore(&PciConfigState { bytes: vec![0; 3] })
            .is_err());
    }
}
