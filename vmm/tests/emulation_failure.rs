//! Tier 4: a guest instruction KVM's emulator lacks stops the VM with a
//! report that says where and what.
//!
//! The tiny guest with one byte changed: the instruction after its banner
//! becomes `fwait` (0x9b). On kvm_pvm the guest's CPL0 code runs in KVM's
//! instruction emulator, which has no `fwait`, so KVM_RUN returns
//! KVM_EXIT_INTERNAL_ERROR suberror 1 (DESIGN.md, "This machine's KVM"). On
//! hardware KVM the instruction runs natively and the guest boots on: the test
//! then says so and passes without checking the report.
//!
//! Needs /dev/kvm like `tiny_guest.rs`; `PROVIUM_SKIP_KVM=1` skips (printing
//! why) where KVM is unusable.

use std::time::{Duration, Instant};

use provium_vmm::tiny_guest::{self, BANNER, READY};
use provium_vmm::{BootSource, KernelImage, StopReason, Vm, VmConfig, VmError, VmState};

const WAIT: Duration = Duration::from_secs(60);

/// The tiny bzImage with `fwait` at the instruction after the banner's
/// `call puts`, and that instruction's guest RIP.
fn fwait_image() -> (Vec<u8>, u64) {
    let mut img = tiny_guest::BZIMAGE.to_vec();
    // The protected-mode kernel follows the boot sector and setup_sects
    // setup sectors (Linux boot protocol).
    let kernel = (usize::from(img[0x1f1]) + 1) * 512;
    let entry = kernel + usize::try_from(tiny_guest::STARTUP_64_OFFSET).expect("small");
    // startup_64: cli; lea rbx, [rip + banner]; call puts; lea rbx, ... —
    // checked, so a change to the guest fails here rather than patching
    // the middle of some other instruction.
    assert_eq!(img[entry], 0xfa, "cli");
    assert_eq!(
        img[entry + 1..entry + 4],
        [0x48, 0x8d, 0x1d],
        "lea rbx, [rip+x]"
    );
    assert_eq!(img[entry + 8], 0xe8, "call puts");
    assert_eq!(
        img[entry + 13..entry + 16],
        [0x48, 0x8d, 0x1d],
        "lea rbx, [rip+x]"
    );
    img[entry + 13] = 0x9b;
    let rip = tiny_guest::LOAD_ADDR + tiny_guest::STARTUP_64_OFFSET + 13;
    (img, rip)
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

#[test]
fn an_instruction_the_emulator_lacks_is_reported_with_rip_bytes_and_console() {
    let test = "an_instruction_the_emulator_lacks_is_reported_with_rip_bytes_and_console";
    let (img, rip) = fwait_image();
    let mut cfg = VmConfig::new(BootSource {
        kernel: KernelImage::Bytes(img.into()),
        initrd: None,
        cmdline: "console=ttyS0".into(),
    });
    cfg.machine.mem_size_mib = 32;
    let vm = match Vm::new(cfg) {
        Ok(vm) => vm,
        Err(e @ VmError::Kvm(_))
            if std::env::var_os("PROVIUM_SKIP_KVM").is_some_and(|v| v == "1") =>
        {
            eprintln!("SKIP {test}: {} (PROVIUM_SKIP_KVM=1)", chain(&e));
            return;
        }
        Err(e) => panic!(
            "{test}: {} — needs /dev/kvm; set PROVIUM_SKIP_KVM=1 on a machine without it",
            chain(&e)
        ),
    };
    vm.boot().expect("boot");
    let deadline = Instant::now() + WAIT;
    while vm.state() != VmState::Dead {
        if vm.console().log_string().contains(READY) {
            eprintln!(
                "SKIP {test}: this KVM ran the guest's fwait natively (hardware \
                 virtualization, not an emulated kernel): no emulation failure to report"
            );
            vm.shutdown().expect("shutdown");
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{test}: the VM neither stopped nor got READY within {WAIT:?}; state {}, console:\n{}",
            vm.state(),
            vm.console().log_string()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let reason = vm.stop_reason().expect("a dead VM has a stop reason");
    let msg = reason.to_string();
    eprintln!("stop reason: {msg}");
    let StopReason::InternalError(_) = &reason else {
        panic!("expected KVM_EXIT_INTERNAL_ERROR, got: {msg}");
    };
    for want in [
        "vCPU 0 stopped on KVM_EXIT_INTERNAL_ERROR suberror 1 (emulation)".to_string(),
        format!("at RIP {rip:#x}"),
        "instruction bytes 9b".to_string(),
        "KVM data [".to_string(),
        format!("last console lines:\n{}", BANNER),
    ] {
        assert!(msg.contains(&want), "{want:?} missing from: {msg}");
    }
}
