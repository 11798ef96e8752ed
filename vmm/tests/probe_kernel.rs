//! Tier 5: the kernel-probe tests (DESIGN.md, "How we test").
//!
//! The minimal Linux kernel that `scripts/build-probe-kernel.sh` builds from
//! Debian's linux-source-6.1 boots on our VMM, and its own drivers probe our
//! devices before user space. Every assertion is on the console log or the
//! devices' registers. A boot takes about a minute here, so one boot serves
//! several assertions: the kernel finds our ACPI tables (no ACPI error) and,
//! through the DSDT alone (ACPI discovery: no `virtio_mmio.device=` words),
//! the virtio devices its own drivers probe; kvm-clock; the kernel's i8042
//! driver on our controller; the ACPI power button (the GED's `_EVT` runs)
//! and the ACPI power-off (a 172-byte static `/init` calls
//! `reboot(POWER_OFF)` once a line is typed on the console, and the kernel
//! writes S5 to our sleep control register). A second, shorter boot with two
//! vCPUs and `acpi=off` stops once the kernel has brought both up from the
//! MP table: the shared boot stays on one vCPU because a second one more
//! than doubles an emulated boot here (each vCPU competes for the same 2
//! host cores, and the AP's idle loop is emulated too).
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
use provium_vmm::netsetup::{MacAddr, Switch, SwitchConfig};
use provium_vmm::vmm_config::{
    DeviceDiscovery, DriveConfig, NetConfig, RngConfig, VirtioTransportKind,
};
use provium_vmm::{
    BootSource, KernelImage, PowerButton, StopReason, Vm, VmConfig, VmError, VmState,
};

/// The command line DESIGN.md gives for Linux guests on kvm_pvm (the CPU
/// features its emulator lacks, hidden from the kernel) plus the console.
const CMDLINE: &str = "console=ttyS0 noxsave nokaslr tsc=reliable \
     clearcpuid=308,141,151,145,158,288,298,306,291,296,156,293";
/// Generous: ~35 s to /init on an idle 2-core machine, CI may be slower.
/// `PROVIUM_PROBE_BOOT_WAIT_S` raises it on a machine shared with heavy
/// builds (at load 10 on 2 cores a boot had not reached virtio_blk in 600 s).
fn boot_wait() -> Duration {
    std::env::var("PROVIUM_PROBE_BOOT_WAIT_S")
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .map_or(Duration::from_secs(600), Duration::from_secs)
}
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

/// `/init`: a static x86_64 ELF that reads one line from its console (fd 0)
/// and then calls `reboot(LINUX_REBOOT_CMD_POWER_OFF)`, pausing forever if
/// that returns. User code runs natively on kvm_pvm, so this is all the
/// user space the probe needs to power the guest off through ACPI.
fn power_off_init() -> Vec<u8> {
    const BASE: u64 = 0x40_0000;
    const CODE_OFFSET: u64 = 64 + 56;
    #[rustfmt::skip]
    let code: [u8; 52] = [
        0x31, 0xc0,                         // 0: xor eax, eax      (read)
        0x31, 0xff,                         // 2: xor edi, edi      (fd 0)
        0x48, 0x8d, 0x74, 0x24, 0xf0,       // 4: lea rsi, [rsp-16]
        0xba, 0x01, 0x00, 0x00, 0x00,       // 9: mov edx, 1
        0x0f, 0x05,                         // 14: syscall
        0x48, 0x85, 0xc0,                   // 16: test rax, rax
        0x7e, 0xeb,                         // 19: jle 0            (retry)
        0xb8, 0xa9, 0x00, 0x00, 0x00,       // 21: mov eax, 169     (reboot)
        0xbf, 0xad, 0xde, 0xe1, 0xfe,       // 26: mov edi, LINUX_REBOOT_MAGIC1
        0xbe, 0x69, 0x19, 0x12, 0x28,       // 31: mov esi, LINUX_REBOOT_MAGIC2
        0xba, 0xdc, 0xfe, 0x21, 0x43,       // 36: mov edx, LINUX_REBOOT_CMD_POWER_OFF
        0x0f, 0x05,                         // 41: syscall
        0xb8, 0x22, 0x00, 0x00, 0x00,       // 43: mov eax, 34      (pause)
        0x0f, 0x05,                         // 48: syscall
        0xeb, 0xf7,                         // 50: jmp 43
    ];
    let size = CODE_OFFSET + code.len() as u64;
    let mut elf = Vec::new();
    elf.extend(b"\x7fELF\x02\x01\x01\x00");
    elf.extend([0u8; 8]);
    elf.extend(2u16.to_le_bytes()); // ET_EXEC
    elf.extend(0x3eu16.to_le_bytes()); // EM_X86_64
    elf.extend(1u32.to_le_bytes());
    elf.extend((BASE + CODE_OFFSET).to_le_bytes()); // e_entry
    elf.extend(64u64.to_le_bytes()); // e_phoff
    elf.extend(0u64.to_le_bytes()); // e_shoff
    elf.extend(0u32.to_le_bytes());
    for v in [64u16, 56, 1, 64, 0, 0] {
        elf.extend(v.to_le_bytes()); // ehsize, phentsize, phnum, shentsize, shnum, shstrndx
    }
    elf.extend(1u32.to_le_bytes()); // PT_LOAD
    elf.extend(5u32.to_le_bytes()); // R+X
    for v in [0, BASE, BASE, size, size, 0x1000u64] {
        elf.extend(v.to_le_bytes()); // offset, vaddr, paddr, filesz, memsz, align
    }
    assert_eq!(elf.len() as u64, CODE_OFFSET);
    elf.extend(code);
    elf
}

/// An uncompressed initrd (gunzip in an emulated kernel is slow) with
/// `/dev/console` and [`power_off_init`] as `/init`.
fn write_initrd(dir: &std::path::Path) -> PathBuf {
    let mut w = CpioWriter::new();
    w.dir("dev", 0o755).expect("dir");
    w.char_dev("dev/console", 0o600, 5, 1).expect("console");
    w.file("init", 0o755, &power_off_init()).expect("init");
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
    let wait = boot_wait();
    let left = wait.saturating_sub(t0.elapsed());
    assert!(
        c.wait_for(needle.as_bytes(), 1, left),
        "expected {needle:?} on the console within {wait:?}; log:\n{}",
        c.log_string()
    );
    t0.elapsed()
}

const DISK_SECTORS: u64 = 16384; // 8 MiB
const GUEST_CID: u64 = 42;
const GUEST_MAC: &str = "02:50:52:4f:42:45";
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
            t0.elapsed() < boot_wait(),
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
    // virtio-net (3) on a switch with a capture and a DHCP server port; the
    // kernel configures eth0 by DHCP before it runs /init.
    let lan = Switch::new("lan", SwitchConfig::default());
    let capture = lan.capture(test);
    let guest_mac: MacAddr = GUEST_MAC.parse().expect("mac");
    cfg.nets = vec![NetConfig::on_port(std::sync::Arc::new(
        lan.attach("probe", guest_mac).expect("attach guest"),
    ))];
    cfg.boot.cmdline.push_str(" ip=dhcp");
    // The kernel finds the virtio-mmio windows in the DSDT only.
    cfg.device_discovery = DeviceDiscovery::Acpi;
    let dhcp = dhcp::Server::start(lan.attach("dhcp", dhcp::SERVER_MAC).expect("attach dhcp"));
    cfg.protocol_version = 1;
    let Some(first) = new_vm(test, cfg.clone()) else {
        return;
    };
    let t0 = Instant::now();
    first.boot().expect("boot");
    let banner = wait_line(&first, "Linux version 6.1", t0);
    // Snapshot the kernel mid-boot, once a driver has probed its device,
    // and let the rest of the boot (more probes, "Run /init", vsock) happen
    // in a NEW VM restored from it: its console must continue and its
    // kernel keep running with the restored vCPU, irqchip, clock and
    // device state. The original is shut down first so the restored VM is
    // the only guest printing these lines.
    wait_line(&first, "virtio_blk virtio0", t0);
    first.pause().expect("pause");
    let snap = dir.path().join("probe.snap");
    let t_snap = Instant::now();
    let stats = first.snapshot(&snap).expect("snapshot of a booting kernel");
    let snap_s = t_snap.elapsed().as_secs_f64();
    let log_at_snapshot = first.console().log_string();
    assert!(
        !log_at_snapshot.contains(RUN_INIT),
        "snapshot taken before the end of boot, so what follows is printed by the restored VM"
    );
    // Where the first boot put things (a restored machine loaded nothing).
    let cmdline = first.boot_info().expect("booted").cmdline;
    first.shutdown().expect("shutdown the original");
    drop(first);
    let vm = new_vm(test, cfg).expect("KVM worked above");
    let t_restore = Instant::now();
    vm.restore(&snap).expect("restore into a new VM");
    let restore_s = t_restore.elapsed().as_secs_f64();
    assert!(
        vm.console().log_string().starts_with(&log_at_snapshot),
        "the restored console starts with the snapshot's log"
    );
    eprintln!(
        "probe kernel snapshot: {} bytes for 256 MiB of RAM in {snap_s:.2} s, restore {restore_s:.3} s",
        stats.file_bytes
    );
    let blk = wait_line(
        &vm,
        &format!("virtio_blk virtio0: [vda] {DISK_SECTORS} 512-byte logical blocks"),
        t0,
    );
    let init = wait_line(&vm, RUN_INIT, t0);
    // Each driver probed its device and started it (DRIVER_OK): virtio-blk
    // (0), virtio-rng (1; hw_random reads it at registration), vsock (2),
    // virtio-net (3).
    let blk_ok = wait_driver_ok(&vm, 0, "virtio-blk", t0);
    let rng_ok = wait_driver_ok(&vm, 1, "virtio-rng", t0);
    let vsock_ok = wait_driver_ok(&vm, 2, "virtio-vsock", t0);
    let net_ok = wait_driver_ok(&vm, 3, "virtio-net", t0);
    // DHCP through our virtio-net and switch: the kernel got its lease
    // before /init ("IP-Config: Complete" precedes "Run /init").
    let dhcp_done = wait_line(&vm, "IP-Config: Complete", t0);
    let log = vm.console().log_string();
    assert!(
        log.contains(&format!("hwaddr={GUEST_MAC}"))
            && log.contains(&format!("ipaddr={}", dhcp::CLIENT_IP_TEXT)),
        "eth0 has our MAC and the leased address: {log}"
    );
    let seen = dhcp.stop();
    assert_eq!(
        (seen.discovers >= 1, seen.requests >= 1),
        (true, true),
        "the server saw DHCPDISCOVER and DHCPREQUEST: {seen:?}"
    );
    // The switch's capture holds the guest's DHCP frames: from our MAC, UDP
    // 68 -> 67, BOOTP requests whose client hardware address is our MAC.
    let frames = pcap_frames(&capture.read_available());
    let from_guest: Vec<&Vec<u8>> = frames
        .iter()
        .filter(|f| f.get(6..12) == Some(&guest_mac.0[..]))
        .collect();
    let bootp_requests = from_guest
        .iter()
        .filter(|f| dhcp::bootp_request(f).is_some_and(|b| b.chaddr == guest_mac.0))
        .count();
    assert!(
        bootp_requests >= 2,
        "DHCP requests from {GUEST_MAC} in the capture: {bootp_requests} of {} frames ({} from the guest)",
        frames.len(),
        from_guest.len()
    );
    // The guest kernel's vsock transport answers: nothing listens on the
    // port (no user space here), so it refuses with RST.
    // Exits spent on one vsock exchange (the host's request in, the
    // guest's RST out): the transports' cost per I/O, printed for docs/vmm.md.
    let before = vm.bus_accesses().expect("booted");
    let refused = vsock.connect(1024, Duration::from_secs(60));
    let after = vm.bus_accesses().expect("booted");
    let boot_exits = before;
    eprintln!(
        "{test}: one vsock connect+RST cost {} MMIO-bus and {} PIO-bus exits; the restored \
         boot until then {} MMIO and {} PIO",
        after.1 - before.1,
        after.0 - before.0,
        boot_exits.1,
        boot_exits.0
    );
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
    // The kernel found our ACPI tables where it looks (the BIOS area and
    // boot_params.acpi_rsdp_addr), took the CPUs from the MADT, ran our
    // AML without complaint and bound the platform devices of the DSDT.
    for line in [
        "ACPI: RSDP 0x00000000000E0000 000024 (v02 PRVIUM)",
        "ACPI: XSDT 0x00000000000E0030",
        "ACPI: FACP 0x",
        "ACPI: DSDT 0x",
        "ACPI: APIC 0x",
        "ACPI: Using ACPI (MADT) for SMP configuration information",
        "ACPI: 1 ACPI AML tables successfully acquired and loaded",
        "ACPI: Interpreter enabled",
        "ACPI: PM: (supports S0 S5)",
        "input: Power Button as /devices/LNXSYSTM:00/LNXSYBUS:00/PNP0C0C:00/input/input0",
        "ACPI: button: Power Button [PWRB]",
        "i8042: PNP: PS/2 Controller [PNP0303:PS2K] at 0x60,0x64",
        "system 00:02: [io  0x0600-0x0601] has been reserved",
    ] {
        assert!(log.contains(line), "{line:?} in the log:\n{log}");
    }
    for bad in [
        "ACPI BIOS Error",
        "ACPI Error",
        "ACPI Warning",
        "can't request region",
        "virtio-mmio: Registering device",
    ] {
        assert!(!log.contains(bad), "{bad:?} in the log:\n{log}");
    }
    // kvm-clock: the KVM paravirt CPUID leaves are visible and the kernel
    // took its clock from MSR_KVM_SYSTEM_TIME_NEW (with tsc=reliable it
    // moves on to the TSC once that registers: kvm-clock rates itself below
    // an invariant TSC).
    for line in [
        "Hypervisor detected: KVM",
        "kvm-clock: Using msrs 4b564d01 and 4b564d00",
        "clocksource: Switched to clocksource kvm-clock",
    ] {
        assert!(log.contains(line), "{line:?} in the log:\n{log}");
    }
    // The kernel's i8042 driver found our controller (command byte,
    // self-test and AUX checks answered) and registered its keyboard port
    // (the IRQ it prints is its own number for GSI 1: a hardware-reduced
    // ACPI machine has no legacy PIC, so ISA IRQs are not identity-mapped).
    assert!(
        log.contains("serio: i8042 KBD port at 0x60,0x64 irq "),
        "i8042 found: {log}"
    );
    eprintln!(
        "probe kernel {}: banner {:.1} s, virtio_blk capacity {:.1} s, \"{RUN_INIT}\" {:.1} s \
         after boot(); DRIVER_OK seen by {:.1} s (blk), {:.1} s (rng), {:.1} s (vsock), \
         {:.1} s (net); DHCP complete {:.1} s",
        kernel.display(),
        banner.as_secs_f64(),
        blk.as_secs_f64(),
        init.as_secs_f64(),
        blk_ok.as_secs_f64(),
        rng_ok.as_secs_f64(),
        vsock_ok.as_secs_f64(),
        net_ok.as_secs_f64(),
        dhcp_done.as_secs_f64()
    );
    assert!(
        !cmdline.contains("virtio_mmio.device="),
        "ACPI discovery announces nothing on the command line: {cmdline}"
    );
    // "Run /init" is printed only after the kernel found /init in the rootfs
    // unpacked from our cpio; the unpacker must not have complained either.
    assert!(
        !log.contains("Initramfs unpacking failed"),
        "initramfs unpacked: {log}"
    );
    // The power button: the guest's GED driver took GSI 23, so the press is
    // an ACPI event, and the guest's `_EVT` read (and so cleared) the GED's
    // event register: our AML ran and notified \_SB.PWRB.
    assert_eq!(
        vm.power_button().expect("press"),
        PowerButton::Acpi,
        "the guest handles ACPI events; log:\n{}",
        vm.console().log_string()
    );
    let t_press = Instant::now();
    while vm.acpi_events_pending() != Some(0) {
        assert!(
            t_press.elapsed() < boot_wait(),
            "the guest never ran the GED's _EVT (event still pending); log:\n{}",
            vm.console().log_string()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // Power-off through ACPI: /init reads this line, calls
    // reboot(POWER_OFF), and the kernel writes SLP_TYP=S5|SLP_EN to the
    // FADT's sleep control register.
    vm.console().write_input(b"off\n").expect("console input");
    let state = vm.wait_for_state(VmState::Shutdown, boot_wait());
    assert_eq!(
        (state, vm.stop_reason()),
        (VmState::Shutdown, Some(StopReason::GuestPowerOff)),
        "the guest powered off through ACPI; log:\n{}",
        vm.console().log_string()
    );
    vm.shutdown().expect("shutdown");
}

/// The same devices over virtio-pci: no `virtio_mmio.device=` words, the
/// kernel finds the bus through ports 0xCF8/0xCFC (no ACPI here), and its
/// virtio_pci driver binds blk, rng, vsock and net with MSI-X vectors. The
/// kernel is snapshotted once virtio-blk probed and the rest of the boot
/// (block I/O for the partition scan, DHCP over virtio-net, a vsock
/// connect) runs in a new VM restored from it: the restored MSI-X table
/// and routes must deliver its interrupts. Once every device is active, a
/// second snapshot is restored into a third VM, whose vsock driver must
/// still answer.
#[test]
fn probe_kernel_probes_devices_over_virtio_pci() {
    let test = "probe_kernel_probes_devices_over_virtio_pci";
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
        cmdline: format!("{CMDLINE} ip=dhcp"),
    });
    cfg.transport = VirtioTransportKind::Pci;
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
    let lan = Switch::new("lan-pci", SwitchConfig::default());
    let guest_mac: MacAddr = GUEST_MAC.parse().expect("mac");
    cfg.nets = vec![NetConfig::on_port(std::sync::Arc::new(
        lan.attach("probe", guest_mac).expect("attach guest"),
    ))];
    let dhcp = dhcp::Server::start(lan.attach("dhcp", dhcp::SERVER_MAC).expect("attach dhcp"));
    cfg.protocol_version = 1;
    let Some(first) = new_vm(test, cfg.clone()) else {
        return;
    };
    let t0 = Instant::now();
    first.boot().expect("boot");
    let cmdline = first.boot_info().expect("booted").cmdline;
    assert!(
        !cmdline.contains("virtio_mmio"),
        "no virtio-mmio words over pci: {cmdline}"
    );
    wait_line(&first, "virtio_blk virtio0", t0);
    first.pause().expect("pause");
    let snap = dir.path().join("probe-pci.snap");
    first
        .snapshot(&snap)
        .expect("snapshot of a booting kernel over pci");
    let log_at_snapshot = first.console().log_string();
    first.shutdown().expect("shutdown the original");
    drop(first);
    let cfg_again = cfg.clone();
    let vm = new_vm(test, cfg).expect("KVM worked above");
    vm.restore(&snap).expect("restore into a new VM");
    assert!(vm.console().log_string().starts_with(&log_at_snapshot));
    let blk = wait_line(
        &vm,
        &format!("virtio_blk virtio0: [vda] {DISK_SECTORS} 512-byte logical blocks"),
        t0,
    );
    let init = wait_line(&vm, RUN_INIT, t0);
    wait_driver_ok(&vm, 0, "virtio-blk over pci", t0);
    wait_driver_ok(&vm, 1, "virtio-rng over pci", t0);
    wait_driver_ok(&vm, 2, "virtio-vsock over pci", t0);
    wait_driver_ok(&vm, 3, "virtio-net over pci", t0);
    let dhcp_done = wait_line(&vm, "IP-Config: Complete", t0);
    let seen = dhcp.stop();
    assert!(
        seen.discovers >= 1 && seen.requests >= 1,
        "DHCP over virtio-net on pci: {seen:?}"
    );
    // A second snapshot with every device activated and its MSI-X vectors
    // programmed, restored into a third VM: the vsock exchange below runs
    // on the restored table, routes and queue vectors.
    let restored_boot = vm.bus_accesses().expect("booted");
    vm.pause().expect("pause");
    let snap2 = dir.path().join("probe-pci-2.snap");
    vm.snapshot(&snap2)
        .expect("snapshot of a booted kernel over pci");
    vm.shutdown().expect("shutdown the restored VM");
    drop(vm);
    let vm = new_vm(test, cfg_again).expect("KVM worked above");
    vm.restore(&snap2)
        .expect("restore of every activated virtio-pci device");
    // Exits spent on one vsock exchange (the host's request in, the
    // guest's RST out): the transports' cost per I/O, printed for docs/vmm.md.
    let before = vm.bus_accesses().expect("booted");
    let refused = vsock.connect(1024, Duration::from_secs(60));
    let after = vm.bus_accesses().expect("booted");
    eprintln!(
        "{test}: one vsock connect+RST cost {} MMIO-bus and {} PIO-bus exits (on the second \
         restore); the first restored boot until \"Run /init\" {} MMIO and {} PIO",
        after.1 - before.1,
        after.0 - before.0,
        restored_boot.1,
        restored_boot.0
    );
    assert_eq!(
        refused.as_ref().map(|_| ()),
        Err(&VsockConnectError::Refused {
            cid: GUEST_CID,
            port: 1024
        }),
        "the guest's vsock driver answers over pci; log:\n{}",
        vm.console().log_string()
    );
    let log = vm.console().log_string();
    for line in [
        // Found through the DSDT's PCI0 and configured through the MCFG's
        // ECAM (a kernel without ACPI would print "PCI: Probing PCI hardware"
        // and use 0xCF8/0xCFC instead).
        "ACPI: PCI Root Bridge [PCI0] (domain 0000 [bus 00])",
        "PCI: MMCONFIG at [mem 0xe0000000-0xe00fffff] reserved in ACPI motherboard resources",
        "pci 0000:00:00.0: [8086:0d57] type 00 class 0x060000",
        "pci 0000:00:01.0: [1af4:1042] type 00 class 0x018000",
        "pci 0000:00:02.0: [1af4:1044]",
        "pci 0000:00:03.0: [1af4:1053]",
        "pci 0000:00:04.0: [1af4:1041] type 00 class 0x020000",
    ] {
        assert!(log.contains(line), "{line:?} in the log:\n{log}");
    }
    let counters = vm.pci_counters().expect("a PCI root");
    eprintln!(
        "probe kernel over virtio-pci {}: virtio_blk capacity {:.1} s, \"{RUN_INIT}\" {:.1} s \
         after boot() (snapshot and restore included); DHCP complete {:.1} s; refused PCI \
         accesses {counters:?}",
        kernel.display(),
        blk.as_secs_f64(),
        init.as_secs_f64(),
        dhcp_done.as_secs_f64()
    );
    vm.shutdown().expect("shutdown");
}

/// The frames of a pcap stream (`provium_netsetup::pcap`'s format: native
/// little-endian, 24-byte global header, 16-byte record headers).
fn pcap_frames(pcap: &[u8]) -> Vec<Vec<u8>> {
    assert_eq!(
        pcap.get(..4),
        Some(&0xa1b2_c3d4u32.to_le_bytes()[..]),
        "pcap magic"
    );
    let mut out = Vec::new();
    let mut at = 24;
    while let Some(h) = pcap.get(at..at + 16) {
        let incl = u32::from_le_bytes([h[8], h[9], h[10], h[11]]) as usize;
        let frame = pcap.get(at + 16..at + 16 + incl).expect("a whole record");
        out.push(frame.to_vec());
        at += 16 + incl;
    }
    out
}

/// A DHCP server just big enough for Linux's `ip=dhcp` (net/ipv4/ipconfig.c):
/// it answers DISCOVER with OFFER and REQUEST with ACK for one fixed lease.
/// The kernel checks the IPv4 header checksum, UDP ports 67 -> 68, the xid and
/// the client hardware address; the UDP checksum may be 0.
mod dhcp {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    use std::thread::JoinHandle;
    use std::time::Duration;

    use provium_vmm::netsetup::{MacAddr, Port};

    pub const SERVER_MAC: MacAddr = MacAddr([0x02, 0x44, 0x48, 0x43, 0x50, 0x01]);
    const SERVER_IP: [u8; 4] = [10, 0, 2, 2];
    const CLIENT_IP: [u8; 4] = [10, 0, 2, 15];
    pub const CLIENT_IP_TEXT: &str = "10.0.2.15";
    const ETH: usize = 14;
    const IP: usize = 20;
    const UDP: usize = 8;
    /// op .. file: the fixed BOOTP part before the magic cookie.
    const BOOTP_FIXED: usize = 236;
    const COOKIE: [u8; 4] = [99, 130, 83, 99];

    /// What a BOOTP request carried.
    pub struct Bootp {
        pub xid: [u8; 4],
        pub chaddr: [u8; 6],
        /// DHCP message type (option 53), 0 when absent.
        pub msg_type: u8,
    }

    /// `f` parsed as an Ethernet/IPv4/UDP 68->67 BOOTP request (op 1).
    pub fn bootp_request(f: &[u8]) -> Option<Bootp> {
        if f.get(12..14)? != [0x08, 0x00] || f.get(ETH)? & 0xf0 != 0x40 {
            return None;
        }
        let ihl = usize::from(f[ETH] & 0x0f) * 4;
        if *f.get(ETH + 9)? != 17 {
            return None;
        }
        let udp = ETH + ihl;
        if f.get(udp..udp + 4)? != [0, 68, 0, 67] {
            return None;
        }
        let b = f.get(udp + UDP..)?;
        if *b.first()? != 1 {
            return None;
        }
        let mut msg_type = 0;
        if b.get(BOOTP_FIXED..BOOTP_FIXED + 4)? == COOKIE {
            let mut o = BOOTP_FIXED + 4;
            while let Some(&code) = b.get(o) {
                match code {
                    0 => o += 1,
                    255 => break,
                    _ => {
                        let len = usize::from(*b.get(o + 1)?);
                        if code == 53 {
                            msg_type = *b.get(o + 2)?;
                        }
                        o += 2 + len;
                    }
                }
            }
        }
        Some(Bootp {
            xid: b.get(4..8)?.try_into().ok()?,
            chaddr: b.get(28..34)?.try_into().ok()?,
            msg_type,
        })
    }

    fn checksum(bytes: &[u8]) -> u16 {
        let mut sum: u32 = 0;
        for c in bytes.chunks(2) {
            sum += u32::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)]));
        }
        while sum > 0xffff {
            sum = (sum & 0xffff) + (sum >> 16);
        }
        !(sum as u16)
    }

    /// The OFFER (2) or ACK (5) for `req`, to its MAC and the broadcast IP.
    fn reply(req: &Bootp, msg_type: u8) -> Vec<u8> {
        let mut bootp = vec![0u8; BOOTP_FIXED];
        bootp[0] = 2; // BOOTREPLY
        bootp[1] = 1; // Ethernet
        bootp[2] = 6;
        bootp[4..8].copy_from_slice(&req.xid);
        bootp[16..20].copy_from_slice(&CLIENT_IP);
        bootp[20..24].copy_from_slice(&SERVER_IP);
        bootp[28..34].copy_from_slice(&req.chaddr);
        bootp.extend_from_slice(&COOKIE);
        bootp.extend_from_slice(&[53, 1, msg_type]);
        bootp.extend_from_slice(&[54, 4]);
        bootp.extend_from_slice(&SERVER_IP);
        bootp.extend_from_slice(&[51, 4, 0, 0, 0x0e, 0x10]); // 1 h lease
        bootp.extend_from_slice(&[1, 4, 255, 255, 255, 0]);
        bootp.extend_from_slice(&[3, 4]);
        bootp.extend_from_slice(&SERVER_IP);
        bootp.push(255);
        bootp.resize(300, 0);
        let udp_len = UDP + bootp.len();
        let total = IP + udp_len;
        let mut f = Vec::with_capacity(ETH + total);
        f.extend_from_slice(&req.chaddr);
        f.extend_from_slice(&SERVER_MAC.0);
        f.extend_from_slice(&[0x08, 0x00]);
        let mut ip = [0u8; IP];
        ip[0] = 0x45;
        ip[2..4].copy_from_slice(&(total as u16).to_be_bytes());
        ip[8] = 64; // TTL
        ip[9] = 17; // UDP
        ip[12..16].copy_from_slice(&SERVER_IP);
        ip[16..20].copy_from_slice(&[255; 4]);
        let c = checksum(&ip);
        ip[10..12].copy_from_slice(&c.to_be_bytes());
        f.extend_from_slice(&ip);
        f.extend_from_slice(&[0, 67, 0, 68]);
        f.extend_from_slice(&(udp_len as u16).to_be_bytes());
        f.extend_from_slice(&[0, 0]); // no UDP checksum
        f.extend_from_slice(&bootp);
        f
    }

    /// Requests answered.
    #[derive(Debug, Default, Clone, Copy)]
    pub struct Seen {
        pub discovers: u32,
        pub requests: u32,
    }

    pub struct Server {
        stop: Arc<AtomicBool>,
        thread: JoinHandle<Seen>,
    }

    impl Server {
        pub fn start(port: Port) -> Server {
            let stop = Arc::new(AtomicBool::new(false));
            let s = stop.clone();
            let thread = std::thread::spawn(move || {
                let mut seen = Seen::default();
                while !s.load(Ordering::SeqCst) {
                    let Some(f) = port.recv_timeout(Duration::from_millis(100)) else {
                        continue;
                    };
                    let Some(req) = bootp_request(&f) else {
                        continue;
                    };
                    let answer = match req.msg_type {
                        1 => {
                            seen.discovers += 1;
                            2
                        }
                        3 => {
                            seen.requests += 1;
                            5
                        }
                        _ => continue,
                    };
                    port.send(&reply(&req, answer))
                        .expect("the switch takes the reply");
                }
                seen
            });
            Server { stop, thread }
        }

        /// Stops the server; what it answered.
        pub fn stop(self) -> Seen {
            self.stop.store(true, Ordering::SeqCst);
            self.thread.join().expect("dhcp server thread")
        }
    }
}

/// The SMP boot: the kernel must find both vCPUs in the MP table and start the second.
const SMP_VCPUS: u8 = 2;

/// Two vCPUs: the kernel finds both in our MP table (`acpi=off`: the MP
/// table is what a kernel without ACPI reads; the shared boot covers the
/// MADT) and
/// brings the second up with INIT/SIPI through the in-kernel LAPIC. This
/// needs the minimal CPU template's hiding of KVM's vmcall-driven PV
/// features (vmcall hangs on kvm_pvm, and the kernel stalled at bring-up
/// with PV IPIs on). The boot stops there: the rest is the shared boot's.
#[test]
fn probe_kernel_brings_up_two_vcpus_from_the_mp_table() {
    let test = "probe_kernel_brings_up_two_vcpus_from_the_mp_table";
    let Some(kernel) = probe_kernel(test) else {
        return;
    };
    let mut cfg = VmConfig::new(BootSource {
        kernel: KernelImage::Path(kernel),
        initrd: None,
        cmdline: format!("{CMDLINE} acpi=off"),
    });
    cfg.machine.mem_size_mib = 256;
    cfg.machine.vcpu_count = SMP_VCPUS;
    let Some(vm) = new_vm(test, cfg) else {
        return;
    };
    let t0 = Instant::now();
    vm.boot().expect("boot");
    let up = wait_line(&vm, "smp: Brought up 1 node, 2 CPUs", t0);
    let log = vm.console().log_string();
    for line in [
        "Intel MultiProcessor Specification v1.4",
        "MPTABLE: OEM ID: PROVIUM",
        "Processor #0 (Bootup-CPU)",
        "Processor #1",
        "IOAPIC[0]: apic_id 2, version 17, address 0xfec00000, GSI 0-23",
        "Processors: 2",
        "smpboot: Allowing 2 CPUs, 0 hotplug CPUs",
    ] {
        assert!(log.contains(line), "{line:?} in the log:\n{log}");
    }
    eprintln!(
        "probe kernel with {SMP_VCPUS} vCPUs: both up {:.1} s after boot()",
        up.as_secs_f64()
    );
    vm.shutdown().expect("shutdown");
}
