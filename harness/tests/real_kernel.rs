//! The real-kernel tier (tests/README.md, tier 6): the Lua suites under
//! tests/lua on the `kvm` backend, booting the user's own Linux kernel and
//! initrd (`PROVIUM_TEST_KERNEL`, `PROVIUM_TEST_INITRD`) with the agent
//! injected, through the real `provium` binary.
//!
//! It runs only where it can mean something, and says why otherwise:
//! - without `PROVIUM_TEST_KERNEL` it skips, printing how to run it;
//! - on kvm_pvm (this project's development and CI machines) it runs too:
//!   the kernel needs the kvm_pvm shims (scripts/probe-kernel/), and guest
//!   kernel code is emulated there, so it is slow;
//! - on hardware KVM every suite must pass.
//!
//! The initrd must hold what the suites' tests run inside the guest: a
//! shell and coreutils, `ip` and `ping` for the network suite.

mod common;

use common::{ensure_agent, repo_root};

use std::path::{Path, PathBuf};
use std::process::Command;

/// The suites that drive a guest; `framework` needs none and runs on the
/// local backend in lua_suites.rs.
const SUITES: &[&str] = &["guest", "network", "snapshots", "disks"];

/// Kernel and initrd from the environment, or None after printing why the
/// tier is skipped.
fn real_kernel(test: &str) -> Option<(PathBuf, PathBuf)> {
    let Some(kernel) = std::env::var_os("PROVIUM_TEST_KERNEL") else {
        eprintln!(
            "{test}: SKIP — PROVIUM_TEST_KERNEL is not set (set it and PROVIUM_TEST_INITRD to a \
             bzImage and an initrd with a shell, coreutils, ip and ping to run the Lua suites \
             on the kvm backend)"
        );
        return None;
    };
    let kernel = PathBuf::from(kernel);
    let initrd = PathBuf::from(std::env::var_os("PROVIUM_TEST_INITRD").unwrap_or_else(|| {
        panic!("{test}: PROVIUM_TEST_KERNEL is set but PROVIUM_TEST_INITRD is not; set both")
    }));
    for (what, p) in [
        ("PROVIUM_TEST_KERNEL", &kernel),
        ("PROVIUM_TEST_INITRD", &initrd),
    ] {
        assert!(p.is_file(), "{test}: {what}={} is not a file", p.display());
    }
    Some((kernel, initrd))
}

/// A provium.toml whose `linux` profile (the one every suite asks for) is
/// the real kernel, with the suites' own roots.
fn config(dir: &Path, kernel: &Path, initrd: &Path) -> PathBuf {
    let cmdline = std::env::var("PROVIUM_TEST_CMDLINE").unwrap_or_else(|_| "quiet".into());
    let path = dir.join("provium.toml");
    std::fs::write(
        &path,
        format!(
            "[provium]\nroots = [{root:?}]\n\n[profiles.linux]\nkernel = {kernel:?}\n\
             initrd = {initrd:?}\ncmdline = {cmdline:?}\nguest_os = \"linux\"\n",
            root = repo_root().join("tests/lua").display().to_string(),
        ),
    )
    .unwrap();
    path
}

#[test]
fn the_lua_suites_pass_on_the_kvm_backend_with_a_real_kernel() {
    let test = "the_lua_suites_pass_on_the_kvm_backend_with_a_real_kernel";
    let Some((kernel, initrd)) = real_kernel(test) else {
        return;
    };
    ensure_agent();
    let scratch = tempfile::tempdir().unwrap();
    let config = config(scratch.path(), &kernel, &initrd);
    let mut failed = Vec::new();
    for suite in SUITES {
        let dir = repo_root().join("tests/lua").join(suite);
        let o = Command::new(env!("CARGO_BIN_EXE_provium"))
            .args(["--vmm", "kvm", "-v", "--config"])
            .arg(&config)
            .arg(&dir)
            .current_dir(repo_root())
            .output()
            .unwrap();
        let out = format!(
            "{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
        eprintln!("== suite {suite}: exit {:?}\n{out}", o.status.code());
        if o.status.code() != Some(0) {
            failed.push(*suite);
        }
    }
    assert!(
        failed.is_empty(),
        "suites failing on the kvm backend: {failed:?} (output above)"
    );
}
