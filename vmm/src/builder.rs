//! Builds a running machine from a `VmConfig`: guest RAM, the KVM VM, the
//! kernel (bzImage or ELF through linux-loader), initrd, command line, zero
//! page, page tables and GDT, legacy devices, then configured vCPU threads.
//!
//! A warm reset runs this again: the same path as the first boot.

use std::fs::File;
use std::io::{self, Cursor, Read, Seek};
use std::sync::Arc;

use kvm_ioctls::VcpuFd;
use linux_loader::cmdline::Cmdline;
use linux_loader::configurator::linux::LinuxBootConfigurator;
use linux_loader::configurator::{BootConfigurator, BootParams};
use linux_loader::loader::{load_cmdline, BzImage, Elf, KernelLoader, KernelLoaderResult};
use vm_memory::{Bytes, GuestAddress, GuestMemoryError, ReadVolatile};

use crate::acpi::{AcpiError, AcpiMachine};
use crate::arch::boot_params::{
    build_zero_page, initrd_gpa, BootParamsError, ZeroPageSpec, DEFAULT_INITRD_ADDR_MAX,
};
use crate::arch::layout::{
    ram_ranges, CMDLINE_ADDR, CMDLINE_MAX_BYTES, HIMEM_START, ZERO_PAGE_ADDR,
};
use crate::arch::mptable::{setup_mptable, MptableError};
use crate::arch::regs::write_boot_tables;
use crate::bus::Bus;
use crate::console::Console;
use crate::device_manager::acpi::{attach_acpi_devices, AcpiDevices, AcpiDevicesError};
use crate::device_manager::legacy::{attach_legacy_devices, LegacyDevices, LegacyDevicesError};
use crate::device_manager::mmio::{attach_virtio_device, MmioDevicesError, MmioSlot, MmioSlots};
use crate::device_manager::pci::{PciDevices, PciDevicesError};
use crate::device_manager::VirtioSlot;
use crate::devices::pci::PciRoot;
use crate::devices::virtio::block::{Block, BlockConfig, DiskImage};
use crate::devices::virtio::console::VirtioConsole;
use crate::devices::virtio::net::Net;
use crate::devices::virtio::rng::Rng;
use crate::devices::virtio::vsock::Vsock;
use crate::devices::virtio::VirtioDevice;
use crate::devices::GuestRequestSink;
use crate::vmm_config::machine_config::MachineConfigError;
use crate::vmm_config::{DeviceDiscovery, KernelImage, VirtioTransportKind, VmConfig};
use crate::vstate::kvm::KvmContext;
use crate::vstate::memory::{create_guest_ram, GuestRam, MemoryError};
use crate::vstate::vcpu::{
    configure_vcpu, VcpuBootConfig, VcpuError, VcpuIo, VcpuSet, VcpuStopSink,
};
use crate::vstate::vm::{KvmVm, KvmVmError};

/// Offset of the 64-bit entry (`startup_64`) in a bzImage's protected-mode kernel.
pub const BZIMAGE_STARTUP_64_OFFSET: u64 = 0x200;
/// `xloadflags` bit: the kernel has a 64-bit entry at +0x200.
const XLF_KERNEL_64: u16 = 1;
const ELF_MAGIC: &[u8; 4] = b"\x7fELF";

/// An error building the machine.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    /// Invalid machine shape.
    #[error("invalid machine configuration")]
    Machine(#[source] MachineConfigError),
    /// Guest RAM.
    #[error("cannot create guest memory")]
    Memory(#[source] MemoryError),
    /// The KVM VM.
    #[error("cannot set up the KVM VM")]
    Vm(#[source] KvmVmError),
    /// Opening or reading the kernel or initrd.
    #[error("cannot read {what} {path}")]
    ReadImage {
        /// "kernel" or "initrd".
        what: &'static str,
        /// Its path.
        path: String,
        /// Cause.
        #[source]
        source: io::Error,
    },
    /// linux-loader refused the kernel.
    #[error("cannot load the kernel {path} as {format} (is it a bzImage or an ELF vmlinux?)")]
    LoadKernel {
        /// Its path.
        path: String,
        /// "bzImage" or "ELF".
        format: &'static str,
        /// Cause.
        #[source]
        source: linux_loader::loader::Error,
    },
    /// A bzImage without the 64-bit entry this VMM uses.
    #[error(
        "the kernel {path} has no 64-bit entry point (boot protocol {version:#x}, xloadflags \
         {xloadflags:#x}); build it with CONFIG_X86_64 and boot protocol 2.12 or later"
    )]
    No64BitEntry {
        /// Its path.
        path: String,
        /// Boot protocol version.
        version: u16,
        /// xloadflags.
        xloadflags: u16,
    },
    /// The initrd does not fit.
    #[error(
        "initrd {path} ({size_bytes} bytes) does not fit in guest memory above the kernel \
         (give the VM more memory)"
    )]
    InitrdTooLarge {
        /// Its path.
        path: String,
        /// Its size.
        size_bytes: u64,
    },
    /// Copying the initrd into guest memory failed.
    #[error("cannot copy initrd {path} into guest memory")]
    CopyInitrd {
        /// Its path.
        path: String,
        /// Cause.
        #[source]
        source: GuestMemoryError,
    },
    /// The command line is invalid or too long.
    #[error("invalid kernel command line (at most {max_bytes} bytes, printable ASCII)")]
    Cmdline {
        /// Capacity including the NUL.
        max_bytes: usize,
        /// Cause.
        #[source]
        source: linux_loader::cmdline::Error,
    },
    /// Writing the command line failed.
    #[error("cannot write the command line to guest memory")]
    WriteCmdline(#[source] linux_loader::loader::Error),
    /// Writing page tables or GDT failed.
    #[error("cannot write boot page tables and GDT")]
    BootTables(#[source] GuestMemoryError),
    /// Building or writing the ACPI tables failed.
    #[error("cannot set up the ACPI tables")]
    Acpi(#[source] AcpiError),
    /// The ACPI devices (GED, sleep registers).
    #[error("cannot attach the ACPI devices")]
    AcpiDevices(#[source] AcpiDevicesError),
    /// Writing the MP table failed.
    #[error("cannot write the MP table")]
    Mptable(#[source] MptableError),
    /// Building the zero page failed.
    #[error("cannot build boot_params")]
    ZeroPage(#[source] BootParamsError),
    /// Writing the zero page failed.
    #[error("cannot write boot_params to guest memory")]
    WriteZeroPage(#[source] linux_loader::configurator::Error),
    /// Legacy devices.
    #[error("cannot attach legacy devices")]
    Legacy(#[source] LegacyDevicesError),
    /// A disk image.
    #[error("cannot attach a disk")]
    Drive(#[source] crate::devices::virtio::block::BlockError),
    /// A virtio-mmio slot.
    #[error("cannot attach a virtio device")]
    Virtio(#[source] MmioDevicesError),
    /// The PCI root complex or a virtio-pci slot.
    #[error("cannot attach a virtio-pci device")]
    Pci(#[source] PciDevicesError),
    /// vCPU setup.
    #[error("cannot set up vCPUs")]
    Vcpu(#[source] VcpuError),
    /// Too many vCPUs for KVM.
    #[error("invalid machine configuration for this KVM")]
    VcpuLimit(#[source] MachineConfigError),
}

/// Where things landed in guest memory (all zero for a restored machine,
/// which loaded nothing).
#[derive(Clone, Debug, Default)]
pub struct BootInfo {
    /// Where the kernel was loaded.
    pub kernel_load_gpa: u64,
    /// The 64-bit entry point.
    pub entry_gpa: u64,
    /// End of the loaded kernel.
    pub kernel_end_gpa: u64,
    /// Initrd (gpa, size).
    pub initrd: Option<(u64, u32)>,
    /// The command line as written.
    pub cmdline: String,
}

/// A running machine: one boot of a VM. Fields drop in order: vCPU threads
/// stop before the devices, the VM fd and the memory they use go away.
pub struct Machine {
    /// vCPU threads.
    pub vcpus: VcpuSet,
    /// Legacy devices.
    pub legacy: LegacyDevices,
    /// The ACPI devices (power button event, power-off registers).
    pub acpi: AcpiDevices,
    /// The PIO bus.
    pub pio: Arc<Bus>,
    /// The MMIO bus (virtio-mmio windows, PCI ECAM and BARs).
    pub mmio: Arc<Bus>,
    /// The virtio transports in attach order (also on the buses), for
    /// status and snapshots.
    pub virtio: Vec<VirtioSlot>,
    /// The PCI root complex, when the devices are on virtio-pci.
    pub pci: Option<Arc<std::sync::Mutex<PciRoot>>>,
    /// The KVM VM.
    pub vm: KvmVm,
    /// Guest RAM.
    pub ram: GuestRam,
    /// Load results.
    pub boot: BootInfo,
}

/// The bits of a boot that come from loading the kernel.
struct LoadedKernel {
    result: KernelLoaderResult,
    entry_gpa: u64,
}

fn load_kernel(ram: &GuestRam, img: &KernelImage) -> Result<LoadedKernel, BuildError> {
    match img {
        KernelImage::Path(p) => {
            let path = p.display().to_string();
            let f = File::open(p).map_err(|source| BuildError::ReadImage {
                what: "kernel",
                path: path.clone(),
                source,
            })?;
            load_kernel_from(ram, f, path)
        }
        KernelImage::Bytes(b) => {
            load_kernel_from(ram, Cursor::new(b.clone()), "<in-memory image>".into())
        }
    }
}

fn load_kernel_from<R: Read + ReadVolatile + Seek>(
    ram: &GuestRam,
    mut src: R,
    path: String,
) -> Result<LoadedKernel, BuildError> {
    let read_err = |path: &str, source| BuildError::ReadImage {
        what: "kernel",
        path: path.to_string(),
        source,
    };
    let mut magic = [0u8; 4];
    src.read_exact(&mut magic).map_err(|e| read_err(&path, e))?;
    src.rewind().map_err(|e| read_err(&path, e))?;
    let highmem = Some(GuestAddress(HIMEM_START));
    if &magic == ELF_MAGIC {
        let result = Elf::load(&ram.memory, None, &mut src, highmem).map_err(|source| {
            BuildError::LoadKernel {
                path: path.clone(),
                format: "ELF",
                source,
            }
        })?;
        return Ok(LoadedKernel {
            entry_gpa: result.kernel_load.0,
            result,
        });
    }
    let result = BzImage::load(&ram.memory, None, &mut src, highmem).map_err(|source| {
        BuildError::LoadKernel {
            path: path.clone(),
            format: "bzImage",
            source,
        }
    })?;
    let hdr = result
        .setup_header
        .expect("the bzImage loader returns the setup header");
    let (version, xloadflags) = (hdr.version, hdr.xloadflags);
    if version < 0x20c || xloadflags & XLF_KERNEL_64 == 0 {
        return Err(BuildError::No64BitEntry {
            path,
            version,
            xloadflags,
        });
    }
    Ok(LoadedKernel {
        entry_gpa: result.kernel_load.0 + BZIMAGE_STARTUP_64_OFFSET,
        result,
    })
}

fn load_initrd(
    ram: &GuestRam,
    mem_bytes: u64,
    path: &std::path::Path,
    kernel_end: u64,
    addr_max: u64,
) -> Result<(u64, u32), BuildError> {
    let shown = path.display().to_string();
    let read_err = |source| BuildError::ReadImage {
        what: "initrd",
        path: shown.clone(),
        source,
    };
    let mut f = File::open(path).map_err(read_err)?;
    let size_bytes = f.metadata().map_err(read_err)?.len();
    let too_large = || BuildError::InitrdTooLarge {
        path: shown.clone(),
        size_bytes,
    };
    let size32 = u32::try_from(size_bytes).map_err(|_| too_large())?;
    let gpa = initrd_gpa(&ram_ranges(mem_bytes), kernel_end, size_bytes, addr_max)
        .ok_or_else(too_large)?;
    let len = usize::try_from(size_bytes).map_err(|_| too_large())?;
    ram.memory
        .read_exact_volatile_from(GuestAddress(gpa), &mut f, len)
        .map_err(|source| BuildError::CopyInitrd {
            path: shown.clone(),
            source,
        })?;
    Ok((gpa, size32))
}

/// Puts the boot timer's port on `pio` and lets it watch the console, when
/// the config has one.
pub(crate) fn attach_boot_timer(
    cfg: &VmConfig,
    console: &Arc<Console>,
    pio: &mut Bus,
) -> Result<(), BuildError> {
    if let Some(t) = &cfg.boot_timer {
        use crate::boot_timer::{BOOT_TIMER_PORT, BOOT_TIMER_PORT_LEN};
        pio.insert(
            BOOT_TIMER_PORT,
            BOOT_TIMER_PORT_LEN,
            Arc::new(std::sync::Mutex::new(t.device())),
        )
        .map_err(|e| BuildError::Legacy(LegacyDevicesError::Bus(e)))?;
        console.set_output_observer(Some(Arc::new(t.clone())));
    }
    Ok(())
}

/// The config's virtio devices in attach order (disks, rng, vsock, console,
/// nets, disk slots, NIC slots: devices of the VMs without slots keep their places): the
/// order slots, IRQs and a snapshot's device list follow.
pub(crate) fn virtio_devices(cfg: &VmConfig) -> Result<Vec<Box<dyn VirtioDevice>>, BuildError> {
    let mut devs: Vec<Box<dyn VirtioDevice>> = Vec::new();
    for drive in &cfg.drives {
        let disk =
            DiskImage::open(&drive.path, drive.read_only, &drive.id).map_err(BuildError::Drive)?;
        devs.push(Box::new(Block::new(BlockConfig {
            disk: Arc::new(disk),
            faults: drive.faults.clone(),
        })));
    }
    if let Some(rng) = cfg.rng {
        devs.push(Box::new(Rng::new(rng)));
    }
    if let Some(host) = &cfg.vsock {
        devs.push(Box::new(Vsock::new(host.clone())));
    }
    if let Some(host) = &cfg.console {
        devs.push(Box::new(VirtioConsole::new(host.clone())));
    }
    for nic in &cfg.nets {
        devs.push(Box::new(Net::new(nic.mac, nic.port.clone())));
    }
    for slot in &cfg.disk_slots {
        devs.push(Box::new(Block::in_slot(slot.clone())));
    }
    for slot in &cfg.nic_slots {
        devs.push(Box::new(Net::on_plug(slot.mac, slot.plug.clone())));
    }
    Ok(devs)
}

/// Appends a device's `virtio_mmio.device=` entry to the command line.
fn announce(cmdline: &mut String, slot: &MmioSlot) {
    if !cmdline.is_empty() {
        cmdline.push(' ');
    }
    cmdline.push_str(&slot.cmdline_entry());
}

/// Builds the machine and starts its vCPUs.
pub fn build_and_start(
    kvm: &KvmContext,
    cfg: &VmConfig,
    console: &Arc<Console>,
    requests: Arc<dyn GuestRequestSink>,
    stops: Arc<dyn VcpuStopSink>,
) -> Result<Machine, BuildError> {
    if let Some(t) = &cfg.boot_timer {
        t.begin_boot();
    }
    let m = &cfg.machine;
    m.validate().map_err(BuildError::Machine)?;
    if usize::from(m.vcpu_count) > kvm.max_vcpus {
        return Err(BuildError::VcpuLimit(MachineConfigError::VcpuCountKvm {
            count: m.vcpu_count,
            max: kvm.max_vcpus,
        }));
    }
    let mem_bytes = m.mem_bytes().map_err(BuildError::Machine)?;
    // RAM bound first, as before: the VM (whose memory slots point into
    // it) drops first on an error below.
    let (ram, vm) = match cfg.prepared.as_ref().and_then(|p| p.take(mem_bytes)) {
        Some(prepared) => (prepared.ram, prepared.vm),
        None => {
            let ram = create_guest_ram(mem_bytes).map_err(BuildError::Memory)?;
            let vm = KvmVm::with_memory(kvm, &ram.memory).map_err(BuildError::Vm)?;
            (ram, vm)
        }
    };

    let kernel = load_kernel(&ram, &cfg.boot.kernel)?;
    let hdr = kernel.result.setup_header;
    let initrd_max = match hdr {
        Some(h) if h.version >= 0x203 => u64::from(h.initrd_addr_max),
        _ => DEFAULT_INITRD_ADDR_MAX,
    };
    let initrd = cfg
        .boot
        .initrd
        .as_deref()
        .map(|p| load_initrd(&ram, mem_bytes, p, kernel.result.kernel_end, initrd_max))
        .transpose()?;

    let mut pio = Bus::new();
    let requests_for_acpi = requests.clone();
    let legacy = attach_legacy_devices(&vm, &mut pio, console, requests, None)
        .map_err(BuildError::Legacy)?;
    attach_boot_timer(cfg, console, &mut pio)?;
    let mut mmio = Bus::new();
    let acpi = attach_acpi_devices(&vm, &mut pio, &mut mmio, requests_for_acpi)
        .map_err(BuildError::AcpiDevices)?;
    let mut cmdline_text = cfg.boot.cmdline.clone();
    let mut virtio = Vec::new();
    let mut pci = None;
    let mut acpi_machine = AcpiMachine {
        vcpu_count: m.vcpu_count,
        ..AcpiMachine::default()
    };
    match cfg.transport {
        VirtioTransportKind::Mmio => {
            let mut slots = MmioSlots::default();
            for dev in virtio_devices(cfg)? {
                let a = attach_virtio_device(&mut slots, &vm, &mut mmio, &ram.memory, dev)
                    .map_err(BuildError::Virtio)?;
                // One way to find each window, never both (vmm_config::DeviceDiscovery).
                match cfg.device_discovery {
                    DeviceDiscovery::Acpi => acpi_machine.virtio_mmio.push(a.slot),
                    DeviceDiscovery::Cmdline => announce(&mut cmdline_text, &a.slot),
                }
                virtio.push(VirtioSlot::Mmio(a.transport));
            }
        }
        VirtioTransportKind::Pci => {
            let mut devs = PciDevices::new(&mut pio, &mut mmio).map_err(BuildError::Pci)?;
            for dev in virtio_devices(cfg)? {
                let t = devs
                    .attach(&vm, &ram.memory, dev, None)
                    .map_err(BuildError::Pci)?;
                virtio.push(VirtioSlot::Pci(t));
            }
            // Always in the DSDT, whatever `device_discovery` says of the
            // mmio windows: a Linux kernel that found ACPI tables scans PCI
            // only through the host bridges they list (its legacy 0xCF8
            // probe runs only when ACPI is off), so a table without PCI0
            // would hide every device. A kernel without ACPI probes 0xCF8.
            acpi_machine.pci = Some(crate::acpi::PciHostAcpi::of_root(
                &devs.root.lock().expect("pci root lock"),
            ));
            pci = Some(devs.root);
        }
    }
    let acpi_tables = crate::acpi::build(&acpi_machine).map_err(BuildError::Acpi)?;
    acpi_tables.write(&ram.memory).map_err(BuildError::Acpi)?;

    let cmdline_cap = match hdr {
        Some(h) if h.version >= 0x206 && h.cmdline_size > 0 => CMDLINE_MAX_BYTES.min(
            usize::try_from(h.cmdline_size)
                .unwrap_or(usize::MAX)
                .saturating_add(1),
        ),
        _ => CMDLINE_MAX_BYTES,
    };
    let cmdline =
        Cmdline::try_from(&cmdline_text, cmdline_cap).map_err(|source| BuildError::Cmdline {
            max_bytes: cmdline_cap,
            source,
        })?;
    load_cmdline(&ram.memory, GuestAddress(CMDLINE_ADDR), &cmdline)
        .map_err(BuildError::WriteCmdline)?;
    write_boot_tables(&ram.memory).map_err(BuildError::BootTables)?;
    // Every vCPU is announced here and in the MADT: a kernel without ACPI
    // learns from the MP table that there is more than the boot processor.
    setup_mptable(&ram.memory, m.vcpu_count).map_err(BuildError::Mptable)?;
    let spec = ZeroPageSpec {
        setup_header: hdr,
        cmdline_gpa: CMDLINE_ADDR,
        cmdline_len_bytes: u32::try_from(cmdline_text.len()).expect("bounded by cmdline_cap"),
        initrd,
        acpi_rsdp: Some(acpi_tables.rsdp_gpa()),
    };
    let zero_page = build_zero_page(&spec, &ram_ranges(mem_bytes)).map_err(BuildError::ZeroPage)?;
    LinuxBootConfigurator::write_bootparams(
        &BootParams::new(&zero_page, GuestAddress(ZERO_PAGE_ADDR)),
        &ram.memory,
    )
    .map_err(BuildError::WriteZeroPage)?;

    let mut fds = Vec::with_capacity(usize::from(m.vcpu_count));
    for index in 0..m.vcpu_count {
        let fd = vm.create_vcpu(index).map_err(BuildError::Vm)?;
        let boot = VcpuBootConfig {
            index,
            count: m.vcpu_count,
            template: m.cpu_template,
            entry_gpa: (index == 0).then_some(kernel.entry_gpa),
        };
        configure_vcpu(&fd, kvm, &boot).map_err(BuildError::Vcpu)?;
        fds.push(fd);
    }
    let boot = BootInfo {
        kernel_load_gpa: kernel.result.kernel_load.0,
        entry_gpa: kernel.entry_gpa,
        kernel_end_gpa: kernel.result.kernel_end,
        initrd,
        cmdline: cmdline_text,
    };
    start_machine(
        cfg,
        MachineParts {
            vm,
            ram,
            legacy,
            acpi,
            pio,
            mmio,
            virtio,
            pci,
            vcpu_fds: fds,
            stops,
            boot,
        },
    )
    .map_err(BuildError::Vcpu)
}

/// A configured machine whose vCPUs have not started: what a cold boot
/// (`build_and_start`) and a restore (`persist::restore_and_start`) both
/// arrive at before the one shared last step, [`start_machine`].
pub(crate) struct MachineParts {
    pub vm: KvmVm,
    pub ram: GuestRam,
    pub legacy: LegacyDevices,
    pub acpi: AcpiDevices,
    pub pio: Bus,
    pub mmio: Bus,
    pub virtio: Vec<VirtioSlot>,
    pub pci: Option<Arc<std::sync::Mutex<PciRoot>>>,
    pub vcpu_fds: Vec<VcpuFd>,
    pub stops: Arc<dyn VcpuStopSink>,
    pub boot: BootInfo,
}

/// Marks setup done on the boot timer and starts the vCPU threads: the
/// guest's next instruction runs after this.
pub(crate) fn start_machine(cfg: &VmConfig, parts: MachineParts) -> Result<Machine, VcpuError> {
    let pio = Arc::new(parts.pio);
    let mmio = Arc::new(parts.mmio);
    let io = VcpuIo {
        pio: pio.clone(),
        mmio: mmio.clone(),
        stops: parts.stops,
        boot_timer: cfg.boot_timer.clone(),
        memory: parts.ram.memory.clone(),
    };
    if let Some(t) = &cfg.boot_timer {
        t.mark(crate::boot_timer::BootMark::SetupDone);
    }
    let vcpus = VcpuSet::start(parts.vcpu_fds, io)?;
    Ok(Machine {
        vcpus,
        legacy: parts.legacy,
        acpi: parts.acpi,
        pio,
        mmio,
        virtio: parts.virtio,
        pci: parts.pci,
        vm: parts.vm,
        ram: parts.ram,
        boot: parts.boot,
    })
}

/// Loads `img` into fresh memory of `mem_bytes` without KVM and returns where
/// it landed and its entry point: what `build_and_start` would use. For tests
/// and tools that check an image before booting it.
pub fn probe_kernel(img: &KernelImage, mem_bytes: u64) -> Result<(BootInfo, GuestRam), BuildError> {
    let ram = create_guest_ram(mem_bytes).map_err(BuildError::Memory)?;
    let k = load_kernel(&ram, img)?;
    let info = BootInfo {
        kernel_load_gpa: k.result.kernel_load.0,
        entry_gpa: k.entry_gpa,
        kernel_end_gpa: k.result.kernel_end,
        initrd: None,
        cmdline: String::new(),
    };
    Ok((info, ram))
}
