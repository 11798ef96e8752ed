//! Where the `provium-agent` binary is: one search, the same for every
//! build directory, documented in docs/harness.md ("Finding the agent").
//!
//! The search starts from what the process knows at run time (the
//! `PROVIUM_AGENT` variable and the running executable's path, both in
//! [`Settings`]), never from where the source tree was when the harness was
//! compiled, so a moved checkout, a fresh clone or an installed binary finds
//! its agent the same way:
//!
//! 1. `PROVIUM_AGENT`, taken as given (it must be executable);
//! 2. beside the running executable: `<exe dir>/provium-agent`, then
//!    `<exe dir>/../provium-agent` (a test binary in `target/<profile>/deps/`
//!    finds the agent cargo built in `target/<profile>/`);
//! 3. when the executable sits in a cargo target dir (its directory, or that
//!    directory's `deps/` parent, is named `debug` or `release`), the other
//!    profiles of that target dir: `<target>/debug/`, `<target>/release/`.
//!
//! A kvm guest needs a static agent (its initrd may have no loader or libc).
//! Its candidates ([`AgentKind::Guest`]) are the target dir's static builds:
//! `<target>/guest-agent/x86_64-unknown-linux-gnu/release/` (what
//! harness/build.rs builds), then `<target>/x86_64-unknown-linux-gnu/
//! {release,debug}/`; `backend::kvm::config::locate_guest_agent` tries
//! them after the agent the build script recorded, then falls back to the
//! host search when that finds a static agent.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use crate::settings::{Settings, AGENT_ENV};

/// The agent binary's file name.
pub const AGENT_BIN: &str = "provium-agent";
/// The target triple of the static guest agent.
pub const GUEST_TARGET: &str = "x86_64-unknown-linux-gnu";
/// Cargo profile directory names that mark a target dir.
const PROFILE_DIRS: &[&str] = &["debug", "release"];

/// Which agent a search is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AgentKind {
    /// Run on the host (the local sandbox's init).
    Host,
    /// Put in a kvm guest's initrd: static builds only.
    Guest,
}

/// No agent where the search looked.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum AgentSearchError {
    #[error("provium-agent not found at {} (from {AGENT_ENV}); point {AGENT_ENV} at an executable agent, or unset it", path.display())]
    EnvNotExecutable { path: PathBuf },
    #[error("provium-agent not found (looked at: {}); build it with `cargo build -p provium-agent`, or set {AGENT_ENV} to its path", join(tried))]
    NotFound { tried: Vec<PathBuf> },
}

fn join(paths: &[PathBuf]) -> String {
    paths
        .iter()
        .map(|p| p.display().to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

/// The inputs of the search: `PROVIUM_AGENT` and the running executable.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct AgentSearch {
    /// `PROVIUM_AGENT`.
    pub env: Option<PathBuf>,
    /// The running executable.
    pub current_exe: Option<PathBuf>,
}

impl From<&Settings> for AgentSearch {
    fn from(settings: &Settings) -> Self {
        AgentSearch {
            env: settings.agent.clone(),
            current_exe: settings.current_exe.clone(),
        }
    }
}

impl AgentSearch {
    /// The cargo target dir the executable runs from, if it runs from one:
    /// the parent of its profile directory (`debug`, `release`), the
    /// executable being in that directory or in its `deps/`.
    pub fn target_dir(&self) -> Option<PathBuf> {
        let dir = self.current_exe.as_deref()?.parent()?;
        let profile_dir = if dir.file_name().is_some_and(|n| n == "deps") {
            dir.parent()?
        } else {
            dir
        };
        let name = profile_dir.file_name()?.to_str()?;
        PROFILE_DIRS
            .contains(&name)
            .then(|| profile_dir.parent().map(Path::to_path_buf))
            .flatten()
    }

    /// The places searched for `kind` after `PROVIUM_AGENT`, in order,
    /// without repeats.
    pub fn candidates(&self, kind: AgentKind) -> Vec<PathBuf> {
        let mut out = Vec::new();
        let target = self.target_dir();
        match kind {
            AgentKind::Host => {
                if let Some(dir) = self.current_exe.as_deref().and_then(Path::parent) {
                    out.push(dir.join(AGENT_BIN));
                    if let Some(up) = dir.parent() {
                        out.push(up.join(AGENT_BIN));
                    }
                }
                if let Some(t) = &target {
                    out.extend(PROFILE_DIRS.iter().map(|p| t.join(p).join(AGENT_BIN)));
                }
            }
            AgentKind::Guest => {
                if let Some(t) = &target {
                    out.push(
                        t.join("guest-agent")
                            .join(GUEST_TARGET)
                            .join("release")
                            .join(AGENT_BIN),
                    );
                    for profile in ["release", "debug"] {
                        out.push(t.join(GUEST_TARGET).join(profile).join(AGENT_BIN));
                    }
                }
            }
        }
        let mut seen = HashSet::new();
        out.retain(|p| seen.insert(p.clone()));
        out
    }

    /// The host agent: `PROVIUM_AGENT` as given, else the first executable
    /// [`AgentKind::Host`] candidate.
    pub fn locate_host(&self) -> Result<PathBuf, AgentSearchError> {
        if let Some(path) = &self.env {
            return if is_executable(path) {
                Ok(path.clone())
            } else {
                Err(AgentSearchError::EnvNotExecutable { path: path.clone() })
            };
        }
        let tried = self.candidates(AgentKind::Host);
        tried
            .iter()
            .find(|p| is_executable(p))
            .cloned()
            .ok_or(AgentSearchError::NotFound { tried })
    }
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn executable(path: &Path) {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, b"#!/bin/sh\n").unwrap();
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
    }

    fn from_exe(exe: &Path) -> AgentSearch {
        AgentSearch {
            env: None,
            current_exe: Some(exe.to_path_buf()),
        }
    }

    #[test]
    fn prefers_env_then_exe_dir_then_its_parent() {
        let tmp = tempfile::tempdir().unwrap();
        let deps = tmp.path().join("target/debug/deps");
        std::fs::create_dir_all(&deps).unwrap();
        let err = from_exe(&deps.join("t")).locate_host().unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("cargo build -p provium-agent"), "{msg}");
        assert!(
            msg.contains(&deps.join(AGENT_BIN).display().to_string()),
            "{msg}"
        );

        let agent = tmp.path().join("target/debug").join(AGENT_BIN);
        executable(&agent);
        assert_eq!(from_exe(&deps.join("t")).locate_host().unwrap(), agent);
        executable(&deps.join(AGENT_BIN));
        assert_eq!(
            from_exe(&deps.join("t")).locate_host().unwrap(),
            deps.join(AGENT_BIN)
        );

        let env = |p: &Path| AgentSearch {
            env: Some(p.to_path_buf()),
            current_exe: Some(deps.join("t")),
        };
        let err = env(Path::new("/nonexistent/agent"))
            .locate_host()
            .unwrap_err();
        assert!(err.to_string().contains("from PROVIUM_AGENT"), "{err}");
        assert_eq!(env(&agent).locate_host().unwrap(), agent);
    }

    /// A release `provium` finds the agent a debug build made in the same
    /// target dir, with no source tree involved.
    #[test]
    fn the_other_profile_of_the_target_dir_is_searched() {
        let tmp = tempfile::tempdir().unwrap();
        let target = tmp.path().join("elsewhere/target");
        let agent = target.join("debug").join(AGENT_BIN);
        executable(&agent);
        let search = from_exe(&target.join("release/provium"));
        assert_eq!(search.target_dir(), Some(target.clone()));
        assert_eq!(
            search.candidates(AgentKind::Host),
            [
                target.join("release").join(AGENT_BIN),
                target.join(AGENT_BIN),
                target.join("debug").join(AGENT_BIN),
            ]
        );
        assert_eq!(search.locate_host().unwrap(), agent);
    }

    /// An installed binary is not taken for a target dir: only its own
    /// directory and the one above are searched.
    #[test]
    fn an_installed_binary_searches_beside_itself_only() {
        let search = from_exe(Path::new("/usr/local/bin/provium"));
        assert_eq!(search.target_dir(), None);
        assert_eq!(
            search.candidates(AgentKind::Host),
            [
                PathBuf::from("/usr/local/bin/provium-agent"),
                PathBuf::from("/usr/local/provium-agent"),
            ]
        );
        assert!(search.candidates(AgentKind::Guest).is_empty());
        assert!(AgentSearch::default()
            .candidates(AgentKind::Host)
            .is_empty());
    }

    #[test]
    fn guest_candidates_are_the_target_dirs_static_builds() {
        let search = from_exe(Path::new("/w/target/debug/deps/provium-1234"));
        assert_eq!(
            search.candidates(AgentKind::Guest),
            [
                PathBuf::from(
                    "/w/target/guest-agent/x86_64-unknown-linux-gnu/release/provium-agent"
                ),
                PathBuf::from("/w/target/x86_64-unknown-linux-gnu/release/provium-agent"),
                PathBuf::from("/w/target/x86_64-unknown-linux-gnu/debug/provium-agent"),
            ]
        );
    }

    #[test]
    fn settings_feed_the_search() {
        let settings = Settings {
            agent: Some(PathBuf::from("/a")),
            current_exe: Some(PathBuf::from("/w/target/debug/provium")),
            ..Settings::default()
        };
        let search = AgentSearch::from(&settings);
        assert_eq!(search.env, Some(PathBuf::from("/a")));
        assert_eq!(search.target_dir(), Some(PathBuf::from("/w/target")));
    }
}
