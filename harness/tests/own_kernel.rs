//! A user's own kernel (issue 25, docs/kernels.md) through the real
//! `provium` binary:
//! - `provium exec --vmm local` (fast: a sandbox, no kernel);
//! - `provium kernel check` on Debian 12's stock kernel
//!   (`scripts/fetch-debian-kernel.sh`, cached under target/debian-kernel):
//!   vsock and the virtio drivers are modules found in its tree, devices are
//!   found through ACPI, and a boot can reach the agent;
//! - booting that kernel to the agent: not on kvm_pvm (this project's
//!   machines: a stock kernel has no kvm_pvm shims, so its user space cannot
//!   run there, and the skip says so); with `PROVIUM_TEST_KERNEL` and
//!   `PROVIUM_TEST_MODULES` set (hardware KVM) it boots and must pass;
//! - `provium exec` on a kernel (kvm, a minute or more of emulated boot
//!   here): in the real-guest tier, harness/tests/real_kernel.rs, which
//!   holds the tier's one-boot-at-a-time lock.
//!
//! `PROVIUM_SKIP_DEBIAN_KERNEL=1` skips the Debian kernel's check (printing
//! why) on a machine without Debian's archive.

mod common;

use common::{ensure_agent, env_is_1, repo_root};

use std::path::PathBuf;
use std::process::{Command, Output};

fn provium(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_provium"))
        .args(args)
        .output()
        .expect("run provium")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn exec_in_a_sandbox_streams_output_and_exits_with_the_commands_code() {
    ensure_agent();
    let out = provium(&[
        "exec",
        "--vmm",
        "local",
        "--",
        "sh",
        "-c",
        "echo to-stdout; echo to-stderr >&2; exit 7",
    ]);
    assert_eq!(out.status.code(), Some(7), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "to-stdout\n");
    assert!(
        text(&out.stderr).contains("to-stderr\n"),
        "{}",
        text(&out.stderr)
    );
    // It runs in the sandbox: its own UTS namespace, named after the VM.
    let out = provium(&["exec", "--vmm", "local", "--", "uname", "-n"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).starts_with("exec-"),
        "the sandbox's hostname: {}",
        text(&out.stdout)
    );
    // A command that does not exist fails the run (exit 2) with the reason.
    let out = provium(&["exec", "--vmm", "local", "--", "/no/such/program"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("/no/such/program"),
        "{}",
        text(&out.stderr)
    );
    // No kernel and no --vmm local: nothing to boot.
    let out = provium(&["exec", "--", "true"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("--kernel is needed"),
        "{}",
        text(&out.stderr)
    );
}

/// Debian 12's stock kernel, fetched and unpacked (cached); `None` after
/// printing why when `PROVIUM_SKIP_DEBIAN_KERNEL=1`.
fn debian_kernel(test: &str) -> Option<PathBuf> {
    if env_is_1("PROVIUM_SKIP_DEBIAN_KERNEL") {
        eprintln!("SKIP {test}: PROVIUM_SKIP_DEBIAN_KERNEL=1");
        return None;
    }
    let out = Command::new(repo_root().join("scripts/fetch-debian-kernel.sh"))
        .output()
        .expect("run scripts/fetch-debian-kernel.sh");
    assert!(
        out.status.success(),
        "{test}: scripts/fetch-debian-kernel.sh failed (set PROVIUM_SKIP_DEBIAN_KERNEL=1 on a \
         machine without Debian's archive): {}",
        text(&out.stderr)
    );
    Some(PathBuf::from(text(&out.stdout).trim()))
}

#[test]
fn kernel_check_on_debians_stock_kernel_finds_its_modules_and_acpi() {
    let Some(root) = debian_kernel("kernel_check_on_debians_stock_kernel") else {
        return;
    };
    let vmlinuz = std::fs::read_dir(root.join("boot"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("vmlinuz-")
        })
        .expect("boot/vmlinuz-*");
    let out = provium(&["kernel", "check", "--kernel", vmlinuz.to_str().unwrap()]);
    let report = text(&out.stdout);
    eprintln!("{report}{}", text(&out.stderr));
    assert_eq!(out.status.code(), Some(0), "a boot can reach the agent");
    let row = |label: &str| -> String {
        report
            .lines()
            .find(|l| l.starts_with(label))
            .unwrap_or_else(|| panic!("no {label:?} row in\n{report}"))
            .to_string()
    };
    assert!(report.contains("bzImage, boot protocol 2."), "{report}");
    assert!(
        report.contains("64-bit entry: yes, relocatable: yes"),
        "{report}"
    );
    let discovery = row("device discovery");
    assert!(
        discovery.contains("module found via ACPI") && discovery.contains("virtio_mmio.ko"),
        "{discovery}"
    );
    let vsock = row("vsock + virtio transport");
    assert!(
        vsock.contains("module found") && vsock.contains("vmw_vsock_virtio_transport.ko"),
        "{vsock}"
    );
    for (label, ko) in [
        ("virtio-blk", "virtio_blk.ko"),
        ("virtio-net", "virtio_net.ko"),
        ("virtio-rng", "virtio-rng.ko"),
    ] {
        let r = row(label);
        assert!(r.contains("module found") && r.contains(ko), "{r}");
    }
    for label in ["8250 serial console", "devtmpfs", "initramfs"] {
        assert!(row(label).contains("built in"), "{}", row(label));
    }
    let order = row("the agent loads, in order:");
    let pos = |m: &str| {
        order
            .split_whitespace()
            .position(|w| w == m)
            .unwrap_or_else(|| panic!("{m} not in {order}"))
    };
    assert!(pos("virtio") < pos("virtio_mmio"));
    assert!(pos("vsock") < pos("vmw_vsock_virtio_transport_common"));
    assert!(pos("vmw_vsock_virtio_transport_common") < pos("vmw_vsock_virtio_transport"));
}

#[test]
fn debians_stock_kernel_boots_to_the_agent_where_kvm_is_hardware() {
    let test = "debians_stock_kernel_boots_to_the_agent";
    let (kernel, modules) = match (
        std::env::var_os("PROVIUM_TEST_KERNEL"),
        std::env::var_os("PROVIUM_TEST_MODULES"),
    ) {
        (Some(k), Some(m)) => (PathBuf::from(k), PathBuf::from(m)),
        _ => {
            eprintln!(
                "SKIP {test}: booting a stock distribution kernel to its agent cannot be done on \
                 kvm_pvm (this project's machines: guest kernel code is emulated and a stock \
                 kernel lacks the kvm_pvm shims its user space needs there, docs/vmm.md); on \
                 hardware KVM set PROVIUM_TEST_KERNEL (e.g. Debian's vmlinuz) and \
                 PROVIUM_TEST_MODULES (its lib/modules/<release>)"
            );
            return;
        }
    };
    ensure_agent();
    let out = provium(&[
        "exec",
        "--kernel",
        kernel.to_str().unwrap(),
        "--modules",
        modules.to_str().unwrap(),
        "--",
        "sh",
        "-c",
        "uname -r; ls /sys/bus/virtio/drivers",
    ]);
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}{}", text(&out.stderr));
    assert!(stdout.contains("vmw_vsock_virtio_transport"), "{stdout}");
}
