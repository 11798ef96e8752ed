//! What Provium needs from a guest kernel: the one source for `kernel
//! check`'s rows, the modules the agent loads, and `provium kconfig`'s
//! merge_config.sh fragment (which docs/vmm.md quotes; a test keeps the two
//! equal).

/// A kernel option a need is made of, and the module that provides it when
/// it is `=m` (`None`: it must be built in, e.g. the boot console).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Part {
    pub option: &'static str,
    pub module: Option<&'static str>,
}

const fn part(option: &'static str, module: Option<&'static str>) -> Part {
    Part { option, module }
}

/// One row of `kernel check`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Need {
    /// How the guest finds our virtio devices: one of [`DISCOVERY_ROUTES`].
    Discovery,
    /// The agent's channel: vsock and its virtio transport.
    Vsock,
    Blk,
    Net,
    Rng,
    /// The serial console the harness reads (ttyS0).
    Console8250,
    Devtmpfs,
    Initramfs,
    /// The alternative agent channel (`agent_channel = "console"`).
    VirtioConsole,
}

impl Need {
    /// Every row, in the order `kernel check` prints them.
    pub const ALL: [Need; 9] = [
        Need::Discovery,
        Need::Vsock,
        Need::Blk,
        Need::Net,
        Need::Rng,
        Need::Console8250,
        Need::Devtmpfs,
        Need::Initramfs,
        Need::VirtioConsole,
    ];

    pub fn label(self) -> &'static str {
        match self {
            Need::Discovery => "device discovery",
            Need::Vsock => "vsock + virtio transport",
            Need::Blk => "virtio-blk",
            Need::Net => "virtio-net",
            Need::Rng => "virtio-rng",
            Need::Console8250 => "8250 serial console",
            Need::Devtmpfs => "devtmpfs",
            Need::Initramfs => "initramfs",
            Need::VirtioConsole => "virtio-console (alt. agent channel)",
        }
    }

    /// The options (and modules) of the need; for [`Need::Discovery`] see
    /// [`DISCOVERY_ROUTES`].
    pub fn parts(self) -> &'static [Part] {
        match self {
            Need::Discovery => &[],
            Need::Vsock => {
                const P: &[Part] = &[
                    part("VIRTIO", Some("virtio")),
                    part("VSOCKETS", Some("vsock")),
                    part("VIRTIO_VSOCKETS", Some("vmw_vsock_virtio_transport")),
                ];
                P
            }
            Need::Blk => {
                const P: &[Part] = &[part("VIRTIO_BLK", Some("virtio_blk"))];
                P
            }
            Need::Net => {
                const P: &[Part] = &[part("VIRTIO_NET", Some("virtio_net"))];
                P
            }
            Need::Rng => {
                const P: &[Part] = &[
                    part("HW_RANDOM", Some("rng_core")),
                    part("HW_RANDOM_VIRTIO", Some("virtio_rng")),
                ];
                P
            }
            Need::Console8250 => {
                const P: &[Part] = &[part("SERIAL_8250", None), part("SERIAL_8250_CONSOLE", None)];
                P
            }
            Need::Devtmpfs => {
                const P: &[Part] = &[part("DEVTMPFS", None)];
                P
            }
            Need::Initramfs => {
                const P: &[Part] = &[part("BLK_DEV_INITRD", None)];
                P
            }
            Need::VirtioConsole => {
                const P: &[Part] = &[part("VIRTIO_CONSOLE", Some("virtio_console"))];
                P
            }
        }
    }
}

/// The virtio transport whose devices a discovery route finds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RouteTransport {
    /// virtio-mmio windows (the DSDT's `LNRO0005` entries or the
    /// `virtio_mmio.device=` words).
    Mmio,
    /// virtio-pci functions on the PCI root bus.
    Pci,
}

/// One way the VMM lets a guest find its virtio devices.
#[derive(Debug, Clone, Copy)]
pub struct DiscoveryRoute {
    pub name: &'static str,
    pub transport: RouteTransport,
    /// What the kernel needs for it.
    pub parts: &'static [Part],
}

/// The ways the VMM lets a guest find its virtio devices, in the order
/// `kernel check` prefers them when several work.
pub const DISCOVERY_ROUTES: &[DiscoveryRoute] = &[
    DiscoveryRoute {
        name: "ACPI",
        transport: RouteTransport::Mmio,
        parts: &[part("ACPI", None), part("VIRTIO_MMIO", Some("virtio_mmio"))],
    },
    DiscoveryRoute {
        name: "cmdline virtio-mmio",
        transport: RouteTransport::Mmio,
        parts: &[
            part("VIRTIO_MMIO", Some("virtio_mmio")),
            part("VIRTIO_MMIO_CMDLINE_DEVICES", None),
        ],
    },
    DiscoveryRoute {
        name: "PCI",
        transport: RouteTransport::Pci,
        parts: &[
            part("PCI", None),
            part("PCI_MSI", None),
            part("VIRTIO_PCI", Some("virtio_pci")),
        ],
    },
];

/// `provium kconfig`'s fragment: every option Provium uses, `=y`, with why.
/// `make defconfig kvm_guest.config` plus this passes `kernel check` with
/// everything built in.
pub const KCONFIG_FRAGMENT: &[(&str, &str)] = &[
    (
        "BLK_DEV_INITRD",
        "the harness boots an initrd with the agent appended",
    ),
    ("DEVTMPFS", "the agent mounts /dev"),
    ("PROC_FS", "the agent mounts /proc"),
    ("SYSFS", "the agent mounts /sys"),
    ("TMPFS", "the agent mounts /tmp"),
    ("BINFMT_ELF", "the agent is a static ELF"),
    ("SERIAL_8250", "the console the harness reads (ttyS0)"),
    ("SERIAL_8250_CONSOLE", "kernel messages on ttyS0"),
    ("VIRTIO_MENU", "virtio drivers"),
    ("VIRTIO", "virtio core"),
    ("VIRTIO_MMIO", "the VMM's virtio-mmio devices"),
    (
        "VIRTIO_MMIO_CMDLINE_DEVICES",
        "virtio_mmio.device= words (no ACPI)",
    ),
    ("ACPI", "the VMM's DSDT lists its virtio-mmio devices"),
    ("ACPI_BUTTON", "vm:power_button() through ACPI"),
    (
        "INPUT_EVDEV",
        "the agent reads the power button's KEY_POWER (/dev/input)",
    ),
    ("PCI", "transport = \"pci\""),
    ("PCI_MSI", "virtio-pci interrupts"),
    ("VIRTIO_PCI", "transport = \"pci\""),
    ("NET", "vsock and virtio-net"),
    ("INET", "guest networking"),
    ("UNIX", "the agent's local sockets"),
    ("VSOCKETS", "the agent's channel"),
    ("VIRTIO_VSOCKETS", "the agent's channel (virtio transport)"),
    ("VIRTIO_CONSOLE", "agent_channel = \"console\""),
    ("VIRTIO_BLK", "vm:attach_disk()"),
    ("NETDEVICES", "virtio-net"),
    ("NET_CORE", "virtio-net"),
    ("VIRTIO_NET", "bridges and NICs"),
    ("HW_RANDOM", "virtio-rng"),
    ("HW_RANDOM_VIRTIO", "the seeded entropy source"),
    (
        "SERIO_I8042",
        "vm:power_button() without ACPI (Ctrl+Alt+Del)",
    ),
    ("KEYBOARD_ATKBD", "vm:power_button() without ACPI"),
];

/// The fragment's text, as `provium kconfig` prints it.
pub fn kconfig_fragment() -> String {
    let mut out = String::from(
        "# Provium guest kernel fragment (provium kconfig): everything Provium uses, built in.\n\
         # make defconfig kvm_guest.config, then\n\
         # scripts/kconfig/merge_config.sh -m .config provium.config && make olddefconfig\n",
    );
    for (option, why) in KCONFIG_FRAGMENT {
        out.push_str(&format!("# {why}\nCONFIG_{option}=y\n"));
    }
    out
}

/// The fragment's options as a Markdown list (docs/vmm.md quotes it).
pub fn kconfig_markdown() -> String {
    KCONFIG_FRAGMENT
        .iter()
        .map(|(o, why)| format!("- `CONFIG_{o}`: {why}\n"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_option_a_row_checks_is_in_the_fragment() {
        let in_fragment = |o: &str| KCONFIG_FRAGMENT.iter().any(|(f, _)| *f == o);
        let rows = Need::ALL.iter().flat_map(|n| n.parts().iter());
        let routes = DISCOVERY_ROUTES.iter().flat_map(|r| r.parts.iter());
        for p in rows.chain(routes) {
            assert!(in_fragment(p.option), "{} is not in the fragment", p.option);
        }
        let text = kconfig_fragment();
        assert!(text.contains("CONFIG_VIRTIO_VSOCKETS=y\n"));
        assert!(text.contains("merge_config.sh"));
    }

    /// The probe kernel (scripts/probe-kernel/options) is built with every
    /// option of the fragment.
    #[test]
    fn the_probe_kernel_has_the_whole_fragment() {
        let options = include_str!("../../../scripts/probe-kernel/options");
        for (o, _) in KCONFIG_FRAGMENT {
            assert!(
                options.lines().any(|l| l.trim() == format!("enable {o}")),
                "scripts/probe-kernel/options lacks `enable {o}`"
            );
        }
    }

    /// docs/vmm.md quotes the fragment's list between markers; a change
    /// here must change it there.
    #[test]
    fn docs_vmm_md_quotes_the_fragment() {
        let doc = include_str!("../../../docs/vmm.md");
        let start = "<!-- provium kconfig: begin -->\n";
        let end = "<!-- provium kconfig: end -->";
        let from = doc.find(start).expect("docs/vmm.md has the begin marker") + start.len();
        let to = doc[from..].find(end).expect("and the end marker") + from;
        assert_eq!(&doc[from..to], kconfig_markdown());
    }
}
