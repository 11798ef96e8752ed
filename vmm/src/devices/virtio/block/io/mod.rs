//! The block I/O engine: executes parsed requests against the backing file,
//! with the Disk page's fault modes applied to the guest's requests.
//!
//! - `eio_read`: reads complete with VIRTIO_BLK_S_IOERR; nothing is copied.
//! - `eio_write`: writes and flushes complete with VIRTIO_BLK_S_IOERR; the file
//!   is not touched.
//! - `slow`: every completion is delayed by 50 ms (`defs::SLOW_COMPLETION_MS`);
//!   the device worker holds the completion, so vCPUs and other devices never
//!   wait.
//!
//! Faults are flags the host flips at any time (`BlockFaults`, shared by `Arc`:
//! the harness's Disk userdata holds the same object, so `disk:fault_inject`
//! reaches the guest's requests and the host-side sector ops alike).
//! `detached` is not a fault mode but a one-way switch: virtio-mmio has no
//! hot-unplug, so a detached disk stays visible to the guest and fails every
//! request with VIRTIO_BLK_S_IOERR, as a surprise-removed disk would.
//! Lengths and sectors come from the guest: ranges are checked against the
//! disk and guest memory with checked arithmetic, and copies go through a
//! bounded bounce buffer.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicBool, Ordering};

use virtio_bindings::virtio_blk::{VIRTIO_BLK_S_IOERR, VIRTIO_BLK_S_OK, VIRTIO_BLK_S_UNSUPP};
use vm_memory::{Address, Bytes, GuestMemory};

use super::defs::{DEVICE_ID_BYTES, IO_CHUNK_BYTES, SECTOR_BYTES};
use super::request::{Request, RequestType};
use super::BlockError;

/// Fault modes of one disk, changeable while the guest runs.
#[derive(Debug, Default)]
pub struct BlockFaults {
    /// Reads fail with EIO.
    pub eio_read: AtomicBool,
    /// Writes and flushes fail with EIO.
    pub eio_write: AtomicBool,
    /// Completions are delayed by 50 ms.
    pub slow: AtomicBool,
    /// The disk was detached: every request fails (see the module doc).
    /// Never cleared: `clear` only clears the fault modes.
    detached: AtomicBool,
}

impl BlockFaults {
    /// The fault modes by their reference names, in the order
    /// [`BlockFaults::active`] lists them (and error messages name them).
    pub const MODES: [&'static str; 3] = ["eio_read", "eio_write", "slow"];

    fn flag(&self, mode: &str) -> Option<&AtomicBool> {
        match mode {
            "eio_read" => Some(&self.eio_read),
            "eio_write" => Some(&self.eio_write),
            "slow" => Some(&self.slow),
            _ => None,
        }
    }

    /// Sets one mode by its reference name (`eio_read`, `eio_write`, `slow`);
    /// false (and nothing changes) for any other name.
    pub fn set(&self, mode: &str, on: bool) -> bool {
        match self.flag(mode) {
            Some(f) => {
                f.store(on, Ordering::SeqCst);
                true
            }
            None => false,
        }
    }

    /// Whether `mode` is active (false for a name that is not a mode).
    pub fn is_set(&self, mode: &str) -> bool {
        self.flag(mode).is_some_and(|f| f.load(Ordering::SeqCst))
    }

    /// The active modes, in [`BlockFaults::MODES`] order.
    pub fn active(&self) -> Vec<&'static str> {
        Self::MODES.into_iter().filter(|m| self.is_set(m)).collect()
    }

    /// Clears every mode (not `detached`).
    pub fn clear(&self) {
        for f in [&self.eio_read, &self.eio_write, &self.slow] {
            f.store(false, Ordering::SeqCst);
        }
    }

    /// Detaches the disk: from now on every guest request fails. One-way.
    pub fn detach(&self) {
        self.detached.store(true, Ordering::SeqCst);
    }

    /// Whether [`BlockFaults::detach`] was called.
    pub fn is_detached(&self) -> bool {
        self.detached.load(Ordering::SeqCst)
    }

    /// Whether completions are delayed.
    pub fn is_slow(&self) -> bool {
        self.slow.load(Ordering::SeqCst)
    }
}

/// The backing file.
#[derive(Debug)]
pub struct DiskImage {
    file: File,
    /// Capacity in 512-byte sectors (a trailing partial sector is not exposed).
    pub sectors: u64,
    /// Writes are refused.
    pub read_only: bool,
    /// The GET_ID string (NUL-padded).
    pub id: [u8; DEVICE_ID_BYTES],
}

/// What a request produced: the status byte and the bytes written into
/// device-writable guest buffers (data + status), for the used ring.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Completion {
    /// VIRTIO_BLK_S_*.
    pub status: u8,
    /// Used length.
    pub used_len: u32,
}

fn status(s: u32) -> u8 {
    u8::try_from(s).expect("virtio-blk status codes fit a byte")
}

/// Completes `req` with VIRTIO_BLK_S_IOERR: an empty disk slot has no
/// medium to serve it (see `slot.rs`).
pub fn fail_no_medium<M: GuestMemory>(req: &Request, mem: &M) -> Completion {
    let st = status(VIRTIO_BLK_S_IOERR);
    // A bad status address is the guest's; nothing more can be reported.
    let _ = mem.write_slice(&[st], req.status_gpa);
    Completion {
        status: st,
        used_len: 1,
    }
}

impl DiskImage {
    /// Opens `path` (read-write unless `read_only`). `id` is truncated to 20 bytes.
    pub fn open(
        path: &std::path::Path,
        read_only: bool,
        id: &str,
    ) -> Result<DiskImage, BlockError> {
        let err = |source| BlockError::Open {
            path: path.display().to_string(),
            source,
        };
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(!read_only)
            .open(path)
            .map_err(err)?;
        let len = file.metadata().map_err(err)?.len();
        Ok(DiskImage::from_file(
            file,
            len / SECTOR_BYTES,
            read_only,
            id,
        ))
    }

    /// Wraps an open file of `sectors` sectors.
    pub fn from_file(file: File, sectors: u64, read_only: bool, id: &str) -> DiskImage {
        let mut idb = [0u8; DEVICE_ID_BYTES];
        let n = id.len().min(DEVICE_ID_BYTES);
        idb[..n].copy_from_slice(&id.as_bytes()[..n]);
        DiskImage {
            file,
            sectors,
            read_only,
            id: idb,
        }
    }

    fn in_range(&self, req: &Request) -> Option<u64> {
        let mut total: u64 = 0;
        for (_, len) in &req.data {
            total = total.checked_add(u64::from(*len))?;
        }
        if total % SECTOR_BYTES != 0 {
            return None;
        }
        let end = req.sector.checked_add(total / SECTOR_BYTES)?;
        (end <= self.sectors).then_some(total)
    }

    /// Executes `req` against the file and guest memory `mem`, then writes the
    /// status byte. Never panics on guest input.
    pub fn execute<M: GuestMemory>(
        &self,
        req: &Request,
        mem: &M,
        faults: &BlockFaults,
    ) -> Completion {
        let (st, data_len) = self.run(req, mem, faults);
        let st = status(st);
        // If the status byte cannot be written the guest gave a bad address;
        // nothing more can be reported to it.
        let _ = mem.write_slice(&[st], req.status_gpa);
        Completion {
            status: st,
            used_len: data_len.saturating_add(1),
        }
    }

    fn run<M: GuestMemory>(&self, req: &Request, mem: &M, faults: &BlockFaults) -> (u32, u32) {
        if faults.is_detached() {
            return (VIRTIO_BLK_S_IOERR, 0);
        }
        match req.kind {
            RequestType::In => {
                if faults.eio_read.load(Ordering::SeqCst) {
                    return (VIRTIO_BLK_S_IOERR, 0);
                }
                let Some(total) = self.in_range(req) else {
                    return (VIRTIO_BLK_S_IOERR, 0);
                };
                match self.copy(req, mem, true) {
                    Ok(()) => (VIRTIO_BLK_S_OK, u32::try_from(total).unwrap_or(u32::MAX)),
                    Err(()) => (VIRTIO_BLK_S_IOERR, 0),
                }
            }
            RequestType::Out => {
                if self.read_only || faults.eio_write.load(Ordering::SeqCst) {
                    return (VIRTIO_BLK_S_IOERR, 0);
                }
                if self.in_range(req).is_none() {
                    return (VIRTIO_BLK_S_IOERR, 0);
                }
                match self.copy(req, mem, false) {
                    Ok(()) => (VIRTIO_BLK_S_OK, 0),
                    Err(()) => (VIRTIO_BLK_S_IOERR, 0),
                }
            }
            RequestType::Flush => {
                if faults.eio_write.load(Ordering::SeqCst) {
                    return (VIRTIO_BLK_S_IOERR, 0);
                }
                if self.read_only || self.file.sync_data().is_ok() {
                    (VIRTIO_BLK_S_OK, 0)
                } else {
                    (VIRTIO_BLK_S_IOERR, 0)
                }
            }
            RequestType::GetId => {
                let Some(&(addr, len)) = req.data.first() else {
                    return (VIRTIO_BLK_S_IOERR, 0);
                };
                let n = usize::try_from(len).unwrap_or(0).min(DEVICE_ID_BYTES);
                match mem.write_slice(&self.id[..n], addr) {
                    Ok(()) => (VIRTIO_BLK_S_OK, u32::try_from(n).expect("<= 20")),
                    Err(_) => (VIRTIO_BLK_S_IOERR, 0),
                }
            }
            RequestType::Unsupported(_) => (VIRTIO_BLK_S_UNSUPP, 0),
        }
    }

    /// Copies between the file (from `req.sector`) and the data buffers,
    /// `to_guest` for reads. Uses one bounded bounce buffer.
    fn copy<M: GuestMemory>(&self, req: &Request, mem: &M, to_guest: bool) -> Result<(), ()> {
        let mut offset = req.sector.checked_mul(SECTOR_BYTES).ok_or(())?;
        let mut buf = vec![0u8; IO_CHUNK_BYTES];
        for &(addr, len) in &req.data {
            let mut done: u64 = 0;
            let len = u64::from(len);
            while done < len {
                let n = usize::try_from((len - done).min(IO_CHUNK_BYTES as u64)).map_err(|_| ())?;
                let gpa = addr.checked_add(done).ok_or(())?;
                let chunk = &mut buf[..n];
                if to_guest {
                    self.file.read_exact_at(chunk, offset).map_err(|_| ())?;
                    mem.write_slice(chunk, gpa).map_err(|_| ())?;
                } else {
                    mem.read_slice(chunk, gpa).map_err(|_| ())?;
                    self.file.write_all_at(chunk, offset).map_err(|_| ())?;
                }
                done += n as u64;
                offset = offset.checked_add(n as u64).ok_or(())?;
            }
        }
        Ok(())
    }
}

/// What a block device is built from: its medium (a disk slot's comes and
/// goes, `slot.rs`). Here, beside the image and the fault engine it pairs,
/// so the device and the slot both import it from below them.
#[derive(Clone)]
pub struct BlockConfig {
    /// The backing file.
    pub disk: std::sync::Arc<DiskImage>,
    /// Fault modes (the host keeps a clone to flip them).
    pub faults: std::sync::Arc<BlockFaults>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::devices::virtio::test_utils::guest_memory;
    use std::io::Write;
    use vm_memory::GuestAddress;

    fn disk(sectors: u64) -> (DiskImage, tempfile::NamedTempFile) {
        let mut f = tempfile::NamedTempFile::new().expect("tempfile");
        let data: Vec<u8> = (0..sectors * 512).map(|i| (i % 251) as u8).collect();
        f.write_all(&data).expect("write");
        let d = DiskImage::open(f.path(), false, "provium-disk-0").expect("open");
        (d, f)
    }

    fn req(kind: RequestType, sector: u64, data: Vec<(u64, u32)>) -> Request {
        Request {
            kind,
            sector,
            data: data
                .into_iter()
                .map(|(a, l)| (GuestAddress(a), l))
                .collect(),
            status_gpa: GuestAddress(0x30_0000),
        }
    }

    #[test]
    fn read_write_round_trip() {
        let (d, _f) = disk(16);
        let mem = guest_memory();
        let faults = BlockFaults::default();
        let pattern = vec![0xabu8; 1024];
        mem.write_slice(&pattern, GuestAddress(0x20_0000))
            .expect("mem");
        let c = d.execute(
            &req(RequestType::Out, 3, vec![(0x20_0000, 1024)]),
            &mem,
            &faults,
        );
        assert_eq!(c.status, 0);
        let c = d.execute(
            &req(RequestType::In, 3, vec![(0x28_0000, 1024)]),
            &mem,
            &faults,
        );
        assert_eq!(
            c,
            Completion {
                status: 0,
                used_len: 1025
            }
        );
        let mut got = vec![0u8; 1024];
        mem.read_slice(&mut got, GuestAddress(0x28_0000))
            .expect("mem");
        assert_eq!(got, pattern);
        let s: u8 = mem.read_obj(GuestAddress(0x30_0000)).expect("mem");
        assert_eq!(s, 0);
    }

    #[test]
    fn faults_fail_the_guest_request_only() {
        let (d, _f) = disk(16);
        let mem = guest_memory();
        let faults = BlockFaults::default();
        assert!(faults.set("eio_read", true));
        let c = d.execute(
            &req(RequestType::In, 0, vec![(0x20_0000, 512)]),
            &mem,
            &faults,
        );
        assert_eq!(c.status, status(VIRTIO_BLK_S_IOERR));
        let c = d.execute(
            &req(RequestType::Out, 0, vec![(0x20_0000, 512)]),
            &mem,
            &faults,
        );
        assert_eq!(c.status, 0, "writes still work under eio_read");
        faults.clear();
        assert!(faults.set("eio_write", true));
        let c = d.execute(
            &req(RequestType::Out, 0, vec![(0x20_0000, 512)]),
            &mem,
            &faults,
        );
        assert_eq!(c.status, status(VIRTIO_BLK_S_IOERR));
        let c = d.execute(&req(RequestType::Flush, 0, vec![]), &mem, &faults);
        assert_eq!(c.status, status(VIRTIO_BLK_S_IOERR));
        assert!(!faults.set("bogus", true));
    }

    #[test]
    fn modes_are_listed_in_order_and_detach_fails_everything() {
        let (d, _f) = disk(16);
        let mem = guest_memory();
        let faults = BlockFaults::default();
        assert!(faults.active().is_empty());
        assert!(faults.set("slow", true));
        assert!(faults.set("eio_read", true));
        assert_eq!(faults.active(), vec!["eio_read", "slow"]);
        assert!(faults.is_set("slow") && !faults.is_set("eio_write") && !faults.is_set("x"));
        faults.clear();
        assert!(faults.active().is_empty());
        let read = req(RequestType::In, 0, vec![(0x20_0000, 512)]);
        assert_eq!(d.execute(&read, &mem, &faults).status, 0);
        faults.detach();
        faults.clear();
        assert!(faults.is_detached(), "clear does not undo a detach");
        for r in [
            read,
            req(RequestType::Out, 0, vec![(0x20_0000, 512)]),
            req(RequestType::Flush, 0, vec![]),
            req(RequestType::GetId, 0, vec![(0x20_0000, 20)]),
        ] {
            assert_eq!(
                d.execute(&r, &mem, &faults).status,
                status(VIRTIO_BLK_S_IOERR),
                "{r:?}"
            );
        }
    }

    #[test]
    fn hostile_ranges_are_errors() {
        let (d, _f) = disk(16);
        let mem = guest_memory();
        let f = BlockFaults::default();
        let ioerr = status(VIRTIO_BLK_S_IOERR);
        for r in [
            req(RequestType::In, 16, vec![(0x20_0000, 512)]),
            req(RequestType::In, u64::MAX, vec![(0x20_0000, 512)]),
            req(RequestType::In, 0, vec![(0x20_0000, 100)]),
            req(RequestType::In, 0, vec![(u64::MAX - 10, 512)]),
            req(RequestType::Out, 0, vec![(0xffff_0000_0000, 512)]),
            req(
                RequestType::In,
                0,
                vec![(0x20_0000, u32::MAX), (0x20_0000, u32::MAX)],
            ),
            req(RequestType::GetId, 0, vec![]),
        ] {
            assert_eq!(d.execute(&r, &mem, &f).status, ioerr, "{r:?}");
        }
        let c = d.execute(&req(RequestType::Unsupported(99), 0, vec![]), &mem, &f);
        assert_eq!(c.status, status(VIRTIO_BLK_S_UNSUPP));
    }

    #[test]
    fn get_id_writes_the_id() {
        let (d, _f) = disk(1);
        let mem = guest_memory();
        let c = d.execute(
            &req(RequestType::GetId, 0, vec![(0x20_0000, 64)]),
            &mem,
            &BlockFaults::default(),
        );
        assert_eq!(
            c,
            Completion {
                status: 0,
                used_len: 21
            }
        );
        let mut id = [0u8; 20];
        mem.read_slice(&mut id, GuestAddress(0x20_0000))
            .expect("mem");
        assert_eq!(&id[..14], b"provium-disk-0");
    }
}
