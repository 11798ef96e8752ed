//! Start-up checks of what the chosen backend needs, each with its recovery line.
//!
//! All checks run, and every problem is reported at once
//! ([`PreflightError::Failed`]), so one run shows everything to fix.

use crate::backend::locate_local_agent as locate_agent;
use crate::error_chain::flatten;
use crate::runner::BackendKind;
use crate::settings::Settings;

/// What the pre-flight checks found.
#[derive(Debug, thiserror::Error)]
pub enum PreflightError {
    /// `/dev/kvm` cannot be opened read-write.
    #[error("/dev/kvm is not usable")]
    KvmUnusable(#[source] std::io::Error),
    /// Each problem with its fix, one per line.
    #[error("pre-flight failed:\n  - {}", problems.join("\n  - "))]
    Failed { problems: Vec<String> },
}

/// Whether this process can open `/dev/kvm` read-write.
pub fn kvm_usable() -> Result<(), PreflightError> {
    match std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/kvm")
    {
        Ok(_) => Ok(()),
        Err(e) => Err(PreflightError::KvmUnusable(e)),
    }
}

/// Whether `bin` is a file in one of `PATH`'s directories.
fn on_path(bin: &str, settings: &Settings) -> bool {
    settings
        .path
        .as_ref()
        .is_some_and(|p| std::env::split_paths(p).any(|d| d.join(bin).is_file()))
}

/// Checks what `backend` (and `--coverage`) need; every problem at once.
pub fn check(
    backend: BackendKind,
    coverage: bool,
    settings: &Settings,
) -> Result<(), PreflightError> {
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
            if let Err(e) = locate_agent(settings) {
                problems.push(format!("{}\n    fix: cargo build -p provium-agent (or set PROVIUM_AGENT=/path/to/provium-agent)", flatten(&e)));
            }
        }
        BackendKind::Kvm => {
            if let Err(e) = kvm_usable() {
                problems.push(format!("{}\n    fix: load kvm_intel/kvm_amd and give this user access to /dev/kvm, or use --vmm local", flatten(&e)));
            }
        }
    }
    if coverage && !on_path("provium-coverage", settings) {
        problems.push("--coverage needs `provium-coverage` on PATH".into());
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(PreflightError::Failed { problems })
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_problem_is_listed_with_its_fix() {
        let settings = Settings {
            agent: Some("/nonexistent/provium-agent".into()),
            path: Some("/nonexistent".into()),
            ..Settings::default()
        };
        let e = check(BackendKind::Local, true, &settings).unwrap_err();
        let text = e.to_string();
        assert!(text.starts_with("pre-flight failed:\n  - "), "{text}");
        assert!(
            text.contains("/nonexistent/provium-agent (from PROVIUM_AGENT)"),
            "{text}"
        );
        assert!(text.contains("fix: cargo build -p provium-agent"), "{text}");
        assert!(
            text.contains("--coverage needs `provium-coverage` on PATH"),
            "{text}"
        );
    }

    #[test]
    fn path_is_searched_from_the_settings() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("tool"), b"").unwrap();
        let settings = Settings {
            path: Some(
                std::env::join_paths(["/nonexistent", dir.path().to_str().unwrap()]).unwrap(),
            ),
            ..Settings::default()
        };
        assert!(on_path("tool", &settings));
        assert!(!on_path("other", &settings));
        assert!(!on_path("tool", &Settings::default()));
    }

    #[test]
    fn an_unusable_kvm_keeps_its_cause() {
        let e = PreflightError::KvmUnusable(std::io::Error::from_raw_os_error(libc::ENOENT));
        assert_eq!(
            flatten(&e),
            "/dev/kvm is not usable: No such file or directory (os error 2)"
        );
    }
}
