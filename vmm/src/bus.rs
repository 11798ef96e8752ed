//! An address bus (PIO or MMIO) mapping non-overlapping ranges to devices.
//!
//! A vCPU exit looks up the device owning the address and hands it the offset
//! inside its range. Accesses that hit no device are not errors: reads float
//! high (all ones, as on an ISA bus) and writes are dropped, so a probing
//! guest cannot disturb the host.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// A device on a bus.
pub trait BusDevice: Send {
    /// A read of `data.len()` bytes at `offset` within the device's range.
    /// The guest controls both; implementations must accept any value.
    fn read(&mut self, offset: u64, data: &mut [u8]);
    /// A write of `data` at `offset` within the device's range.
    fn write(&mut self, offset: u64, data: &[u8]);
}

/// A bus error.
#[derive(Debug, thiserror::Error)]
pub enum BusError {
    /// The new range is empty or overlaps an existing one.
    #[error("bus range {base:#x}+{len:#x} is empty or overlaps a registered device")]
    Overlap {
        /// Start of the rejected range.
        base: u64,
        /// Its length.
        len: u64,
    },
}

struct BusRange {
    len: u64,
    device: Arc<Mutex<dyn BusDevice>>,
}

/// A set of devices keyed by address range.
#[derive(Default)]
pub struct Bus {
    ranges: BTreeMap<u64, BusRange>,
    /// Accesses dispatched (each one a vCPU exit): how the transports'
    /// costs are compared (docs/vmm.md, "PCI").
    accesses: AtomicU64,
}

impl Bus {
    /// An empty bus.
    pub fn new() -> Bus {
        Bus::default()
    }

    /// Registers `device` for `[base, base + len)`.
    pub fn insert(
        &mut self,
        base: u64,
        len: u64,
        device: Arc<Mutex<dyn BusDevice>>,
    ) -> Result<(), BusError> {
        let overlap = || BusError::Overlap { base, len };
        let end = base.checked_add(len).ok_or_else(overlap)?;
        if len == 0 {
            return Err(overlap());
        }
        if let Some((b, r)) = self.ranges.range(..end).next_back() {
            if b + r.len > base {
                return Err(overlap());
            }
        }
        self.ranges.insert(base, BusRange { len, device });
        Ok(())
    }

    /// Accesses dispatched so far, to a device or not.
    pub fn accesses(&self) -> u64 {
        self.accesses.load(Ordering::Relaxed)
    }

    fn find(&self, addr: u64) -> Option<(u64, &BusRange)> {
        self.accesses.fetch_add(1, Ordering::Relaxed);
        let (base, r) = self.ranges.range(..=addr).next_back()?;
        (addr - base < r.len).then_some((addr - base, r))
    }

    /// Dispatches a read; fills `data` with 0xff if no device owns `addr`.
    /// Returns whether a device handled it.
    pub fn read(&self, addr: u64, data: &mut [u8]) -> bool {
        match self.find(addr) {
            Some((offset, r)) => {
                r.device
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .read(offset, data);
                true
            }
            None => {
                data.fill(0xff);
                false
            }
        }
    }

    /// Dispatches a write; drops it if no device owns `addr`.
    pub fn write(&self, addr: u64, data: &[u8]) -> bool {
        match self.find(addr) {
            Some((offset, r)) => {
                r.device
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .write(offset, data);
                true
            }
            None => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Default)]
    struct Recorder {
        writes: Vec<(u64, Vec<u8>)>,
    }

    impl BusDevice for Recorder {
        fn read(&mut self, offset: u64, data: &mut [u8]) {
            data.fill(u8::try_from(offset).unwrap_or(0xee));
        }
        fn write(&mut self, offset: u64, data: &[u8]) {
            self.writes.push((offset, data.to_vec()));
        }
    }

    #[test]
    fn dispatch_by_range() {
        let dev = Arc::new(Mutex::new(Recorder::default()));
        let mut bus = Bus::new();
        bus.insert(0x3f8, 8, dev.clone()).expect("free range");
        let mut b = [0u8; 1];
        assert!(bus.read(0x3fd, &mut b));
        assert_eq!(b, [5]);
        assert!(!bus.read(0x400, &mut b));
        assert_eq!(b, [0xff]);
        assert!(!bus.read(0x3f7, &mut b));
        assert!(bus.write(0x3f8, &[1, 2]));
        assert!(!bus.write(u64::MAX, &[1]));
        assert_eq!(bus.accesses(), 5);
        assert_eq!(
            dev.lock().expect("not poisoned").writes,
            vec![(0, vec![1, 2])]
        );
    }

    #[test]
    fn overlaps_are_refused() {
        let dev = Arc::new(Mutex::new(Recorder::default()));
        let mut bus = Bus::new();
        bus.insert(0x60, 5, dev.clone()).expect("free");
        assert!(bus.insert(0x64, 1, dev.clone()).is_err());
        assert!(bus.insert(0x5f, 2, dev.clone()).is_err());
        assert!(bus.insert(0x50, 0, dev.clone()).is_err());
        assert!(bus.insert(u64::MAX, 2, dev.clone()).is_err());
        bus.insert(0x65, 1, dev.clone()).expect("adjacent is fine");
        bus.insert(0x5b, 5, dev).expect("adjacent below is fine");
    }
}
