//! A cache directory shared by two machines (NFS or similar), seen the way
//! two hosts whose locks do not see each other would see it: two processes
//! lock one key's build lock with different mechanisms (`flock(2)` and a
//! POSIX `fcntl` record lock, which do not exclude each other on Linux),
//! both get it, and both install the same key over and over, a VM entry and
//! a lab entry, while this process reads the entries. Every read must see
//! one writer's whole entry, never a mix or a torn file, and nothing may be
//! left behind (docs/ci.md, "A shared cache directory").
//!
//! The two writers are this test binary re-run with `--ignored --exact
//! writer` and `PROVIUM_SHARED_CACHE_ROLE` set.

use std::fs::{self, File, OpenOptions};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use provium_snapshot::cache::LockAttempt;
use provium_snapshot::{CacheKey, EntryKind, FixtureCache};

const KEY: CacheKey = CacheKey([7; 32]);
const LEN: usize = 256 * 1024;
const ROUNDS: usize = 40;

fn wait_for(path: &Path, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !path.exists() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Take the build lock with a POSIX record lock, as a host whose locking
/// does not see the other host's `flock` would.
fn fcntl_lock(path: &Path) -> File {
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
        .unwrap();
    // SAFETY: a zeroed flock struct is a valid argument once its fields are set.
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = libc::F_WRLCK as libc::c_short;
    fl.l_whence = libc::SEEK_SET as libc::c_short;
    // SAFETY: F_SETLK on a descriptor we own, with a valid flock struct.
    let rc = unsafe { libc::fcntl(f.as_raw_fd(), libc::F_SETLK, &fl) };
    assert_eq!(rc, 0, "fcntl lock: {}", std::io::Error::last_os_error());
    f
}

/// One writer (only when run as a child with its role set).
#[test]
#[ignore = "run by two_hosts_with_different_locks_never_tear_an_entry"]
fn writer() {
    let Ok(role) = std::env::var("PROVIUM_SHARED_CACHE_ROLE") else {
        return;
    };
    let dir = PathBuf::from(std::env::var("PROVIUM_SHARED_CACHE_DIR").unwrap());
    let byte: u8 = std::env::var("PROVIUM_SHARED_CACHE_BYTE")
        .unwrap()
        .parse()
        .unwrap();
    let cache = FixtureCache::open(&dir.join("cache")).unwrap();
    let lock = cache.lock_path(&KEY, EntryKind::Vm);
    let _held: Box<dyn std::any::Any> = match role.as_str() {
        "flock" => match cache.try_lock(&KEY, EntryKind::Vm, "flock host").unwrap() {
            LockAttempt::Acquired(l) => Box::new(l),
            LockAttempt::Busy { held_by } => panic!("flock busy (held by {held_by})"),
        },
        "fcntl" => Box::new(fcntl_lock(&lock)),
        other => panic!("unknown role {other}"),
    };
    // Both hold "the" lock at once: neither waits for the other.
    fs::write(dir.join(format!("{role}.locked")), b"").unwrap();
    let other = if role == "flock" { "fcntl" } else { "flock" };
    wait_for(
        &dir.join(format!("{other}.locked")),
        "the other writer's lock",
    );
    let src = dir.join(format!("src-{role}"));
    fs::create_dir_all(&src).unwrap();
    let snap = src.join("one.snap");
    fs::write(&snap, vec![byte; LEN]).unwrap();
    let lab = src.join("lab");
    fs::create_dir_all(&lab).unwrap();
    fs::write(lab.join("lab.json"), format!("{{\"writer\": {byte}}}")).unwrap();
    fs::write(lab.join("a.snap"), vec![byte; LEN]).unwrap();
    for _ in 0..ROUNDS {
        cache.install_vm(&KEY, &snap).unwrap();
        cache.install_lab(&KEY, &lab).unwrap();
    }
}

fn spawn(dir: &Path, role: &str, byte: u8) -> Child {
    Command::new(std::env::current_exe().unwrap())
        .args(["--ignored", "--exact", "writer", "--nocapture"])
        .env("PROVIUM_SHARED_CACHE_ROLE", role)
        .env("PROVIUM_SHARED_CACHE_DIR", dir)
        .env("PROVIUM_SHARED_CACHE_BYTE", byte.to_string())
        .spawn()
        .unwrap()
}

/// The writer whose whole entry `bytes` is, if it is one writer's.
fn whole(bytes: &[u8]) -> Option<u8> {
    (bytes.len() == LEN && bytes.iter().all(|b| *b == bytes[0])).then(|| bytes[0])
}

#[test]
fn two_hosts_with_different_locks_never_tear_an_entry() {
    let d = tempfile::tempdir().unwrap();
    let cache = FixtureCache::open(&d.path().join("cache")).unwrap();
    let (a, b) = (0xaa_u8, 0xbb_u8);
    let mut children = [spawn(d.path(), "flock", a), spawn(d.path(), "fcntl", b)];
    let vm = cache.entry_path(&KEY, EntryKind::Vm);
    let lab = cache.entry_path(&KEY, EntryKind::Lab);
    let mut seen = std::collections::BTreeSet::new();
    let mut reads = 0;
    loop {
        let running = children.iter_mut().any(|c| c.try_wait().unwrap().is_none());
        if let Ok(bytes) = fs::read(&vm) {
            let w = whole(&bytes).unwrap_or_else(|| panic!("torn vm entry: {} bytes", bytes.len()));
            seen.insert(w);
            reads += 1;
        }
        // Read the lab entry through one directory handle, as a restore
        // that opened it would: both files come from the same entry.
        if let Ok(dirf) = File::open(&lab) {
            let base = PathBuf::from(format!("/proc/self/fd/{}", dirf.as_raw_fd()));
            if let (Ok(index), Ok(snap)) = (
                fs::read_to_string(base.join("lab.json")),
                fs::read(base.join("a.snap")),
            ) {
                let w = whole(&snap).expect("torn lab snapshot");
                assert_eq!(
                    index,
                    format!("{{\"writer\": {w}}}"),
                    "a lab entry mixing two writers"
                );
            }
        }
        if !running {
            break;
        }
    }
    for c in &mut children {
        assert!(c.wait().unwrap().success(), "a writer failed");
    }
    // Both held a lock at once, so both wrote: the lock did not serialise them.
    assert!(d.path().join("flock.locked").exists() && d.path().join("fcntl.locked").exists());
    let last = whole(&fs::read(&vm).unwrap()).expect("a whole final entry");
    assert!(last == a || last == b);
    assert!(
        reads > 0 && seen.iter().all(|w| *w == a || *w == b),
        "{seen:?}"
    );
    let leftovers: Vec<String> = fs::read_dir(cache.dir())
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains(".tmp-"))
        .collect();
    assert!(
        leftovers.is_empty(),
        "temporaries left behind: {leftovers:?}"
    );
}
