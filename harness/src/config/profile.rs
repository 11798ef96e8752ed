//! A `[profiles.<name>]` table: one VM type (kernel, initrd, command line,
//! guest OS), optionally built by its own `build` command.
//!
//! Validation here is what the config can know alone: a command line from
//! somewhere, a supported `guest_os`. Whether the files exist is checked at
//! boot, so one provium.toml serves machines with different layouts.

use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::settings::Settings;

/// Guest OS identifiers this build can boot. The reference's v1 accepted only
/// `peios`; this VMM boots any Linux guest, so `linux` is accepted too.
pub const SUPPORTED_GUEST_OS: &[&str] = &["peios", "linux"];
/// `guest_os` when the profile does not say.
pub const DEFAULT_GUEST_OS: &str = "peios";

/// A profile the config cannot use.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ProfileError {
    #[error("profile `{name}` has empty cmdline and no `cmdline_file`; set at least one")]
    NoCmdline { name: String },
    #[error(
        "profile `{name}` has guest_os = `{guest_os}`, only {} are supported",
        supported_guest_os()
    )]
    UnsupportedGuestOs { name: String, guest_os: String },
    #[error("profile `{name}` has {key} = {got}; at most {MAX_SLOTS} (each is a virtio-mmio device with its own interrupt line)")]
    TooManySlots {
        name: String,
        key: &'static str,
        got: u32,
    },
}

fn slot_count(
    name: &str,
    key: &'static str,
    v: Option<u32>,
    default: u32,
) -> Result<u32, ProfileError> {
    match v {
        None => Ok(default),
        Some(n) if n <= MAX_SLOTS => Ok(n),
        Some(n) => Err(ProfileError::TooManySlots {
            name: name.to_string(),
            key,
            got: n,
        }),
    }
}

/// "`peios` and `linux`".
fn supported_guest_os() -> String {
    SUPPORTED_GUEST_OS
        .iter()
        .map(|s| format!("`{s}`"))
        .collect::<Vec<_>>()
        .join(" and ")
}

/// A profile's `cmdline_file` could not be read (at boot).
#[derive(Debug, thiserror::Error)]
#[error("cmdline_file `{}`", path.display())]
pub struct CmdlineFileError {
    pub path: PathBuf,
    #[source]
    pub source: std::io::Error,
}

/// `[profiles.<name>]` as written.
#[derive(Debug, Default, Deserialize)]
pub(super) struct ProfileTable {
    kernel: Option<String>,
    initrd: Option<String>,
    cmdline: Option<String>,
    cmdline_file: Option<String>,
    guest_os: Option<String>,
    inject_agent: Option<bool>,
    agent_overlay_path: Option<String>,
    build: Option<String>,
    build_out: Option<String>,
    disk_slots: Option<u32>,
    nic_slots: Option<u32>,
}

/// A validated profile, `{out}` expanded and its paths resolved.
#[derive(Debug, Clone, PartialEq)]
pub struct Profile {
    pub name: String,
    pub kernel: Option<PathBuf>,
    pub initrd: Option<PathBuf>,
    pub cmdline: String,
    pub cmdline_file: Option<PathBuf>,
    pub guest_os: String,
    pub inject_agent: bool,
    pub agent_overlay_path: Option<PathBuf>,
    pub build: Option<String>,
    pub build_out: PathBuf,
    /// Disks a running guest can be given (`vm:attach_disk` after boot):
    /// on kvm, empty virtio-blk slots made at boot ([`DEFAULT_DISK_SLOTS`]).
    pub disk_slots: u32,
    /// NICs a running guest can be given (`bridge:attach(vm)` after boot):
    /// on kvm, link-down virtio-net slots made at boot ([`DEFAULT_NIC_SLOTS`]).
    pub nic_slots: u32,
}

/// `disk_slots` when the profile does not say.
pub const DEFAULT_DISK_SLOTS: u32 = 2;
/// `nic_slots` when the profile does not say.
pub const DEFAULT_NIC_SLOTS: u32 = 2;
/// The most slots of one kind: virtio-mmio devices each take one of the
/// VMM's 19 interrupt lines, shared with the VM's other devices.
pub const MAX_SLOTS: u32 = 8;

/// Where a dynamic profile builds when `build_out` is unset: `<base>/<name>`,
/// the base being the first of `$PROVIUM_BUILD_DIR`, `<cache home>/builds`
/// (when `XDG_CACHE_HOME` or `HOME` is set), `/tmp/provium-builds`.
pub(super) fn default_build_base(settings: &Settings) -> PathBuf {
    if let Some(d) = &settings.build_dir {
        return d.clone();
    }
    if settings.xdg_cache_home.is_some() || settings.home.is_some() {
        return settings.cache_home().join("builds");
    }
    PathBuf::from("/tmp/provium-builds")
}

impl ProfileTable {
    /// Validates the profile `name`; `{out}` expands to its build-output
    /// directory, relative paths are joined to `base_dir`.
    pub(super) fn resolve(
        self,
        name: String,
        base_dir: &Path,
        settings: &Settings,
    ) -> Result<Profile, ProfileError> {
        let cmdline = self.cmdline.unwrap_or_default();
        if cmdline.trim().is_empty() && self.cmdline_file.is_none() {
            return Err(ProfileError::NoCmdline { name });
        }
        let guest_os = self.guest_os.unwrap_or_else(|| DEFAULT_GUEST_OS.into());
        if !SUPPORTED_GUEST_OS.contains(&guest_os.as_str()) {
            return Err(ProfileError::UnsupportedGuestOs { name, guest_os });
        }
        let resolve = |p: &str| super::resolve_path(base_dir, p);
        let build_out = match &self.build_out {
            Some(b) => resolve(b),
            None => default_build_base(settings).join(&name),
        };
        let out = build_out.to_string_lossy().into_owned();
        let expand = |s: &str| s.replace("{out}", &out);
        let path_field = |v: &Option<String>| v.as_deref().map(|s| resolve(&expand(s)));
        Ok(Profile {
            kernel: path_field(&self.kernel),
            initrd: path_field(&self.initrd),
            cmdline: expand(&cmdline),
            cmdline_file: path_field(&self.cmdline_file),
            guest_os,
            inject_agent: self.inject_agent.unwrap_or(true),
            agent_overlay_path: path_field(&self.agent_overlay_path),
            build: self.build.as_deref().map(expand),
            build_out,
            disk_slots: slot_count(&name, "disk_slots", self.disk_slots, DEFAULT_DISK_SLOTS)?,
            nic_slots: slot_count(&name, "nic_slots", self.nic_slots, DEFAULT_NIC_SLOTS)?,
            name,
        })
    }
}

impl Profile {
    /// The kernel command line for a boot: the file's contents (whitespace
    /// collapsed), then the inline `cmdline`, or `override_cmdline` instead of
    /// both; `console=ttyS0` appended when absent.
    pub fn kernel_cmdline(
        &self,
        override_cmdline: Option<&str>,
    ) -> Result<String, CmdlineFileError> {
        let mut parts: Vec<String> = Vec::new();
        match override_cmdline {
            Some(c) => parts.push(c.to_string()),
            None => {
                if let Some(file) = &self.cmdline_file {
                    let text =
                        std::fs::read_to_string(file).map_err(|source| CmdlineFileError {
                            path: file.clone(),
                            source,
                        })?;
                    parts.push(text.split_whitespace().collect::<Vec<_>>().join(" "));
                }
                parts.push(self.cmdline.clone());
            }
        }
        let mut line = parts
            .into_iter()
            .filter(|p| !p.trim().is_empty())
            .collect::<Vec<_>>()
            .join(" ");
        if !line.split_whitespace().any(|t| t == "console=ttyS0") {
            if !line.is_empty() {
                line.push(' ');
            }
            line.push_str("console=ttyS0");
        }
        Ok(line)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn profile(text: &str) -> Result<Profile, ProfileError> {
        let table: ProfileTable = toml::from_str(text).unwrap();
        table.resolve("x".into(), Path::new("/p"), &Settings::default())
    }

    #[test]
    fn validation_names_the_profile_and_the_fix() {
        assert_eq!(
            profile("kernel = \"k\"\n").unwrap_err().to_string(),
            "profile `x` has empty cmdline and no `cmdline_file`; set at least one"
        );
        assert_eq!(
            profile("cmdline = \"q\"\nguest_os = \"windows\"\n")
                .unwrap_err()
                .to_string(),
            "profile `x` has guest_os = `windows`, only `peios` and `linux` are supported"
        );
        assert!(profile("cmdline_file = \"cl\"\n").is_ok());
    }

    #[test]
    fn defaults_and_out_expansion() {
        let p = profile("cmdline = \"q {out}\"\nkernel = \"{out}/k\"\ninitrd = \"i\"\n").unwrap();
        assert_eq!(p.guest_os, "peios");
        assert!(p.inject_agent);
        assert_eq!(p.build_out, PathBuf::from("/tmp/provium-builds/x"));
        assert_eq!(p.cmdline, "q /tmp/provium-builds/x");
        assert_eq!(p.kernel, Some(PathBuf::from("/tmp/provium-builds/x/k")));
        assert_eq!(p.initrd, Some(PathBuf::from("/p/i")));
    }

    #[test]
    fn build_base_prefers_provium_build_dir_then_the_cache_home() {
        let mut s = Settings {
            home: Some(PathBuf::from("/h")),
            ..Settings::default()
        };
        assert_eq!(
            default_build_base(&s),
            PathBuf::from("/h/.cache/provium/builds")
        );
        s.build_dir = Some(PathBuf::from("/b"));
        assert_eq!(default_build_base(&s), PathBuf::from("/b"));
        assert_eq!(
            default_build_base(&Settings::default()),
            PathBuf::from("/tmp/provium-builds")
        );
    }

    #[test]
    fn an_unreadable_cmdline_file_is_named_with_its_cause() {
        let p = profile("cmdline_file = \"/nonexistent/cl\"\n").unwrap();
        let e = p.kernel_cmdline(None).unwrap_err();
        assert_eq!(
            crate::error_chain::flatten(&e),
            "cmdline_file `/nonexistent/cl`: No such file or directory (os error 2)"
        );
        assert_eq!(p.kernel_cmdline(Some("x")).unwrap(), "x console=ttyS0");
    }

    #[test]
    fn console_is_appended_once() {
        let p = profile("cmdline = \"quiet\"\n").unwrap();
        assert_eq!(p.kernel_cmdline(None).unwrap(), "quiet console=ttyS0");
        assert_eq!(
            p.kernel_cmdline(Some("console=ttyS0 x")).unwrap(),
            "console=ttyS0 x"
        );
    }
}
