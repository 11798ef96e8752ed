//! Start-up checks of what the chosen backend needs, each with its recovery line.

use crate::backend::locate_local_agent as locate_agent;
use crate::runner::BackendKind;

pub fn kvm_usable() -> Result<(), String> {
    match std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/kvm")
    {
        Ok(_) => Ok(()),
        Err(e) => Err(format!("/dev/kvm is not usable: {e}")),
    }
}

fn on_path(bin: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(bin).is_file()))
}

pub fn check(backend: BackendKind, coverage: bool) -> Result<(), String> {
    let mut problems = Vec::new();
    match backend {
        BackendKind::Local => {
            // SAFETY: geteuid has no preconditions.
            if unsafe { libc::geteuid() } != 0 {
                problems.push(
                    "the local backend needs root (namespaces and overlay mounts): run as root, or pass --no-preflight to see the error at boot"
                        .to_string(),
                );
            }
            if let Err(e) = locate_agent() {
                problems.push(format!("{e}\n    fix: cargo build -p provium-agent (or set PROVIUM_AGENT=/path/to/provium-agent)"));
            }
        }
        BackendKind::Kvm => {
            if let Err(e) = kvm_usable() {
                problems.push(format!("{e}\n    fix: load kvm_intel/kvm_amd and give this user access to /dev/kvm, or use --vmm local"));
            }
        }
    }
    if coverage && !on_path("provium-coverage") {
        problems.push("--coverage needs `provium-coverage` on PATH".into());
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "pre-flight failed:\n  - {}",
            problems.join("\n  - ")
        ))
    }
}

/// Let KSM merge identical guest pages: `run = 1`, `pages_to_scan = 1000`,
/// `sleep_millisecs = 20`. Best effort, one line on stderr either way.
pub fn tune_ksm() {
    let knobs = [
        ("run", "1"),
        ("pages_to_scan", "1000"),
        ("sleep_millisecs", "20"),
    ];
    let mut tuned = 0;
    let mut failures = Vec::new();
    for (knob, value) in knobs {
        match std::fs::write(format!("/sys/kernel/mm/ksm/{knob}"), value) {
            Ok(()) => tuned += 1,
            Err(e) => failures.push(format!("{knob}: {e}")),
        }
    }
    if failures.is_empty() {
        eprintln!("provium: ksm: tuned ({tuned} knobs)");
    } else {
        eprintln!(
            "provium: ksm: tuned {tuned} of 3 knobs ({}); pass --no-ksm to skip",
            failures.join("; ")
        );
    }
}
