//! MSI-X (PCI 3.0, 6.8.2): a function's vector table and pending-bit array,
//! and the delivery of each vector through its own irqfd.
//!
//! Each vector owns a GSI; the guest's (address, data) for it becomes a KVM
//! MSI route for that GSI (through an [`MsiRouter`]) whenever MSI-X is on,
//! and signalling the vector writes its irqfd, so an interrupt never leaves
//! the kernel. Masking stays in userspace: a masked vector (or a masked
//! function) sets its pending bit instead, and unmasking fires what is
//! pending, as the specification requires.
//!
//! Table accesses come from the guest: only aligned 4- or 8-byte accesses
//! inside the table are taken, the PBA is read-only, and everything else is
//! refused (reads give zeros) and counted.

use std::sync::{Mutex, MutexGuard};

use serde::{Deserialize, Serialize};
use vmm_sys_util::eventfd::EventFd;

use crate::msi::{MsiMessage, MsiRouter};

/// MSI-X capability ID.
pub const MSIX_CAP_ID: u8 = 0x11;
/// Bytes per table entry.
pub const ENTRY_BYTES: u64 = 16;
/// Message control: MSI-X enable.
pub const CONTROL_ENABLE: u16 = 1 << 15;
/// Message control: function mask.
pub const CONTROL_FUNCTION_MASK: u16 = 1 << 14;
/// Vector control: masked.
const VECTOR_MASKED: u32 = 1;
/// The most vectors a function may have (table size field is 11 bits).
pub const MAX_VECTORS: u16 = 2048;

/// One table entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MsixEntry {
    /// Message address, low dword.
    pub addr_lo: u32,
    /// Message address, high dword.
    pub addr_hi: u32,
    /// Message data.
    pub data: u32,
    /// Vector control (bit 0: masked).
    pub control: u32,
}

impl Default for MsixEntry {
    fn default() -> MsixEntry {
        MsixEntry {
            addr_lo: 0,
            addr_hi: 0,
            data: 0,
            control: VECTOR_MASKED,
        }
    }
}

impl MsixEntry {
    fn message(&self) -> MsiMessage {
        MsiMessage {
            address: u64::from(self.addr_hi) << 32 | u64::from(self.addr_lo),
            data: self.data,
        }
    }

    fn masked(&self) -> bool {
        self.control & VECTOR_MASKED != 0
    }
}

/// What a snapshot keeps of a function's MSI-X.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MsixState {
    /// The table.
    pub table: Vec<MsixEntry>,
    /// Pending bits, one per vector.
    pub pending: Vec<bool>,
    /// MSI-X enable (message control).
    pub enabled: bool,
    /// Function mask (message control).
    pub function_masked: bool,
}

/// Counters of what the guest did wrong or the host refused.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MsixCounters {
    /// Table or PBA accesses refused (width, alignment, range, PBA writes).
    pub refused_accesses: u64,
    /// Signals of a vector the function does not have (a bogus vector).
    pub bogus_vectors: u64,
    /// KVM route updates that failed.
    pub route_failures: u64,
    /// irqfd writes that failed.
    pub irqfd_failures: u64,
}

struct Inner {
    state: MsixState,
    /// Set while a restore builds the machine: KVM drops an MSI for a vCPU
    /// that does not exist yet (and KVM_SET_LAPIC would overwrite one that
    /// arrived first), so signals are held until [`MsixVectors::release`].
    held: Option<Vec<bool>>,
    /// What each GSI is routed to now.
    routed: Vec<Option<MsiMessage>>,
    counters: MsixCounters,
}

/// A function's MSI-X vectors: table, PBA, one irqfd and GSI per vector.
/// Shared by the transport (vCPU threads: table accesses) and the device's
/// interrupt (worker threads: signals).
pub struct MsixVectors {
    inner: Mutex<Inner>,
    irqfds: Vec<EventFd>,
    gsis: Vec<u32>,
    router: std::sync::Arc<dyn MsiRouter>,
}

impl MsixVectors {
    /// `irqfds[i]` is registered with KVM on `gsis[i]`; `router` sets
    /// their routes. The lengths must match and be at most [`MAX_VECTORS`].
    pub fn new(
        irqfds: Vec<EventFd>,
        gsis: Vec<u32>,
        router: std::sync::Arc<dyn MsiRouter>,
    ) -> MsixVectors {
        assert_eq!(irqfds.len(), gsis.len(), "one GSI per irqfd");
        assert!(gsis.len() <= usize::from(MAX_VECTORS), "MSI-X table size");
        let n = gsis.len();
        MsixVectors {
            inner: Mutex::new(Inner {
                state: MsixState {
                    table: vec![MsixEntry::default(); n],
                    pending: vec![false; n],
                    enabled: false,
                    function_masked: false,
                },
                routed: vec![None; n],
                counters: MsixCounters::default(),
                held: None,
            }),
            irqfds,
            gsis,
            router,
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Number of vectors.
    pub fn len(&self) -> u16 {
        u16::try_from(self.gsis.len()).expect("checked in new")
    }

    /// Whether there are no vectors.
    pub fn is_empty(&self) -> bool {
        self.gsis.is_empty()
    }

    /// The table's size in bytes.
    pub fn table_bytes(&self) -> u64 {
        u64::from(self.len()) * ENTRY_BYTES
    }

    /// The PBA's size in bytes (whole qwords).
    pub fn pba_bytes(&self) -> u64 {
        u64::from(self.len()).div_ceil(64) * 8
    }

    /// The counters.
    pub fn counters(&self) -> MsixCounters {
        self.lock().counters
    }

    /// Whether MSI-X is enabled.
    pub fn enabled(&self) -> bool {
        self.lock().state.enabled
    }

    /// The message control bits (enable, function mask) changed.
    pub fn set_control(&self, control: u16) {
        let mut g = self.lock();
        g.state.enabled = control & CONTROL_ENABLE != 0;
        g.state.function_masked = control & CONTROL_FUNCTION_MASK != 0;
        self.sync(&mut g);
    }

    /// A guest read in the table.
    pub fn read_table(&self, offset: u64, data: &mut [u8]) {
        let mut g = self.lock();
        let Some((i, field)) = self.table_slot(offset, data.len()) else {
            g.counters.refused_accesses += 1;
            data.fill(0);
            return;
        };
        let e = g.state.table[i];
        let words = [e.addr_lo, e.addr_hi, e.data, e.control];
        let mut bytes = [0u8; 16];
        for (k, w) in words.iter().enumerate() {
            bytes[k * 4..k * 4 + 4].copy_from_slice(&w.to_le_bytes());
        }
        data.copy_from_slice(&bytes[field..field + data.len()]);
    }

    /// A guest write in the table.
    pub fn write_table(&self, offset: u64, data: &[u8]) {
        let mut g = self.lock();
        let Some((i, field)) = self.table_slot(offset, data.len()) else {
            g.counters.refused_accesses += 1;
            return;
        };
        let mut e = g.state.table[i];
        for (k, chunk) in data.chunks(4).enumerate() {
            let v = u32::from_le_bytes(chunk.try_into().expect("4- or 8-byte access"));
            match field / 4 + k {
                0 => e.addr_lo = v,
                1 => e.addr_hi = v,
                2 => e.data = v,
                _ => e.control = v & VECTOR_MASKED,
            }
        }
        g.state.table[i] = e;
        self.sync(&mut g);
    }

    /// A guest read in the PBA.
    pub fn read_pba(&self, offset: u64, data: &mut [u8]) {
        let mut g = self.lock();
        let ok = matches!(data.len(), 4 | 8)
            && offset % data.len() as u64 == 0
            && offset
                .checked_add(data.len() as u64)
                .is_some_and(|end| end <= self.pba_bytes());
        if !ok {
            g.counters.refused_accesses += 1;
            data.fill(0);
            return;
        }
        for (k, b) in data.iter_mut().enumerate() {
            let bit0 = (offset as usize + k) * 8;
            let mut v = 0u8;
            for bit in 0..8 {
                if g.state.pending.get(bit0 + bit).copied().unwrap_or(false) {
                    v |= 1 << bit;
                }
            }
            *b = v;
        }
    }

    /// A guest write in the PBA: read-only, refused.
    pub fn write_pba(&self, _offset: u64, _data: &[u8]) {
        self.lock().counters.refused_accesses += 1;
    }

    /// (entry, byte offset in it) for an aligned 4/8-byte access in the table.
    fn table_slot(&self, offset: u64, len: usize) -> Option<(usize, usize)> {
        if !matches!(len, 4 | 8) || offset % len as u64 != 0 {
            return None;
        }
        let end = offset.checked_add(len as u64)?;
        if end > self.table_bytes() {
            return None;
        }
        let i = usize::try_from(offset / ENTRY_BYTES).ok()?;
        let field = usize::try_from(offset % ENTRY_BYTES).ok()?;
        Some((i, field))
    }

    /// Holds every signal until [`Self::release`] (a restore, until the
    /// vCPUs' LAPICs are restored).
    pub fn hold(&self) {
        let n = self.gsis.len();
        self.lock().held = Some(vec![false; n]);
    }

    /// Delivers what was signalled while held (or sets its pending bit if
    /// masked) and stops holding.
    pub fn release(&self) {
        let held = {
            let mut g = self.lock();
            let held = g.held.take();
            // Pending bits of unmasked vectors (from the file) go out now.
            self.sync(&mut g);
            held
        };
        for (i, hit) in held.into_iter().flatten().enumerate() {
            if hit {
                self.signal(u16::try_from(i).expect("at most 2048 vectors"));
            }
        }
    }

    /// Raises `vector`: its irqfd when deliverable, its pending bit when
    /// masked; nothing while MSI-X is off (this function has no INTx).
    pub fn signal(&self, vector: u16) {
        let mut g = self.lock();
        let i = usize::from(vector);
        if i >= self.gsis.len() {
            g.counters.bogus_vectors += 1;
            return;
        }
        if let Some(h) = g.held.as_mut() {
            h[i] = true;
            return;
        }
        if !g.state.enabled {
            return;
        }
        if g.state.function_masked || g.state.table[i].masked() {
            g.state.pending[i] = true;
            return;
        }
        self.fire(&mut g, i);
    }

    fn fire(&self, g: &mut Inner, i: usize) {
        // A full counter means an interrupt is already pending.
        if self.irqfds[i].write(1).is_err() {
            g.counters.irqfd_failures += 1;
        }
    }

    /// Brings KVM's routes in line with the table and fires pending
    /// vectors that became deliverable.
    fn sync(&self, g: &mut Inner) {
        for i in 0..self.gsis.len() {
            let want = g.state.enabled.then(|| g.state.table[i].message());
            if g.routed[i] != want {
                match self.router.route(self.gsis[i], want) {
                    Ok(()) => g.routed[i] = want,
                    Err(_) => g.counters.route_failures += 1,
                }
            }
        }
        if !g.state.enabled || g.state.function_masked || g.held.is_some() {
            return;
        }
        for i in 0..self.gsis.len() {
            if g.state.pending[i] && !g.state.table[i].masked() {
                g.state.pending[i] = false;
                self.fire(g, i);
            }
        }
    }

    /// Saves the table, PBA and control bits.
    pub fn save(&self) -> MsixState {
        self.lock().state.clone()
    }

    /// Loads `state` (a file; its sizes must be this function's) and routes
    /// the vectors as it says.
    pub fn restore(&self, state: &MsixState) -> Result<(), String> {
        let n = self.gsis.len();
        if state.table.len() != n || state.pending.len() != n {
            return Err(format!(
                "{} MSI-X entries and {} pending bits, the function has {n} vectors",
                state.table.len(),
                state.pending.len()
            ));
        }
        let mut g = self.lock();
        g.state = state.clone();
        for e in &mut g.state.table {
            e.control &= VECTOR_MASKED;
        }
        self.sync(&mut g);
        Ok(())
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::sync::Arc;

    /// A router that records routes.
    #[derive(Default)]
    pub struct RecordingRouter {
        /// (gsi, message) in call order.
        pub calls: Mutex<Vec<(u32, Option<MsiMessage>)>>,
    }

    impl MsiRouter for RecordingRouter {
        fn route(&self, gsi: u32, msg: Option<MsiMessage>) -> std::io::Result<()> {
            self.calls.lock().expect("ok").push((gsi, msg));
            Ok(())
        }
    }

    pub fn vectors(n: usize) -> (MsixVectors, Arc<RecordingRouter>) {
        let router = Arc::new(RecordingRouter::default());
        let fds = (0..n)
            .map(|_| EventFd::new(libc::EFD_NONBLOCK).expect("eventfd"))
            .collect();
        let gsis = (0..n as u32).map(|i| 24 + i).collect();
        (MsixVectors::new(fds, gsis, router.clone()), router)
    }

    fn program(v: &MsixVectors, i: u64, addr: u32, data: u32, masked: bool) {
        v.write_table(i * 16, &addr.to_le_bytes());
        v.write_table(i * 16 + 4, &0u32.to_le_bytes());
        v.write_table(i * 16 + 8, &data.to_le_bytes());
        v.write_table(i * 16 + 12, &u32::from(masked).to_le_bytes());
    }

    fn fired(v: &MsixVectors, i: usize) -> bool {
        v.irqfds[i].read().is_ok()
    }

    #[test]
    fn vectors_start_masked_and_routes_follow_the_table() {
        let (v, router) = vectors(2);
        let mut b = [0u8; 4];
        v.read_table(12, &mut b);
        assert_eq!(u32::from_le_bytes(b), 1, "masked at reset");
        program(&v, 1, 0xfee0_0000, 0x41, false);
        assert!(
            router.calls.lock().expect("ok").is_empty(),
            "MSI-X off: no route"
        );
        v.set_control(CONTROL_ENABLE);
        let calls = router.calls.lock().expect("ok").clone();
        assert!(calls.contains(&(
            25,
            Some(MsiMessage {
                address: 0xfee0_0000,
                data: 0x41
            })
        )));
        v.signal(1);
        assert!(fired(&v, 1));
        v.set_control(0);
        assert_eq!(router.calls.lock().expect("ok").last(), Some(&(25, None)));
    }

    #[test]
    fn masking_sets_pending_and_unmask_delivers() {
        let (v, _) = vectors(2);
        v.set_control(CONTROL_ENABLE);
        program(&v, 0, 0xfee0_0000, 0x30, true);
        v.signal(0);
        assert!(!fired(&v, 0), "masked vector does not fire");
        let mut pba = [0u8; 8];
        v.read_pba(0, &mut pba);
        assert_eq!(pba[0], 1, "pending bit set");
        v.write_table(12, &0u32.to_le_bytes());
        assert!(fired(&v, 0), "unmask delivers the pending interrupt");
        v.read_pba(0, &mut pba);
        assert_eq!(pba[0], 0);
        // The function mask holds every vector.
        v.set_control(CONTROL_ENABLE | CONTROL_FUNCTION_MASK);
        v.signal(0);
        assert!(!fired(&v, 0));
        v.set_control(CONTROL_ENABLE);
        assert!(fired(&v, 0));
    }

    #[test]
    fn hostile_accesses_are_refused_and_counted() {
        let (v, _) = vectors(2);
        let mut b = [0u8; 4];
        v.read_table(2, &mut b); // unaligned
        v.read_table(32, &mut b); // past the table
        v.read_table(u64::MAX - 1, &mut b);
        v.write_table(0, &[1, 2]); // wrong width
        v.write_table(28, &[0; 8]); // unaligned qword
        v.write_pba(0, &[0; 8]); // PBA is read-only
        v.read_pba(8, &mut [0u8; 8]); // past the PBA
        v.signal(2); // no such vector
        v.signal(u16::MAX);
        let c = v.counters();
        assert_eq!(c.refused_accesses, 7);
        assert_eq!(c.bogus_vectors, 2);
        let mut q = [0u8; 8];
        v.read_table(8, &mut q);
        assert_eq!(q, [0, 0, 0, 0, 1, 0, 0, 0], "8-byte access: data, control");
    }

    #[test]
    fn held_signals_wait_for_release() {
        let (v, _) = vectors(2);
        v.set_control(CONTROL_ENABLE);
        program(&v, 1, 0xfee0_0000, 0x31, false);
        v.hold();
        v.signal(1);
        assert!(!fired(&v, 1), "held while the machine is rebuilt");
        v.release();
        assert!(fired(&v, 1), "delivered on release");
        v.signal(1);
        assert!(fired(&v, 1), "no longer held");
    }

    #[test]
    fn state_round_trips() {
        let (v, _) = vectors(3);
        v.set_control(CONTROL_ENABLE);
        program(&v, 2, 0xfee0_1000, 0x55, true);
        v.signal(2);
        let s = v.save();
        let (w, router) = vectors(3);
        w.restore(&s).expect("same size");
        assert_eq!(w.save(), s);
        assert!(router.calls.lock().expect("ok").contains(&(
            26,
            Some(MsiMessage {
                address: 0xfee0_1000,
                data: 0x55
            })
        )));
        let (x, _) = vectors(2);
        assert!(x.restore(&s).is_err());
    }
}
