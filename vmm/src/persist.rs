//! Whole-VM snapshot and restore (Firecracker's `persist.rs` shape).
//!
//! A snapshot is a `provium_snapshot` container with shape `kvm` / guest
//! memory size / vCPU count and three sections:
//!
//! - `vm`: [`MicrovmState`], msgpack: the VM-wide KVM state (PICs, IOAPIC,
//!   PIT, kvmclock), every vCPU's state (registers, sregs, XSAVE, XCRs,
//!   LAPIC, MSRs, events, MP state, debug registers), COM1's registers and
//!   every virtio transport with its device's state, in slot order;
//! - `memory`: guest RAM as a sparse (zero pages skipped), zstd image;
//! - `console`: the tail of the console log;
//!
//! plus any sections the caller adds (the harness's `vm-decl`).
//!
//! Saving pauses every vCPU, quiesces device workers (they hand their
//! queues and in-flight work back), stops the vCPU threads to read their
//! fds, reads RAM through its mappings, writes the file atomically, then
//! restarts workers and vCPU threads: the VM goes on as before.
//!
//! Restoring builds a new machine from the file and the restoring VM's
//! config: the shape (memory, vCPUs) and the device list (types, in order)
//! must match, or the restore is refused by name. Guest RAM is the
//! snapshot's restore image (`<snapshot>.img`, written with the snapshot;
//! built by the first restore where it is missing or stale), copied
//! once per run into a sealed memfd that every VM restored from it maps
//! copy-on-write ([`RestoreRamCache`]), so nothing is decompressed before
//! the guest runs and parallel restores hold the image's pages once. Not restored: vsock connections (the guest gets TRANSPORT_RESET,
//! clients reconnect), host entropy (the rng is reseeded unless `rng_seed`
//! pins it), wall-clock time (kvmclock is advanced by the time the
//! snapshot sat on disk, as after a suspend).
//!
//! The file is untrusted: every size is bounded before allocation, every
//! field validated (queues against guest memory, FIFO lengths, MSR counts)
//! and KVM validates the registers; a bad file is an error that names the
//! problem, never a panic.

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use provium_snapshot::Persist;
use serde::{Deserialize, Serialize};

use crate::builder::{
    attach_boot_timer, start_machine, virtio_devices, BootInfo, BuildError, Machine, MachineParts,
};
use crate::bus::Bus;
use crate::console::Console;
use crate::device_manager::legacy::attach_legacy_devices;
use crate::device_manager::mmio::{attach_restored_virtio_device, MmioSlots};
use crate::device_manager::pci::PciDevices;
use crate::device_manager::{VirtioSlot, VirtioTransportState};
use crate::devices::legacy::serial::SerialDeviceState;
use crate::devices::GuestRequestSink;
use crate::snapshot::memory::DataPages;
use crate::snapshot::{Expect, Shape, Snapshot, SnapshotBuilder, SnapshotError};
use crate::vmm_config::{VirtioTransportKind, VmConfig};
use crate::vstate::kvm::KvmContext;
use crate::vstate::memory::{data_masks, host_parts, MemoryError, RestoreRamCache};
use crate::vstate::vcpu::{
    configure_vcpu, restore_vcpu, save_vcpu, VcpuBootConfig, VcpuError, VcpuSet, VcpuState,
    VcpuStopSink,
};
use crate::vstate::vm::{KvmVm, KvmVmError, KvmVmState};

/// The `backend` a VMM snapshot's shape names.
pub const SNAPSHOT_BACKEND: &str = "kvm";
/// Version of [`MicrovmState`]'s layout. Bump it with any change to a state
/// struct; `tests::state_version_pin` makes a change visible.
pub const VM_STATE_VERSION: u32 = 3;
/// Section names.
pub const VM_SECTION: &str = "vm";
/// The guest memory section.
pub const MEMORY_SECTION: &str = "memory";
/// The console tail section.
pub const CONSOLE_SECTION: &str = "console";
/// The largest `vm` section a restore decodes (a few KiB per vCPU and
/// device in practice): bounds what a file can make the host allocate.
pub const MAX_VM_STATE_BYTES: u64 = 16 << 20;
/// The largest console tail a restore takes.
pub const MAX_CONSOLE_BYTES: u64 = 16 << 20;
/// How long a snapshot waits for vCPUs to pause or stop.
const VCPU_WAIT: Duration = Duration::from_secs(10);

/// Everything but memory and the console.
#[derive(Serialize, Deserialize)]
pub struct MicrovmState {
    /// [`VM_STATE_VERSION`] of the writer.
    pub version: u32,
    /// PICs, IOAPIC, PIT, kvmclock.
    pub vm: KvmVmState,
    /// One per vCPU, in index order.
    pub vcpus: Vec<VcpuState>,
    /// COM1.
    pub serial: SerialDeviceState,
    /// Virtio transports (mmio or pci, all the same) and their devices,
    /// in attach order.
    pub virtio: Vec<VirtioTransportState>,
}

/// Why a snapshot or restore failed.
#[derive(Debug, thiserror::Error)]
pub enum PersistError {
    /// The snapshot container (open, verify, read, write).
    #[error("snapshot file")]
    File(#[source] SnapshotError),
    /// A vCPU could not be saved or restored.
    #[error("vCPU state")]
    Vcpu(#[source] VcpuError),
    /// The irqchip, PIT or clock could not be saved or restored.
    #[error("VM state")]
    Vm(#[source] KvmVmError),
    /// Guest memory could not be mapped from the restore image.
    #[error("guest memory")]
    Memory(#[source] MemoryError),
    /// Building the restored machine's devices or KVM objects failed.
    #[error("cannot rebuild the machine")]
    Build(#[source] BuildError),
    /// A section is larger than any this VMM writes.
    #[error("snapshot {file}: section `{section}` is {len_bytes} bytes decoded, at most {max_bytes} allowed (not a snapshot this VMM wrote)")]
    TooLarge {
        /// The snapshot.
        file: String,
        /// The section.
        section: &'static str,
        /// Its decoded size.
        len_bytes: u64,
        /// The limit.
        max_bytes: u64,
    },
    /// The `vm` section does not decode.
    #[error("snapshot {file}: the VM state does not decode ({detail})")]
    Decode {
        /// The snapshot.
        file: String,
        /// The decoder's message.
        detail: String,
    },
    /// Written by a VMM with another state layout.
    #[error("snapshot {file} has VM state version {found}; this provium reads version {supported} (take the snapshot again)")]
    StateVersion {
        /// The snapshot.
        file: String,
        /// Its version.
        found: u32,
        /// Ours.
        supported: u32,
    },
    /// The snapshot's machine differs from the restoring VM's.
    #[error("snapshot {file} was taken from a different VM shape: {what} (restore it into a VM declared like the one that took it)")]
    Shape {
        /// The snapshot.
        file: String,
        /// What differs.
        what: String,
    },
    /// A vCPU thread panicked before it could be saved.
    #[error("vCPU {0}'s thread is gone; the VM cannot be snapshotted")]
    LostVcpu(u8),
}

/// What a snapshot wrote.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SnapshotStats {
    /// The file's length in bytes.
    pub file_bytes: u64,
    /// Guest memory size in bytes.
    pub memory_bytes: u64,
}

fn file_err(e: SnapshotError) -> PersistError {
    PersistError::File(e)
}

/// The shape of a VM with `cfg`.
pub fn shape_of(cfg: &VmConfig) -> Result<Shape, PersistError> {
    let memory_bytes = cfg
        .machine
        .mem_bytes()
        .map_err(|e| PersistError::Build(BuildError::Machine(e)))?;
    Ok(Shape {
        backend: SNAPSHOT_BACKEND.into(),
        memory_bytes,
        vcpus: u32::from(cfg.machine.vcpu_count),
    })
}

/// Saves `m` to `path`. Every vCPU must be paused; on return (error or not)
/// devices run again and the vCPU threads are back, parked: the caller
/// resumes them if the VM was running.
pub fn save_machine(
    m: &mut Machine,
    kvm: &KvmContext,
    cfg: &VmConfig,
    console: &Console,
    path: &Path,
    extra: &[(&str, Vec<u8>)],
) -> Result<SnapshotStats, PersistError> {
    let virtio: Vec<VirtioTransportState> = m.virtio.iter().map(VirtioSlot::save).collect();
    let r = save_quiesced(m, kvm, cfg, console, path, virtio, extra);
    for t in &m.virtio {
        t.resume_after_save();
    }
    r
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The part of a save that runs with device workers stopped.
fn save_quiesced(
    m: &mut Machine,
    kvm: &KvmContext,
    cfg: &VmConfig,
    console: &Console,
    path: &Path,
    virtio: Vec<VirtioTransportState>,
    extra: &[(&str, Vec<u8>)],
) -> Result<SnapshotStats, PersistError> {
    let serial = lock(&m.legacy.serial).save();
    let io = m.vcpus.io().clone();
    let fds = m
        .vcpus
        .stop_and_take(VCPU_WAIT)
        .map_err(PersistError::Vcpu)?;
    let msr_indices: Vec<u32> = kvm
        .kvm
        .get_msr_index_list()
        .map(|l| l.as_slice().to_vec())
        .unwrap_or_default();
    let mut vcpus = Vec::with_capacity(fds.len());
    let mut live = Vec::with_capacity(fds.len());
    let mut saved = Ok(());
    for (i, fd) in fds.into_iter().enumerate() {
        let index = u8::try_from(i).expect("vCPU count is a u8");
        let Some(mut fd) = fd else {
            saved = saved.and(Err(PersistError::LostVcpu(index)));
            continue;
        };
        if saved.is_ok() {
            match save_vcpu(&mut fd, index, &msr_indices) {
                Ok(s) => vcpus.push(s),
                Err(e) => saved = Err(PersistError::Vcpu(e)),
            }
        }
        live.push(fd);
    }
    // Threads go back on the same fds, parked, whatever happened above.
    m.vcpus = VcpuSet::start_in(live, io, true).map_err(PersistError::Vcpu)?;
    saved?;
    let state = MicrovmState {
        version: VM_STATE_VERSION,
        vm: m.vm.save_state().map_err(PersistError::Vm)?,
        vcpus,
        serial,
        virtio,
    };
    let shape = shape_of(cfg)?;
    let memory_bytes = shape.memory_bytes;
    let mut b = SnapshotBuilder::new(cfg.protocol_version, shape);
    let encoded = rmp_serde::to_vec(&state).map_err(|e| PersistError::Decode {
        file: path.display().to_string(),
        detail: format!("cannot encode: {e}"),
    })?;
    b.add_section(VM_SECTION, &encoded).map_err(file_err)?;
    b.add_section(CONSOLE_SECTION, &console.log())
        .map_err(file_err)?;
    for (name, data) in extra {
        b.add_section(name, data).map_err(file_err)?;
    }
    let parts = host_parts(&m.ram.memory);
    let pages = DataPages::scan(&parts, &data_masks(&m.ram.memory)).map_err(|e| {
        file_err(SnapshotError::InvalidSection {
            name: MEMORY_SECTION.into(),
            reason: format!("cannot encode the memory image: {e}"),
        })
    })?;
    b.add_memory_pages(MEMORY_SECTION, &pages)
        .map_err(file_err)?;
    let file_bytes = b.write_file(path).map_err(file_err)?;
    write_restore_image(&b, path, &pages);
    Ok(SnapshotStats {
        file_bytes,
        memory_bytes,
    })
}

/// Writes the restore image of the snapshot just written at `path` from
/// the pages it holds, so that its first restore finds the image ready
/// instead of decoding the memory section (docs/snapshots.md measures the
/// cost moved here). Best effort: the image is derived data, and without it
/// the first restore builds it as before. A stale image left at that path
/// (another snapshot's) is removed either way.
fn write_restore_image(b: &SnapshotBuilder, path: &Path, pages: &DataPages<'_>) {
    let image = crate::snapshot::image_path(path);
    let written = b
        .section_sha256(MEMORY_SECTION)
        .map(|sha| provium_snapshot::image::write_image(&image, &sha, pages));
    if !matches!(written, Some(Ok(_))) {
        let _ = std::fs::remove_file(&image);
    }
}

/// A section's decoded bytes, refusing one larger than `max`.
fn bounded_section(snap: &Snapshot, name: &'static str, max: u64) -> Result<Vec<u8>, PersistError> {
    let raw_len = snap
        .sections()
        .iter()
        .find(|s| s.name == name)
        .map_or(0, |s| s.raw_len);
    if raw_len > max {
        return Err(PersistError::TooLarge {
            file: snap.origin().into(),
            section: name,
            len_bytes: raw_len,
            max_bytes: max,
        });
    }
    snap.section(name).map_err(file_err)
}

/// Opens `path` for a VM with `cfg`: header, checksums of what it reads,
/// protocol version and shape checked; the `vm` state decoded and matched
/// against the config's vCPUs and devices.
pub fn open_for(cfg: &VmConfig, path: &Path) -> Result<(Snapshot, MicrovmState), PersistError> {
    let expect = Expect::protocol(cfg.protocol_version).with_shape(shape_of(cfg)?);
    let snap = Snapshot::open(path, &expect).map_err(file_err)?;
    let file = snap.origin().to_string();
    let bytes = bounded_section(&snap, VM_SECTION, MAX_VM_STATE_BYTES)?;
    let state: MicrovmState = rmp_serde::from_slice(&bytes).map_err(|e| PersistError::Decode {
        file: file.clone(),
        detail: e.to_string(),
    })?;
    if state.version != VM_STATE_VERSION {
        return Err(PersistError::StateVersion {
            file,
            found: state.version,
            supported: VM_STATE_VERSION,
        });
    }
    if state.vcpus.len() != usize::from(cfg.machine.vcpu_count) {
        return Err(PersistError::Shape {
            file,
            what: format!(
                "{} vCPU states for a VM of {} vCPUs",
                state.vcpus.len(),
                cfg.machine.vcpu_count
            ),
        });
    }
    let devices = cfg.virtio_device_count();
    if state.virtio.len() != devices {
        return Err(PersistError::Shape {
            file,
            what: format!(
                "{} virtio devices in the snapshot, {devices} in this VM (disks, rng, vsock, console, nics, disk slots, NIC slots)",
                state.virtio.len()
            ),
        });
    }
    Ok((snap, state))
}

/// Builds a machine from the snapshot at `path` and starts its vCPUs. Its
/// RAM is the restore image's sealed copy in `ram_cache`, made by the first
/// restore of that image through the cache and shared by the later ones.
pub fn restore_and_start(
    kvm: &KvmContext,
    cfg: &VmConfig,
    console: &Arc<Console>,
    requests: Arc<dyn GuestRequestSink>,
    stops: Arc<dyn VcpuStopSink>,
    path: &Path,
    ram_cache: &RestoreRamCache,
) -> Result<Machine, PersistError> {
    if let Some(t) = &cfg.boot_timer {
        t.begin_boot();
    }
    let m = &cfg.machine;
    m.validate()
        .map_err(|e| PersistError::Build(BuildError::Machine(e)))?;
    let (snap, state) = open_for(cfg, path)?;
    let tail = bounded_section(&snap, CONSOLE_SECTION, MAX_CONSOLE_BYTES)?;
    let image = open_restore_image(&snap, path)?;
    // Keyed by the image's place beside the snapshot even when this restore
    // had to build a private one elsewhere: the content is the same.
    let ram = ram_cache
        .guest_ram(
            &crate::snapshot::image_path(path),
            &image.file,
            image.guest_len_bytes,
            image.data_offset,
            &image.data_sha256,
        )
        .map_err(PersistError::Memory)?;
    let build = PersistError::Build;
    let vm = KvmVm::with_memory(kvm, &ram.memory).map_err(|e| build(BuildError::Vm(e)))?;
    vm.restore_state(&state.vm).map_err(PersistError::Vm)?;

    let mut pio = Bus::new();
    let acpi_requests = requests.clone();
    let legacy = attach_legacy_devices(&vm, &mut pio, console, requests, Some(&state.serial))
        .map_err(|e| build(BuildError::Legacy(e)))?;
    attach_boot_timer(cfg, console, &mut pio).map_err(build)?;
    let mut mmio = Bus::new();
    // The ACPI tables came back with RAM; their devices hold no state.
    let acpi =
        crate::device_manager::acpi::attach_acpi_devices(&vm, &mut pio, &mut mmio, acpi_requests)
            .map_err(|e| build(BuildError::AcpiDevices(e)))?;
    let mut slots = MmioSlots::default();
    let mut pci_devs = match cfg.transport {
        VirtioTransportKind::Mmio => None,
        VirtioTransportKind::Pci => {
            Some(PciDevices::new(&mut pio, &mut mmio).map_err(|e| build(BuildError::Pci(e)))?)
        }
    };
    let mut virtio: Vec<VirtioSlot> = Vec::new();
    for (dev, st) in virtio_devices(cfg)
        .map_err(build)?
        .into_iter()
        .zip(&state.virtio)
    {
        match (st, pci_devs.as_mut()) {
            (VirtioTransportState::Mmio(st), None) => {
                let a =
                    attach_restored_virtio_device(&mut slots, &vm, &mut mmio, &ram.memory, dev, st)
                        .map_err(|e| build(BuildError::Virtio(e)))?;
                virtio.push(VirtioSlot::Mmio(a.transport));
            }
            (VirtioTransportState::Pci(st), Some(p)) => {
                let t = p
                    .attach(&vm, &ram.memory, dev, Some(st))
                    .map_err(|e| build(BuildError::Pci(e)))?;
                virtio.push(VirtioSlot::Pci(t));
            }
            (st, _) => {
                let found = match st {
                    VirtioTransportState::Mmio(_) => "mmio",
                    VirtioTransportState::Pci(_) => "pci",
                };
                return Err(PersistError::Shape {
                    file: path.display().to_string(),
                    what: format!(
                        "its virtio devices are on {found}, this VM puts them on {}",
                        cfg.transport.name()
                    ),
                });
            }
        }
    }
    let pci = pci_devs.map(|p| p.root);

    let mut fds = Vec::with_capacity(state.vcpus.len());
    for (i, vs) in state.vcpus.iter().enumerate() {
        let index = u8::try_from(i).expect("checked against the u8 vCPU count");
        let fd = vm
            .create_vcpu(index)
            .map_err(|e| build(BuildError::Vm(e)))?;
        let boot = VcpuBootConfig {
            index,
            count: m.vcpu_count,
            template: m.cpu_template,
            entry_gpa: None,
        };
        configure_vcpu(&fd, kvm, &boot).map_err(PersistError::Vcpu)?;
        restore_vcpu(&fd, index, vs).map_err(PersistError::Vcpu)?;
        fds.push(fd);
    }
    console.restore_log(&tail);
    for v in &virtio {
        v.release_interrupts();
    }
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
            boot: BootInfo::default(),
        },
    )
    .map_err(PersistError::Vcpu)
}

/// The snapshot's restore image: beside it when that directory is
/// writable, else a private one in the temp directory, unlinked once
/// mapped (this restore pays the decode; the mapping keeps the file).
fn open_restore_image(
    snap: &Snapshot,
    path: &Path,
) -> Result<crate::snapshot::RestoreImage, PersistError> {
    match snap.restore_image(MEMORY_SECTION, &crate::snapshot::image_path(path)) {
        Ok(img) => Ok(img),
        Err(SnapshotError::Write { .. } | SnapshotError::NoSpace { .. }) => {
            let tmp = std::env::temp_dir().join(format!(
                "provium-restore-{}-{}.img",
                std::process::id(),
                crate::vstate::vm::realtime_ns()
            ));
            let img = snap.restore_image(MEMORY_SECTION, &tmp);
            let _ = std::fs::remove_file(&tmp);
            img.map_err(file_err)
        }
        Err(e) => Err(file_err(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn state_version_pin() {
        // Changing any state struct (vCPU, VM, serial, virtio transport or
        // a device's <Dev>State) must bump VM_STATE_VERSION; update this
        // pin with it.
        // 3: BlockState records the capacity the guest was told (disk slots).
        assert_eq!(VM_STATE_VERSION, 3);
    }

    #[test]
    fn errors_name_the_problem() {
        let e = PersistError::Shape {
            file: "/tmp/x.snap".into(),
            what: "2 vCPU states for a VM of 1 vCPUs".into(),
        };
        assert_eq!(
            e.to_string(),
            "snapshot /tmp/x.snap was taken from a different VM shape: 2 vCPU states for a VM of \
             1 vCPUs (restore it into a VM declared like the one that took it)"
        );
    }
}
