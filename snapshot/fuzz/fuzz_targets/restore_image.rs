//! The restore image (`<snapshot>.img`) beside a snapshot, found in any
//! state on disk: a restore must either reuse it when it is exactly the
//! image of this snapshot, or rebuild it, and the guest memory it hands out
//! must be the snapshot's.
//!
//! Input: byte 0 picks the starting file (even: the valid image, odd:
//! empty); then `(u16 LE position, u8 value)` edits applied within the
//! header page, then, when the edit count is odd, a new length (u16 LE,
//! the last two bytes, scaled to the image size). Edits stay in the header
//! page: the data pages of an image whose header matches are not hashed
//! when it is opened; the restore that copies them checks them against the
//! header's digest (so the target checks that digest stays right).

#![no_main]

use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use provium_snapshot::image::IMAGE_DATA_OFFSET;
use provium_snapshot::{image_path, Expect, ImageDigest, Shape, Snapshot, SnapshotBuilder};

const PROTO: u32 = 3;
const GUEST_LEN: usize = 16 * 4096;
/// The part of the header page that must match the snapshot; the data
/// digest follows it.
const HEADER_USED: usize = 56;

struct Fixture {
    _dir: tempfile::TempDir,
    snap: PathBuf,
    guest: Vec<u8>,
    valid_image: Vec<u8>,
}

fn fixture() -> &'static Fixture {
    static F: OnceLock<Fixture> = OnceLock::new();
    F.get_or_init(|| {
        // tmpfs where there is one: a rebuild syncs the image.
        let dir = tempfile::tempdir_in("/dev/shm")
            .or_else(|_| tempfile::tempdir())
            .expect("a temporary directory");
        let mut guest = vec![0u8; GUEST_LEN];
        guest[4096 * 2 + 5] = 1;
        guest[4096 * 11..4096 * 12].fill(0x5a);
        let shape = Shape {
            backend: "kvm".into(),
            memory_bytes: GUEST_LEN as u64,
            vcpus: 1,
        };
        let mut b = SnapshotBuilder::new(PROTO, shape);
        b.add_memory("memory", &guest).expect("valid memory");
        let snap = dir.path().join("f.snap");
        b.write_file(&snap).expect("write the snapshot");
        let s = Snapshot::open(&snap, &Expect::protocol(PROTO)).expect("open the snapshot");
        let img = image_path(&snap);
        s.restore_image("memory", &img).expect("build the image");
        let valid_image = std::fs::read(&img).expect("read the image");
        Fixture {
            _dir: dir,
            snap,
            guest,
            valid_image,
        }
    })
}

fuzz_target!(|data: &[u8]| {
    let f = fixture();
    let Some((&start, rest)) = data.split_first() else {
        return;
    };
    let mut file = if start % 2 == 0 {
        f.valid_image.clone()
    } else {
        Vec::new()
    };
    let edits = rest.chunks_exact(3);
    let n = edits.len();
    for e in edits {
        let pos = usize::from(u16::from_le_bytes([e[0], e[1]])) % IMAGE_DATA_OFFSET as usize;
        if pos < file.len() {
            file[pos] = e[2];
        }
    }
    if n % 2 == 1 && rest.len() >= 2 {
        let l = usize::from(u16::from_le_bytes([
            rest[rest.len() - 2],
            rest[rest.len() - 1],
        ]));
        file.resize(l * f.valid_image.len() / usize::from(u16::MAX), 0);
    }
    let img = image_path(&f.snap);
    std::fs::write(&img, &file).expect("write the image under test");
    let s = Snapshot::open(&f.snap, &Expect::protocol(PROTO)).expect("open the snapshot");
    let r = s
        .restore_image("memory", &img)
        .expect("a bad image is rebuilt, never an error");
    assert_eq!(r.guest_len_bytes, GUEST_LEN as u64);
    // The header's used part (magic, version, size, the section's hash)
    // and the length decide; the rest of the header page is padding.
    let same =
        file.len() == f.valid_image.len() && file[..HEADER_USED] == f.valid_image[..HEADER_USED];
    assert_eq!(
        r.built, !same,
        "reused exactly when the header and length match"
    );
    let mut got = vec![0u8; GUEST_LEN];
    r.file
        .read_exact_at(&mut got, r.data_offset)
        .expect("read guest memory");
    assert!(got == f.guest, "the image holds the snapshot's memory");
    // The digest a restore checks the pages against is the pages' digest
    // exactly when the header's digest field was left alone.
    let mut d = ImageDigest::default();
    for (i, p) in got.chunks(4096).enumerate() {
        d.page(i as u64, p);
    }
    let digest_intact = r.built
        || file[HEADER_USED..HEADER_USED + 32] == f.valid_image[HEADER_USED..HEADER_USED + 32];
    assert_eq!(d.finish() == r.data_sha256, digest_intact);
});
