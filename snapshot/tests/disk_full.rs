//! A full file system under the fixture cache: a snapshot write, a cache
//! install and a restore-image build into a small tmpfs that cannot hold
//! them fail with a clean error naming the directory and its free space,
//! leave nothing partial behind, and succeed once there is room (the tmpfs
//! is remounted larger).
//!
//! Mounting needs root (CAP_SYS_ADMIN); elsewhere each test prints why it
//! is skipped.

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use provium_snapshot::{
    image_path, CacheError, EntryKind, Expect, FixtureCache, KeyBuilder, Shape, Snapshot,
    SnapshotBuilder, SnapshotError,
};

/// A tmpfs of `size_kib` mounted on a fresh directory, unmounted on drop.
struct Tmpfs {
    dir: PathBuf,
    _parent: tempfile::TempDir,
}

impl Tmpfs {
    fn mount(size_kib: u64) -> Option<Tmpfs> {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("skipped: mounting a small tmpfs needs root (run the tests as root)");
            return None;
        }
        let parent = tempfile::tempdir().expect("a temporary directory");
        let dir = parent.path().join("fs");
        std::fs::create_dir(&dir).expect("create the mount point");
        match mount(&dir, size_kib, 0) {
            Ok(()) => Some(Tmpfs {
                dir,
                _parent: parent,
            }),
            Err(e) => {
                eprintln!("skipped: cannot mount a tmpfs on {}: {e}", dir.display());
                None
            }
        }
    }

    fn grow(&self, size_kib: u64) {
        mount(&self.dir, size_kib, libc::MS_REMOUNT).expect("remount the tmpfs larger");
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let c = CString::new(self.dir.as_os_str().as_bytes()).expect("no NUL in a temp path");
        // SAFETY: a NUL-terminated path; a failed unmount only leaks a tmpfs.
        unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
    }
}

fn mount(dir: &Path, size_kib: u64, flags: libc::c_ulong) -> std::io::Result<()> {
    let target = CString::new(dir.as_os_str().as_bytes()).expect("no NUL in a temp path");
    let opts = CString::new(format!("size={size_kib}k")).expect("no NUL");
    // SAFETY: NUL-terminated strings that outlive the call.
    let rc = unsafe {
        libc::mount(
            c"tmpfs".as_ptr(),
            target.as_ptr(),
            c"tmpfs".as_ptr(),
            flags,
            opts.as_ptr().cast(),
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Bytes zstd cannot shrink (an LCG's high bytes).
fn noise(len: usize) -> Vec<u8> {
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    (0..len)
        .map(|_| {
            x = x
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            (x >> 56) as u8
        })
        .collect()
}

fn shape(memory_bytes: u64) -> Shape {
    Shape {
        backend: "kvm".into(),
        memory_bytes,
        vcpus: 1,
    }
}

fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .expect("read the directory")
        .map(|e| {
            e.expect("an entry")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    v.sort();
    v
}

#[test]
fn a_snapshot_write_into_a_full_directory_is_a_clean_error() {
    let Some(fs) = Tmpfs::mount(64) else { return };
    let mut b = SnapshotBuilder::new(1, shape(0));
    b.add_raw_section("vcpu", &noise(200 << 10)).unwrap();
    let path = fs.dir.join("x.snap");
    let e = b.write_file(&path).unwrap_err();
    let SnapshotError::NoSpace {
        dir,
        free_bytes,
        needed_bytes,
        ..
    } = &e
    else {
        panic!("expected NoSpace, got {e:?}");
    };
    assert_eq!(dir, &fs.dir);
    assert!(
        *free_bytes < *needed_bytes,
        "{free_bytes} >= {needed_bytes}"
    );
    assert_eq!(*needed_bytes, b.len_bytes());
    let msg = e.to_string();
    assert!(
        msg.contains(&format!("no space left in {}", fs.dir.display()))
            && msg.contains("bytes free"),
        "{msg}"
    );
    assert!(
        names(&fs.dir).is_empty(),
        "left behind: {:?}",
        names(&fs.dir)
    );
    fs.grow(1024);
    assert_eq!(b.write_file(&path).unwrap(), b.len_bytes());
    let s = Snapshot::open(&path, &Expect::protocol(1)).unwrap();
    assert_eq!(s.section("vcpu").unwrap(), noise(200 << 10));
}

#[test]
fn a_cache_install_into_a_full_cache_is_a_clean_error_and_the_next_succeeds() {
    let Some(fs) = Tmpfs::mount(64) else { return };
    let src_dir = tempfile::tempdir().unwrap();
    let src = src_dir.path().join("built.snap");
    let mut b = SnapshotBuilder::new(1, shape(0));
    b.add_raw_section("vcpu", &noise(200 << 10)).unwrap();
    b.write_file(&src).unwrap();
    let cache = FixtureCache::open(&fs.dir).unwrap();
    let mut k = KeyBuilder::new("test");
    k.field("n", b"1");
    let key = k.finish();
    let e = cache.install_vm(&key, &src).unwrap_err();
    let CacheError::NoSpace {
        dir,
        free_bytes,
        needed_bytes,
        ..
    } = &e
    else {
        panic!("expected NoSpace, got {e:?}");
    };
    assert_eq!(dir, &fs.dir);
    assert_eq!(*needed_bytes, b.len_bytes());
    assert!(*free_bytes < *needed_bytes);
    assert!(
        e.to_string()
            .contains(&format!("no space left in {}", fs.dir.display())),
        "{e}"
    );
    // No partial entry: nothing to look up, nothing on disk.
    assert_eq!(cache.lookup(&key, EntryKind::Vm), None);
    assert!(
        names(&fs.dir).is_empty(),
        "left behind: {:?}",
        names(&fs.dir)
    );

    // A lab entry too.
    let lab = src_dir.path().join("lab");
    std::fs::create_dir(&lab).unwrap();
    std::fs::write(lab.join("lab.json"), b"{}").unwrap();
    std::fs::copy(&src, lab.join("a.snap")).unwrap();
    let e = cache.install_lab(&key, &lab).unwrap_err();
    assert!(matches!(e, CacheError::NoSpace { .. }), "{e:?}");
    assert!(
        names(&fs.dir).is_empty(),
        "left behind: {:?}",
        names(&fs.dir)
    );

    fs.grow(1024);
    let p = cache.install_vm(&key, &src).unwrap();
    assert_eq!(cache.lookup(&key, EntryKind::Vm), Some(p.clone()));
    let s = Snapshot::open(&p, &Expect::protocol(1)).unwrap();
    assert_eq!(s.section("vcpu").unwrap(), noise(200 << 10));
}

#[test]
fn a_restore_image_build_on_a_full_file_system_is_an_error_not_a_sigbus() {
    let Some(fs) = Tmpfs::mount(128) else { return };
    // 64 non-zero pages: a tiny snapshot, a 256 KiB image.
    let mut guest = vec![0u8; 128 * 4096];
    for i in 0..64 {
        guest[i * 2 * 4096..(i * 2 + 1) * 4096].fill(i as u8 + 1);
    }
    let mut b = SnapshotBuilder::new(1, shape(guest.len() as u64));
    b.add_memory("memory", &guest).unwrap();
    let path = fs.dir.join("x.snap");
    b.write_file(&path).unwrap();
    let s = Snapshot::open(&path, &Expect::protocol(1)).unwrap();
    let img = image_path(&path);
    let e = s.restore_image("memory", &img).unwrap_err();
    assert!(matches!(e, SnapshotError::NoSpace { .. }), "{e:?}");
    assert!(e.to_string().contains("bytes free"), "{e}");
    assert_eq!(names(&fs.dir), ["x.snap"], "only the snapshot is left");
    fs.grow(1024);
    let r = s.restore_image("memory", &img).unwrap();
    assert!(r.built);
    let mut back = vec![0u8; guest.len()];
    r.file.read_exact_at(&mut back, r.data_offset).unwrap();
    assert!(back == guest, "the image holds the guest's memory");
}
