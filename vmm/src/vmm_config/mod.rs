//! User-facing VM configuration, validated before anything is built.

pub mod boot_source;
pub mod drive;
pub mod machine_config;
pub mod net;
pub mod transport;

pub use crate::devices::virtio::net::PortPlug;
pub use boot_source::{BootSource, KernelImage};
pub use drive::DriveConfig;
pub use machine_config::MachineConfig;
pub use net::{NetConfig, NicSlot};
pub use transport::VirtioTransportKind;

use std::sync::Arc;

pub use crate::devices::virtio::block::BlockSlot;

pub use crate::devices::virtio::console::ConsoleHost;
pub use crate::devices::virtio::rng::RngConfig;
pub use crate::devices::virtio::vsock::VsockHost;

/// Everything needed to build a VM.
#[derive(Clone, Debug)]
pub struct VmConfig {
    /// vCPUs, memory, CPU template.
    pub machine: MachineConfig,
    /// Kernel, initrd, command line.
    pub boot: BootSource,
    /// Bytes of console output kept in the log.
    pub console_log_bytes: usize,
    /// Disks, in attach order (the guest sees vda, vdb, ...).
    pub drives: Vec<DriveConfig>,
    /// Disk slots (after the nets; the guest's next vdX names, as no other
    /// virtio-blk device comes between): empty
    /// virtio-blk devices, or holding a medium (a restore), whose medium the
    /// host changes while the guest runs (`devices::virtio::block::slot`).
    pub disk_slots: Vec<Arc<BlockSlot>>,
    /// A virtio-rng device (after the disks), seeded or from host randomness.
    pub rng: Option<RngConfig>,
    /// A virtio-vsock device (after the rng). The handle carries the guest
    /// CID; keep a clone to connect and listen, across resets too.
    pub vsock: Option<VsockHost>,
    /// A virtio-console device with the agent's named port (after the
    /// vsock): the agent's channel for kernels without vsock. Keep a clone
    /// of the handle to connect, across resets too.
    pub console: Option<ConsoleHost>,
    /// virtio-net devices (after the console), one per switch port, announced
    /// in this order (the guest's eth0, eth1, ...).
    pub nets: Vec<NetConfig>,
    /// The transport every virtio device goes on (virtio-mmio or virtio-pci).
    pub transport: VirtioTransportKind,
    /// NIC slots (after the disk slots): virtio-net devices whose port the host
    /// swaps while the guest runs (`devices::virtio::net::plug`).
    pub nic_slots: Vec<NicSlot>,
    /// Boot timing (`boot_timer.rs`): the VMM stamps its marks into this
    /// handle and puts its port on the PIO bus. Keep a clone to read them.
    pub boot_timer: Option<crate::boot_timer::BootTimer>,
    /// The agent wire protocol version recorded in (and required of)
    /// snapshots: the harness sets its `PROTOCOL_VERSION`, so a snapshot
    /// whose agent state another protocol wrote is refused by name.
    pub protocol_version: u32,
    /// How the guest kernel finds the virtio-mmio devices (the ACPI tables
    /// are there either way).
    pub device_discovery: DeviceDiscovery,
    /// Where a boot takes its RAM and KVM VM ready-made, if one is ready
    /// (`vstate/prepared.rs`); `None` builds them on the boot's path.
    /// Give every VM of a run the same pool.
    pub prepared: Option<crate::vstate::prepared::PreparedVms>,
}

/// How a guest kernel finds the virtio-mmio devices (docs/vmm.md, "ACPI").
/// Never both: a kernel with ACPI and `CONFIG_VIRTIO_MMIO_CMDLINE_DEVICES`
/// given both would create every device twice.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum DeviceDiscovery {
    /// Each window is a `LNRO0005` device in the DSDT and the command line
    /// gets no `virtio_mmio.device=` words: what a stock kernel with ACPI
    /// and virtio-mmio needs.
    Acpi,
    /// The command line announces each window (`virtio_mmio.device=`,
    /// needs `CONFIG_VIRTIO_MMIO_CMDLINE_DEVICES`) and the DSDT leaves them
    /// out: for kernels without ACPI and for guests that read the command
    /// line themselves (the tiny test guest).
    #[default]
    Cmdline,
}

impl VmConfig {
    /// A config with default machine settings and console size.
    pub fn new(boot: BootSource) -> VmConfig {
        VmConfig {
            machine: MachineConfig::default(),
            boot,
            console_log_bytes: crate::console::DEFAULT_LOG_CAPACITY_BYTES,
            drives: Vec::new(),
            rng: None,
            vsock: None,
            console: None,
            nets: Vec::new(),
            transport: VirtioTransportKind::default(),
            nic_slots: Vec::new(),
            disk_slots: Vec::new(),
            boot_timer: None,
            protocol_version: 0,
            device_discovery: DeviceDiscovery::default(),
            prepared: None,
        }
    }

    /// How many virtio devices the VM gets ([`crate::builder`]'s attach
    /// order: disks, rng, vsock, console, nets, disk slots, NIC slots); at
    /// most [`VirtioTransportKind::max_devices`] of its transport build.
    pub fn virtio_device_count(&self) -> usize {
        self.drives.len()
            + usize::from(self.rng.is_some())
            + usize::from(self.vsock.is_some())
            + usize::from(self.console.is_some())
            + self.nets.len()
            + self.disk_slots.len()
            + self.nic_slots.len()
    }
}
