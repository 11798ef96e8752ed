//! The real-guest tier's guest selection and profile, shared by its test
//! binaries (harness/tests/real_kernel.rs, harness/tests/hostile_guest.rs):
//! which kernel and initrd to boot, when to skip, and the profile text.
//!
//! The guest, in order of preference:
//! - the user's own kernel and initrd (`PROVIUM_TEST_KERNEL`,
//!   `PROVIUM_TEST_INITRD`), for hardware KVM;
//! - the distro-shaped probe kernel with its kvm_pvm shims
//!   (`scripts/build-probe-kernel.sh --modular`, booted as the stripped
//!   vmlinux): virtio, its transports, vsock, blk, net, rng and console are
//!   modules, which the harness packs into the agent overlay from the
//!   kernel's lib/modules/<release> beside it and the agent loads before it
//!   serves (docs/kernels.md); and the busybox initrd
//!   (`scripts/build-guest-initrd.sh`), which `.ci/run` builds before the
//!   tests. Missing, the test fails saying how to build them, unless
//!   `PROVIUM_SKIP_REAL_GUEST=1` (then it skips, printing why).

use std::path::{Path, PathBuf};

use provium_vmm::initrd::inject::{overlay_cpio, BootFile};

use super::{env_is_1, repo_root};

pub struct Guest {
    pub kernel: PathBuf,
    pub initrd: PathBuf,
    /// The user's own kernel (PROVIUM_TEST_KERNEL), not the probe kernel.
    pub users: bool,
}

impl Guest {
    /// Which kernel this is, for the tier's output.
    pub fn kernel_kind(&self) -> &'static str {
        if self.users {
            "the user's kernel"
        } else {
            "the distro-shaped probe kernel (modules loaded by the agent)"
        }
    }
}

pub fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join("target"))
}

/// The guest to boot, or None after printing why the tier is skipped.
pub fn guest(test: &str) -> Option<Guest> {
    if let Some(kernel) = std::env::var_os("PROVIUM_TEST_KERNEL") {
        let initrd = std::env::var_os("PROVIUM_TEST_INITRD").unwrap_or_else(|| {
            panic!("{test}: PROVIUM_TEST_KERNEL is set but PROVIUM_TEST_INITRD is not; set both")
        });
        let g = Guest {
            kernel: PathBuf::from(kernel),
            initrd: PathBuf::from(initrd),
            users: true,
        };
        for (what, p) in [
            ("PROVIUM_TEST_KERNEL", &g.kernel),
            ("PROVIUM_TEST_INITRD", &g.initrd),
        ] {
            assert!(p.is_file(), "{test}: {what}={} is not a file", p.display());
        }
        return Some(g);
    }
    let g = Guest {
        kernel: target_dir().join("probe-kernel-modular/vmlinux"),
        initrd: target_dir().join("guest-initrd/initrd.cpio"),
        users: false,
    };
    let missing: Vec<String> = [
        (&g.kernel, "scripts/build-probe-kernel.sh --modular"),
        (&g.initrd, "scripts/build-guest-initrd.sh"),
    ]
    .iter()
    .filter(|(p, _)| !p.is_file())
    .map(|(p, script)| format!("{} (build it with `{script}`)", p.display()))
    .collect();
    if missing.is_empty() {
        return Some(Guest {
            kernel: g.kernel.canonicalize().unwrap(),
            initrd: g.initrd.canonicalize().unwrap(),
            users: false,
        });
    }
    let why = format!(
        "the real-guest tier needs {} (.ci/run builds both), or PROVIUM_TEST_KERNEL and \
         PROVIUM_TEST_INITRD",
        missing.join(" and ")
    );
    if env_is_1("PROVIUM_SKIP_REAL_GUEST") {
        eprintln!("SKIP {test}: {why} (PROVIUM_SKIP_REAL_GUEST=1)");
        return None;
    }
    if std::fs::metadata("/dev/kvm").is_err() && env_is_1("PROVIUM_SKIP_KVM") {
        eprintln!("SKIP {test}: no /dev/kvm (PROVIUM_SKIP_KVM=1)");
        return None;
    }
    panic!("{test}: {why}; set PROVIUM_SKIP_REAL_GUEST=1 to skip this tier");
}

/// The body of a provium.toml profile that boots `guest` (kernel, initrd,
/// command line, guest_os, virtio transport; one `key = value` a line).
/// `transport` is the virtio transport (`mmio` or `pci`) the caller's suite
/// covers; PROVIUM_TEST_TRANSPORT overrides it for every suite.
pub fn profile(guest: &Guest, transport: &str) -> String {
    // A profile written for hardware KVM: on kvm_pvm the backend adds the
    // command-line words that KVM needs itself.
    // No `quiet` by default: the console lines a failed boot's error quotes
    // are how an emulated boot that stalls is diagnosed.
    let cmdline = std::env::var("PROVIUM_TEST_CMDLINE").unwrap_or_else(|_| "console=ttyS0".into());
    let transport = std::env::var("PROVIUM_TEST_TRANSPORT").unwrap_or_else(|_| transport.into());
    format!(
        "kernel = {kernel:?}\ninitrd = {initrd:?}\ncmdline = {cmdline:?}\nguest_os = \"linux\"\n\
         transport = {transport:?}\n",
        kernel = guest.kernel.display().to_string(),
        initrd = guest.initrd.display().to_string(),
    )
}

/// A static guest binary harness/build.rs built (`built`: its path, from
/// `option_env!`; `what`: its name in the failure message).
pub fn static_guest_binary(built: Option<&str>, what: &str) -> Vec<u8> {
    let path = built.unwrap_or_else(|| {
        panic!(
            "the real-guest tier needs the static {what} harness/build.rs builds \
             (unset PROVIUM_SKIP_GUEST_AGENT_BUILD and rebuild)"
        )
    });
    std::fs::read(path).unwrap_or_else(|e| panic!("read the static {what} {path}: {e}"))
}

/// A prebuilt agent overlay (what a user ships as `agent_overlay_path`):
/// `agent` as the guest's `/sbin/provium-agent`, plus `files`, written to
/// `path`.
pub fn write_overlay(path: &Path, agent: &[u8], files: &[BootFile]) -> PathBuf {
    std::fs::write(path, overlay_cpio(agent, files).unwrap()).unwrap();
    path.to_path_buf()
}
