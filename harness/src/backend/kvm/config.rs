//! A profile + [`MachineSpec`] → the VMM's `VmConfig` (the one place the
//! harness's shape becomes the VMM's): kernel, initrd (with the
//! agent injected unless the profile says `inject_agent = false`), command
//! line (the reference's rules; on kvm_pvm also the words a Linux guest
//! needs there, [`KVM_PVM_CMDLINE_WORDS`]), sizing, rng seed, the VM's disks
//! (virtio-blk, in attach order, each with its Disk's shared fault set), and
//! the agent's channel: a vsock device, or (profile `agent_channel`) a
//! virtio-console device with the agent's named port, with
//! `provium.agent_channel=console` on the command line so the agent serves
//! there.
//!
//! The injected agent is the static, stripped one harness/build.rs builds
//! (`PROVIUM_GUEST_AGENT` at compile time) unless `PROVIUM_AGENT` names
//! another; see [`locate_guest_agent`].

use std::path::{Path, PathBuf};
use std::sync::Once;

use provium_vmm::initrd::inject::{cmdline_words, merged_initrd, InjectError};
use provium_vmm::initrd::{inject_agent, AgentInjection, BootFile, CpioWriter};
use provium_vmm::vmm_config::{
    ConsoleHost, DeviceDiscovery, RngConfig, VirtioTransportKind, VsockHost,
};

use crate::kernel::needs::RouteTransport;
use crate::kernel::KernelReport;
use provium_vmm::{BootSource, KernelImage, MachineConfig, VmConfig};

use crate::agent_search::{AgentKind, AgentSearch, AgentSearchError};
use crate::backend::local::locate_agent;
use crate::backend::MachineSpec;
use crate::config::profile::{resolve_agent_channel, ResolvedChannel};
use crate::config::{Profile, Transport};
use crate::settings::Settings;

/// Why a profile and spec make no VM config: each names the value and
/// the fix; causes are sources.
#[derive(Debug, thiserror::Error)]
pub enum VmConfigError {
    #[error(
        "profile `{profile}` has no kernel: set `kernel = \"/path/to/bzImage\"` in provium.toml"
    )]
    NoKernel { profile: String },
    #[error("profile `{profile}`: kernel `{}` does not exist (build it, or fix the path)", path.display())]
    KernelMissing { profile: String, path: PathBuf },
    #[error("profile `{profile}`: initrd `{}` does not exist", path.display())]
    InitrdMissing { profile: String, path: PathBuf },
    #[error("profile `{profile}`")]
    Cmdline {
        profile: String,
        #[source]
        source: crate::config::CmdlineFileError,
    },
    /// No agent to inject (it says what was tried and the fix).
    #[error(transparent)]
    Agent(#[from] GuestAgentError),
    #[error(transparent)]
    Inject(#[from] InjectError),
    #[error(
        "agent_overlay_path `{}` is unreadable (fix the path, unset PROVIUM_OVERLAY, or remove \
         the field to use the built agent)",
        path.display()
    )]
    Overlay {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cpus = {cpus} is more than this VMM supports")]
    TooManyCpus { cpus: u32 },
    #[error("cannot set up the vsock device")]
    Vsock(#[source] std::io::Error),
    #[error("cannot set up the virtio-console device")]
    Console(#[source] std::io::Error),
    #[error(transparent)]
    Channel(#[from] crate::config::profile::AgentChannelError),
    /// The kernel's modules the agent must load cannot be packed.
    #[error("profile `{profile}`: the kernel's modules for the agent")]
    Modules {
        profile: String,
        #[source]
        source: crate::kernel::modtree::ModuleError,
    },
}

/// The kernel command-line word that tells the agent which channel the VMM
/// offers (its `auto` reads it; see agent/src/listen.rs).
pub const AGENT_CHANNEL_PARAM: &str = "provium.agent_channel=";

/// Where merged initrds are cached (content-addressed, so sharing is safe):
/// `$PROVIUM_OVERLAY_CACHE`, else `$TMPDIR/provium-agent-overlay-cache`.
pub fn overlay_cache_dir(settings: &Settings) -> PathBuf {
    settings
        .overlay_cache
        .clone()
        .unwrap_or_else(|| std::env::temp_dir().join("provium-agent-overlay-cache"))
}

/// The VMM config for `profile`, and the vsock handle (guest `cid`) to reach it.
pub fn vm_config(
    profile: &Profile,
    opts: &MachineSpec,
    cid: u32,
) -> Result<(VmConfig, VsockHost), VmConfigError> {
    vm_config_with(
        profile,
        opts,
        cid,
        &|| locate_guest_agent(&opts.settings),
        &overlay_cache_dir(&opts.settings),
        opts.settings.host_kvm_pvm,
    )
}

/// [`vm_config`] with the agent locator, the overlay cache and whether the
/// host's KVM is kvm_pvm given.
pub fn vm_config_with(
    profile: &Profile,
    opts: &MachineSpec,
    cid: u32,
    agent: &dyn Fn() -> Result<PathBuf, GuestAgentError>,
    cache: &Path,
    kvm_pvm: bool,
) -> Result<(VmConfig, VsockHost), VmConfigError> {
    let kernel = profile
        .kernel
        .clone()
        .ok_or_else(|| VmConfigError::NoKernel {
            profile: profile.name.clone(),
        })?;
    if !kernel.is_file() {
        return Err(VmConfigError::KernelMissing {
            profile: profile.name.clone(),
            path: kernel,
        });
    }
    if let Some(i) = &profile.initrd {
        if !i.is_file() {
            return Err(VmConfigError::InitrdMissing {
                profile: profile.name.clone(),
                path: i.clone(),
            });
        }
    }
    let cmdline = profile
        .kernel_cmdline(opts.kernel_cmdline.as_deref())
        .map_err(|source| VmConfigError::Cmdline {
            profile: profile.name.clone(),
            source,
        })?;
    let cmdline = if kvm_pvm {
        let (line, added) = with_missing_words(&cmdline, KVM_PVM_CMDLINE_WORDS);
        if !added.is_empty() {
            note_kvm_pvm_words(&added);
        }
        line
    } else {
        cmdline
    };
    let boot = BootSource {
        kernel: KernelImage::Path(kernel.clone()),
        initrd: profile.initrd.clone(),
        cmdline,
    };
    let files: Vec<BootFile> = opts
        .files
        .iter()
        .map(|(path, content)| BootFile {
            path: path.clone(),
            content: content.clone(),
            mode: 0o644,
        })
        .collect();
    // What the kernel has (`kernel check`): the channel `auto` takes, the
    // modules the agent loads and how the kernel finds the devices. A kernel
    // whose image or config cannot be read is unknown (`None`): `auto`
    // stays on vsock and nothing is packed.
    let report = kernel_report(profile, &kernel)?;
    let channel = resolve_agent_channel(
        &profile.name,
        profile.agent_channel,
        report.as_ref().map(KernelReport::vsock_available),
        report.as_ref().map(KernelReport::console_available),
    )?;
    let mut files = files;
    if let (true, Some(r)) = (opts.inject_agent, &report) {
        files.extend(module_boot_files(&r.modules));
    }
    let mut boot = if let (true, Some(overlay)) = (opts.inject_agent, &profile.agent_overlay_path) {
        prebuilt_overlay_boot(&boot, overlay, &files, cache)?
    } else if opts.inject_agent {
        let inj = AgentInjection {
            agent: agent()?,
            files,
            cache_dir: cache.to_path_buf(),
        };
        let mut boot = inject_agent(&boot, &inj)?;
        // Tell the agent where the VMM's boot timer is: it writes the
        // "ready" mark there once it can take our Hello, which is what
        // `provium bench boot --until ready` times. Appended last so it
        // wins over any profile value (the agent takes the last one).
        boot.cmdline = format!(
            "{} provium.boot_timer={:#x}",
            boot.cmdline,
            provium_vmm::boot_timer::BOOT_TIMER_PORT
        );
        boot
    } else if !files.is_empty() {
        // No agent, but the files must still be there before init runs.
        let overlay = files_cpio(&files)?;
        let initrd = merged_initrd(boot.initrd.as_deref(), &overlay, cache)?;
        BootSource {
            initrd: Some(initrd),
            ..boot
        }
    } else {
        boot
    };
    let mem_size_mib = opts.memory_bytes.div_ceil(1 << 20);
    let vcpu_count =
        u8::try_from(opts.cpus).map_err(|_| VmConfigError::TooManyCpus { cpus: opts.cpus })?;
    if channel == ResolvedChannel::Console {
        // Appended last, so it wins over a profile's own word.
        boot.cmdline = format!("{} {AGENT_CHANNEL_PARAM}console", boot.cmdline);
    }
    let vsock = VsockHost::new(u64::from(cid)).map_err(VmConfigError::Vsock)?;
    let mut cfg = VmConfig::new(boot);
    cfg.machine = MachineConfig {
        vcpu_count,
        mem_size_mib,
        ..MachineConfig::default()
    };
    cfg.device_discovery = device_discovery(&cfg.boot.cmdline, &kernel, report.as_ref());
    cfg.drives = super::devices::drive_configs(&opts.disks);
    cfg.rng = Some(RngConfig {
        seed: opts.rng_seed,
    });
    // One channel device: the agent serves on the one the VMM offers.
    match channel {
        ResolvedChannel::Vsock => cfg.vsock = Some(vsock.clone()),
        ResolvedChannel::Console => {
            cfg.console = Some(ConsoleHost::new().map_err(VmConfigError::Console)?);
        }
    }
    // Snapshots record (and restores require) the agent protocol this
    // harness speaks.
    cfg.protocol_version = provium_protocol::PROTOCOL_VERSION;
    cfg.nets = super::devices::net_configs(&opts.nics);
    cfg.boot_timer = opts.boot_timer.clone();
    cfg.transport = virtio_transport(profile.transport, report.as_ref());
    Ok((cfg, vsock))
}

/// The virtio transport a boot puts its devices on: the profile's, or for
/// `auto` the one `kernel check` finds the kernel can use, virtio-mmio
/// first (docs/vmm.md, "PCI", says why). A kernel whose config cannot be
/// read, or that finds neither, gets virtio-mmio (a boot without Hello then
/// quotes the check's verdict).
pub fn virtio_transport(profile: Transport, report: Option<&KernelReport>) -> VirtioTransportKind {
    match profile {
        Transport::Mmio => VirtioTransportKind::Mmio,
        Transport::Pci => VirtioTransportKind::Pci,
        Transport::Auto => match report {
            Some(r)
                if !r.transports.contains(&RouteTransport::Mmio)
                    && r.transports.contains(&RouteTransport::Pci) =>
            {
                VirtioTransportKind::Pci
            }
            _ => VirtioTransportKind::Mmio,
        },
    }
}

/// Where the agent finds the modules it loads (agent/src/modules.rs).
pub const GUEST_MODULES_DIR: &str = "/lib/provium/modules";

/// The overlay files of the kernel modules the agent must load before it
/// serves (issue 25, docs/kernels.md): when `kernel check` finds vsock, its
/// transport or our devices as modules, each `.ko` (decompressed, in
/// dependency order) as `GUEST_MODULES_DIR/NN-name.ko`, and the manifest
/// `order`. They are part of the overlay, so the merged initrd's cache key
/// (its content hash) covers them. A kernel whose image or config cannot
/// be read packs nothing (the "no Hello" error then carries `kernel
/// check`'s verdict); a module tree that is there but unusable is an error.
pub fn agent_module_files(
    profile: &Profile,
    kernel: &Path,
) -> Result<Vec<BootFile>, VmConfigError> {
    Ok(kernel_report(profile, kernel)?
        .map(|r| module_boot_files(&r.modules))
        .unwrap_or_default())
}

/// `kernel check` of the profile's kernel: `None` when its image or config
/// cannot be read (nothing is known then); a module tree that is there but
/// unusable is an error naming it.
fn kernel_report(profile: &Profile, kernel: &Path) -> Result<Option<KernelReport>, VmConfigError> {
    use crate::kernel::CheckError;
    match crate::kernel::check(kernel, profile.modules.as_deref()) {
        Ok(r) => Ok(Some(r)),
        Err(CheckError::Modules(source)) => Err(VmConfigError::Modules {
            profile: profile.name.clone(),
            source,
        }),
        Err(CheckError::Image(_) | CheckError::Config(_)) => Ok(None),
    }
}

/// How the kernel finds the virtio-mmio windows (docs/vmm.md, "ACPI"): the
/// DSDT for a kernel with ACPI, the `virtio_mmio.device=` words for one
/// without, never both. Our ACPI machine is hardware-reduced, so a kernel
/// that read the tables has no legacy interrupt numbers: given the words it
/// registers devices whose IRQs it cannot request (their drivers fail with
/// -22). `acpi=off` on the command line makes any kernel one without ACPI.
/// With no config to read, a Linux image (it has a version string) is taken
/// to have ACPI, as every distro kernel does; anything else (the tiny test
/// guest) reads the command line.
pub fn device_discovery(
    cmdline: &str,
    kernel: &Path,
    report: Option<&KernelReport>,
) -> DeviceDiscovery {
    if cmdline.split_whitespace().any(|w| w == "acpi=off") {
        return DeviceDiscovery::Cmdline;
    }
    let acpi = match report {
        Some(r) => r.acpi,
        None => crate::kernel::image::read_image(kernel).is_ok_and(|i| i.release.is_some()),
    };
    if acpi {
        DeviceDiscovery::Acpi
    } else {
        DeviceDiscovery::Cmdline
    }
}

/// [`agent_module_files`]' files for `modules`, in load order.
pub fn module_boot_files(modules: &[crate::kernel::modtree::LoadableModule]) -> Vec<BootFile> {
    if modules.is_empty() {
        return Vec::new();
    }
    let mut order = String::new();
    let mut files = Vec::with_capacity(modules.len() + 1);
    for (i, m) in modules.iter().enumerate() {
        let file = format!("{i:02}-{}.ko", m.name);
        order.push_str(&format!("{file} {}\n", m.name));
        files.push(BootFile {
            path: format!("{GUEST_MODULES_DIR}/{file}"),
            content: m.bytes.clone(),
            mode: 0o644,
        });
    }
    files.push(BootFile {
        path: format!("{GUEST_MODULES_DIR}/order"),
        content: order.into_bytes(),
        mode: 0o644,
    });
    files
}

/// The kernel command-line words a Linux guest needs on kvm_pvm, where
/// `KVM_SET_CPUID2` does not change what the guest sees (DESIGN.md "This
/// machine's KVM"): no XSAVE, no KASLR, a trusted TSC, and the CPUID
/// features the emulator cannot run hidden. The tests' probe profiles use
/// the same line.
pub const KVM_PVM_CMDLINE_WORDS: &[&str] = &[
    "noxsave",
    "nokaslr",
    "tsc=reliable",
    "clearcpuid=308,141,151,145,158,288,298,306,291,296,156,293",
    // Guest user code runs natively on kvm_pvm and its CPUID is the host's,
    // so glibc picks AVX/AVX2/AVX-512 routines, while the guest kernel
    // (noxsave) saves only the FXSAVE state across context switches. On an
    // AMD family 26 host with AVX-512 (2026-12-02) the real-guest tier
    // failed without this word (guest processes killed by SIGSEGV, empty
    // exec output) and passed with it. An unknown `KEY=value` word reaches
    // init as an environment variable, and every process inherits it.
    GLIBC_NO_WIDE_VECTORS,
];

/// The glibc tunable that keeps guest user space to SSE (see
/// [`KVM_PVM_CMDLINE_WORDS`]).
pub const GLIBC_NO_WIDE_VECTORS: &str = "GLIBC_TUNABLES=glibc.cpu.hwcaps=-AVX,-AVX2,-AVX512F,-AVX512CD,-AVX512BW,-AVX512DQ,-AVX512VL,-AVX512ER,-AVX512PF,-FMA,-FMA4,-F16C";

/// `cmdline` with those of `words` it does not have put in front (so a
/// profile written for hardware KVM boots on kvm_pvm unchanged), and the
/// words added. The cmdline's own words win: a word is left out when the
/// kernel's part of the cmdline (before `--`) has one with the same key
/// (the part before `=`, so a profile's `clearcpuid=` or `tsc=` stays the
/// only one), or, for a bare `noX` word, says `X` (`kaslr` keeps KASLR on).
pub fn with_missing_words<'w>(cmdline: &str, words: &[&'w str]) -> (String, Vec<&'w str>) {
    let key = |w: &str| -> String {
        let k = w.split('=').next().unwrap_or(w);
        if w.contains('=') {
            k.to_string()
        } else {
            k.strip_prefix("no").unwrap_or(k).to_string()
        }
    };
    let have: Vec<String> = cmdline_words(cmdline)
        .into_iter()
        .take_while(|w| *w != "--")
        .map(key)
        .collect();
    let added: Vec<&'w str> = words
        .iter()
        .copied()
        .filter(|w| !have.contains(&key(w)))
        .collect();
    if added.is_empty() {
        return (cmdline.to_string(), added);
    }
    let mut line = added.join(" ");
    if !cmdline.trim().is_empty() {
        line.push(' ');
        line.push_str(cmdline.trim_start());
    }
    (line, added)
}

/// Says once per process, on stderr, which words the kvm_pvm host adds.
fn note_kvm_pvm_words(added: &[&str]) {
    static NOTE: Once = Once::new();
    NOTE.call_once(|| {
        eprintln!(
            "provium: kvm_pvm host: adding kernel command-line words {} (guest kernel code is emulated here)",
            added.join(" ")
        );
    });
}

/// The agent from a prebuilt overlay cpio (`agent_overlay_path`, or
/// `PROVIUM_OVERLAY`): its bytes as they are, then the boot opts' `files`,
/// appended to the initrd, with `rdinit=` as for a built overlay. No boot
/// timer word: a prebuilt agent need not know it.
fn prebuilt_overlay_boot(
    boot: &BootSource,
    overlay: &Path,
    files: &[BootFile],
    cache: &Path,
) -> Result<BootSource, VmConfigError> {
    let mut bytes = std::fs::read(overlay).map_err(|source| VmConfigError::Overlay {
        path: overlay.to_path_buf(),
        source,
    })?;
    if !files.is_empty() {
        let pad = (4 - bytes.len() % 4) % 4;
        bytes.extend(std::iter::repeat_n(0u8, pad));
        bytes.extend(files_cpio(files)?);
    }
    let cmdline = provium_vmm::initrd::inject::inject_cmdline(&boot.cmdline)?;
    let initrd = merged_initrd(boot.initrd.as_deref(), &bytes, cache)?;
    Ok(BootSource {
        kernel: boot.kernel.clone(),
        initrd: Some(initrd),
        cmdline,
    })
}

fn files_cpio(files: &[BootFile]) -> Result<Vec<u8>, InjectError> {
    let mut w = CpioWriter::new();
    let mut dirs = Vec::new();
    for f in files {
        w.file_with_parents(&f.path, f.mode, &f.content, &mut dirs)
            .map_err(|source| InjectError::BadFile {
                path: f.path.clone(),
                source,
            })?;
    }
    Ok(w.finish())
}

/// The static agent harness/build.rs built for this harness, if it did
/// (`PROVIUM_SKIP_GUEST_AGENT_BUILD`, or a host that is not x86_64 Linux,
/// skips it).
pub const BUILT_GUEST_AGENT: Option<&str> = option_env!("PROVIUM_GUEST_AGENT");

/// The agent binary to put in the guest. `PROVIUM_AGENT` wins as given;
/// otherwise the static, stripped agent harness/build.rs built (the path it
/// recorded), then the static builds in the running executable's target
/// dir ([`AgentKind::Guest`] candidates of [`crate::agent_search`]), then
/// the local backend's agent if it is static. A dynamically linked agent is
/// refused: a guest initrd need not have its loader and libc.
pub fn locate_guest_agent(settings: &Settings) -> Result<PathBuf, GuestAgentError> {
    if settings.agent.is_some() {
        return Ok(locate_agent(settings)?);
    }
    let candidates = AgentSearch::from(settings).candidates(AgentKind::Guest);
    pick_guest_agent(BUILT_GUEST_AGENT.map(Path::new), &candidates, &|| {
        locate_agent(settings)
    })
}

/// What rebuilds the guest's static agent, for [`GuestAgentError`].
const GUEST_AGENT_FIX: &str = "cargo build -p provium rebuilds it (harness/build.rs builds a \
     static, stripped agent into target/guest-agent; `touch agent/src/main.rs` first if it is \
     gone), or point PROVIUM_AGENT at a static agent the guest can run";

/// No agent a kvm guest can run: what was found, and the fix.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum GuestAgentError {
    /// `PROVIUM_AGENT`'s agent, or the host search, failed.
    #[error(transparent)]
    Search(#[from] AgentSearchError),
    #[error(
        "the agent {} is dynamically linked, and a guest initrd may have no loader or libc for \
         it; {built_state}: {GUEST_AGENT_FIX}",
        found.display()
    )]
    Dynamic { found: PathBuf, built_state: String },
    #[error("no static agent for the guest: {built_state}: {GUEST_AGENT_FIX}")]
    NoStatic {
        built_state: String,
        #[source]
        source: AgentSearchError,
    },
}

/// [`locate_guest_agent`] after `PROVIUM_AGENT`: `built` (the build
/// script's agent), then the first static `candidates`, then `fallback`'s
/// agent if static; else an error that says what was found and the fix.
pub fn pick_guest_agent(
    built: Option<&Path>,
    candidates: &[PathBuf],
    fallback: &dyn Fn() -> Result<PathBuf, AgentSearchError>,
) -> Result<PathBuf, GuestAgentError> {
    if let Some(b) = built {
        if is_static_elf(b) == Some(true) {
            return Ok(b.to_path_buf());
        }
    }
    if let Some(p) = candidates.iter().find(|p| is_static_elf(p) == Some(true)) {
        return Ok(p.clone());
    }
    let built_state = match built {
        Some(b) if b.exists() => format!(
            "the build script's agent {} is not a static ELF",
            b.display()
        ),
        Some(b) => format!("the build script's agent {} is gone", b.display()),
        None => "this harness was built without the static agent (PROVIUM_SKIP_GUEST_AGENT_BUILD)"
            .into(),
    };
    match fallback() {
        Ok(found) if is_static_elf(&found) == Some(true) => Ok(found),
        Ok(found) => Err(GuestAgentError::Dynamic { found, built_state }),
        Err(source) => Err(GuestAgentError::NoStatic {
            built_state,
            source,
        }),
    }
}

/// Whether `path` is an ELF without a `PT_INTERP` (static); `None` if it is
/// not a readable 64-bit ELF.
pub fn is_static_elf(path: &Path) -> Option<bool> {
    let bytes = std::fs::read(path).ok()?;
    if bytes.len() < 64 || &bytes[..4] != b"\x7fELF" || bytes[4] != 2 {
        return None;
    }
    let u64_at = |o: usize| Some(u64::from_le_bytes(bytes.get(o..o + 8)?.try_into().ok()?));
    let u16_at = |o: usize| Some(u16::from_le_bytes(bytes.get(o..o + 2)?.try_into().ok()?));
    let phoff = usize::try_from(u64_at(0x20)?).ok()?;
    let phentsize = usize::from(u16_at(0x36)?);
    let phnum = usize::from(u16_at(0x38)?);
    const PT_INTERP: u32 = 3;
    for i in 0..phnum {
        let o = phoff.checked_add(i.checked_mul(phentsize)?)?;
        let ty = u32::from_le_bytes(bytes.get(o..o + 4)?.try_into().ok()?);
        if ty == PT_INTERP {
            return Some(false);
        }
    }
    Some(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn no_agent() -> Result<PathBuf, GuestAgentError> {
        Err(AgentSearchError::NotFound { tried: vec![] }.into())
    }

    fn cfg(
        p: &Profile,
        opts: &MachineSpec,
        cid: u32,
        dir: &Path,
    ) -> Result<(VmConfig, VsockHost), VmConfigError> {
        vm_config_with(p, opts, cid, &no_agent, &dir.join("cache"), false)
    }

    fn profile(dir: &Path) -> Profile {
        let kernel = dir.join("bzImage");
        std::fs::write(&kernel, provium_vmm::tiny_guest::BZIMAGE).unwrap();
        Profile {
            disk_slots: crate::config::profile::DEFAULT_DISK_SLOTS,
            nic_slots: crate::config::profile::DEFAULT_NIC_SLOTS,
            name: "p".into(),
            kernel: Some(kernel),
            initrd: None,
            cmdline: "quiet".into(),
            cmdline_file: None,
            guest_os: "linux".into(),
            transport: Default::default(),
            inject_agent: true,
            agent_overlay_path: None,
            agent_channel: Default::default(),
            modules: None,
            build: None,
            build_out: dir.into(),
        }
    }

    /// `transport = "auto"` takes virtio-pci for a kernel that has only
    /// that (`defconfig + kvm_guest.config`), virtio-mmio for one that has
    /// it, and virtio-mmio when there is no config to read (the tiny
    /// guest); an explicit transport is kept.
    #[test]
    fn auto_transport_follows_the_kernel() {
        let d = tempfile::tempdir().unwrap();
        let rel = "6.1.0-kvm-guest";
        let kernel = d.path().join("vmlinuz");
        std::fs::write(
            &kernel,
            crate::kernel::image::fake_bzimage(2, 15, &format!("{rel} (x@y) #1"), true, true),
        )
        .unwrap();
        let config = d.path().join(format!("config-{rel}"));
        let pci_only = "CONFIG_ACPI=y\nCONFIG_PCI=y\nCONFIG_PCI_MSI=y\nCONFIG_VIRTIO=y\n\
            CONFIG_VIRTIO_PCI=y\nCONFIG_VSOCKETS=y\nCONFIG_VIRTIO_VSOCKETS=y\n";
        std::fs::write(&config, pci_only).unwrap();
        let report = crate::kernel::check(&kernel, None).unwrap();
        assert_eq!(
            virtio_transport(Transport::Auto, Some(&report)),
            VirtioTransportKind::Pci
        );
        assert_eq!(
            virtio_transport(Transport::Mmio, Some(&report)),
            VirtioTransportKind::Mmio,
            "an explicit transport is the user's"
        );
        std::fs::write(&config, format!("{pci_only}CONFIG_VIRTIO_MMIO=y\n")).unwrap();
        let report = crate::kernel::check(&kernel, None).unwrap();
        assert_eq!(
            virtio_transport(Transport::Auto, Some(&report)),
            VirtioTransportKind::Mmio
        );
        assert_eq!(
            virtio_transport(Transport::Pci, Some(&report)),
            VirtioTransportKind::Pci
        );
        assert_eq!(
            virtio_transport(Transport::Auto, None),
            VirtioTransportKind::Mmio
        );
        // Through the boot's config: the tiny guest has no config.
        let opts = MachineSpec {
            memory_bytes: 64 << 20,
            cpus: 1,
            inject_agent: false,
            ..MachineSpec::default()
        };
        let (c, _) = cfg(&profile(d.path()), &opts, 3, d.path()).unwrap();
        assert_eq!(c.transport, VirtioTransportKind::Mmio);
    }

    /// `agent_channel = "console"`: the VM gets the console device instead
    /// of vsock, and the agent is told so on the command line (last word).
    #[test]
    fn the_console_channel_replaces_vsock() {
        let d = tempfile::tempdir().unwrap();
        let mut p = profile(d.path());
        let opts = MachineSpec {
            memory_bytes: 64 << 20,
            cpus: 1,
            inject_agent: false,
            ..MachineSpec::default()
        };
        let (c, _) = cfg(&p, &opts, 3, d.path()).unwrap();
        assert!(c.vsock.is_some() && c.console.is_none(), "auto: vsock");
        assert!(!c.boot.cmdline.contains(AGENT_CHANNEL_PARAM));
        p.agent_channel = crate::config::profile::AgentChannel::Console;
        let (c, _) = cfg(&p, &opts, 3, d.path()).unwrap();
        assert!(c.vsock.is_none() && c.console.is_some());
        assert!(
            c.boot.cmdline.ends_with(" provium.agent_channel=console"),
            "{}",
            c.boot.cmdline
        );
        p.agent_channel = crate::config::profile::AgentChannel::Vsock;
        let (c, _) = cfg(&p, &opts, 3, d.path()).unwrap();
        assert!(c.vsock.is_some() && c.console.is_none());
    }

    #[test]
    fn sizing_seed_vsock_and_cmdline() {
        let d = tempfile::tempdir().unwrap();
        let p = profile(d.path());
        let opts = MachineSpec {
            memory_bytes: (256 << 20) + 1,
            cpus: 2,
            rng_seed: Some(7),
            ..MachineSpec::default()
        };
        let (c, vsock) = cfg(&p, &opts, 9, d.path()).unwrap();
        assert_eq!(c.machine.mem_size_mib, 257);
        assert_eq!(c.machine.vcpu_count, 2);
        assert_eq!(c.rng.unwrap().seed, Some(7));
        assert_eq!(vsock.guest_cid(), 9);
        assert_eq!(c.boot.cmdline, "quiet console=ttyS0");
        assert!(c.boot.initrd.is_none());
        let opts = MachineSpec {
            kernel_cmdline: Some("x=1".into()),
            memory_bytes: 64 << 20,
            cpus: 1,
            ..MachineSpec::default()
        };
        assert_eq!(
            cfg(&p, &opts, 3, d.path()).unwrap().0.boot.cmdline,
            "x=1 console=ttyS0"
        );
    }

    #[test]
    fn injected_agent_is_told_the_boot_timer_port() {
        let d = tempfile::tempdir().unwrap();
        let p = profile(d.path());
        // A real (static) file stands in for the agent: injection only
        // copies its bytes into the initrd overlay.
        let agent = d.path().join("provium-agent");
        std::fs::write(&agent, b"not really an agent").unwrap();
        let found = || Ok(agent.clone());
        let with = MachineSpec {
            memory_bytes: 64 << 20,
            cpus: 1,
            inject_agent: true,
            ..MachineSpec::default()
        };
        let (c, _) = vm_config_with(&p, &with, 3, &found, &d.path().join("cache"), false).unwrap();
        assert!(
            c.boot.cmdline.ends_with(" provium.boot_timer=0x440"),
            "{}",
            c.boot.cmdline
        );
        assert!(c.boot.cmdline.contains("rdinit="), "{}", c.boot.cmdline);
        let without = MachineSpec {
            inject_agent: false,
            ..with
        };
        let (c, _) =
            vm_config_with(&p, &without, 3, &found, &d.path().join("cache"), false).unwrap();
        assert!(
            !c.boot.cmdline.contains("provium.boot_timer"),
            "{}",
            c.boot.cmdline
        );
    }

    #[test]
    fn a_prebuilt_agent_overlay_is_used_as_it_is() {
        let d = tempfile::tempdir().unwrap();
        let mut p = profile(d.path());
        // A prebuilt overlay: a newc archive holding a stand-in agent.
        let mut w = CpioWriter::new();
        w.file_with_parents(
            "/sbin/provium-agent",
            0o755,
            b"prebuilt agent",
            &mut Vec::new(),
        )
        .unwrap();
        let overlay = d.path().join("agent-overlay.cpio");
        std::fs::write(&overlay, w.finish()).unwrap();
        p.agent_overlay_path = Some(overlay.clone());
        let opts = MachineSpec {
            memory_bytes: 64 << 20,
            cpus: 1,
            inject_agent: true,
            files: vec![("/etc/x.conf".into(), b"k=v\n".to_vec())],
            ..MachineSpec::default()
        };
        // `no_agent`: the built agent is never looked for.
        let (c, _) = cfg(&p, &opts, 3, d.path()).unwrap();
        assert!(
            c.boot.cmdline.contains("rdinit=/sbin/provium-agent"),
            "{}",
            c.boot.cmdline
        );
        let initrd = std::fs::read(c.boot.initrd.unwrap()).unwrap();
        let entries = provium_vmm::initrd::cpio::parse(&initrd).unwrap();
        assert!(entries
            .iter()
            .any(|e| e.name == "sbin/provium-agent" && e.data == b"prebuilt agent"));
        assert!(entries
            .iter()
            .any(|e| e.name == "etc/x.conf" && e.data == b"k=v\n"));
        // A missing overlay names the field and the fix.
        p.agent_overlay_path = Some(d.path().join("missing.cpio"));
        let e = crate::error_chain::flatten(&cfg(&p, &opts, 3, d.path()).unwrap_err());
        assert!(
            e.contains("agent_overlay_path") && e.contains("missing.cpio"),
            "{e}"
        );
    }

    #[test]
    fn nics_become_net_devices_in_order() {
        use provium_netsetup::{MacAddr, Switch, SwitchConfig};
        let d = tempfile::tempdir().unwrap();
        let p = profile(d.path());
        let (a, b) = (
            Switch::new("a", SwitchConfig::default()),
            Switch::new("b", SwitchConfig::default()),
        );
        let nics = vec![
            crate::backend::NicSpec::on_port(std::sync::Arc::new(
                a.attach("v", MacAddr::local(1)).unwrap(),
            )),
            crate::backend::NicSpec::on_port(std::sync::Arc::new(
                b.attach("v", MacAddr::local(2)).unwrap(),
            )),
        ];
        let opts = MachineSpec {
            memory_bytes: 64 << 20,
            cpus: 1,
            nics,
            ..MachineSpec::default()
        };
        let (c, _) = cfg(&p, &opts, 3, d.path()).unwrap();
        let got: Vec<(MacAddr, &str)> = c.nets.iter().map(|n| (n.mac, n.port.bridge())).collect();
        assert_eq!(got, [(MacAddr::local(1), "a"), (MacAddr::local(2), "b")]);
    }

    /// A kernel with vsock as a module: the overlay carries its modules
    /// (dependencies first) and the manifest, and the initrd's name (its
    /// content hash) changes with them.
    #[test]
    fn a_modular_kernels_modules_go_into_the_overlay() {
        use crate::kernel::image::fake_bzimage;
        use crate::kernel::modinfo::fake_ko;
        let d = tempfile::tempdir().unwrap();
        let rel = "6.1.0-1-amd64";
        let boot = d.path().join("boot");
        std::fs::create_dir_all(&boot).unwrap();
        let kernel = boot.join("vmlinuz");
        std::fs::write(
            &kernel,
            fake_bzimage(2, 15, &format!("{rel} (x)"), true, true),
        )
        .unwrap();
        std::fs::write(
            boot.join(format!("config-{rel}")),
            "CONFIG_ACPI=y\nCONFIG_VIRTIO=y\nCONFIG_VIRTIO_MMIO=y\nCONFIG_VSOCKETS=m\n\
             CONFIG_VIRTIO_VSOCKETS=m\nCONFIG_BLK_DEV_INITRD=y\n",
        )
        .unwrap();
        let tree = d.path().join("lib/modules").join(rel);
        std::fs::create_dir_all(&tree).unwrap();
        let ko = |name: &str, deps: &str| {
            fake_ko(&[
                &format!("depends={deps}"),
                &format!("name={name}"),
                &format!("vermagic={rel}"),
            ])
        };
        std::fs::write(tree.join("vsock.ko"), ko("vsock", "")).unwrap();
        std::fs::write(
            tree.join("vmw_vsock_virtio_transport.ko"),
            ko("vmw_vsock_virtio_transport", "vsock"),
        )
        .unwrap();
        let mut p = profile(d.path());
        p.kernel = Some(kernel);
        let agent = d.path().join("agent");
        std::fs::write(&agent, b"AGENT").unwrap();
        let opts = MachineSpec {
            memory_bytes: 64 << 20,
            cpus: 1,
            inject_agent: true,
            ..MachineSpec::default()
        };
        let found = || Ok(agent.clone());
        let cache = d.path().join("cache");
        let (c, _) = vm_config_with(&p, &opts, 3, &found, &cache, false).unwrap();
        let initrd = c.boot.initrd.unwrap();
        let entries = provium_vmm::initrd::cpio::parse(&std::fs::read(&initrd).unwrap()).unwrap();
        let names: Vec<&str> = entries.iter().map(|e| e.name.as_str()).collect();
        assert!(
            names.ends_with(&[
                "lib/provium/modules/00-vsock.ko",
                "lib/provium/modules/01-vmw_vsock_virtio_transport.ko",
                "lib/provium/modules/order"
            ]),
            "{names:?}"
        );
        let order = entries.iter().find(|e| e.name.ends_with("order")).unwrap();
        assert_eq!(
            order.data,
            b"00-vsock.ko vsock\n01-vmw_vsock_virtio_transport.ko vmw_vsock_virtio_transport\n"
        );
        // A changed module is a different initrd.
        std::fs::write(
            tree.join("vsock.ko"),
            ko("vsock", "")
                .into_iter()
                .chain([0u8; 8])
                .collect::<Vec<u8>>(),
        )
        .unwrap();
        let (c2, _) = vm_config_with(&p, &opts, 3, &found, &cache, false).unwrap();
        assert_ne!(c2.boot.initrd.unwrap(), initrd);
        // A module tree of another release is an error naming it.
        p.modules = Some(d.path().join("other"));
        std::fs::create_dir_all(d.path().join("other")).unwrap();
        std::fs::write(
            d.path().join("other/vsock.ko"),
            fake_ko(&["name=vsock", "vermagic=5.10.0 SMP"]),
        )
        .unwrap();
        let e = crate::error_chain::flatten(
            &vm_config_with(&p, &opts, 3, &found, &cache, false).unwrap_err(),
        );
        assert!(
            e.contains("is for release 5.10.0") && e.contains(rel),
            "{e}"
        );
    }

    #[test]
    fn files_without_agent_still_reach_the_initrd() {
        let d = tempfile::tempdir().unwrap();
        let p = profile(d.path());
        let opts = MachineSpec {
            memory_bytes: 64 << 20,
            cpus: 1,
            files: vec![("/etc/x.conf".into(), b"k=v\n".to_vec())],
            ..MachineSpec::default()
        };
        let (c, _) = cfg(&p, &opts, 3, d.path()).unwrap();
        let initrd = std::fs::read(c.boot.initrd.unwrap()).unwrap();
        let entries = provium_vmm::initrd::cpio::parse(&initrd).unwrap();
        assert!(entries
            .iter()
            .any(|e| e.name == "etc/x.conf" && e.data == b"k=v\n"));
        assert!(!c.boot.cmdline.contains("rdinit="));
    }

    #[test]
    fn rdinit_conflict_and_missing_kernel_are_errors() {
        let d = tempfile::tempdir().unwrap();
        let mut p = profile(d.path());
        p.cmdline = "rdinit=/bin/sh".into();
        let agent = d.path().join("agent");
        std::fs::write(&agent, b"\x7fELF").unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&agent, std::fs::Permissions::from_mode(0o755)).unwrap();
        let opts = MachineSpec {
            memory_bytes: 64 << 20,
            cpus: 1,
            inject_agent: true,
            ..MachineSpec::default()
        };
        let with_agent = || Ok(agent.clone());
        let e = vm_config_with(&p, &opts, 3, &with_agent, &d.path().join("cache"), false)
            .map_err(|e| crate::error_chain::flatten(&e))
            .unwrap_err();
        assert!(
            e.contains("rdinit=/bin/sh") && e.contains("inject_agent = false"),
            "{e}"
        );
        p.kernel = Some(d.path().join("nope"));
        let e = crate::error_chain::flatten(&cfg(&p, &opts, 3, d.path()).unwrap_err());
        assert!(e.contains("does not exist"), "{e}");
    }

    /// The disks of a kvm VM reach the VmConfig in attach order, each with
    /// the very fault set its Disk userdata holds: a fault injected through
    /// the Disk fails the VMM block backend's request for the guest.
    #[test]
    fn disks_reach_the_config_in_attach_order_sharing_their_faults() {
        use crate::config::Config;
        use crate::events::EventSender;
        use crate::lua::disk::boot_drives;
        use crate::lua::vm::{Vm, VmSizing};
        use crate::runner::{BackendKind, FileEnv};
        use provium_vmm::devices::virtio::block::request::{Request, RequestType};
        use provium_vmm::devices::virtio::block::DiskImage;
        use provium_vmm::guest_memory::GuestMemoryMmap;
        use std::sync::Arc;
        use vm_memory::{Bytes, GuestAddress};

        let d = tempfile::tempdir().unwrap();
        let p = profile(d.path());
        let env = Arc::new(FileEnv::new(
            "t.test.lua".into(),
            "/t.test.lua".into(),
            Vec::new(),
            Arc::new(Config::default()),
            crate::backend::for_kind(BackendKind::Kvm),
            EventSender::disabled(),
        ));
        let vm = Vm::create(
            env,
            "v".into(),
            "p".into(),
            VmSizing {
                memory_bytes: 64 << 20,
                cpus: 1,
            },
        )
        .unwrap();
        let lua = mlua::Lua::new();
        let mut images = Vec::new();
        for (i, id) in ["data", "logs", "gone"].iter().enumerate() {
            let img = d.path().join(format!("{id}.img"));
            // Sector 0 of each image holds its index, to tell them apart.
            let mut bytes = vec![0u8; 8 * 512];
            bytes[0] = u8::try_from(i).unwrap() + 1;
            std::fs::write(&img, &bytes).unwrap();
            let opts = lua.create_table().unwrap();
            opts.set("id", *id).unwrap();
            opts.set("image", img.to_str().unwrap()).unwrap();
            vm.attach_disk(&mlua::Value::Table(opts)).unwrap();
            images.push(img);
        }
        let disks = ["data", "logs", "gone"].map(|id| vm.disk(id).unwrap());
        disks[2].detach();
        let boot = boot_drives("v", &disks).unwrap();
        let opts = MachineSpec {
            memory_bytes: 64 << 20,
            cpus: 1,
            disks: boot.specs.clone(),
            ..MachineSpec::default()
        };
        let (c, _) = cfg(&p, &opts, 3, d.path()).unwrap();
        assert_eq!(disks[0].guest_device(), None, "not before the VM is built");
        boot.given_to_guest();
        let ids: Vec<&str> = c.drives.iter().map(|x| x.id.as_str()).collect();
        assert_eq!(
            ids,
            ["data", "logs"],
            "attach order, the detached disk left out"
        );
        for (i, drive) in c.drives.iter().enumerate() {
            assert_eq!(drive.path, std::fs::canonicalize(&images[i]).unwrap());
            assert!(
                Arc::ptr_eq(&drive.faults, disks[i].faults()),
                "one shared fault set"
            );
        }
        assert_eq!(disks[0].guest_device().as_deref(), Some("/dev/vda"));
        assert_eq!(disks[1].guest_device().as_deref(), Some("/dev/vdb"));
        assert_eq!(disks[2].guest_device(), None);

        // The guest's side: the VMM's block I/O layer over drive 0, as its
        // virtio-blk device executes a guest read of sector 0.
        let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 1 << 20)]).unwrap();
        let drive = &c.drives[0];
        let image = DiskImage::open(&drive.path, drive.read_only, &drive.id).unwrap();
        let read = Request {
            kind: RequestType::In,
            sector: 0,
            data: vec![(GuestAddress(0x1000), 512)],
            status_gpa: GuestAddress(0x3000),
        };
        const IOERR: u8 = 1;
        let done = image.execute(&read, &mem, &drive.faults);
        assert_eq!(done.status, 0);
        assert_eq!(mem.read_obj::<u8>(GuestAddress(0x1000)).unwrap(), 1);
        let fault = mlua::Value::String(lua.create_string("eio_read").unwrap());
        disks[0].fault_inject(&fault).unwrap();
        assert_eq!(image.execute(&read, &mem, &drive.faults).status, IOERR);
        assert_eq!(
            DiskImage::open(&c.drives[1].path, false, "logs")
                .unwrap()
                .execute(&read, &mem, &c.drives[1].faults)
                .status,
            0,
            "faults are per disk"
        );
        disks[0].faults().clear();
        assert_eq!(image.execute(&read, &mem, &drive.faults).status, 0);
        // Shutting the VM down detaches its disks; the guest's requests fail.
        vm.shutdown().unwrap();
        assert!(disks[0].is_detached());
        assert_eq!(image.execute(&read, &mem, &drive.faults).status, IOERR);
    }

    #[test]
    fn kvm_pvm_words_are_added_once_and_the_profiles_win() {
        let all = KVM_PVM_CMDLINE_WORDS.join(" ");
        let (line, added) = with_missing_words("quiet console=ttyS0", KVM_PVM_CMDLINE_WORDS);
        assert_eq!(line, format!("{all} quiet console=ttyS0"));
        assert_eq!(added, KVM_PVM_CMDLINE_WORDS);
        // A line that has them all (the probe profiles') is left as it is.
        let (same, added) =
            with_missing_words(&format!("{all} console=ttyS0"), KVM_PVM_CMDLINE_WORDS);
        assert_eq!(same, format!("{all} console=ttyS0"));
        assert!(added.is_empty());
        // The profile's own values win; only the missing words come in.
        let (line, added) = with_missing_words(
            "tsc=unstable clearcpuid=1 kaslr console=ttyS0",
            KVM_PVM_CMDLINE_WORDS,
        );
        assert_eq!(added, ["noxsave", GLIBC_NO_WIDE_VECTORS]);
        assert_eq!(
            line,
            format!(
                "noxsave {GLIBC_NO_WIDE_VECTORS} tsc=unstable clearcpuid=1 kaslr console=ttyS0"
            )
        );
        // A profile that sets GLIBC_TUNABLES itself keeps its own.
        let (line, added) = with_missing_words(
            "GLIBC_TUNABLES=glibc.malloc.check=3 console=ttyS0",
            &[GLIBC_NO_WIDE_VECTORS],
        );
        assert!(added.is_empty());
        assert_eq!(line, "GLIBC_TUNABLES=glibc.malloc.check=3 console=ttyS0");
        // Words after `--` are init's: they do not count.
        let (line, added) = with_missing_words("ro -- noxsave", &["noxsave"]);
        assert_eq!((line.as_str(), added.len()), ("noxsave ro -- noxsave", 1));
        assert_eq!(with_missing_words("", &["nokaslr"]).0, "nokaslr");
    }

    #[test]
    fn kvm_pvm_hosts_get_the_words_in_the_vm_config() {
        let d = tempfile::tempdir().unwrap();
        let p = profile(d.path());
        let opts = MachineSpec {
            memory_bytes: 64 << 20,
            cpus: 1,
            ..MachineSpec::default()
        };
        let cache = d.path().join("cache");
        let (c, _) = vm_config_with(&p, &opts, 3, &no_agent, &cache, true).unwrap();
        assert_eq!(
            c.boot.cmdline,
            format!("{} quiet console=ttyS0", KVM_PVM_CMDLINE_WORDS.join(" "))
        );
        let (c, _) = vm_config_with(&p, &opts, 3, &no_agent, &cache, false).unwrap();
        assert_eq!(
            c.boot.cmdline, "quiet console=ttyS0",
            "hardware KVM: as written"
        );
    }

    /// A 64-bit ELF header with no program headers: static to
    /// [`is_static_elf`].
    fn fake_static_elf(path: &Path) {
        let mut h = vec![0u8; 64];
        h[..4].copy_from_slice(b"\x7fELF");
        h[4] = 2;
        std::fs::write(path, h).unwrap();
    }

    #[test]
    fn the_build_scripts_agent_comes_first_and_dynamic_ones_are_refused() {
        let d = tempfile::tempdir().unwrap();
        let built = d.path().join("built");
        let cand = d.path().join("candidate");
        fake_static_elf(&built);
        fake_static_elf(&cand);
        let dynamic = std::env::current_exe().unwrap();
        let fallback = || Ok(dynamic.clone());
        let cands = [d.path().join("missing"), cand.clone()];
        assert_eq!(
            pick_guest_agent(Some(&built), &cands, &fallback),
            Ok(built.clone())
        );
        let gone = d.path().join("gone");
        assert_eq!(
            pick_guest_agent(Some(&gone), &cands, &fallback),
            Ok(cand.clone())
        );
        // Nothing static: the (dynamic) local agent is refused with the fix.
        let e = pick_guest_agent(Some(&gone), &[], &fallback)
            .unwrap_err()
            .to_string();
        for want in [
            "is dynamically linked",
            "the build script's agent",
            "is gone",
            "cargo build -p provium",
            "PROVIUM_AGENT",
        ] {
            assert!(e.contains(want), "missing {want:?} in {e}");
        }
        let no_agent_found = AgentSearchError::NotFound {
            tried: vec![d.path().join("nowhere")],
        };
        let e = pick_guest_agent(None, &[], &|| Err(no_agent_found.clone())).unwrap_err();
        let text = crate::error_chain::flatten(&e);
        assert!(
            text.contains("PROVIUM_SKIP_GUEST_AGENT_BUILD")
                && text.contains(&no_agent_found.to_string()),
            "{text}"
        );
        // The search's own error is the cause, printed once, last.
        assert!(
            matches!(&e, GuestAgentError::NoStatic { source, .. } if *source == no_agent_found)
        );
        assert_eq!(text.matches("provium-agent not found").count(), 1, "{text}");
        let fallback_static = || Ok(cand.clone());
        assert_eq!(
            pick_guest_agent(None, &[], &fallback_static),
            Ok(cand.clone())
        );
    }

    /// Whether an ELF has a symbol table section (`SHT_SYMTAB`): a stripped
    /// binary has none.
    fn has_symtab(bytes: &[u8]) -> bool {
        let u64_at = |o: usize| u64::from_le_bytes(bytes[o..o + 8].try_into().unwrap());
        let u16_at = |o: usize| u16::from_le_bytes(bytes[o..o + 2].try_into().unwrap());
        let shoff = usize::try_from(u64_at(0x28)).unwrap();
        let (size, num) = (usize::from(u16_at(0x3a)), usize::from(u16_at(0x3c)));
        (0..num).any(|i| {
            let o = shoff + i * size + 4;
            u32::from_le_bytes(bytes[o..o + 4].try_into().unwrap()) == 2
        })
    }

    /// The normal build (harness/build.rs) made a static, stripped agent.
    #[test]
    fn the_build_script_built_a_static_stripped_agent() {
        let Some(built) = BUILT_GUEST_AGENT else {
            eprintln!(
                "SKIP the_build_script_built_a_static_stripped_agent: this harness was built without it \
                 (PROVIUM_SKIP_GUEST_AGENT_BUILD, or not an x86_64 Linux host)"
            );
            return;
        };
        let path = Path::new(built);
        assert_eq!(is_static_elf(path), Some(true), "{built}");
        let bytes = std::fs::read(path).unwrap();
        assert!(!has_symtab(&bytes), "{built} is not stripped");
        assert!(has_symtab(
            &std::fs::read(std::env::current_exe().unwrap()).unwrap()
        ));
        eprintln!("the guest agent {built}: {} bytes", bytes.len());
    }

    #[test]
    fn static_elf_detection() {
        let me = std::env::current_exe().unwrap();
        // Test binaries are built the normal (dynamic) way.
        assert_eq!(is_static_elf(&me), Some(false));
        let d = tempfile::tempdir().unwrap();
        let f = d.path().join("x");
        std::fs::write(&f, b"#!/bin/sh\n").unwrap();
        assert_eq!(is_static_elf(&f), None);
    }
}
