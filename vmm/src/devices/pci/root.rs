//! The root bus: slots, the host bridge, BAR allocation and the three ways
//! the guest reaches the bus (ECAM, ports 0xCF8/0xCFC, the BAR window).
//!
//! Functions that do not exist read as all ones, as on hardware: that is
//! how the guest's scan finds the empty slots, so those reads are not
//! counted. Accesses to a present function with a bad width or alignment
//! are refused and counted, as are BAR-window accesses no BAR claims.

use std::sync::{Arc, Mutex, MutexGuard};

use super::config::{check_access, PciConfig, PciHeader};
use super::{AccessRefused, PciDevice};
use crate::bus::BusDevice;

/// Slots on the bus (device numbers 0-31); slot 0 is the host bridge.
pub const SLOTS: usize = 32;
/// The legacy configuration-address port; data is at +4.
pub const CONFIG_IO_PORT: u64 = 0xcf8;
/// Bytes of the legacy port range (address and data).
pub const CONFIG_IO_BYTES: u64 = 8;
/// Host bridge identity: Intel's vendor ID with a device ID no Linux quirk
/// matches (no chipset-specific MMCONFIG probing; Cloud Hypervisor uses it).
const HOST_BRIDGE: PciHeader = PciHeader {
    vendor_id: 0x8086,
    device_id: 0x0d57,
    revision_id: 0,
    class: [0x06, 0x00, 0x00],
    subsystem_vendor_id: 0,
    subsystem_id: 0,
};

/// An error building the bus (VMM setup, not guest input).
#[derive(Debug, thiserror::Error)]
pub enum PciRootError {
    /// Every slot is taken.
    #[error("the PCI bus is full: at most {} devices besides the host bridge", SLOTS - 1)]
    BusFull,
    /// The BAR window has no room left.
    #[error("no room for a {size_bytes:#x}-byte BAR in the PCI window {base:#x}+{len_bytes:#x}")]
    BarWindowFull {
        /// BAR size.
        size_bytes: u64,
        /// Window base.
        base: u64,
        /// Window size.
        len_bytes: u64,
    },
}

/// Counters of guest accesses refused.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PciCounters {
    /// Configuration accesses with a bad width, alignment or range.
    pub config_refused: u64,
    /// Accesses to the 0xCF8 address register other than an aligned dword.
    pub config_address_refused: u64,
    /// BAR-window accesses no enabled BAR claims.
    pub unclaimed_bar_accesses: u64,
}

/// The host bridge: a header and nothing else.
struct HostBridge {
    config: PciConfig,
}

impl PciDevice for HostBridge {
    fn config(&self) -> &PciConfig {
        &self.config
    }
    fn write_config(&mut self, offset: u64, data: &[u8]) -> Result<(), AccessRefused> {
        self.config.write(offset, data)
    }
    fn read_bar(&mut self, _bar: usize, _offset: u64, data: &mut [u8]) {
        data.fill(0xff);
    }
    fn write_bar(&mut self, _bar: usize, _offset: u64, _data: &[u8]) {}
}

/// A function as the bus holds it.
pub type SharedPciDevice = Arc<Mutex<dyn PciDevice>>;

/// Bus 0.
pub struct PciRoot {
    slots: Vec<Option<SharedPciDevice>>,
    config_address: u32,
    ecam: (u64, u64),
    window: (u64, u64),
    next_bar: u64,
    counters: PciCounters,
}

fn lock<'a>(d: &'a Mutex<dyn PciDevice + 'static>) -> MutexGuard<'a, dyn PciDevice + 'static> {
    d.lock().unwrap_or_else(|e| e.into_inner())
}

impl PciRoot {
    /// A bus with the host bridge, ECAM at `ecam` (base, bytes) and BARs
    /// allocated from `window` (base, bytes).
    pub fn new(ecam: (u64, u64), window: (u64, u64)) -> PciRoot {
        let mut slots: Vec<Option<Arc<Mutex<dyn PciDevice>>>> = vec![None; SLOTS];
        slots[0] = Some(Arc::new(Mutex::new(HostBridge {
            config: PciConfig::new(&HOST_BRIDGE),
        })));
        PciRoot {
            slots,
            config_address: 0,
            ecam,
            window,
            next_bar: window.0,
            counters: PciCounters::default(),
        }
    }

    /// The ECAM window, (base, bytes): bus 0 only. The ACPI tables
    /// (`crate::acpi`) describe it in the MCFG and `_SB.PCI0`.
    pub fn ecam_window(&self) -> (u64, u64) {
        self.ecam
    }

    /// The 32-bit BAR window, (base, bytes).
    pub fn bar_window(&self) -> (u64, u64) {
        self.window
    }

    /// The next free slot.
    pub fn next_slot(&self) -> Result<u8, PciRootError> {
        let i = self
            .slots
            .iter()
            .position(Option::is_none)
            .ok_or(PciRootError::BusFull)?;
        Ok(u8::try_from(i).expect("32 slots"))
    }

    /// Reserves a naturally aligned BAR of `size_bytes` (a power of two) in
    /// the window.
    pub fn allocate_bar(&mut self, size_bytes: u64) -> Result<u64, PciRootError> {
        let full = || PciRootError::BarWindowFull {
            size_bytes,
            base: self.window.0,
            len_bytes: self.window.1,
        };
        let align = size_bytes.max(1);
        let start = self
            .next_bar
            .checked_add(align - 1)
            .map(|a| a & !(align - 1))
            .ok_or_else(full)?;
        let end = start.checked_add(size_bytes).ok_or_else(full)?;
        if end > self.window.0 + self.window.1 {
            return Err(full());
        }
        self.next_bar = end;
        Ok(start)
    }

    /// Puts `dev` in `slot` (from [`Self::next_slot`]).
    pub fn insert(&mut self, slot: u8, dev: Arc<Mutex<dyn PciDevice>>) -> Result<(), PciRootError> {
        match self.slots.get_mut(usize::from(slot)) {
            Some(s @ None) => {
                *s = Some(dev);
                Ok(())
            }
            _ => Err(PciRootError::BusFull),
        }
    }

    /// The counters.
    pub fn counters(&self) -> PciCounters {
        self.counters
    }

    fn function(&self, bus: u32, dev: u32, func: u32) -> Option<Arc<Mutex<dyn PciDevice>>> {
        if bus != 0 || func != 0 {
            return None;
        }
        self.slots.get(usize::try_from(dev).ok()?)?.clone()
    }

    /// A configuration read of function bus:dev.func at `reg`.
    pub fn config_read(&mut self, bus: u32, dev: u32, func: u32, reg: u64, data: &mut [u8]) {
        let Some(d) = self.function(bus, dev, func) else {
            data.fill(0xff);
            return;
        };
        if lock(&d).config().read(reg, data).is_err() {
            self.counters.config_refused += 1;
        }
    }

    /// A configuration write of function bus:dev.func at `reg`.
    pub fn config_write(&mut self, bus: u32, dev: u32, func: u32, reg: u64, data: &[u8]) {
        let Some(d) = self.function(bus, dev, func) else {
            return;
        };
        if check_access(reg, data.len()).is_err() || lock(&d).write_config(reg, data).is_err() {
            self.counters.config_refused += 1;
        }
    }

    fn ecam_access(&mut self, offset: u64, data: &mut [u8], write: Option<&[u8]>) {
        if offset >= self.ecam.1 {
            self.counters.config_refused += 1;
            data.fill(0xff);
            return;
        }
        let bus = u32::try_from(offset >> 20).unwrap_or(u32::MAX);
        let dev = u32::try_from((offset >> 15) & 0x1f).expect("5 bits");
        let func = u32::try_from((offset >> 12) & 0x7).expect("3 bits");
        let reg = offset & 0xfff;
        match write {
            Some(w) => self.config_write(bus, dev, func, reg, w),
            None => self.config_read(bus, dev, func, reg, data),
        }
    }

    /// The function and BAR that decode `[gpa, gpa + len)`, and the offset.
    fn claim(&self, gpa: u64, len: u64) -> Option<(SharedPciDevice, usize, u64)> {
        for d in self.slots.iter().flatten() {
            let dev = lock(d);
            if !dev.config().memory_enabled() {
                continue;
            }
            for bar in 0..super::config::BAR_COUNT {
                let Some((base, size)) = dev.config().bar(bar) else {
                    continue;
                };
                let inside = gpa >= base
                    && gpa
                        .checked_add(len)
                        .is_some_and(|end| end <= base.saturating_add(size));
                if inside {
                    return Some((d.clone(), bar, gpa - base));
                }
            }
        }
        None
    }

    fn bar_read(&mut self, offset: u64, data: &mut [u8]) {
        let gpa = self.window.0.saturating_add(offset);
        match self.claim(gpa, data.len() as u64) {
            Some((d, bar, off)) => lock(&d).read_bar(bar, off, data),
            None => {
                self.counters.unclaimed_bar_accesses += 1;
                data.fill(0xff);
            }
        }
    }

    fn bar_write(&mut self, offset: u64, data: &[u8]) {
        let gpa = self.window.0.saturating_add(offset);
        match self.claim(gpa, data.len() as u64) {
            Some((d, bar, off)) => lock(&d).write_bar(bar, off, data),
            None => self.counters.unclaimed_bar_accesses += 1,
        }
    }
}

fn locked(root: &Mutex<PciRoot>) -> MutexGuard<'_, PciRoot> {
    root.lock().unwrap_or_else(|e| e.into_inner())
}

/// The ECAM window on the MMIO bus.
pub struct PciEcam(pub Arc<Mutex<PciRoot>>);

impl BusDevice for PciEcam {
    fn read(&mut self, offset: u64, data: &mut [u8]) {
        locked(&self.0).ecam_access(offset, data, None);
    }
    fn write(&mut self, offset: u64, data: &[u8]) {
        locked(&self.0).ecam_access(offset, &mut [], Some(data));
    }
}

/// Ports 0xCF8 (address) and 0xCFC-0xCFF (data) on the PIO bus.
pub struct PciConfigIo(pub Arc<Mutex<PciRoot>>);

impl PciConfigIo {
    /// (bus, dev, func, reg) addressed by the current 0xCF8 value and an
    /// access at data-port byte `k`; `None` when the enable bit is clear.
    fn target(address: u32, k: u64) -> Option<(u32, u32, u32, u64)> {
        if address & 0x8000_0000 == 0 {
            return None;
        }
        let bus = (address >> 16) & 0xff;
        let dev = (address >> 11) & 0x1f;
        let func = (address >> 8) & 0x7;
        let reg = u64::from(address & 0xfc) + k;
        Some((bus, dev, func, reg))
    }
}

impl BusDevice for PciConfigIo {
    fn read(&mut self, offset: u64, data: &mut [u8]) {
        let mut root = locked(&self.0);
        if offset < 4 {
            if offset == 0 && data.len() == 4 {
                data.copy_from_slice(&root.config_address.to_le_bytes());
            } else {
                root.counters.config_address_refused += 1;
                data.fill(0xff);
            }
            return;
        }
        match Self::target(root.config_address, offset - 4) {
            Some((b, d, f, r)) => root.config_read(b, d, f, r, data),
            None => data.fill(0xff),
        }
    }

    fn write(&mut self, offset: u64, data: &[u8]) {
        let mut root = locked(&self.0);
        if offset < 4 {
            match <[u8; 4]>::try_from(data) {
                Ok(b) if offset == 0 => root.config_address = u32::from_le_bytes(b),
                _ => root.counters.config_address_refused += 1,
            }
            return;
        }
        if let Some((b, d, f, r)) = Self::target(root.config_address, offset - 4) {
            root.config_write(b, d, f, r, data);
        }
    }
}

/// The 32-bit BAR window on the MMIO bus.
pub struct PciBarWindow(pub Arc<Mutex<PciRoot>>);

impl BusDevice for PciBarWindow {
    fn read(&mut self, offset: u64, data: &mut [u8]) {
        locked(&self.0).bar_read(offset, data);
    }
    fn write(&mut self, offset: u64, data: &[u8]) {
        locked(&self.0).bar_write(offset, data);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::devices::pci::config::COMMAND_MEMORY;

    /// A function with one 4 KiB BAR that records BAR accesses.
    struct Probe {
        config: PciConfig,
        writes: Vec<(usize, u64, Vec<u8>)>,
    }

    impl PciDevice for Probe {
        fn config(&self) -> &PciConfig {
            &self.config
        }
        fn write_config(&mut self, offset: u64, data: &[u8]) -> Result<(), AccessRefused> {
            self.config.write(offset, data)
        }
        fn read_bar(&mut self, bar: usize, offset: u64, data: &mut [u8]) {
            data.fill(u8::try_from(offset & 0xff).expect("masked") ^ bar as u8);
        }
        fn write_bar(&mut self, bar: usize, offset: u64, data: &[u8]) {
            self.writes.push((bar, offset, data.to_vec()));
        }
    }

    const ECAM: (u64, u64) = (0xe000_0000, 1 << 20);
    const WINDOW: (u64, u64) = (0xc000_0000, 0x1000_0000);

    fn root_with_probe() -> (Arc<Mutex<PciRoot>>, Arc<Mutex<Probe>>) {
        let mut root = PciRoot::new(ECAM, WINDOW);
        let slot = root.next_slot().expect("free");
        assert_eq!(slot, 1);
        let addr = root.allocate_bar(0x1000).expect("room");
        let mut config = PciConfig::new(&PciHeader {
            vendor_id: 0x1af4,
            device_id: 0x1044,
            revision_id: 1,
            class: [0xff, 0, 0],
            subsystem_vendor_id: 0x1af4,
            subsystem_id: 0x40,
        });
        config.add_bar(0, 0x1000, addr).expect("valid");
        let probe = Arc::new(Mutex::new(Probe {
            config,
            writes: Vec::new(),
        }));
        root.insert(slot, probe.clone()).expect("free slot");
        (Arc::new(Mutex::new(root)), probe)
    }

    fn cf8_read32(io: &mut PciConfigIo, dev: u32, reg: u32) -> u32 {
        io.write(0, &(0x8000_0000 | dev << 11 | reg).to_le_bytes());
        let mut b = [0u8; 4];
        io.read(4, &mut b);
        u32::from_le_bytes(b)
    }

    #[test]
    fn legacy_ports_reach_the_bus() {
        let (root, _) = root_with_probe();
        let mut io = PciConfigIo(root.clone());
        assert_eq!(cf8_read32(&mut io, 0, 0), 0x0d57_8086, "host bridge");
        assert_eq!(
            cf8_read32(&mut io, 0, 8) >> 8,
            0x06_0000,
            "class: host bridge"
        );
        assert_eq!(cf8_read32(&mut io, 1, 0), 0x1044_1af4);
        assert_eq!(cf8_read32(&mut io, 2, 0), u32::MAX, "empty slot");
        // The address register reads back (Linux's type 1 check).
        let mut b = [0u8; 4];
        io.read(0, &mut b);
        assert_eq!(
            u32::from_le_bytes(b),
            0x8000_1000,
            "the last address written"
        );
        // A word read at 0xCFE: the device ID.
        io.write(0, &(0x8000_0800u32).to_le_bytes());
        let mut w = [0u8; 2];
        io.read(6, &mut w);
        assert_eq!(u16::from_le_bytes(w), 0x1044);
        // Enable bit clear: nothing decodes.
        io.write(0, &(0x0000_0800u32).to_le_bytes());
        io.read(4, &mut b);
        assert_eq!(b, [0xff; 4]);
        // Another bus: nothing there.
        assert_eq!(cf8_read32(&mut io, 1 | 1 << 5, 0), u32::MAX);
    }

    #[test]
    fn ecam_reaches_the_bus_and_sizes_bars() {
        let (root, _) = root_with_probe();
        let mut ecam = PciEcam(root.clone());
        let mut b = [0u8; 4];
        ecam.read(1 << 15, &mut b);
        assert_eq!(u32::from_le_bytes(b), 0x1044_1af4);
        ecam.write((1 << 15) + 0x10, &u32::MAX.to_le_bytes());
        ecam.read((1 << 15) + 0x10, &mut b);
        assert_eq!(u32::from_le_bytes(b), 0xffff_f000);
        ecam.read((1 << 15) | (1 << 12), &mut b);
        assert_eq!(b, [0xff; 4], "function 1 does not exist");
        ecam.read(1 << 20, &mut b);
        assert_eq!(b, [0xff; 4], "past bus 0");
    }

    #[test]
    fn bar_window_follows_the_bars() {
        let (root, probe) = root_with_probe();
        let mut win = PciBarWindow(root.clone());
        let mut b = [0u8; 4];
        win.read(0x10, &mut b);
        assert_eq!(b, [0xff; 4], "memory decoding is off at reset");
        let mut ecam = PciEcam(root.clone());
        ecam.write((1 << 15) + 4, &COMMAND_MEMORY.to_le_bytes());
        win.read(0x10, &mut b);
        assert_eq!(b, [0x10; 4]);
        win.write(0x20, &[1, 2]);
        // The guest moves the BAR: the old place stops decoding.
        ecam.write((1 << 15) + 0x10, &0xc010_0000u32.to_le_bytes());
        win.write(0x20, &[3]);
        win.write(0x10_0008, &[4]);
        win.read(0x0fff, &mut b); // straddles the end of the old BAR
        assert_eq!(
            probe.lock().expect("ok").writes,
            vec![(0, 0x20, vec![1, 2]), (0, 8, vec![4])]
        );
        let c = root.lock().expect("ok").counters();
        assert_eq!(c.unclaimed_bar_accesses, 3);
    }

    #[test]
    fn hostile_config_accesses_are_refused_and_counted() {
        let (root, _) = root_with_probe();
        let mut io = PciConfigIo(root.clone());
        let mut ecam = PciEcam(root.clone());
        io.write(3, &[1]); // byte write to 0xCFB
        io.write(0, &[1, 2]); // word write to 0xCF8
        io.read(1, &mut [0u8; 2]);
        io.write(0, &0x8000_0800u32.to_le_bytes());
        io.read(5, &mut [0u8; 2]); // unaligned word in the data port
        ecam.read((1 << 15) + 1, &mut [0u8; 4]);
        ecam.write((1 << 15) + 2, &[0; 4]);
        ecam.read(u64::MAX, &mut [0u8; 4]);
        ecam.read(1 << 15, &mut [0u8; 3]);
        let c = root.lock().expect("ok").counters();
        assert_eq!(c.config_address_refused, 3);
        assert_eq!(c.config_refused, 5);
    }

    #[test]
    fn allocation_and_slots_are_bounded() {
        let mut root = PciRoot::new(ECAM, (0xc000_0000, 0x10000));
        assert_eq!(root.allocate_bar(0x1000).expect("room"), 0xc000_0000);
        assert_eq!(root.allocate_bar(0x8000).expect("room"), 0xc000_8000);
        assert!(root.allocate_bar(0x8000).is_err());
        for _ in 1..SLOTS {
            let s = root.next_slot().expect("free");
            let dev = Arc::new(Mutex::new(HostBridge {
                config: PciConfig::new(&HOST_BRIDGE),
            }));
            root.insert(s, dev).expect("free");
        }
        assert!(matches!(root.next_slot(), Err(PciRootError::BusFull)));
        assert_eq!(root.ecam_window().0, 0xe000_0000);
    }
}
