//! Disks through the real `provium` binary.
//!
//! - The disks suite (`tests/lua/disks`) on the kvm backend, on VMs that are
//!   created and never booted: every Disk method and error, host-side. It
//!   needs no /dev/kvm (nothing boots; `--no-preflight`).
//! - The same suite on the local backend: `vm:attach_disk` is refused, naming
//!   the backend, and every other test skips saying why.
//! - The tiny guest (tier 4) booted with a disk attached from Lua: the VMM
//!   gives it a virtio-blk device in the first virtio-mmio slot.
//! - The probe kernel (tier 5) booted (no agent) with two disks attached
//!   from Lua and `eio_read` injected on the first: Linux's virtio_blk
//!   driver finds them in attach order (vda, vdb) with their sizes, its
//!   partition scan of vda fails with an I/O error, and vdb, an ext4 image
//!   this test made with mkfs.ext4, is mounted as the root file system
//!   (`root=/dev/vdb`; the initrd has no /init, so the kernel goes on to
//!   mount `root=`). That is the Disk's fault set acting on the guest's
//!   requests, and our virtio-blk serving a real file system. A second boot
//!   makes an ext4 image the root (`root=/dev/vda`) with `eio_read` on it:
//!   the mount fails (`VFS: Unable to mount root fs`). (A boot with
//!   no initrd at all stopped early on this machine, before any device
//!   probe; see docs/vmm.md.)
//!
//! KVM tests need /dev/kvm (`PROVIUM_SKIP_KVM=1` skips, printing why); the
//! probe test needs the probe kernel (`PROVIUM_SKIP_PROBE_KERNEL=1` skips).

mod common;

use common::{kvm_or_skip, probe_kernel, repo_root, PROBE_CMDLINE};

use std::path::Path;
use std::process::{Command, Output};

use provium_vmm::tiny_guest;

fn provium(dir: &Path, args: &[&str], envs: &[(&str, &str)]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_provium"))
        // No KSM tuning: these runs must not change the host.
        .args(["--no-preflight", "--no-ksm", "-v"])
        .args(args)
        .current_dir(dir)
        .env(
            "PROVIUM_RERUN_STATE",
            std::env::temp_dir().join(format!("provium-disks-rerun-{}.json", std::process::id())),
        )
        .envs(envs.iter().copied())
        .output()
        .unwrap()
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn suite(vmm: &str) -> (Option<i32>, String) {
    let o = provium(
        &repo_root(),
        &[
            "--vmm",
            vmm,
            "--config",
            "tests/lua/provium.toml",
            "tests/lua/disks",
        ],
        &[],
    );
    (o.status.code(), text(&o))
}

#[test]
fn disks_suite_passes_on_the_kvm_backend_without_booting() {
    let (code, out) = suite("kvm");
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("PASS disks/attach.test.lua"), "{out}");
    assert!(out.contains("PASS disks/sectors.test.lua"), "{out}");
    assert!(out.contains("PASS disks/faults.test.lua"), "{out}");
    // Only the local-backend refusal skips, and it says why.
    assert!(out.contains(", 0 failed, 1 skipped;"), "{out}");
    assert!(
        out.contains("SKIP the local backend refuses disks, naming the backend and the fix (this run's backend (kvm) has disks"),
        "{out}"
    );
}

#[test]
fn disks_suite_on_the_local_backend_refuses_disks_and_says_why_it_skips() {
    let (code, out) = suite("local");
    assert_eq!(code, Some(0), "{out}");
    assert!(
        out.contains("PASS the local backend refuses disks, naming the backend and the fix"),
        "{out}"
    );
    assert!(out.contains("1 passed, 0 failed, 22 skipped;"), "{out}");
    assert!(
        out.contains("SKIP eio_read fails reads only, before any I/O (the local backend has no block devices; this suite's disk tests run with --vmm kvm)"),
        "{out}"
    );
}

/// A project in a temp dir: provium.toml with `profile` and one test file.
fn project(profile: &str, test: &str) -> tempfile::TempDir {
    let d = tempfile::tempdir().unwrap();
    std::fs::write(
        d.path().join("provium.toml"),
        format!("[provium]\nroots = [\"tests\"]\n\n{profile}"),
    )
    .unwrap();
    std::fs::create_dir_all(d.path().join("tests")).unwrap();
    std::fs::write(d.path().join("tests/disks.test.lua"), test).unwrap();
    d
}

/// An ext4 file system of `sectors` 512-byte sectors, made by the host's
/// mkfs.ext4 (e2fsprogs, priority "required" on Debian) with a /sbin/init
/// in it.
fn ext4_image(dir: &Path, name: &str, sectors: usize) -> String {
    let root = dir.join(format!("{name}.root"));
    std::fs::create_dir_all(root.join("sbin")).unwrap();
    std::fs::write(
        root.join("sbin/init"),
        "#!/bin/sh\necho provium ext4 root\n",
    )
    .unwrap();
    let p = image(dir, name, sectors);
    let o = Command::new("mkfs.ext4")
        .args(["-q", "-F", "-L", "provium-root", "-d"])
        .arg(&root)
        .arg(&p)
        .output()
        .expect("mkfs.ext4 (e2fsprogs) runs");
    assert!(o.status.success(), "mkfs.ext4: {}", text(&o));
    p
}

/// A newc initrd holding only /dev/console: with no /init in it the kernel
/// goes on to mount `root=`.
fn initrd_without_init(dir: &Path) -> std::path::PathBuf {
    let mut w = provium_vmm::initrd::CpioWriter::new();
    w.dir("dev", 0o755).unwrap();
    w.char_dev("dev/console", 0o600, 5, 1).unwrap();
    let path = dir.join("initrd-no-init.cpio");
    std::fs::write(&path, w.finish()).unwrap();
    path
}

fn image(dir: &Path, name: &str, sectors: usize) -> String {
    let p = dir.join(name);
    std::fs::write(&p, vec![0u8; sectors * 512]).unwrap();
    p.to_str().unwrap().to_string()
}

const TINY_TEST: &str = r#"
test("a disk attached from Lua is the guest's first virtio-mmio device", function(t)
    local vm = provium:vm("v", "tiny", {memory = "64M"})
    local d = vm:attach_disk({id = "vda", image = IMAGE})
    local ok = pcall(function() vm:boot() end)
    t:assert(not ok, "no agent in the tiny guest: the boot must fail")
    t:assert_eq(d:guest_device(), "/dev/vda")
    local log = vm:console():read_log()
    -- magic "virt", device id 2 (block) in slot 0; without the disk slot 0
    -- would hold the rng (device id 4).
    t:assert(log:find("mmio0=74726976/00000002", 1, true), log)
    local _, n = log:gsub("virtio_mmio.device=", "")
    -- block, rng, vsock, then the profile's default 2 disk and 2 NIC slots.
    t:assert_eq(n, 7, "block, rng, vsock and 4 slots on the command line: " .. log)
    vm:attach_disk({id = "late"})
end)
"#;

#[test]
fn a_disk_attached_in_lua_reaches_the_tiny_guest_as_virtio_blk() {
    let test = "a_disk_attached_in_lua_reaches_the_tiny_guest_as_virtio_blk";
    if !kvm_or_skip(test) {
        return;
    }
    let scratch = tempfile::tempdir().unwrap();
    let img = image(scratch.path(), "vda.img", 64);
    let p = project(
        "[profiles.tiny]\nkernel = \"tiny.bzImage\"\ncmdline = \"tiny\"\nguest_os = \"linux\"\ninject_agent = false\n",
        &TINY_TEST.replace("IMAGE", &format!("{img:?}")),
    );
    std::fs::write(p.path().join("tiny.bzImage"), tiny_guest::BZIMAGE).unwrap();
    let o = provium(
        p.path(),
        &["--vmm", "kvm"],
        &[("PROVIUM_KVM_AGENT_TIMEOUT", "2")],
    );
    let out = text(&o);
    // The last line of the test attaches to a VM that has booted (and
    // died): that must fail, saying which VMs take disks.
    assert_eq!(o.status.code(), Some(1), "{out}");
    assert!(
        out.contains("vm:attach_disk: vm `v` is dead; attach disks to a created vm (given at vm:boot()) or a booted one (into a disk slot)"),
        "{out}"
    );
    assert!(out.contains("0 passed, 1 failed"), "{out}");
}

const PROBE_TEST: &str = r#"
test("the guest kernel sees the disks in attach order, and EIO on the faulty one", function(t)
    local vm = provium:vm("v", "probe", {memory = "256M"})
    local bad = vm:attach_disk({id = "bad", image = BAD})
    local good = vm:attach_disk({id = "good", image = GOOD})
    bad:fault_inject("eio_read")
    local ok = pcall(function() vm:boot() end)
    t:assert(not ok, "no agent in this guest: the boot must fail")
    t:assert_eq(bad:guest_device(), "/dev/vda")
    t:assert_eq(good:guest_device(), "/dev/vdb")
    local log = vm:console():read_log()
    t:assert(log:find("virtio_blk virtio0: [vda] 2048 512-byte logical blocks", 1, true), log)
    t:assert(log:find("virtio_blk virtio1: [vdb] 16384 512-byte logical blocks", 1, true), log)
    t:assert(log:find("I/O error, dev vda, sector 0", 1, true), "the partition scan of vda saw EIO: " .. log)
    t:assert(not log:find("error, dev vdb", 1, true), "vdb has no fault: " .. log)
    -- vdb holds the ext4 file system mkfs.ext4 made: the kernel mounts it
    -- as root through our virtio-blk (superblock, group descriptors, root
    -- inode all read by the guest's requests).
    t:assert(log:find("EXT4-fs (vdb): mounted filesystem", 1, true), "ext4 on vdb mounted: " .. log)
    t:assert(log:find("VFS: Mounted root (ext4 filesystem)", 1, true), "root=/dev/vdb mounted: " .. log)
    -- The host side agrees: the fault is still active, the image intact.
    t:assert_eq(bad:active_faults()[1], "eio_read")
    bad:clear_faults()
    t:assert_eq(bad:read_sectors(0, 1), string.rep("\0", 512))
end)
"#;

const PROBE_ROOT_EIO_TEST: &str = r#"
test("an eio_read on the ext4 root fails its mount in the guest kernel", function(t)
    local vm = provium:vm("v", "probe", {memory = "256M"})
    local root = vm:attach_disk({id = "root", image = ROOT})
    root:fault_inject("eio_read")
    local ok = pcall(function() vm:boot() end)
    t:assert(not ok, "the root cannot be mounted: the boot must fail")
    local log = vm:console():read_log()
    t:assert(log:find("I/O error, dev vda", 1, true), "the guest's reads of vda saw EIO: " .. log)
    t:assert(log:find("VFS: Unable to mount root fs", 1, true), "the root mount failed: " .. log)
    t:assert(not log:find("VFS: Mounted root", 1, true), "nothing was mounted: " .. log)
    -- The image itself is intact: ext4's magic 0xEF53 at byte 1080
    -- (sector 2, offset 56), read host-side once the fault is cleared.
    root:clear_faults()
    t:assert_eq(root:read_sectors(2, 1):sub(57, 58), "\x53\xEF")
end)
"#;

/// Boots the probe kernel from a project whose `probe` profile adds
/// `cmdline_extra` and has an initrd without /init (so the kernel mounts
/// `root=`), runs `lua` in it, and asserts its one test passed.
fn run_probe_disk_test(test: &str, scratch: &Path, cmdline_extra: &str, lua: &str) {
    let Some(kernel) = probe_kernel(test) else {
        return;
    };
    let initrd = initrd_without_init(scratch);
    // No agent: the boot fails once the kernel panics (no working init, or
    // no root), after the probes the test asserts on.
    let cmdline = format!("{PROBE_CMDLINE} {cmdline_extra}");
    let p = project(
        &format!(
            "[profiles.probe]\nkernel = {kernel:?}\ninitrd = {initrd:?}\ncmdline = {cmdline:?}\nguest_os = \"linux\"\ninject_agent = false\n"
        ),
        lua,
    );
    let t0 = std::time::Instant::now();
    let o = provium(
        p.path(),
        &["--vmm", "kvm", "--timeout", "1200"],
        &[("PROVIUM_KVM_AGENT_TIMEOUT", "1100")],
    );
    eprintln!("{test}: probe boot with disks: {:?}", t0.elapsed());
    let out = text(&o);
    assert_eq!(o.status.code(), Some(0), "{out}");
    assert!(out.contains("1 passed, 0 failed"), "{out}");
}

#[test]
fn an_injected_eio_reaches_the_probe_kernel() {
    let test = "an_injected_eio_reaches_the_probe_kernel";
    if !kvm_or_skip(test) {
        return;
    }
    let scratch = tempfile::tempdir().unwrap();
    let bad = image(scratch.path(), "bad.img", 2048);
    let good = ext4_image(scratch.path(), "good.img", 16384);
    // The kernel probes both disks (the partition scan included), finds no
    // /init in the initrd, mounts root=/dev/vdb and tries its /sbin/init
    // (kvm_pvm runs no user space).
    let lua = PROBE_TEST
        .replace("BAD", &format!("{bad:?}"))
        .replace("GOOD", &format!("{good:?}"));
    run_probe_disk_test(test, scratch.path(), "root=/dev/vdb rootfstype=ext4", &lua);
}

#[test]
fn an_eio_on_the_root_disk_fails_the_ext4_mount_in_the_probe_kernel() {
    let test = "an_eio_on_the_root_disk_fails_the_ext4_mount_in_the_probe_kernel";
    if !kvm_or_skip(test) {
        return;
    }
    let scratch = tempfile::tempdir().unwrap();
    let root = ext4_image(scratch.path(), "root.img", 16384);
    let lua = PROBE_ROOT_EIO_TEST.replace("ROOT", &format!("{root:?}"));
    run_probe_disk_test(test, scratch.path(), "root=/dev/vda rootfstype=ext4", &lua);
}
