//! The KVM VM: memory slots, the in-kernel irqchip (PIC + IOAPIC + LAPICs),
//! the PIT, irqfds.

use std::io;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use kvm_bindings::{
    kvm_clock_data, kvm_irq_routing_entry, kvm_irq_routing_irqchip, kvm_irq_routing_msi,
    kvm_irqchip, kvm_pit_config, kvm_pit_state2, kvm_userspace_memory_region, KvmIrqRouting,
    KVM_IRQCHIP_IOAPIC, KVM_IRQCHIP_PIC_MASTER, KVM_IRQCHIP_PIC_SLAVE, KVM_IRQ_ROUTING_IRQCHIP,
    KVM_IRQ_ROUTING_MSI, KVM_PIT_SPEAKER_DUMMY,
};
use kvm_ioctls::{VcpuFd, VmFd};
use serde::{Deserialize, Serialize};
use vm_memory::{Address, GuestMemoryBackend, GuestMemoryRegion};
use vmm_sys_util::eventfd::EventFd;

use super::kvm::KvmContext;
use crate::arch::layout::KVM_TSS_ADDR;
use crate::guest_memory::GuestMemoryMmap;
use crate::msi::{MsiMessage, MsiRouter};

/// Pins of the in-kernel IOAPIC: GSIs 0-23 route to them (and 0-15 also to
/// the PICs); MSI routes take GSIs from here up.
pub const IOAPIC_PINS: u32 = 24;

/// An error setting up the KVM VM.
#[derive(Debug, thiserror::Error)]
pub enum KvmVmError {
    /// KVM_CREATE_VM failed.
    #[error("KVM_CREATE_VM failed (too many VMs, or out of memory?)")]
    Create(#[source] io::Error),
    /// KVM_SET_TSS_ADDR failed.
    #[error("KVM_SET_TSS_ADDR at {KVM_TSS_ADDR:#x} failed")]
    TssAddress(#[source] io::Error),
    /// KVM_CREATE_IRQCHIP failed.
    #[error("KVM_CREATE_IRQCHIP failed")]
    IrqChip(#[source] io::Error),
    /// KVM_CREATE_PIT2 failed.
    #[error("KVM_CREATE_PIT2 failed")]
    Pit(#[source] io::Error),
    /// KVM_SET_USER_MEMORY_REGION failed.
    #[error("KVM_SET_USER_MEMORY_REGION for slot {slot} at {gpa:#x} failed")]
    MemoryRegion {
        /// Slot number.
        slot: u32,
        /// Guest address.
        gpa: u64,
        /// Cause.
        #[source]
        source: io::Error,
    },
    /// KVM_IRQFD failed.
    #[error("KVM_IRQFD for GSI {gsi} failed")]
    Irqfd {
        /// The GSI.
        gsi: u32,
        /// Cause.
        #[source]
        source: io::Error,
    },
    /// A VM state ioctl (irqchip, PIT, clock) failed while saving or restoring.
    #[error("{ioctl} failed")]
    State {
        /// The ioctl.
        ioctl: &'static str,
        /// Cause.
        #[source]
        source: io::Error,
    },
    /// KVM_CREATE_VCPU failed.
    #[error("KVM_CREATE_VCPU {index} failed")]
    CreateVcpu {
        /// vCPU index.
        index: u8,
        /// Cause.
        #[source]
        source: io::Error,
    },
}

fn io_err(e: kvm_ioctls::Error) -> io::Error {
    io::Error::from_raw_os_error(e.errno())
}

fn state_err(ioctl: &'static str) -> impl Fn(kvm_ioctls::Error) -> KvmVmError {
    move |e| KvmVmError::State {
        ioctl,
        source: io_err(e),
    }
}

/// The VM-wide KVM state a snapshot carries: the in-kernel PICs and IOAPIC,
/// the PIT and kvmclock. Raw kvm structs (kvm-bindings' `serde`); KVM
/// validates them when they are set.
#[derive(Serialize, Deserialize)]
pub struct KvmVmState {
    /// The master 8259.
    pub pic_master: kvm_irqchip,
    /// The slave 8259.
    pub pic_slave: kvm_irqchip,
    /// The IOAPIC (redirection table, IRR).
    pub ioapic: kvm_irqchip,
    /// The i8254 PIT's channels.
    pub pit: kvm_pit_state2,
    /// kvmclock at the snapshot (ns since the VM's clock started).
    pub clock: kvm_clock_data,
    /// The host's CLOCK_REALTIME at the snapshot, in ns since the epoch:
    /// restore advances kvmclock by the time since, so the guest's wall
    /// clock is right again.
    pub realtime_ns: u64,
}

/// CLOCK_REALTIME in ns since the epoch (0 before 1970).
pub fn realtime_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

/// A KVM VM with its irqchip and PIT.
pub struct KvmVm {
    fd: Arc<VmFd>,
    router: Arc<GsiRouter>,
}

/// The VM's GSI routing table: KVM's default irqchip routes for GSIs 0-23
/// plus one MSI route per programmed MSI-X vector. KVM_SET_GSI_ROUTING
/// replaces the whole table, so every update sends both.
pub struct GsiRouter {
    fd: Arc<VmFd>,
    msi: Mutex<BTreeMap<u32, MsiMessage>>,
}

impl GsiRouter {
    /// KVM's default routes (arch/x86/kvm/irq_comm.c): GSI n to IOAPIC pin
    /// n, and GSIs 0-15 also to PIC pin n % 8 of the master or slave.
    fn irqchip_entries() -> Vec<kvm_irq_routing_entry> {
        let entry = |gsi: u32, irqchip: u32, pin: u32| {
            let mut e = kvm_irq_routing_entry {
                gsi,
                type_: KVM_IRQ_ROUTING_IRQCHIP,
                ..Default::default()
            };
            e.u.irqchip = kvm_irq_routing_irqchip { irqchip, pin };
            e
        };
        let mut v = Vec::new();
        for gsi in 0..IOAPIC_PINS {
            v.push(entry(gsi, KVM_IRQCHIP_IOAPIC, gsi));
            if gsi < 16 {
                let pic = if gsi < 8 {
                    KVM_IRQCHIP_PIC_MASTER
                } else {
                    KVM_IRQCHIP_PIC_SLAVE
                };
                v.push(entry(gsi, pic, gsi % 8));
            }
        }
        v
    }
}

impl MsiRouter for GsiRouter {
    fn route(&self, gsi: u32, msg: Option<MsiMessage>) -> io::Result<()> {
        let mut msi = self.msi.lock().unwrap_or_else(|e| e.into_inner());
        match msg {
            Some(m) => msi.insert(gsi, m),
            None => msi.remove(&gsi),
        };
        let mut entries = Self::irqchip_entries();
        for (&gsi, m) in msi.iter() {
            let mut e = kvm_irq_routing_entry {
                gsi,
                type_: KVM_IRQ_ROUTING_MSI,
                ..Default::default()
            };
            e.u.msi = kvm_irq_routing_msi {
                address_lo: m.address as u32,
                address_hi: (m.address >> 32) as u32,
                data: m.data,
                ..Default::default()
            };
            entries.push(e);
        }
        let table = KvmIrqRouting::from_entries(&entries)
            .map_err(|_| io::Error::from_raw_os_error(libc::E2BIG))?;
        self.fd.set_gsi_routing(&table).map_err(io_err)
    }
}

fn create_vm(kvm: &KvmContext) -> Result<VmFd, KvmVmError> {
    kvm.kvm
        .create_vm()
        .map_err(|e| KvmVmError::Create(io_err(e)))
}

/// The TSS address, the in-kernel irqchip and the PIT of a new VM.
fn set_up_devices(fd: &VmFd) -> Result<(), KvmVmError> {
    let tss = usize::try_from(KVM_TSS_ADDR).expect("64-bit host");
    fd.set_tss_address(tss)
        .map_err(|e| KvmVmError::TssAddress(io_err(e)))?;
    fd.create_irq_chip()
        .map_err(|e| KvmVmError::IrqChip(io_err(e)))?;
    let pit = kvm_pit_config {
        flags: KVM_PIT_SPEAKER_DUMMY,
        ..Default::default()
    };
    fd.create_pit2(pit).map_err(|e| KvmVmError::Pit(io_err(e)))
}

/// Registers every region of `mem` as a memory slot of `fd`; `mem` must
/// outlive the VM's use of it.
fn register_regions(fd: &VmFd, mem: &GuestMemoryMmap) -> Result<(), KvmVmError> {
    for (slot, region) in mem.iter().enumerate() {
        let slot = u32::try_from(slot).expect("few regions");
        let gpa = region.start_addr().raw_value();
        let host = mem
            .get_host_address(region.start_addr())
            .expect("a region's start is inside guest memory");
        let r = kvm_userspace_memory_region {
            slot,
            guest_phys_addr: gpa,
            memory_size: region.len(),
            userspace_addr: host as u64,
            flags: 0,
        };
        // SAFETY: the region describes a live mapping of `region.len()` bytes
        // owned by `mem`, which the caller keeps alive while the VM runs.
        unsafe { fd.set_user_memory_region(r) }.map_err(|e| KvmVmError::MemoryRegion {
            slot,
            gpa,
            source: io_err(e),
        })?;
    }
    Ok(())
}

impl KvmVm {
    /// Creates the VM, its in-kernel irqchip and PIT.
    pub fn new(kvm: &KvmContext) -> Result<KvmVm, KvmVmError> {
        let fd = Arc::new(create_vm(kvm)?);
        set_up_devices(&fd)?;
        Ok(KvmVm::of(fd))
    }

    /// [`KvmVm::new`] with `mem` registered ([`KvmVm::register_memory`]),
    /// the registration issued on a second thread while the irqchip and PIT
    /// are created.
    ///
    /// Why: each of these ioctls ends in an expedited SRCU grace period of
    /// the VM (`synchronize_srcu_expedited(&kvm->srcu)`: a memslot swap, an
    /// I/O bus device added), which the calling thread sleeps through until
    /// a kernel worker has run. One after the other they cost one grace
    /// period each; issued together, the kernel's SRCU serves concurrent
    /// requests with a shared grace period. On a loaded 2-CPU kvm_pvm host
    /// the memslot's alone took 6-10 ms, most of a cold boot's setup
    /// (docs/benchmarking.md, "Where vmm_setup goes").
    ///
    /// `mem` must outlive the VM's use of it, as for `register_memory`.
    pub fn with_memory(kvm: &KvmContext, mem: &GuestMemoryMmap) -> Result<KvmVm, KvmVmError> {
        let fd = Arc::new(create_vm(kvm)?);
        let (registered, devices) = std::thread::scope(|s| {
            let slots = s.spawn(|| register_regions(&fd, mem));
            let devices = set_up_devices(&fd);
            (slots.join(), devices)
        });
        devices?;
        match registered {
            Ok(r) => r?,
            // It only issues ioctls; a panic there is a bug, resumed here.
            Err(panic) => std::panic::resume_unwind(panic),
        }
        Ok(KvmVm::of(fd))
    }

    fn of(fd: Arc<VmFd>) -> KvmVm {
        let router = Arc::new(GsiRouter {
            fd: fd.clone(),
            msi: Mutex::new(BTreeMap::new()),
        });
        KvmVm { fd, router }
    }

    /// The VM's GSI routing table, for MSI-X vectors.
    pub fn gsi_router(&self) -> Arc<GsiRouter> {
        self.router.clone()
    }

    /// Registers every region of `mem` as a memory slot.
    ///
    /// `mem` must outlive the VM's use of it: the caller keeps the mapping alive
    /// for as long as this VM (and its vCPUs) exist.
    pub fn register_memory(&self, mem: &GuestMemoryMmap) -> Result<(), KvmVmError> {
        register_regions(&self.fd, mem)
    }

    /// Routes `evt` to `gsi`: a write to the eventfd raises the interrupt.
    pub fn register_irqfd(&self, evt: &EventFd, gsi: u32) -> Result<(), KvmVmError> {
        self.fd
            .register_irqfd(evt, gsi)
            .map_err(|e| KvmVmError::Irqfd {
                gsi,
                source: io_err(e),
            })
    }

    /// Whether the guest has unmasked IOAPIC pin `pin`, i.e. a driver
    /// installed a handler for that GSI (Linux unmasks a pin when an IRQ on
    /// it is requested). Safe while vCPUs run: KVM reads the IOAPIC under
    /// its lock. A pin past the IOAPIC's 24 reads as masked.
    pub fn ioapic_pin_unmasked(&self, pin: u32) -> Result<bool, KvmVmError> {
        /// Bit 16 of a redirection entry: interrupt mask.
        const RTE_MASKED: u64 = 1 << 16;
        let mut c = kvm_irqchip {
            chip_id: KVM_IRQCHIP_IOAPIC,
            ..Default::default()
        };
        self.fd
            .get_irqchip(&mut c)
            .map_err(state_err("KVM_GET_IRQCHIP"))?;
        // SAFETY: chip_id is KVM_IRQCHIP_IOAPIC, so KVM filled the `ioapic`
        // member of the union; every bit pattern is a valid
        // kvm_ioapic_state (plain integers), and `bits` of a redirection
        // entry covers all of its 64 bits.
        let entry = unsafe {
            c.chip
                .ioapic
                .redirtbl
                .get(usize::try_from(pin).unwrap_or(usize::MAX))
                .map(|e| e.bits)
        };
        Ok(entry.is_some_and(|bits| bits & RTE_MASKED == 0))
    }

    /// Saves the irqchip, PIT and clock. Call with every vCPU stopped.
    pub fn save_state(&self) -> Result<KvmVmState, KvmVmError> {
        let chip = |chip_id| -> Result<kvm_irqchip, KvmVmError> {
            let mut c = kvm_irqchip {
                chip_id,
                ..Default::default()
            };
            self.fd
                .get_irqchip(&mut c)
                .map_err(state_err("KVM_GET_IRQCHIP"))?;
            Ok(c)
        };
        Ok(KvmVmState {
            pic_master: chip(KVM_IRQCHIP_PIC_MASTER)?,
            pic_slave: chip(KVM_IRQCHIP_PIC_SLAVE)?,
            ioapic: chip(KVM_IRQCHIP_IOAPIC)?,
            pit: self.fd.get_pit2().map_err(state_err("KVM_GET_PIT2"))?,
            clock: self.fd.get_clock().map_err(state_err("KVM_GET_CLOCK"))?,
            realtime_ns: realtime_ns(),
        })
    }

    /// Loads `state` (from a snapshot file) into this fresh VM: irqchip
    /// (each chip id is forced to the slot it is restored into, whatever the
    /// file says), PIT, and kvmclock advanced by the wall time since the
    /// snapshot, as if the guest had been suspended meanwhile.
    pub fn restore_state(&self, state: &KvmVmState) -> Result<(), KvmVmError> {
        for (mut c, id) in [
            (state.pic_master, KVM_IRQCHIP_PIC_MASTER),
            (state.pic_slave, KVM_IRQCHIP_PIC_SLAVE),
            (state.ioapic, KVM_IRQCHIP_IOAPIC),
        ] {
            c.chip_id = id;
            self.fd
                .set_irqchip(&c)
                .map_err(state_err("KVM_SET_IRQCHIP"))?;
        }
        self.fd
            .set_pit2(&state.pit)
            .map_err(state_err("KVM_SET_PIT2"))?;
        let slept = realtime_ns().saturating_sub(state.realtime_ns);
        let clock = kvm_clock_data {
            clock: state.clock.clock.saturating_add(slept),
            ..Default::default()
        };
        self.fd
            .set_clock(&clock)
            .map_err(state_err("KVM_SET_CLOCK"))?;
        Ok(())
    }

    /// Creates vCPU `index` (its APIC ID).
    pub fn create_vcpu(&self, index: u8) -> Result<VcpuFd, KvmVmError> {
        self.fd
            .create_vcpu(u64::from(index))
            .map_err(|e| KvmVmError::CreateVcpu {
                index,
                source: io_err(e),
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_routes_match_kvms() {
        let e = GsiRouter::irqchip_entries();
        // 24 IOAPIC pins, and the PICs' 16 lines beside the first 16.
        assert_eq!(e.len(), 40);
        let routes: Vec<(u32, u32, u32)> = e
            .iter()
            .map(|r| {
                assert_eq!(r.type_, KVM_IRQ_ROUTING_IRQCHIP);
                // SAFETY: `irqchip` is the member these entries were built with.
                let c = unsafe { r.u.irqchip };
                (r.gsi, c.irqchip, c.pin)
            })
            .collect();
        assert!(routes.contains(&(4, KVM_IRQCHIP_IOAPIC, 4)));
        assert!(routes.contains(&(4, KVM_IRQCHIP_PIC_MASTER, 4)));
        assert!(routes.contains(&(12, KVM_IRQCHIP_PIC_SLAVE, 4)));
        assert!(routes.contains(&(23, KVM_IRQCHIP_IOAPIC, 23)));
        assert!(!routes.iter().any(|r| r.0 >= IOAPIC_PINS));
    }
}
