//! `provium kernel check [PROFILE | --kernel PATH [--modules DIR]]`: what a
//! kernel offers of what Provium needs, one row per need
//! (harness/src/kernel/needs.rs), read without booting it; docs/kernels.md.
//!
//! Exit codes: 0 a boot can reach the agent, 1 it cannot, 2 unreadable
//! input (not a bzImage or ELF, no readable config, a bad module tree),
//! with the reason.

use std::path::PathBuf;

use clap::Subcommand;

use super::{load_config, EXIT_FAILED, EXIT_OK};
use crate::config::ConfigError;
use crate::kernel::CheckError;
use crate::settings::Settings;

#[derive(Debug, Subcommand)]
pub enum KernelOp {
    /// Check a kernel (a profile's, or --kernel) against what Provium needs.
    Check {
        /// A profile of provium.toml (its `kernel` and `modules`).
        #[arg(conflicts_with = "kernel")]
        profile: Option<String>,
        /// A bzImage or ELF vmlinux.
        #[arg(long, value_name = "PATH")]
        kernel: Option<PathBuf>,
        /// Its module tree: lib/modules/<release>, or a root holding it.
        #[arg(long, value_name = "DIR", requires = "kernel")]
        modules: Option<PathBuf>,
    },
}

/// Why `kernel check` could not give a verdict (exit 2).
#[derive(Debug, thiserror::Error)]
pub enum KernelCmdError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("kernel check: profile `{profile}` not found in provium.toml")]
    UnknownProfile { profile: String },
    #[error(
        "kernel check: profile `{profile}` has no kernel (set `kernel = ...` on it, or pass --kernel PATH)"
    )]
    NoKernel { profile: String },
    #[error("kernel check: say which kernel: a PROFILE, or --kernel PATH [--modules DIR]")]
    NothingToCheck,
    #[error(transparent)]
    Check(#[from] CheckError),
}

pub fn run(
    config: &std::path::Path,
    settings: &Settings,
    op: KernelOp,
) -> Result<i32, KernelCmdError> {
    let KernelOp::Check {
        profile,
        kernel,
        modules,
    } = op;
    let (kernel, modules) = match (profile, kernel) {
        (_, Some(k)) => (k, modules),
        (Some(name), None) => {
            let config = load_config(config, settings)?;
            let p = config
                .profiles
                .get(&name)
                .ok_or_else(|| KernelCmdError::UnknownProfile {
                    profile: name.clone(),
                })?;
            let k = p
                .kernel
                .clone()
                .ok_or(KernelCmdError::NoKernel { profile: name })?;
            (k, p.modules.clone())
        }
        (None, None) => return Err(KernelCmdError::NothingToCheck),
    };
    let report = crate::kernel::check(&kernel, modules.as_deref())?;
    print!("{}", report.render());
    Ok(if report.can_reach_agent() {
        EXIT_OK
    } else {
        EXIT_FAILED
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::image::fake_bzimage;

    fn check_args(args: &[&str]) -> KernelOp {
        let (_d, cli) = super::super::parse_in_project("", args);
        match cli.command {
            Some(super::super::Command::Kernel { op }) => op,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn exit_codes_follow_the_verdict_and_bad_input_is_an_error() {
        let d = tempfile::tempdir().unwrap();
        let k = d.path().join("bzImage");
        std::fs::write(&k, fake_bzimage(2, 15, "6.9.0 (x)", true, true)).unwrap();
        let ks = k.to_str().unwrap();
        let s = Settings::default();
        let cfg = d.path().join("provium.toml");
        // No config beside it: unreadable input (exit 2 through main).
        let e = run(&cfg, &s, check_args(&["kernel", "check", "--kernel", ks])).unwrap_err();
        assert!(
            matches!(e, KernelCmdError::Check(CheckError::Config(_))),
            "{e}"
        );
        let all = "CONFIG_ACPI=y\nCONFIG_VIRTIO=y\nCONFIG_VIRTIO_MMIO=y\nCONFIG_VSOCKETS=y\n\
                   CONFIG_VIRTIO_VSOCKETS=y\nCONFIG_BLK_DEV_INITRD=y\n";
        std::fs::write(d.path().join("config"), all).unwrap();
        assert_eq!(
            run(&cfg, &s, check_args(&["kernel", "check", "--kernel", ks])).unwrap(),
            EXIT_OK
        );
        std::fs::write(
            d.path().join("config"),
            all.replace("CONFIG_VSOCKETS=y\n", ""),
        )
        .unwrap();
        assert_eq!(
            run(&cfg, &s, check_args(&["kernel", "check", "--kernel", ks])).unwrap(),
            EXIT_FAILED
        );
        // A profile's kernel; an unknown profile; nothing named.
        std::fs::write(
            &cfg,
            format!("[profiles.p]\ncmdline = \"q\"\nkernel = \"{ks}\"\n"),
        )
        .unwrap();
        assert_eq!(
            run(&cfg, &s, check_args(&["kernel", "check", "p"])).unwrap(),
            EXIT_FAILED
        );
        let e = run(&cfg, &s, check_args(&["kernel", "check", "q"])).unwrap_err();
        assert!(e.to_string().contains("profile `q` not found"), "{e}");
        let e = run(&cfg, &s, check_args(&["kernel", "check"])).unwrap_err();
        assert!(matches!(e, KernelCmdError::NothingToCheck));
    }
}
