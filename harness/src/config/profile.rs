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
    #[error(
        "profile `{name}` has transport = `{transport}`; use `auto` (the default: what the \
         kernel finds), `mmio` (virtio-mmio, through ACPI or the command line) or `pci` \
         (virtio-pci, for kernels without virtio-mmio)"
    )]
    UnknownTransport { name: String, transport: String },
    #[error("profile `{name}` has {key} = {got}; at most {MAX_SLOTS} (each is a virtio device made at boot; on virtio-mmio each takes one of the 18 interrupt lines the VM's devices share)")]
    TooManySlots {
        name: String,
        key: &'static str,
        got: u32,
    },
}

/// The virtio transport a profile's VMs put their devices on.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Transport {
    /// What `kernel check` finds the kernel can use, at each boot:
    /// virtio-mmio when the kernel finds it (through ACPI or the command
    /// line), else virtio-pci when it has that, else virtio-mmio (and a
    /// boot without Hello then quotes the check's verdict). A user's
    /// kernel built with only virtio-pci (`defconfig + kvm_guest.config`)
    /// gets its devices without a profile line. docs/vmm.md, "PCI", has
    /// the measurements behind preferring virtio-mmio.
    #[default]
    Auto,
    /// virtio-mmio, announced through the DSDT or `virtio_mmio.device=`
    /// words.
    Mmio,
    /// virtio-pci on a PCI root bus with MSI-X.
    Pci,
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

/// `agent_channel`: how the harness reaches the guest agent.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AgentChannel {
    /// vsock when the kernel has it, else the console port.
    #[default]
    Auto,
    /// virtio-vsock (port 1024).
    Vsock,
    /// The virtio-console port `org.provium.agent`.
    Console,
}

/// The channel a boot uses: `AgentChannel` made concrete.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResolvedChannel {
    Vsock,
    Console,
}

impl ResolvedChannel {
    /// "vsock" / "console", as Hello's `channel:` feature says it.
    pub fn word(self) -> &'static str {
        match self {
            ResolvedChannel::Vsock => "vsock",
            ResolvedChannel::Console => "console",
        }
    }
}

/// A profile's `agent_channel` the kernel cannot serve.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AgentChannelError {
    #[error(
        "profile `{profile}` sets agent_channel = \"vsock\", but its kernel has no vsock \
         (CONFIG_VSOCKETS and CONFIG_VIRTIO_VSOCKETS neither built in nor a module found); \
         set agent_channel = \"console\" or \"auto\", or build the kernel with them"
    )]
    NoVsock { profile: String },
    #[error(
        "profile `{profile}` sets agent_channel = \"console\", but its kernel has no \
         virtio-console (CONFIG_VIRTIO_CONSOLE neither built in nor a module found); \
         set agent_channel = \"vsock\" or \"auto\", or build the kernel with it"
    )]
    NoConsole { profile: String },
    #[error(
        "profile `{profile}`'s kernel has neither vsock (CONFIG_VIRTIO_VSOCKETS) nor \
         virtio-console (CONFIG_VIRTIO_CONSOLE), so the agent cannot be reached; \
         build the kernel with either (Linux's kvm_guest.config has VIRTIO_CONSOLE)"
    )]
    NoChannel { profile: String },
}

/// The channel `chosen` gives on a kernel whose vsock and virtio-console
/// availability (built in, or its module found) is `kernel_vsock` and
/// `kernel_console`; `None` is unknown. `auto` takes vsock unless the kernel
/// is known to lack it; an unknown answer never refuses a choice.
pub fn resolve_agent_channel(
    profile: &str,
    chosen: AgentChannel,
    kernel_vsock: Option<bool>,
    kernel_console: Option<bool>,
) -> Result<ResolvedChannel, AgentChannelError> {
    let profile = profile.to_string();
    match chosen {
        AgentChannel::Vsock if kernel_vsock == Some(false) => {
            Err(AgentChannelError::NoVsock { profile })
        }
        AgentChannel::Vsock => Ok(ResolvedChannel::Vsock),
        AgentChannel::Console if kernel_console == Some(false) => {
            Err(AgentChannelError::NoConsole { profile })
        }
        AgentChannel::Console => Ok(ResolvedChannel::Console),
        AgentChannel::Auto => match (kernel_vsock, kernel_console) {
            (Some(false), Some(false)) => Err(AgentChannelError::NoChannel { profile }),
            (Some(false), _) => Ok(ResolvedChannel::Console),
            _ => Ok(ResolvedChannel::Vsock),
        },
    }
}

/// `[profiles.<name>]` as written.
#[derive(Debug, Default, Deserialize)]
pub(super) struct ProfileTable {
    kernel: Option<String>,
    initrd: Option<String>,
    cmdline: Option<String>,
    cmdline_file: Option<String>,
    guest_os: Option<String>,
    transport: Option<String>,
    inject_agent: Option<bool>,
    agent_overlay_path: Option<String>,
    agent_channel: Option<AgentChannel>,
    modules: Option<String>,
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
    pub transport: Transport,
    pub inject_agent: bool,
    pub agent_overlay_path: Option<PathBuf>,
    /// `agent_channel` (default `auto`).
    pub agent_channel: AgentChannel,
    /// The kernel's module tree (`lib/modules/<release>`) when it is not
    /// where harness/src/kernel/modtree.rs looks (docs/kernels.md).
    pub modules: Option<PathBuf>,
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
/// VMM's 18 interrupt lines (IRQs 5..=22), shared with the VM's other devices.
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
        let transport = match self.transport.as_deref() {
            None | Some("auto") => Transport::Auto,
            Some("mmio") => Transport::Mmio,
            Some("pci") => Transport::Pci,
            Some(other) => {
                return Err(ProfileError::UnknownTransport {
                    name,
                    transport: other.into(),
                })
            }
        };
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
            transport,
            inject_agent: self.inject_agent.unwrap_or(true),
            agent_overlay_path: path_field(&self.agent_overlay_path),
            agent_channel: self.agent_channel.unwrap_or_default(),
            modules: path_field(&self.modules),
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
        assert_eq!(
            profile("cmdline = \"q\"\ntransport = \"isa\"\n")
                .unwrap_err()
                .to_string(),
            "profile `x` has transport = `isa`; use `auto` (the default: what the kernel finds), \
             `mmio` (virtio-mmio, through ACPI or the command line) or `pci` (virtio-pci, for \
             kernels without virtio-mmio)"
        );
    }

    #[test]
    fn transport_defaults_to_auto_and_takes_mmio_and_pci() {
        assert_eq!(
            profile("cmdline = \"q\"\n").unwrap().transport,
            Transport::Auto
        );
        let p = profile("cmdline = \"q\"\ntransport = \"pci\"\n").unwrap();
        assert_eq!(p.transport, Transport::Pci);
        let p = profile("cmdline = \"q\"\ntransport = \"mmio\"\n").unwrap();
        assert_eq!(p.transport, Transport::Mmio);
        let p = profile("cmdline = \"q\"\ntransport = \"auto\"\n").unwrap();
        assert_eq!(p.transport, Transport::Auto);
    }

    #[test]
    fn agent_channel_parses_and_auto_follows_the_kernel() {
        assert_eq!(
            profile("cmdline = \"q\"\n").unwrap().agent_channel,
            AgentChannel::Auto
        );
        assert_eq!(
            profile("cmdline = \"q\"\nagent_channel = \"console\"\n")
                .unwrap()
                .agent_channel,
            AgentChannel::Console
        );
        let table: Result<ProfileTable, _> = toml::from_str("agent_channel = \"tcp\"\n");
        assert!(table.is_err(), "an unknown channel is refused");
        use AgentChannel as A;
        use ResolvedChannel as R;
        let r = |c, v, k| resolve_agent_channel("p", c, v, k);
        // auto: vsock unless the kernel is known to lack it.
        assert_eq!(r(A::Auto, None, None), Ok(R::Vsock));
        assert_eq!(r(A::Auto, Some(true), Some(true)), Ok(R::Vsock));
        assert_eq!(r(A::Auto, Some(false), None), Ok(R::Console));
        assert_eq!(r(A::Auto, Some(false), Some(true)), Ok(R::Console));
        assert!(r(A::Auto, Some(false), Some(false))
            .unwrap_err()
            .to_string()
            .contains("neither vsock"));
        // A channel chosen by name is kept unless the kernel cannot have it.
        assert_eq!(r(A::Console, Some(true), None), Ok(R::Console));
        assert_eq!(r(A::Vsock, None, Some(false)), Ok(R::Vsock));
        let e = r(A::Vsock, Some(false), None).unwrap_err().to_string();
        assert!(
            e.contains("agent_channel = \"vsock\"")
                && e.contains("set agent_channel = \"console\""),
            "{e}"
        );
        let e = r(A::Console, None, Some(false)).unwrap_err().to_string();
        assert!(e.contains("CONFIG_VIRTIO_CONSOLE"), "{e}");
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
