//! Tier 5: the kernel-probe tests (DESIGN.md, "How we test").
//!
//! The minimal Linux kernel that `scripts/build-probe-kernel.sh` builds from
//! Debian's linux-source-6.1 boots on our VMM, and its own drivers probe our
//! devices before user space (which this machine's kvm_pvm cannot run). Every
//! assertion is on the console log. A boot takes about a minute here, so one
//! boot serves several assertions.
//!
//! The kernel is `PROVIUM_PROBE_KERNEL` if set, else `target/probe-kernel/bzImage`.
//! Without it the tests FAIL and say how to build it; `PROVIUM_SKIP_PROBE_KERNEL=1`
//! turns that into a printed skip. Like the tier-4 tests they need /dev/kvm
//! (`PROVIUM_SKIP_KVM=1` skips, printing why, where there is none).
//!
//! Nothing asserts a timing: the time to "Run /init" is printed for the record
//! (docs/vmm.md has the measured numbers).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use provium_vmm::devices::virtio::vsock::{VsockConnectError, VsockHost};
use provium_vmm::initrd::CpioWriter;
use provium_vmm::vmm_config::{DriveConfig, RngConfig};
use provium_vmm::{BootSource, KernelImage, Vm, VmConfig, VmError};

/// The command line DESIGN.md gives for Linux guests on kvm_pvm (the CPU
/// features its emulator lacks, hidden from the kernel) plus the console.
const CMDLINE: &str = "console=ttyS0 noxsave nokaslr tsc=reliable \
     clearcpuid=308,141,151,145,158,288,298,306,291,296,156,293";
/// Generous: ~35 s to /init on an idle 2-core machine, CI may be slower.
const BOOT_WAIT: Duration = Duration::from_secs(600);
const RUN_INIT: &str = "Run /init as init process";

fn env_is_1(name: &str) -> bool {
    std::env::var_os(name).is_some_and(|v| v == "1")
}

/// The probe kernel, or `None` after printing why the test skips.
fn probe_kernel(test: &str) -> Option<PathBuf> {
    let path = match std::env::var_os("PROVIUM_PROBE_KERNEL") {
        Some(p) => PathBuf::from(p),
        None => {
            let target = std::env::var_os("CARGO_TARGET_DIR")
                .map(PathBuf::from)
                .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target"));
            target.join("probe-kernel/bzImage")
        }
    };
    if path.is_file() {
        return Some(path);
    }
    let why = format!(
        "the probe kernel {} is missing: build it with `scripts/build-probe-kernel.sh` \
         (2.5 min on 2 idle cores, much longer on busy ones; installs Debian's linux-source-6.1 and build tools if missing), \
         or point PROVIUM_PROBE_KERNEL at a bzImage",
        path.display()
    );
    if env_is_1("PROVIUM_SKIP_PROBE_KERNEL") {
        eprintln!("SKIP {test}: {why} (PROVIUM_SKIP_PROBE_KERNEL=1)");
        return None;
    }
    panic!("{test}: {why}; set PROVIUM_SKIP_PROBE_KERNEL=1 to skip this tier");
}

fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut c = e.source();
    while let Some(x) = c {
        s += ": ";
        s += &x.to_string();
        c = x.source();
    }
    s
}

/// An uncompressed initrd (gunzip in an emulated kernel is slow) with a
/// `/init` and `/dev/console`. The init never runs here: kvm_pvm cannot run
/// Linux user space, and the kernel prints "Run /init" before trying.
fn write_initrd(dir: &std::path::Path) -> PathBuf {
    let mut w = CpioWriter::new();
    w.dir("dev", 0o755).expect("dir");
    w.char_dev("dev/console", 0o600, 5, 1).expect("console");
    w.file("init", 0o755, b"#!/bin/sh\necho provium probe init\n")
        .expect("init");
    let path = dir.join("initrd.cpio");
    std::fs::write(&path, w.finish()).expect("write initrd");
    path
}

fn new_vm(test: &str, cfg: VmConfig) -> Option<Vm> {
    match Vm::new(cfg) {
        Ok(vm) => Some(vm),
        Err(e @ VmError::Kvm(_)) if env_is_1("PROVIUM_SKIP_KVM") => {
            eprintln!("SKIP {test}: {} (PROVIUM_SKIP_KVM=1)", chain(&e));
            None
        }
        Err(e) => panic!(
            "{test}: {} — this tier needs /dev/kvm; set PROVIUM_SKIP_KVM=1 on a machine without it",
            chain(&e)
        ),
    }
}

/// Waits for `needle`, returning when it appeared (since `t0`); fails with the log.
fn wait_line(vm: &Vm, needle: &str, t0: Instant) -> Duration {
    let c = vm.console();
    let left = BOOT_WAIT.saturating_sub(t0.elapsed());
    assert!(
        c.wait_for(needle.as_bytes(), 1, left),
        "expected {needle:?} on the console within {BOOT_WAIT:?}; log:\n{}",
        c.log_string()
    );
    t0.elapsed()
}

const DISK_SECTORS: u64 = 16384; // 8 MiB
const GUEST_CID: u64 = 42;
/// virtio status bits (virtio 1.2, 2.1).
const DRIVER_OK: u32 = 4;
const NEEDS_RESET: u32 = 0x40;
const FAILED: u32 = 0x80;

/// Polls until the `index`th virtio device's driver set DRIVER_OK.
fn wait_driver_ok(vm: &Vm, index: u32, what: &str, t0: Instant) -> Duration {
    loop {
        let st = vm.virtio_status(index).expect("booted, device present");
        assert_eq!(
            st & (NEEDS_RESET | FAILED),
            0,
            "{what}: status {st:#x}; log:\n{}",
            vm.console().log_string()
        );
        if st & DRIVER_OK != 0 {
            return t0.elapsed();
        }
        assert!(
            t0.elapsed() < BOOT_WAIT,
            "{what}: the guest's driver never set DRIVER_OK (status {st:#x}); log:\n{}",
            vm.console().log_string()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn probe_kernel_boots_to_init_and_probes_devices() {
    let test = "probe_kernel_boots_to_init_and_probes_devices";
    let Some(kernel) = probe_kernel(test) else {
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let initrd = write_initrd(dir.path());
    let disk = dir.path().join("disk.img");
    std::fs::write(
        &disk,
        vec![0u8; usize::try_from(DISK_SECTORS * 512).expect("small")],
    )
    .expect("disk");

    let mut cfg = VmConfig::new(BootSource {
        kernel: KernelImage::Path(kernel.clone()),
        initrd: Some(initrd),
        cmdline: CMDLINE.to_string(),
    });
    cfg.machine.mem_size_mib = 256;
    cfg.drives = vec![DriveConfig {
        path: disk,
        read_only: false,
        id: "probe-vda".into(),
        faults: Default::default(),
    }];
    cfg.rng = Some(RngConfig { seed: Some(7) });
    let vsock = VsockHost::new(GUEST_CID).expect("vsock host");
    cfg.vsock = Some(vsock.clone());
    let Some(vm) = new_vm(test, cfg) else {
        return;
    };
    let t0 = Instant::now();
    vm.boot().expect("boot");
    let banner = wait_line(&vm, "Linux version 6.1", t0);
    let blk = wait_line(
        &vm,
        &format!("virtio_blk virtio0: [vda] {DISK_SECTORS} 512-byte logical blocks"),
        t0,
    );
    let init = wait_line(&vm, RUN_INIT, t0);
    // Each driver probed its device and started it (DRIVER_OK): virtio-blk
    // (0), virtio-rng (1; hw_random reads it at registration), vsock (2).
    let blk_ok = wait_driver_ok(&vm, 0, "virtio-blk", t0);
    let rng_ok = wait_driver_ok(&vm, 1, "virtio-rng", t0);
    let vsock_ok = wait_driver_ok(&vm, 2, "virtio-vsock", t0);
    // The guest kernel's vsock transport answers: nothing listens on the
    // port (no user space here), so it refuses with RST.
    let refused = vsock.connect(1024, Duration::from_secs(60));
    assert_eq!(
        refused.as_ref().map(|_| ()),
        Err(&VsockConnectError::Refused {
            cid: GUEST_CID,
            port: 1024
        }),
        "the guest's vsock driver answers a connect; log:\n{}",
        vm.console().log_string()
    );
    let log = vm.console().log_string();
    eprintln!(
        "probe kernel {}: banner {:.1} s, virtio_blk capacity {:.1} s, \"{RUN_INIT}\" {:.1} s \
         after boot(); DRIVER_OK seen by {:.1} s (blk), {:.1} s (rng), {:.1} s (vsock)",
        kernel.display(),
        banner.as_secs_f64(),
        blk.as_secs_f64(),
        init.as_secs_f64(),
        blk_ok.as_secs_f64(),
        rng_ok.as_secs_f64(),
        vsock_ok.as_secs_f64()
    );
    let cmdline = vm.boot_info().expect("booted").cmdline;
    for entry in [
        "virtio_mmio.device=4K@0xd0000000:5",
        "virtio_mmio.device=4K@0xd0001000:6",
        "virtio_mmio.device=4K@0xd0002000:7",
    ] {
        assert!(cmdline.contains(entry), "{entry} in {cmdline}");
    }
    assert!(
        log.contains("Kernel command line:") && log.contains("virtio_mmio.device=4K@0xd0000000:5"),
        "the kernel saw our command line: {log}"
    );
    // "Run /init" is printed only after the kernel found /init in the rootfs
    // unpacked from our cpio; the unpacker must not have complained either.
    assert!(
        !log.contains("Initramfs unpacking failed"),
        "initramfs unpacked: {log}"
    );
    vm.shutdown().expect("shutdown");
}
