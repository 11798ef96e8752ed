//! Tier 4: the tiny guest boots on our VMM under this machine's KVM.
//!
//! These tests need a usable /dev/kvm and fail loudly without one (CI runs on
//! machines that have it). On a machine without KVM, set `PROVIUM_SKIP_KVM=1`:
//! each test then prints why it skipped and passes.
//!
//! Nothing here asserts timings: waits poll the console or guest memory against
//! generous deadlines (the guest's kernel-mode code is emulated on kvm_pvm).

use std::time::{Duration, Instant};

use provium_vmm::tiny_guest::{self, BANNER, CMD_POWER_OFF, CMD_RESET, COUNTER_GPA, READY};
use provium_vmm::vmm_config::DriveConfig;
use provium_vmm::{
    BootSource, ConsoleRead, KernelImage, StopReason, Vm, VmConfig, VmError, VmState,
};

const WAIT: Duration = Duration::from_secs(60);
const CMDLINE: &str = "console=ttyS0 provium.test=tiny-guest-42";

/// A VM running the tiny guest, or `None` (after printing why) when
/// `PROVIUM_SKIP_KVM=1` and KVM is unusable.
fn tiny_vm(test: &str) -> Option<Vm> {
    tiny_vm_with(test, 1)
}

fn tiny_vm_with(test: &str, vcpus: u8) -> Option<Vm> {
    tiny_vm_cfg(test, vcpus, Vec::new())
}

fn tiny_vm_cfg(test: &str, vcpus: u8, drives: Vec<DriveConfig>) -> Option<Vm> {
    let mut cfg = VmConfig::new(BootSource {
        kernel: KernelImage::Bytes(tiny_guest::BZIMAGE.into()),
        initrd: None,
        cmdline: CMDLINE.to_string(),
    });
    cfg.machine.mem_size_mib = 32;
    cfg.machine.vcpu_count = vcpus;
    cfg.drives = drives;
    match Vm::new(cfg) {
        Ok(vm) => Some(vm),
        Err(e @ VmError::Kvm(_)) if std::env::var_os("PROVIUM_SKIP_KVM").is_some_and(|v| v == "1") => {
            eprintln!("SKIP {test}: {} (PROVIUM_SKIP_KVM=1)", chain(&e));
            None
        }
        Err(e) => panic!(
            "{test}: {} — these tests need /dev/kvm; set PROVIUM_SKIP_KVM=1 on a machine without it",
            chain(&e)
        ),
    }
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

fn wait_console(vm: &Vm, needle: &str, count: usize) {
    let c = vm.console();
    assert!(
        c.wait_for(needle.as_bytes(), count, WAIT),
        "expected {needle:?} x{count} on the console within {WAIT:?}; log:\n{}",
        c.log_string()
    );
}

fn boot_ready(vm: &Vm) {
    vm.boot().expect("boot");
    assert_eq!(vm.state(), VmState::Booted);
    wait_console(vm, READY, 1);
}

/// Polls `f` until it returns true or the deadline passes.
fn wait_until(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + WAIT;
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn boots_and_reports_boot_params() {
    let Some(vm) = tiny_vm("boots_and_reports_boot_params") else {
        return;
    };
    boot_ready(&vm);
    let log = vm.console().log_string();
    eprintln!("console:\n{log}");
    assert!(log.contains(BANNER), "{log}");
    assert!(
        log.contains(&format!("cmdline={CMDLINE}\n")),
        "cmdline read through boot_params: {log}"
    );
    // 32 MiB: [0, EBDA) and [1 MiB, 32 MiB).
    assert!(log.contains("e820=02"), "two e820 entries: {log}");
    assert!(log.contains("initrd=00000000+00000000"), "no initrd: {log}");
    assert!(
        log.contains("mmio0=ffffffff/ffffffff"),
        "no virtio device, MMIO floats: {log}"
    );
    let info = vm.boot_info().expect("booted");
    assert_eq!(
        info.entry_gpa,
        tiny_guest::LOAD_ADDR + tiny_guest::STARTUP_64_OFFSET
    );
    vm.shutdown().expect("shutdown");
    assert_eq!(vm.state(), VmState::Shutdown);
    assert_eq!(vm.stop_reason(), Some(StopReason::HostShutdown));
}

#[test]
fn console_input_is_echoed() {
    let Some(vm) = tiny_vm("console_input_is_echoed") else {
        return;
    };
    let c = vm.console();
    let sub = c.subscribe();
    boot_ready(&vm);
    let msg = "hello-from-host-0123456789-abcdefghijklmnopqrstuvwxyz-0123456789-more-than-a-fifo";
    assert!(msg.len() > 64);
    c.write_input(msg.as_bytes()).expect("input queued");
    wait_console(&vm, msg, 1);
    // The live stream saw the same bytes.
    let mut seen = Vec::new();
    let deadline = Instant::now() + WAIT;
    while !String::from_utf8_lossy(&seen).contains(msg) {
        assert!(Instant::now() < deadline, "stream missed the echo");
        if let ConsoleRead::Data(d) = sub.read_timeout(Duration::from_millis(100)) {
            seen.extend(d);
        }
    }
    assert!(String::from_utf8_lossy(&seen).contains(BANNER));
}

#[test]
fn pause_stops_the_guest_and_resume_restarts_it() {
    let Some(vm) = tiny_vm("pause_stops_the_guest_and_resume_restarts_it") else {
        return;
    };
    boot_ready(&vm);
    let c0 = vm.read_guest_u64(COUNTER_GPA).expect("counter");
    wait_until("the counter to move", || {
        vm.read_guest_u64(COUNTER_GPA).expect("counter") > c0
    });

    vm.pause().expect("pause");
    assert_eq!(vm.state(), VmState::Paused);
    let a = vm.read_guest_u64(COUNTER_GPA).expect("counter");
    // Input typed while paused is not echoed until resume.
    vm.console().write_input(b"Z").expect("queued");
    let log_len = vm.console().log().len();
    // Give a running guest ample opportunity to move the counter (it moves
    // thousands of times per second when running), then check it did not.
    for _ in 0..20 {
        std::thread::sleep(Duration::from_millis(10));
        assert_eq!(
            vm.read_guest_u64(COUNTER_GPA).expect("counter"),
            a,
            "counter moved while paused"
        );
    }
    assert_eq!(
        vm.console().log().len(),
        log_len,
        "guest wrote while paused"
    );

    let e = vm.pause().expect_err("pausing twice is an error");
    assert!(e.to_string().contains("VM is paused; use resume()"), "{e}");
    let e = vm.reset().expect_err("reset needs Booted");
    assert!(matches!(
        e,
        VmError::WrongState {
            state: VmState::Paused,
            ..
        }
    ));

    vm.resume().expect("resume");
    assert_eq!(vm.state(), VmState::Booted);
    wait_until("the counter to move after resume", || {
        vm.read_guest_u64(COUNTER_GPA).expect("counter") > a
    });
    wait_console(&vm, "Z", 1);
    let e = vm.resume().expect_err("resume needs Paused");
    assert!(matches!(
        e,
        VmError::WrongState {
            state: VmState::Booted,
            ..
        }
    ));
}

#[test]
fn guest_reset_through_i8042_reboots() {
    let Some(vm) = tiny_vm("guest_reset_through_i8042_reboots") else {
        return;
    };
    boot_ready(&vm);
    assert_eq!(vm.boot_count(), 1);
    vm.console().write_input(&[CMD_RESET]).expect("queued");
    wait_console(&vm, BANNER, 2);
    wait_console(&vm, READY, 2);
    assert_eq!(vm.boot_count(), 2);
    assert_eq!(vm.state(), VmState::Booted);
    // The new boot is live: it echoes.
    vm.console().write_input(b"after-reset").expect("queued");
    wait_console(&vm, "after-reset", 1);
}

#[test]
fn host_reset_reboots() {
    let Some(vm) = tiny_vm("host_reset_reboots") else {
        return;
    };
    boot_ready(&vm);
    vm.reset().expect("reset");
    assert_eq!(vm.state(), VmState::Booted);
    wait_console(&vm, READY, 2);
    assert_eq!(vm.boot_count(), 2);
}

#[test]
fn guest_power_off_shuts_down() {
    let Some(vm) = tiny_vm("guest_power_off_shuts_down") else {
        return;
    };
    boot_ready(&vm);
    vm.console().write_input(&[CMD_POWER_OFF]).expect("queued");
    assert_eq!(
        vm.wait_for_state(VmState::Shutdown, WAIT),
        VmState::Shutdown
    );
    assert_eq!(vm.stop_reason(), Some(StopReason::GuestPowerOff));
    let e = vm.boot().expect_err("no boot after shutdown");
    assert!(
        e.to_string().contains("VM is shutdown; create a new one"),
        "{e}"
    );
    vm.shutdown().expect("shutdown is idempotent");
}

#[test]
fn lifecycle_errors_before_boot() {
    let Some(vm) = tiny_vm("lifecycle_errors_before_boot") else {
        return;
    };
    assert_eq!(vm.state(), VmState::Created);
    for (op, r) in [
        ("pause", vm.pause()),
        ("resume", vm.resume()),
        ("reset", vm.reset()),
    ] {
        let e = r.expect_err(op);
        assert!(
            matches!(
                e,
                VmError::WrongState {
                    state: VmState::Created,
                    ..
                }
            ),
            "{op}: {e}"
        );
    }
    vm.shutdown().expect("created -> shutdown");
    assert_eq!(vm.state(), VmState::Shutdown);
}

#[test]
fn smp_guest_boots_with_four_vcpus() {
    let Some(vm) = tiny_vm_with("smp_guest_boots_with_four_vcpus", 4) else {
        return;
    };
    boot_ready(&vm);
    // APs wait for INIT/SIPI inside KVM_RUN; pausing must still stop all four threads.
    vm.pause().expect("pause with parked APs");
    let a = vm.read_guest_u64(COUNTER_GPA).expect("counter");
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(vm.read_guest_u64(COUNTER_GPA).expect("counter"), a);
    vm.resume().expect("resume");
    wait_until("the counter to move after resume", || {
        vm.read_guest_u64(COUNTER_GPA).expect("counter") > a
    });
    vm.shutdown().expect("shutdown");
}

#[test]
fn virtio_blk_is_announced_and_discoverable() {
    let disk = tempfile::NamedTempFile::new().expect("tempfile");
    disk.as_file().set_len(1 << 20).expect("size");
    let drive = DriveConfig {
        path: disk.path().to_path_buf(),
        read_only: false,
        id: "vda".into(),
        faults: Default::default(),
    };
    let Some(vm) = tiny_vm_cfg("virtio_blk_is_announced_and_discoverable", 1, vec![drive]) else {
        return;
    };
    boot_ready(&vm);
    let log = vm.console().log_string();
    assert!(
        log.contains(&format!(
            "cmdline={CMDLINE} virtio_mmio.device=4K@0xd0000000:5\n"
        )),
        "the device manager's entry reached the guest: {log}"
    );
    assert!(
        log.contains("mmio0=74726976/00000002"),
        "magic 'virt', device id 2 (block): {log}"
    );
}
