//! The snapshot container's reader on hostile files: nothing a file holds
//! may panic the host or make it allocate without bound, and a file that
//! opens must answer every section read with a value or a typed error.
//!
//! Input layout: byte 0 selects the mode (mod 4), the rest drives it.
//! - 0: the rest is a whole file.
//! - 1: a valid snapshot (built here) mutated: the rest is
//!   `(u16 LE position, u8 value)` edits, then a cut at `u16 LE` (the last
//!   two bytes) when the edit count is odd.
//! - 2: as 1, then the header checksum is re-sealed over the edited table,
//!   so the table parser sees hostile records behind a valid checksum.
//! - 3: a container written here around one hostile payload, every
//!   checksum valid: byte 1 bit 0 is the kind (data/memory), bit 1 the
//!   encoding (raw/zstd), bytes 2..6 the declared decoded length (u32 LE),
//!   byte 6 the guest size in pages, the rest the stored payload. This
//!   drives the zstd decoder and the sparse memory decoder on hostile
//!   bytes.

#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use provium_snapshot::format::DEFAULT_MAX_SECTION_BYTES;
use provium_snapshot::{Expect, Shape, Snapshot, SnapshotBuilder, HEADER_LEN, MAGIC};
use sha2::{Digest, Sha256};

const PROTO: u32 = 3;
const GUEST_PAGES: usize = 16;
/// Sections decode to at most this much here (callers bound it the same
/// way: a hostile zstd frame could otherwise ask for gigabytes).
const MAX_SECTION: u64 = 1 << 20;

fn shape(pages: usize) -> Shape {
    Shape {
        backend: "kvm".into(),
        memory_bytes: (pages * 4096) as u64,
        vcpus: 1,
    }
}

fn expect() -> Expect {
    let mut e = Expect::protocol(PROTO);
    assert!(MAX_SECTION < DEFAULT_MAX_SECTION_BYTES);
    e.max_section_bytes = MAX_SECTION;
    e
}

/// A valid snapshot with a zstd data section, a raw one and a memory image.
fn sample() -> &'static [u8] {
    static SAMPLE: OnceLock<Vec<u8>> = OnceLock::new();
    SAMPLE.get_or_init(|| {
        let mut guest = vec![0u8; GUEST_PAGES * 4096];
        guest[4096 * 3..4096 * 3 + 10].copy_from_slice(b"0123456789");
        guest[4096 * 4] = 0xaa;
        guest[4096 * 9 + 7] = 0x55;
        let mut b = SnapshotBuilder::new(PROTO, shape(GUEST_PAGES));
        b.add_section("vcpu", b"registers and more registers")
            .expect("valid section");
        b.add_raw_section("console", b"boot log tail")
            .expect("valid section");
        b.add_memory("memory", &guest).expect("valid memory");
        b.to_bytes()
    })
}

/// Read everything an opened snapshot offers, as a restore would.
fn exercise(s: &Snapshot) {
    let pages = usize::try_from(s.shape().memory_bytes / 4096)
        .unwrap_or(usize::MAX)
        .min(256);
    for sec in s.sections().to_vec() {
        if let Ok(data) = s.section(&sec.name) {
            assert_eq!(data.len() as u64, sec.raw_len, "section length is checked");
        }
        let mut dest = vec![0u8; pages * 4096];
        if let Ok(stats) = s.memory_into(&sec.name, &mut dest) {
            assert_eq!(stats.guest_len_bytes, dest.len() as u64);
            assert!(stats.data_bytes <= dest.len() as u64);
        }
    }
}

fn reseal_header(b: &mut [u8]) {
    let table_len = u64::from_le_bytes(b[24..32].try_into().expect("8 bytes"));
    let Some(end) = usize::try_from(table_len)
        .ok()
        .and_then(|t| t.checked_add(HEADER_LEN as usize))
        .filter(|e| *e <= b.len())
    else {
        return;
    };
    let mut sum = Sha256::new();
    sum.update(&b[..40]);
    sum.update(&b[HEADER_LEN as usize..end]);
    let d = sum.finalize();
    b[40..72].copy_from_slice(&d);
}

/// A one-section container per the documented layout, checksums valid.
fn container(kind: u8, encoding: u8, raw_len: u64, pages: usize, payload: &[u8]) -> Vec<u8> {
    let name = if kind == 1 { "memory" } else { "vcpu" };
    let backend = "kvm";
    let mut table = Vec::new();
    table.extend_from_slice(&(backend.len() as u16).to_le_bytes());
    table.extend_from_slice(backend.as_bytes());
    table.extend_from_slice(&((pages * 4096) as u64).to_le_bytes());
    table.extend_from_slice(&1u32.to_le_bytes());
    table.extend_from_slice(&(name.len() as u16).to_le_bytes());
    table.extend_from_slice(name.as_bytes());
    let record_fixed = 1 + 1 + 2 + 8 + 8 + 8 + 32;
    let table_len = table.len() + record_fixed;
    let offset = HEADER_LEN + table_len as u64;
    table.push(kind);
    table.push(encoding);
    table.extend_from_slice(&0u16.to_le_bytes());
    table.extend_from_slice(&offset.to_le_bytes());
    table.extend_from_slice(&(payload.len() as u64).to_le_bytes());
    table.extend_from_slice(&raw_len.to_le_bytes());
    table.extend_from_slice(&Sha256::digest(payload));
    assert_eq!(table.len(), table_len);
    let mut h = Vec::new();
    h.extend_from_slice(&MAGIC);
    h.extend_from_slice(&provium_snapshot::SNAPSHOT_FORMAT_VERSION.to_le_bytes());
    h.extend_from_slice(&PROTO.to_le_bytes());
    h.extend_from_slice(&1u32.to_le_bytes());
    h.extend_from_slice(&0u32.to_le_bytes());
    h.extend_from_slice(&(table_len as u64).to_le_bytes());
    h.extend_from_slice(&(offset + payload.len() as u64).to_le_bytes());
    h.extend_from_slice(&[0u8; 32]);
    h.extend_from_slice(&table);
    h.extend_from_slice(payload);
    reseal_header(&mut h);
    h
}

fn open(bytes: Vec<u8>) -> Option<Snapshot> {
    Snapshot::from_bytes("fuzz.snap", bytes, &expect()).ok()
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    match mode % 4 {
        0 => {
            if let Some(s) = open(rest.to_vec()) {
                exercise(&s);
            }
        }
        1 | 2 => {
            let mut b = sample().to_vec();
            let edits = rest.chunks_exact(3);
            let n = edits.len();
            for e in edits {
                let pos = usize::from(u16::from_le_bytes([e[0], e[1]])) % b.len();
                b[pos] = e[2];
            }
            if n % 2 == 1 && rest.len() >= 2 {
                let cut = usize::from(u16::from_le_bytes([
                    rest[rest.len() - 2],
                    rest[rest.len() - 1],
                ]));
                b.truncate(cut);
            }
            if mode % 4 == 2 && b.len() >= HEADER_LEN as usize {
                reseal_header(&mut b);
            }
            let unchanged = b == sample();
            match open(b) {
                Some(s) => exercise(&s),
                None => assert!(!unchanged, "the valid sample must open"),
            }
        }
        _ => {
            if rest.len() < 6 {
                return;
            }
            let kind = rest[0] & 1;
            let encoding = (rest[0] >> 1) & 1;
            let raw_len = u64::from(u32::from_le_bytes(rest[1..5].try_into().expect("4")));
            let pages = usize::from(rest[5]) % 64 + 1;
            let payload = &rest[6..];
            let file = container(kind, encoding, raw_len, pages, payload);
            let s = open(file);
            // Raw with matching lengths and a small decoded size always opens.
            if encoding == 0 && raw_len == payload.len() as u64 {
                assert!(s.is_some(), "a well-formed container must open");
            }
            if let Some(s) = s {
                exercise(&s);
            }
        }
    }
});
