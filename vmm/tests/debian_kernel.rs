//! Debian 12's stock kernel (`scripts/fetch-debian-kernel.sh`, its
//! extracted `vmlinux`) on our VMM: it finds and parses our ACPI tables
//! with no ACPI error and gets as far as ACPI device enumeration (on
//! kvm_pvm it then stops at an `ldmxcsr` the emulator lacks, after the line
//! this test waits for). Its
//! virtio drivers are modules, so it binds none of our virtio devices
//! without a module-loading initrd; this test is about the firmware side
//! (docs/vmm.md, "ACPI", "A stock kernel").
//!
//! On kvm_pvm its CPL0 code is emulated: it needs the kvm_pvm command-line
//! words and the VMM's int3/fwait fixups (`vstate::emulation_fixup`) to get
//! past `int3_selftest`.
//!
//! The test calls the fetch script (about 70 MB from Debian's archive once,
//! then cached under target/debian-kernel/). Where it cannot fetch (no apt,
//! no network) the test fails saying so; `PROVIUM_SKIP_DEBIAN_KERNEL=1`
//! turns that into a printed skip, as does `PROVIUM_SKIP_KVM=1` without KVM.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use provium_vmm::vmm_config::DeviceDiscovery;
use provium_vmm::{BootSource, KernelImage, Vm, VmConfig, VmError};

const CMDLINE: &str = "console=ttyS0 noxsave nokaslr tsc=reliable \
     clearcpuid=308,141,151,145,158,288,298,306,291,296,156,293";
/// The line that says the kernel enumerated the DSDT's devices.
const ENUMERATED: &str = "pnp: PnP ACPI: found";

fn env_is_1(name: &str) -> bool {
    std::env::var_os(name).is_some_and(|v| v == "1")
}

fn wait() -> Duration {
    std::env::var("PROVIUM_PROBE_BOOT_WAIT_S")
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .map_or(Duration::from_secs(600), Duration::from_secs)
}

/// The fetched kernel's vmlinux, or `None` after printing why the test skips.
fn debian_vmlinux(test: &str) -> Option<PathBuf> {
    let script =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../scripts/fetch-debian-kernel.sh");
    let out = std::process::Command::new("bash").arg(&script).output();
    let why = match out {
        Ok(o) if o.status.success() => {
            let root = String::from_utf8_lossy(&o.stdout).trim().to_string();
            let vmlinux = PathBuf::from(root).join("vmlinux");
            if vmlinux.is_file() {
                return Some(vmlinux);
            }
            format!("{} printed no root with a vmlinux", script.display())
        }
        Ok(o) => format!(
            "{} failed: {}",
            script.display(),
            String::from_utf8_lossy(&o.stderr).trim()
        ),
        Err(e) => format!("cannot run {}: {e}", script.display()),
    };
    if env_is_1("PROVIUM_SKIP_DEBIAN_KERNEL") {
        eprintln!("SKIP {test}: {why} (PROVIUM_SKIP_DEBIAN_KERNEL=1)");
        return None;
    }
    panic!("{test}: {why}; set PROVIUM_SKIP_DEBIAN_KERNEL=1 to skip this test");
}

#[test]
fn debian_stock_kernel_parses_our_acpi_tables_and_enumerates_devices() {
    let test = "debian_stock_kernel_parses_our_acpi_tables_and_enumerates_devices";
    let Some(vmlinux) = debian_vmlinux(test) else {
        return;
    };
    let mut cfg = VmConfig::new(BootSource {
        kernel: KernelImage::Path(vmlinux),
        initrd: None,
        cmdline: CMDLINE.to_string(),
    });
    cfg.machine.mem_size_mib = 256;
    cfg.device_discovery = DeviceDiscovery::Acpi;
    let vm = match Vm::new(cfg) {
        Ok(vm) => vm,
        Err(e @ VmError::Kvm(_)) if env_is_1("PROVIUM_SKIP_KVM") => {
            eprintln!("SKIP {test}: {e} (PROVIUM_SKIP_KVM=1)");
            return;
        }
        Err(e) => panic!("{test}: {e}: needs /dev/kvm; PROVIUM_SKIP_KVM=1 skips"),
    };
    let t0 = Instant::now();
    vm.boot().expect("boot");
    let found = vm.console().wait_for(ENUMERATED.as_bytes(), 1, wait());
    let log = vm.console().log_string();
    assert!(
        found,
        "{ENUMERATED:?} within {:?} (state {}, reason {:?}); log:\n{log}",
        wait(),
        vm.state(),
        vm.stop_reason().map(|r| r.to_string())
    );
    eprintln!(
        "debian kernel: {ENUMERATED:?} {:.1} s after boot()",
        t0.elapsed().as_secs_f64()
    );
    for line in [
        "ACPI: RSDP 0x00000000000E0000 000024 (v02 PRVIUM)",
        "ACPI: DSDT 0x",
        "ACPI: Interpreter enabled",
        "ACPI: PM: (supports S0 S5)",
    ] {
        assert!(log.contains(line), "{line:?} in the log:\n{log}");
    }
    for bad in [
        "ACPI BIOS Error",
        "ACPI Error",
        "A valid RSDP was not found",
    ] {
        assert!(!log.contains(bad), "{bad:?} in the log:\n{log}");
    }
    vm.shutdown().expect("shutdown");
}
