//! `kernel check`'s verdict on a kernel (and its module tree): one row per
//! need ([`super::needs`]), each built in, module found (where), module
//! missing, or absent, with the fix for the last two; whether a boot can
//! reach the agent; and the modules the agent must load, read and
//! decompressed, in dependency order.
//!
//! The kvm backend calls [`check`] for every boot: its modules go into the
//! agent overlay, and its one-line [`KernelReport::verdict`] goes into the
//! "no Hello" error.

use std::path::{Path, PathBuf};

use super::image::{read_image, ImageError, ImageKind, KernelImageInfo};
use super::kconfig::{read_config, KconfigError, KernelConfig, Tristate};
use super::modtree::{locate, LoadableModule, ModuleError, ModuleTree};
use super::needs::{Need, Part, RouteTransport, DISCOVERY_ROUTES};

/// One row's state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Status {
    BuiltIn,
    /// Every `=m` part's module is in the tree (the files).
    ModuleFound(Vec<PathBuf>),
    /// `=m`, and these modules are not in the tree (or there is no tree).
    ModuleMissing(Vec<String>),
    /// These options are not set (or are `=m` where only `=y` works).
    Absent(Vec<String>),
}

impl Status {
    /// Better states rank higher.
    fn rank(&self) -> u8 {
        match self {
            Status::BuiltIn => 3,
            Status::ModuleFound(_) => 2,
            Status::ModuleMissing(_) => 1,
            Status::Absent(_) => 0,
        }
    }

    /// Whether a boot has it (built in, or a module the agent loads).
    pub fn usable(&self) -> bool {
        self.rank() >= 2
    }
}

/// One printed row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Row {
    pub need: Need,
    pub status: Status,
    /// For discovery: the route(s) that work, e.g. "ACPI".
    pub detail: String,
}

/// Everything `kernel check` found.
#[derive(Debug, Clone)]
pub struct KernelReport {
    pub kernel: PathBuf,
    pub image: KernelImageInfo,
    pub release: String,
    /// Where the config came from.
    pub config_source: String,
    /// The module tree, if one was found.
    pub tree: Option<ModuleTree>,
    pub rows: Vec<Row>,
    /// The modules the agent loads, dependencies first.
    pub modules: Vec<LoadableModule>,
    /// Whether the kernel has ACPI (`CONFIG_ACPI=y`): it then finds the
    /// VMM's devices through the DSDT, and one without needs the
    /// `virtio_mmio.device=` words (vmm_config::DeviceDiscovery).
    pub acpi: bool,
    /// The virtio transports whose devices the kernel can find (built in,
    /// or modules the agent loads): what a profile's `transport = "auto"`
    /// chooses from.
    pub transports: Vec<RouteTransport>,
}

/// Why there is no report (exit 2 of `kernel check`).
#[derive(Debug, thiserror::Error)]
pub enum CheckError {
    #[error(transparent)]
    Image(#[from] ImageError),
    #[error(transparent)]
    Config(#[from] KconfigError),
    #[error(transparent)]
    Modules(#[from] ModuleError),
}

/// Checks the kernel at `kernel`, with its module tree at `modules` or
/// found by the rules of [`super::modtree`].
pub fn check(kernel: &Path, modules: Option<&Path>) -> Result<KernelReport, CheckError> {
    check_with_host(kernel, modules, Path::new("/"))
}

/// [`check`] with the host's root (whose `lib/modules/<release>` is the
/// last place a tree is looked for) given.
pub fn check_with_host(
    kernel: &Path,
    modules: Option<&Path>,
    host_root: &Path,
) -> Result<KernelReport, CheckError> {
    let image = read_image(kernel)?;
    let release = image.release.clone().unwrap_or_else(|| "unknown".into());
    let tree = locate(modules, kernel, &release, host_root)?;
    let elf_bytes = match image.kind {
        ImageKind::Elf => Some(std::fs::read(kernel).map_err(|source| ImageError::Read {
            path: kernel.to_path_buf(),
            source,
        })?),
        ImageKind::BzImage(_) => None,
    };
    let config = read_config(
        kernel,
        elf_bytes.as_deref(),
        &release,
        tree.as_ref().map(|t| t.dir.as_path()),
    )?;
    let rows = rows(&config, tree.as_ref());
    let acpi = config.get("ACPI") == super::kconfig::Tristate::Yes;
    let mut transports = Vec::new();
    for route in DISCOVERY_ROUTES {
        if parts_status(&config, tree.as_ref(), route.parts).usable()
            && !transports.contains(&route.transport)
        {
            transports.push(route.transport);
        }
    }
    let roots: Vec<&str> = agent_roots(&config, tree.as_ref(), &rows);
    let modules = match (&tree, roots.is_empty()) {
        (Some(t), false) => t.resolve(&roots)?,
        _ => Vec::new(),
    };
    Ok(KernelReport {
        kernel: kernel.to_path_buf(),
        image,
        release,
        config_source: config.source.clone(),
        tree,
        rows,
        modules,
        acpi,
        transports,
    })
}

/// The state of a set of parts: absent if any option is unset, missing if
/// any module is not in the tree, found if any is a module, else built in.
fn parts_status(config: &KernelConfig, tree: Option<&ModuleTree>, parts: &[Part]) -> Status {
    let mut absent = Vec::new();
    let mut missing = Vec::new();
    let mut found = Vec::new();
    for p in parts {
        match (config.get(p.option), p.module) {
            (Tristate::Yes, _) => {}
            (Tristate::Module, Some(m)) => {
                if tree.is_some_and(|t| t.is_builtin(m)) {
                    continue;
                }
                match tree.and_then(|t| t.find(m)) {
                    Some(path) => found.push(path.to_path_buf()),
                    None => missing.push(m.to_string()),
                }
            }
            (Tristate::Module, None) => absent.push(format!("CONFIG_{}=y (not =m)", p.option)),
            (Tristate::No, _) => absent.push(format!("CONFIG_{}", p.option)),
        }
    }
    if !absent.is_empty() {
        Status::Absent(absent)
    } else if !missing.is_empty() {
        Status::ModuleMissing(missing)
    } else if !found.is_empty() {
        Status::ModuleFound(found)
    } else {
        Status::BuiltIn
    }
}

fn rows(config: &KernelConfig, tree: Option<&ModuleTree>) -> Vec<Row> {
    Need::ALL
        .iter()
        .map(|&need| {
            if need != Need::Discovery {
                return Row {
                    need,
                    status: parts_status(config, tree, need.parts()),
                    detail: String::new(),
                };
            }
            let routes: Vec<(&str, Status)> = DISCOVERY_ROUTES
                .iter()
                .map(|r| (r.name, parts_status(config, tree, r.parts)))
                .collect();
            let best = routes
                .iter()
                .max_by_key(|(_, s)| s.rank())
                .map(|(_, s)| s.rank())
                .unwrap_or(0);
            let winners: Vec<&(&str, Status)> =
                routes.iter().filter(|(_, s)| s.rank() == best).collect();
            let detail = if best >= 1 {
                let names: Vec<&str> = winners.iter().map(|(n, _)| *n).collect();
                format!("via {}", names.join(", "))
            } else {
                "no route: ACPI, cmdline virtio-mmio or PCI".into()
            };
            Row {
                need,
                status: winners[0].1.clone(),
                detail,
            }
        })
        .collect()
}

/// The modules the agent loads: the `=m` modules of every row whose
/// modules are all in the tree (every discovery route that works, so both
/// transports are there); a row with a module missing packs nothing.
fn agent_roots(
    config: &KernelConfig,
    tree: Option<&ModuleTree>,
    rows: &[Row],
) -> Vec<&'static str> {
    let mut out: Vec<&'static str> = Vec::new();
    let mut add = |parts: &[Part]| {
        for p in parts {
            if let (Tristate::Module, Some(m)) = (config.get(p.option), p.module) {
                if !out.contains(&m) {
                    out.push(m);
                }
            }
        }
    };
    // A route whose module is missing from the tree is not one the guest
    // can use: its row says so; packing stops at what is there.
    for route in DISCOVERY_ROUTES {
        if matches!(
            parts_status(config, tree, route.parts),
            Status::ModuleFound(_)
        ) {
            add(route.parts);
        }
    }
    for row in rows {
        if row.need != Need::Discovery
            && matches!(row.status, Status::ModuleFound(_))
            && !matches!(
                row.need,
                Need::Console8250 | Need::Devtmpfs | Need::Initramfs
            )
        {
            add(row.need.parts());
        }
    }
    out
}

impl KernelReport {
    fn row(&self, need: Need) -> &Row {
        self.rows
            .iter()
            .find(|r| r.need == need)
            .expect("every need has a row")
    }

    /// Whether the agent's vsock channel is there (built in or loadable).
    pub fn vsock_available(&self) -> bool {
        self.row(Need::Vsock).status.usable()
    }

    /// Whether the virtio-console channel is there (built in or loadable).
    pub fn console_available(&self) -> bool {
        self.row(Need::VirtioConsole).status.usable()
    }

    /// Whether a boot can reach the agent: devices found, a channel (vsock,
    /// or virtio-console), an initramfs.
    pub fn can_reach_agent(&self) -> bool {
        self.row(Need::Discovery).status.usable()
            && (self.vsock_available() || self.row(Need::VirtioConsole).status.usable())
            && self.row(Need::Initramfs).status.usable()
    }

    /// The verdict in one line (the "no Hello" error quotes it).
    pub fn verdict(&self) -> String {
        let bad: Vec<String> = self
            .rows
            .iter()
            .filter(|r| !r.status.usable())
            .map(|r| format!("{} {}", r.need.label(), status_word(&r.status)))
            .collect();
        let loaded = if self.modules.is_empty() {
            String::new()
        } else {
            format!("; the agent loads {} module(s)", self.modules.len())
        };
        let head = if self.can_reach_agent() {
            "a boot can reach the agent"
        } else {
            "a boot cannot reach the agent"
        };
        let tail = if bad.is_empty() {
            String::new()
        } else {
            format!(
                " ({}; `provium kernel check` says how to fix it)",
                bad.join(", ")
            )
        };
        format!(
            "kernel check of {} ({}): {head}{tail}{loaded}",
            self.kernel.display(),
            self.release
        )
    }

    /// The table `kernel check` prints.
    pub fn render(&self) -> String {
        let mut out = String::new();
        out.push_str(&format!("kernel   {}\n", self.kernel.display()));
        match &self.image.kind {
            ImageKind::BzImage(h) => out.push_str(&format!(
                "image    bzImage, boot protocol {}.{:02}, 64-bit entry: {}, relocatable: {}\n\
                 version  {}\n",
                h.protocol.0,
                h.protocol.1,
                yes_no(h.entry_64),
                yes_no(h.relocatable),
                h.version
            )),
            ImageKind::Elf => out.push_str("image    ELF vmlinux\n"),
        }
        out.push_str(&format!("release  {}\n", self.release));
        out.push_str(&format!("config   {}\n", self.config_source));
        match &self.tree {
            Some(t) => out.push_str(&format!(
                "modules  {} ({} modules; found as {})\n",
                t.dir.display(),
                t.len(),
                t.found_by
            )),
            None => out.push_str("modules  none found\n"),
        }
        out.push('\n');
        for r in &self.rows {
            let mut line = format!("{:<38} {}", r.need.label(), status_word(&r.status));
            if !r.detail.is_empty() {
                line.push_str(&format!(" {}", r.detail));
            }
            if let Status::ModuleFound(paths) = &r.status {
                let shown: Vec<String> = paths
                    .iter()
                    .map(|p| {
                        self.tree
                            .as_ref()
                            .and_then(|t| p.strip_prefix(&t.dir).ok())
                            .unwrap_or(p)
                            .display()
                            .to_string()
                    })
                    .collect();
                line.push_str(&format!(" ({})", shown.join(", ")));
            }
            if let Some(fix) = self.fix(r) {
                line.push_str(&format!("\n{:<38}   fix: {fix}", ""));
            }
            out.push_str(&line);
            out.push('\n');
        }
        out.push('\n');
        if !self.modules.is_empty() {
            let names: Vec<&str> = self.modules.iter().map(|m| m.name.as_str()).collect();
            out.push_str(&format!("the agent loads, in order: {}\n", names.join(" ")));
        }
        out.push_str(&format!(
            "verdict: {}\n",
            if self.can_reach_agent() {
                "a boot can reach the agent"
            } else {
                "a boot cannot reach the agent"
            }
        ));
        out
    }

    fn fix(&self, r: &Row) -> Option<String> {
        match &r.status {
            Status::BuiltIn | Status::ModuleFound(_) => None,
            Status::ModuleMissing(m) => Some(format!(
                "{} {} =m but not in {}: set the profile's `modules` (or --modules) to this \
                 kernel's lib/modules/{}",
                m.join(", "),
                if m.len() == 1 { "is" } else { "are" },
                self.tree
                    .as_ref()
                    .map_or("any module tree found".into(), |t| t
                        .dir
                        .display()
                        .to_string()),
                self.release
            )),
            Status::Absent(opts) => Some(format!(
                "rebuild with {} (=y, or =m with the module tree; `provium kconfig` prints \
                 everything Provium uses)",
                opts.join(", ")
            )),
        }
    }
}

fn yes_no(b: bool) -> &'static str {
    if b {
        "yes"
    } else {
        "no"
    }
}

fn status_word(s: &Status) -> &'static str {
    match s {
        Status::BuiltIn => "built in",
        Status::ModuleFound(_) => "module found",
        Status::ModuleMissing(_) => "module missing",
        Status::Absent(_) => "absent",
    }
}

#[cfg(test)]
mod tests {
    use super::super::image::fake_bzimage;
    use super::super::modinfo::fake_ko;
    use super::*;

    const REL: &str = "6.1.0-9-amd64";

    /// A Debian-shaped unpacked package: boot/vmlinuz + config, lib/modules.
    fn debian_like(root: &Path, config: &str) -> PathBuf {
        let boot = root.join("boot");
        std::fs::create_dir_all(&boot).unwrap();
        let k = boot.join(format!("vmlinuz-{REL}"));
        std::fs::write(
            &k,
            fake_bzimage(2, 15, &format!("{REL} (x@y) #1"), true, true),
        )
        .unwrap();
        std::fs::write(boot.join(format!("config-{REL}")), config).unwrap();
        let dir = root.join("lib/modules").join(REL).join("kernel");
        std::fs::create_dir_all(&dir).unwrap();
        for (name, deps) in [
            ("virtio", ""),
            ("virtio_ring", ""),
            ("virtio_mmio", "virtio,virtio_ring"),
            ("vsock", ""),
            (
                "vmw_vsock_virtio_transport_common",
                "vsock,virtio,virtio_ring",
            ),
            (
                "vmw_vsock_virtio_transport",
                "vsock,vmw_vsock_virtio_transport_common,virtio,virtio_ring",
            ),
            ("virtio_blk", "virtio,virtio_ring"),
        ] {
            let ko = fake_ko(&[
                &format!("depends={deps}"),
                &format!("name={name}"),
                &format!("vermagic={REL} SMP"),
            ]);
            std::fs::write(dir.join(format!("{name}.ko")), ko).unwrap();
        }
        k
    }

    const DEBIAN: &str = "CONFIG_ACPI=y\nCONFIG_PCI=y\nCONFIG_VIRTIO=m\nCONFIG_VIRTIO_MMIO=m\n\
        CONFIG_VSOCKETS=m\nCONFIG_VIRTIO_VSOCKETS=m\nCONFIG_VIRTIO_BLK=m\nCONFIG_VIRTIO_NET=m\n\
        CONFIG_SERIAL_8250=y\nCONFIG_SERIAL_8250_CONSOLE=y\nCONFIG_DEVTMPFS=y\n\
        CONFIG_BLK_DEV_INITRD=y\nCONFIG_HW_RANDOM=y\n";

    #[test]
    fn a_modular_kernel_reaches_the_agent_with_its_modules_loaded() {
        let d = tempfile::tempdir().unwrap();
        let k = debian_like(d.path(), DEBIAN);
        let r = check_with_host(&k, None, &d.path().join("none")).unwrap();
        // PCI + PCI_MSI + VIRTIO_PCI=m with no virtio_pci.ko: that route is
        // missing a module, and the rest is still packed.
        let with_pci = format!("{DEBIAN}CONFIG_PCI_MSI=y\nCONFIG_VIRTIO_PCI=m\n");
        std::fs::write(d.path().join(format!("boot/config-{REL}")), with_pci).unwrap();
        let r2 = check_with_host(&k, None, &d.path().join("none")).unwrap();
        assert_eq!(
            r2.modules.len(),
            7,
            "{:?}",
            r2.modules.iter().map(|m| &m.name).collect::<Vec<_>>()
        );
        std::fs::write(d.path().join(format!("boot/config-{REL}")), DEBIAN).unwrap();
        let status = |n: Need| r.rows.iter().find(|x| x.need == n).unwrap().clone();
        let disc = status(Need::Discovery);
        assert!(matches!(disc.status, Status::ModuleFound(_)), "{disc:?}");
        assert_eq!(disc.detail, "via ACPI");
        assert!(matches!(status(Need::Vsock).status, Status::ModuleFound(ref p) if p.len() == 3));
        assert!(matches!(status(Need::Blk).status, Status::ModuleFound(_)));
        assert_eq!(
            status(Need::Net).status,
            Status::ModuleMissing(vec!["virtio_net".into()])
        );
        assert_eq!(
            status(Need::Rng).status,
            Status::Absent(vec!["CONFIG_HW_RANDOM_VIRTIO".into()])
        );
        assert_eq!(status(Need::Initramfs).status, Status::BuiltIn);
        assert!(r.vsock_available() && r.can_reach_agent());
        let names: Vec<&str> = r.modules.iter().map(|m| m.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "virtio",
                "virtio_ring",
                "virtio_mmio",
                "vsock",
                "vmw_vsock_virtio_transport_common",
                "vmw_vsock_virtio_transport",
                "virtio_blk"
            ]
        );
        let text = r.render();
        for want in [
            "bzImage, boot protocol 2.15, 64-bit entry: yes, relocatable: yes",
            "release  6.1.0-9-amd64",
            "device discovery",
            "module found via ACPI (kernel/virtio_mmio.ko)",
            "virtio-net                             module missing",
            "fix: virtio_net is =m but not in",
            "fix: rebuild with CONFIG_HW_RANDOM_VIRTIO",
            "verdict: a boot can reach the agent",
        ] {
            assert!(text.contains(want), "missing {want:?} in\n{text}");
        }
        let v = r.verdict();
        assert!(
            v.contains("a boot can reach the agent (virtio-net module missing, virtio-rng absent"),
            "{v}"
        );
    }

    /// The transports a kernel can find devices on: Debian's (virtio-mmio
    /// through ACPI; no VIRTIO_PCI here), `defconfig + kvm_guest.config`
    /// (virtio-pci built in, no virtio-mmio), and one with both.
    #[test]
    fn transports_follow_the_discovery_routes() {
        let d = tempfile::tempdir().unwrap();
        let k = debian_like(d.path(), DEBIAN);
        let none = d.path().join("none");
        let r = check_with_host(&k, None, &none).unwrap();
        assert_eq!(r.transports, [RouteTransport::Mmio]);
        let kvm_guest = "CONFIG_ACPI=y\nCONFIG_PCI=y\nCONFIG_PCI_MSI=y\nCONFIG_VIRTIO=y\n\
            CONFIG_VIRTIO_PCI=y\nCONFIG_VIRTIO_BLK=y\nCONFIG_SERIAL_8250=y\n";
        std::fs::write(d.path().join(format!("boot/config-{REL}")), kvm_guest).unwrap();
        let r = check_with_host(&k, None, &none).unwrap();
        assert_eq!(r.transports, [RouteTransport::Pci]);
        let both = format!("{kvm_guest}CONFIG_VIRTIO_MMIO=y\n");
        std::fs::write(d.path().join(format!("boot/config-{REL}")), both).unwrap();
        let r = check_with_host(&k, None, &none).unwrap();
        assert_eq!(r.transports, [RouteTransport::Mmio, RouteTransport::Pci]);
        // VIRTIO_PCI=m with no virtio_pci.ko in the tree: not usable.
        let missing = format!("{DEBIAN}CONFIG_PCI_MSI=y\nCONFIG_VIRTIO_PCI=m\n");
        std::fs::write(d.path().join(format!("boot/config-{REL}")), missing).unwrap();
        let r = check_with_host(&k, None, &none).unwrap();
        assert_eq!(r.transports, [RouteTransport::Mmio]);
    }

    #[test]
    fn no_vsock_and_no_console_cannot_reach_the_agent() {
        let d = tempfile::tempdir().unwrap();
        let config = DEBIAN.replace("CONFIG_VSOCKETS=m\n", "");
        let k = debian_like(d.path(), &config);
        let r = check_with_host(&k, None, &d.path().join("none")).unwrap();
        assert!(!r.vsock_available() && !r.can_reach_agent());
        assert!(
            r.verdict().contains("cannot reach the agent"),
            "{}",
            r.verdict()
        );
        assert!(r.render().contains("fix: rebuild with CONFIG_VSOCKETS"));
        // A built-in kernel with no tree at all: everything built in.
        let all_y = DEBIAN.replace("=m", "=y") + "CONFIG_VIRTIO_MMIO_CMDLINE_DEVICES=y\n";
        std::fs::write(d.path().join(format!("boot/config-{REL}")), all_y).unwrap();
        std::fs::remove_dir_all(d.path().join("lib")).unwrap();
        let r = check_with_host(&k, None, &d.path().join("none")).unwrap();
        assert!(r.can_reach_agent() && r.modules.is_empty());
        let disc = &r.rows[0];
        assert_eq!(disc.status, Status::BuiltIn);
        assert_eq!(disc.detail, "via ACPI, cmdline virtio-mmio");
    }

    #[test]
    fn unreadable_input_is_an_error() {
        let d = tempfile::tempdir().unwrap();
        let k = d.path().join("notakernel");
        std::fs::write(&k, b"hello").unwrap();
        assert!(matches!(check(&k, None), Err(CheckError::Image(_))));
        std::fs::write(&k, fake_bzimage(2, 15, "6.9 (x)", true, true)).unwrap();
        assert!(matches!(
            check_with_host(&k, None, d.path()),
            Err(CheckError::Config(_))
        ));
    }
}
