//! The Disk userdata (reference: "Disk", "Disks and fault injection"): one
//! disk attached to a VM, with host-side sector access to its backing image
//! and the fault modes `eio_read`, `eio_write` and `slow`.
//!
//! # One fault set
//! A disk's faults are one [`DiskFaults`] (the VMM block backend's model),
//! shared by `Arc`: the disk's `DiskSpec` carries the same object into the VM, so
//! `disk:fault_inject` fails or slows the *guest's* virtio-blk requests and
//! the host-side `read_sectors` / `write_sectors` alike, and `detach` makes
//! the guest's requests fail too (virtio-mmio has no hot-unplug: the device
//! stays visible and every request gets VIRTIO_BLK_S_IOERR).
//!
//! # Backends
//! - kvm: disks attached while the VM is `created` become virtio-blk devices
//!   at `vm:boot()`, in attach order (`/dev/vda`, `/dev/vdb`, …; detached
//!   disks are left out). A booted VM takes no new disk: virtio-mmio devices
//!   are announced on the kernel command line, and without ACPI there is no
//!   hotplug, so the error says to attach before boot.
//! - local: a sandbox shares the host's kernel and has no block devices, so
//!   `vm:attach_disk` fails, naming the backend (never a silent success).
//!
//! # Host-side sector ops
//! They act on the image file directly (512-byte sectors), with the
//! reference's order of checks: detached, no image, the matching EIO mode,
//! then `slow` (a 50 ms sleep, after which the EIO mode is checked again),
//! the bounds, the I/O, and one more EIO check after it. A write never grows
//! the image: the guest's disk size is fixed at boot.
//!
//! Disks are not closed on their own scope: a VM's shutdown (explicit, or its
//! auto-close) detaches its disks.

use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use crate::backend::vmm_models::{DiskFaults, SECTOR_BYTES, SLOW_COMPLETION_MS};
use crate::backend::{AddedDisk, BackendError, DeviceLease, DiskSpec, Guest};
use mlua::{Lua, Table, UserData, UserDataMethods, Value};

use super::snapshot::{DiskDecl, SlotDiskDecl};
use super::{err, rust_err};

/// Why a VM's disks cannot become its machine's drives, each naming the
/// VM or disk and the fix.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum DiskError {
    #[error(
        "vm `{vm}`: disk `{id}` has no backing image, and the kvm backend gives the guest a \
         file; attach it with {{image = path}} or call disk:with_image(path) before vm:boot()"
    )]
    NoImage { vm: String, id: String },
    /// The snapshot's image is not there (`reason`: what the path check said).
    #[error(
        "disk `{id}`: {reason} (a snapshot does not hold its disks' contents; put the image back, or \
         attach another before vm:restore)"
    )]
    ImageGone { id: String, reason: String },
}
use crate::config::parse_size;
use crate::lock::Locked;
use crate::runner::FileEnv;

/// `size` when `vm:attach_disk` gives none (the reference's default).
pub const DEFAULT_SIZE_BYTES: u64 = 4 << 30;
/// The keys `vm:attach_disk` accepts.
pub const ATTACH_KEYS: &[&str] = &["id", "size", "image"];

/// A VM's disks in attach order. Disks hold it weakly (to check a new
/// image against their siblings) so a disk never keeps its VM's list alive.
pub type DiskList = Arc<Mutex<Vec<Disk>>>;

/// A disk handle; clones share the disk.
#[derive(Clone)]
pub struct Disk(Arc<DiskInner>);

struct DiskInner {
    id: String,
    vm_name: String,
    /// The modelled size (`:size()` without an image).
    size_bytes: u64,
    /// Absolute path of the backing file; set once (attach or `with_image`).
    image: Mutex<Option<PathBuf>>,
    /// Shared with the VMM's block device (see the module doc).
    faults: Arc<DiskFaults>,
    /// `/dev/vdX` once a boot gave the disk to the guest.
    guest_device: Mutex<Option<String>>,
    /// Set when a running guest took the disk (`give_to_running_guest`):
    /// dropping it takes the disk back out of the guest's slot.
    lease: Mutex<Option<(usize, DeviceLease)>>,
    siblings: Weak<Mutex<Vec<Disk>>>,
    env: Arc<FileEnv>,
}

/// Validated `vm:attach_disk` opts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AttachOpts {
    pub id: String,
    pub size_bytes: u64,
    pub image: Option<PathBuf>,
}

impl AttachOpts {
    /// Parses `opts` (a table or nil) for VM `vm_name`, naming the bad key.
    pub fn parse(vm_name: &str, opts: &Value) -> mlua::Result<AttachOpts> {
        const M: &str = "vm:attach_disk";
        let mut out = AttachOpts {
            id: format!("attached-{vm_name}"),
            size_bytes: DEFAULT_SIZE_BYTES,
            image: None,
        };
        let t = match opts {
            Value::Nil => return Ok(out),
            Value::Table(t) => t,
            other => {
                return Err(err(format!(
                    "{M}: opts must be a table like {{id = \"vda\", image = \"/path/disk.img\"}}, got {}",
                    other.type_name()
                )))
            }
        };
        for pair in t.pairs::<Value, Value>() {
            let (k, v) = pair?;
            let Value::String(k) = k else {
                return Err(err(format!(
                    "{M}: opts keys must be names (accepted: {}), got a {} key",
                    ATTACH_KEYS.join(", "),
                    k.type_name()
                )));
            };
            let k = k.to_str()?.to_string();
            match k.as_str() {
                "id" => {
                    let id = match v {
                        Value::String(s) => s.to_str()?.to_string(),
                        other => {
                            return Err(err(format!(
                                "{M}: id must be a string like \"vdb\", got {}",
                                other.type_name()
                            )))
                        }
                    };
                    if id.is_empty() || id.contains('\0') {
                        return Err(err(format!(
                            "{M}: id must be a non-empty name without NUL bytes, got {id:?}"
                        )));
                    }
                    out.id = id;
                }
                "size" => out.size_bytes = size_opt(v)?,
                "image" => {
                    let path = match v {
                        Value::String(s) => s.to_str()?.to_string(),
                        other => {
                            return Err(err(format!(
                                "{M}: image must be a path string, got {}",
                                other.type_name()
                            )))
                        }
                    };
                    out.image = Some(image_path(M, &path)?);
                }
                other => {
                    return Err(err(format!(
                        "{M}: unknown option `{other}` (accepted: {})",
                        ATTACH_KEYS.join(", ")
                    )))
                }
            }
        }
        Ok(out)
    }
}

/// `size`: bytes as an integer or a size string ("1M"), a positive multiple
/// of the 512-byte sector.
fn size_opt(v: Value) -> mlua::Result<u64> {
    const M: &str = "vm:attach_disk";
    let bytes = match v {
        Value::Integer(i) if i > 0 => i.unsigned_abs(),
        Value::String(s) => {
            parse_size(&s.to_str()?).map_err(|e| rust_err(&format!("{M}: size"), &e))?
        }
        other => {
            return Err(err(format!(
                "{M}: size must be a positive number of bytes or a string like \"64M\", got {}",
                describe(&other)
            )))
        }
    };
    if bytes == 0 || bytes % SECTOR_BYTES != 0 {
        return Err(err(format!(
            "{M}: size {bytes} is not a positive multiple of the {SECTOR_BYTES}-byte sector \
             (round it, e.g. {})",
            bytes.div_ceil(SECTOR_BYTES).max(1) * SECTOR_BYTES
        )));
    }
    Ok(bytes)
}

/// A backing image path: an existing regular file (Provium never creates
/// one), made absolute so later messages and the VMM name the same file.
fn image_path(method: &str, path: &str) -> mlua::Result<PathBuf> {
    if path.is_empty() {
        return Err(err(format!("{method}: image must be a non-empty path")));
    }
    let abs = std::fs::canonicalize(path).map_err(|e| {
        err(format!(
            "{method}: image {path}: {e} (create the backing file first; Provium does not create it)"
        ))
    })?;
    if !abs.is_file() {
        return Err(err(format!(
            "{method}: image {} is not a regular file (give a disk image file)",
            abs.display()
        )));
    }
    Ok(abs)
}

/// A value's type, and the value itself when it is a number (so `-1` and
/// `1.5` are named in the message).
fn describe(v: &Value) -> String {
    match v {
        Value::Integer(i) => i.to_string(),
        Value::Number(n) => n.to_string(),
        other => other.type_name().to_string(),
    }
}

/// A sector number or count argument: a non-negative integer (an integral
/// float such as `2.0` is accepted, as Lua arithmetic produces those).
fn sector_arg(method: &str, what: &str, v: &Value) -> mlua::Result<u64> {
    let n = match v {
        Value::Integer(i) => u64::try_from(*i).ok(),
        Value::Number(f) if f.fract() == 0.0 && *f >= 0.0 && *f < 2f64.powi(63) => {
            // Checked just above: integral, non-negative, below 2^63.
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
            Some(*f as u64)
        }
        _ => None,
    };
    n.ok_or_else(|| {
        err(format!(
            "{method}: {what} must be a whole number of sectors >= 0, got {}",
            describe(v)
        ))
    })
}

pub use crate::backend::guest_device_name;

/// The drives of a kvm boot (see [`boot_drives`]) and their disks.
pub struct BootDrives {
    /// For `MachineSpec::disks`, in attach order.
    pub specs: Vec<DiskSpec>,
    disks: Vec<Disk>,
}

impl BootDrives {
    /// Records each disk's guest device (`/dev/vda`, …), once the VMM has
    /// built the VM with these drives (a boot that failed before that gave
    /// the guest nothing).
    pub fn given_to_guest(&self) {
        for (i, d) in self.disks.iter().enumerate() {
            *d.0.guest_device.locked() = Some(guest_device_name(i));
        }
    }
}

/// The drives of a kvm boot: `disks` that are not detached, in attach
/// order, each carrying its disk's shared fault set. A disk without an image
/// cannot be given to a guest.
pub fn boot_drives(vm_name: &str, disks: &[Disk]) -> Result<BootDrives, DiskError> {
    let live: Vec<Disk> = disks.iter().filter(|d| !d.is_detached()).cloned().collect();
    drives_of(vm_name, live)
}

/// The drives of exactly `disks`, detached ones included (a restore from
/// [`DiskDecl`]s: a disk detached before the snapshot is still a device of
/// the snapshot's machine).
pub fn drives_of(vm_name: &str, disks: Vec<Disk>) -> Result<BootDrives, DiskError> {
    let mut specs = Vec::with_capacity(disks.len());
    for d in &disks {
        let Some(path) = d.image() else {
            return Err(DiskError::NoImage {
                vm: vm_name.to_owned(),
                id: d.0.id.clone(),
            });
        };
        specs.push(DiskSpec {
            id: d.0.id.clone(),
            image: path,
            faults: d.0.faults.clone(),
        });
    }
    Ok(BootDrives { specs, disks })
}

impl BootDrives {
    /// The disks, in device order.
    pub fn disks(&self) -> &[Disk] {
        &self.disks
    }
}

/// What a snapshot records for a machine's disks (its boot's drives, in
/// device order).
pub fn disk_decls(disks: &[Disk]) -> Vec<DiskDecl> {
    disks
        .iter()
        .filter_map(|d| {
            Some(DiskDecl {
                id: d.0.id.clone(),
                image: d.image()?,
                size_bytes: d.0.size_bytes,
                detached: d.is_detached(),
            })
        })
        .collect()
}

impl Disk {
    /// A new disk of VM `vm_name`, in its list `siblings` (the caller
    /// appends it).
    pub fn new(env: Arc<FileEnv>, vm_name: &str, opts: AttachOpts, siblings: &DiskList) -> Disk {
        Disk(Arc::new(DiskInner {
            id: opts.id,
            vm_name: vm_name.to_string(),
            size_bytes: opts.size_bytes,
            image: Mutex::new(opts.image),
            faults: Arc::new(DiskFaults::default()),
            guest_device: Mutex::new(None),
            lease: Mutex::new(None),
            siblings: Arc::downgrade(siblings),
            env,
        }))
    }

    pub fn id(&self) -> &str {
        &self.0.id
    }

    /// A disk of VM `vm_name` like the snapshot's `decl` (same id and
    /// image, detached if it was), in `siblings` (the caller appends it).
    /// Errors when the image is gone: the snapshot does not hold its
    /// contents.
    pub fn from_decl(
        env: Arc<FileEnv>,
        vm_name: &str,
        decl: &DiskDecl,
        siblings: &DiskList,
    ) -> Result<Disk, DiskError> {
        let shown = decl.image.to_string_lossy();
        let image =
            image_path("the snapshot's disk", &shown).map_err(|e| DiskError::ImageGone {
                id: decl.id.clone(),
                reason: super::error_message(&e),
            })?;
        let opts = AttachOpts {
            id: decl.id.clone(),
            size_bytes: decl.size_bytes,
            image: Some(image),
        };
        let d = Disk::new(env, vm_name, opts, siblings);
        if decl.detached {
            d.detach();
        }
        Ok(d)
    }

    pub fn image(&self) -> Option<PathBuf> {
        self.0.image.locked().clone()
    }

    /// The fault set the VMM's block device shares.
    pub fn faults(&self) -> &Arc<DiskFaults> {
        &self.0.faults
    }

    pub fn is_detached(&self) -> bool {
        self.0.faults.is_detached()
    }

    /// Detaches: host-side sector ops error from now on, and the guest's
    /// requests fail (see the module doc). Idempotent.
    pub fn detach(&self) {
        self.0.faults.detach();
        // A disk a running guest took after boot leaves its slot: the
        // guest's /dev/vdX goes back to size 0.
        if let Some((_, lease)) = self.0.lease.locked().take() {
            lease.release();
        }
    }

    /// Gives this disk (its image and fault set) to `machine`, which runs
    /// (`Guest::add_disk`), and records its guest device.
    pub fn give_to_running_guest(&self, machine: &dyn Guest) -> Result<(), BackendError> {
        let spec = self.spec().expect("the caller checked the image");
        self.adopt(machine.add_disk(&spec)?);
        Ok(())
    }

    /// This disk as a machine's: its image and fault set (`None` without
    /// an image).
    pub fn spec(&self) -> Option<DiskSpec> {
        Some(DiskSpec {
            id: self.0.id.clone(),
            image: self.image()?,
            faults: self.0.faults.clone(),
        })
    }

    /// Takes a running guest's slot for this disk (`Guest::add_disk`, or a
    /// restore that put it back).
    pub fn adopt(&self, added: AddedDisk) {
        *self.0.guest_device.locked() = Some(added.guest_device);
        *self.0.lease.locked() = Some((added.slot, added.lease));
    }

    /// What a snapshot records of a disk in a slot (`None` for a disk given
    /// at boot, or detached).
    pub fn slot_decl(&self) -> Option<SlotDiskDecl> {
        let slot = self.0.lease.locked().as_ref().map(|(s, _)| *s)?;
        if self.is_detached() {
            return None;
        }
        Some(SlotDiskDecl {
            slot,
            disk: DiskDecl {
                id: self.0.id.clone(),
                image: self.image()?,
                size_bytes: self.0.size_bytes,
                detached: false,
            },
        })
    }

    /// `/dev/vdX` once booted into a guest, else None.
    pub fn guest_device(&self) -> Option<String> {
        self.0.guest_device.locked().clone()
    }

    /// `:size()`: the live image size, or the modelled size without one.
    pub fn size(&self) -> mlua::Result<u64> {
        match self.image() {
            None => Ok(self.0.size_bytes),
            Some(p) => std::fs::metadata(&p).map(|m| m.len()).map_err(|e| {
                err(format!(
                    "disk:size: disk `{}`: cannot stat image {}: {e}",
                    self.0.id,
                    p.display()
                ))
            }),
        }
    }

    /// `disk:with_image(path)`: gives an image-less disk its backing file.
    pub fn with_image(&self, path: &str) -> mlua::Result<()> {
        const M: &str = "disk:with_image";
        if self.is_detached() {
            return Err(err(format!("{M}: disk is detached")));
        }
        let already = |old: &Path| {
            err(format!(
                "{M}: disk `{}` already has image {} (an image is set once; attach another disk for \
                 another image)",
                self.0.id,
                old.display()
            ))
        };
        if let Some(old) = self.image() {
            return Err(already(&old));
        }
        let abs = image_path(M, path)?;
        // Not under this disk's image lock: the check reads every sibling's
        // image, this disk's included.
        if let Some(list) = self.0.siblings.upgrade() {
            let list = list.locked();
            check_image_unused(M, &self.0.vm_name, &abs, &list)?;
        }
        let mut image = self.0.image.locked();
        if let Some(old) = image.as_ref() {
            return Err(already(old));
        }
        *image = Some(abs);
        Ok(())
    }

    /// The image for a sector op, after the detached and no-image checks.
    fn usable_image(&self, method: &str) -> mlua::Result<PathBuf> {
        if self.is_detached() {
            return Err(err(format!("{method}: disk is detached")));
        }
        self.image().ok_or_else(|| {
            err(format!(
                "{method}: no backing image — disk:with_image required"
            ))
        })
    }

    fn eio(&self, method: &str, mode: &str) -> mlua::Result<()> {
        if self.0.faults.is_set(mode) {
            return Err(err(format!("{method}: EIO (fault_inject)")));
        }
        Ok(())
    }

    /// The faults before the I/O: `mode`'s EIO wins over `slow`; after the
    /// slow sleep `mode` is checked again (a fault set meanwhile counts).
    fn before_io(&self, method: &str, mode: &str) -> mlua::Result<()> {
        self.eio(method, mode)?;
        if self.0.faults.is_slow() {
            // Cancellable: the watchdog can still end the test.
            self.0
                .env
                .sleep(Duration::from_millis(SLOW_COMPLETION_MS))?;
            self.eio(method, mode)?;
        }
        Ok(())
    }

    fn open(&self, method: &str, path: &Path, write: bool) -> mlua::Result<std::fs::File> {
        std::fs::OpenOptions::new()
            .read(true)
            .write(write)
            .open(path)
            .map_err(|e| {
                err(format!(
                    "{method}: disk `{}`: cannot open image {}: {e}",
                    self.0.id,
                    path.display()
                ))
            })
    }

    fn io_err(&self, method: &str, path: &Path, e: std::io::Error) -> mlua::Error {
        err(format!(
            "{method}: disk `{}`: image {}: {e}",
            self.0.id,
            path.display()
        ))
    }

    /// `disk:read_sectors(offset, n)`: `n` sectors from sector `offset`.
    pub fn read_sectors(&self, offset: &Value, count: &Value) -> mlua::Result<Vec<u8>> {
        const M: &str = "disk:read_sectors";
        let offset = sector_arg(M, "offset", offset)?;
        let count = sector_arg(M, "count", count)?;
        let path = self.usable_image(M)?;
        self.before_io(M, "eio_read")?;
        let file = self.open(M, &path, false)?;
        let len = file.metadata().map_err(|e| self.io_err(M, &path, e))?.len();
        let sectors = len / SECTOR_BYTES;
        let in_range = offset
            .checked_add(count)
            .filter(|end| *end <= sectors)
            .is_some();
        if !in_range {
            return Err(err(format!(
                "{M}: sectors {offset}..{offset}+{count} are past the end of disk `{}` ({sectors} sectors: \
                 image {} is {len} bytes); read below sector {sectors}",
                self.0.id,
                path.display()
            )));
        }
        // In range, so the length is at most the image's, which fits memory
        // only if the test asked for it.
        let bytes = usize::try_from(count * SECTOR_BYTES).map_err(|_| {
            err(format!(
                "{M}: {count} sectors do not fit in memory on this host"
            ))
        })?;
        let mut buf = vec![0u8; bytes];
        file.read_exact_at(&mut buf, offset * SECTOR_BYTES)
            .map_err(|e| self.io_err(M, &path, e))?;
        self.eio(M, "eio_read")?;
        Ok(buf)
    }

    /// `disk:write_sectors(offset, data)`: `data` verbatim from sector
    /// `offset`, within the image (a write never grows it).
    pub fn write_sectors(&self, offset: &Value, data: &Value) -> mlua::Result<()> {
        const M: &str = "disk:write_sectors";
        let offset = sector_arg(M, "offset", offset)?;
        let Value::String(data) = data else {
            return Err(err(format!(
                "{M}: data must be a string of bytes, got {}",
                data.type_name()
            )));
        };
        let data = data.as_bytes();
        let path = self.usable_image(M)?;
        self.before_io(M, "eio_write")?;
        let file = self.open(M, &path, true)?;
        let len = file.metadata().map_err(|e| self.io_err(M, &path, e))?.len();
        let start = offset.checked_mul(SECTOR_BYTES);
        let end = start.and_then(|s| s.checked_add(data.len() as u64));
        let (Some(start), Some(end)) = (start, end) else {
            return Err(err(format!(
                "{M}: sector {offset} is past the end of disk `{}` (image {} is {len} bytes)",
                self.0.id,
                path.display()
            )));
        };
        if end > len {
            return Err(err(format!(
                "{M}: {} bytes at sector {offset} end at byte {end}, past the end of disk `{}` \
                 (image {} is {len} bytes); write within it, or grow the image before boot",
                data.len(),
                self.0.id,
                path.display()
            )));
        }
        file.write_all_at(&data, start)
            .map_err(|e| self.io_err(M, &path, e))?;
        self.eio(M, "eio_write")?;
        Ok(())
    }

    /// `disk:fault_inject(mode)`.
    pub fn fault_inject(&self, mode: &Value) -> mlua::Result<()> {
        const M: &str = "disk:fault_inject";
        let valid = DiskFaults::MODES.join(", ");
        let Value::String(s) = mode else {
            return Err(err(format!(
                "{M}: mode must be a string (valid: {valid}), got {}",
                mode.type_name()
            )));
        };
        let mode = s.to_str()?.to_string();
        if !self.0.faults.set(&mode, true) {
            return Err(err(format!("{M}: unknown mode `{mode}` (valid: {valid})")));
        }
        Ok(())
    }
}

/// Errors if `image` already backs one of `disks` (two devices over one
/// file would corrupt it).
pub fn check_image_unused(
    method: &str,
    vm_name: &str,
    image: &Path,
    disks: &[Disk],
) -> mlua::Result<()> {
    if let Some(other) = disks
        .iter()
        .find(|d| !d.is_detached() && d.image().as_deref() == Some(image))
    {
        return Err(err(format!(
            "{method}: image {} already backs disk `{}` of vm `{vm_name}` (two disks over one file \
             would corrupt it; copy the image)",
            image.display(),
            other.id()
        )));
    }
    Ok(())
}

impl UserData for Disk {
    fn add_methods<M: UserDataMethods<Self>>(m: &mut M) {
        m.add_method("id", |_, this, ()| Ok(this.0.id.clone()));
        m.add_method("size", |_, this, ()| this.size());
        m.add_method("read_sectors", |lua: &Lua, this, (o, n): (Value, Value)| {
            lua.create_string(this.read_sectors(&o, &n)?)
        });
        m.add_method("write_sectors", |_, this, (o, d): (Value, Value)| {
            this.write_sectors(&o, &d)
        });
        m.add_method("fault_inject", |_, this, mode: Value| {
            this.fault_inject(&mode)
        });
        m.add_method("clear_faults", |_, this, ()| {
            this.0.faults.clear();
            Ok(())
        });
        m.add_method("active_faults", |lua, this, ()| -> mlua::Result<Table> {
            lua.create_sequence_from(this.0.faults.active())
        });
        m.add_method("detach", |_, this, ()| {
            this.detach();
            Ok(())
        });
        m.add_method("is_detached", |_, this, ()| Ok(this.is_detached()));
        m.add_method("with_image", |_, this, path: Value| {
            let Value::String(p) = &path else {
                return Err(err(format!(
                    "disk:with_image: path must be a string, got {}",
                    path.type_name()
                )));
            };
            this.with_image(&p.to_str()?)?;
            Ok(this.clone())
        });
        m.add_method("image", |_, this, ()| {
            Ok(this.image().map(|p| p.display().to_string()))
        });
        m.add_method("guest_device", |_, this, ()| Ok(this.guest_device()));
        m.add_meta_method(mlua::MetaMethod::ToString, |_, this, ()| {
            Ok(format!("Disk({} on {})", this.0.id, this.0.vm_name))
        });
        // `vm:disk(id)` makes a new userdata per call: equal when the same disk.
        m.add_meta_method(mlua::MetaMethod::Eq, |_, this, other: mlua::AnyUserData| {
            Ok(other
                .borrow::<Disk>()
                .map(|o| Arc::ptr_eq(&o.0, &this.0))
                .unwrap_or(false))
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use crate::events::EventSender;
    use crate::lua::error_message;
    use crate::runner::{BackendKind, CancelReason};
    use std::time::Instant;

    fn env() -> Arc<FileEnv> {
        Arc::new(FileEnv::new(
            "t.test.lua".into(),
            "/t.test.lua".into(),
            Vec::new(),
            Arc::new(Config::default()),
            crate::backend::for_kind(BackendKind::Kvm),
            EventSender::disabled(),
        ))
    }

    /// A disk over a fresh 8-sector image of `fill` bytes.
    #[test]
    fn a_disk_in_a_slot_is_recorded_by_slot_and_detach_gives_the_slot_back() {
        use std::sync::atomic::{AtomicBool, Ordering};
        let (d, _f, _list) = disk(env(), 1);
        assert!(d.slot_decl().is_none(), "a disk given at boot is no slot's");
        let released = Arc::new(AtomicBool::new(false));
        let r = released.clone();
        d.adopt(AddedDisk {
            guest_device: "/dev/vdc".into(),
            slot: 1,
            lease: DeviceLease::new(move || r.store(true, Ordering::SeqCst)),
        });
        assert_eq!(d.guest_device().as_deref(), Some("/dev/vdc"));
        let decl = d.slot_decl().expect("recorded");
        assert_eq!((decl.slot, decl.disk.id.as_str()), (1, "vda"));
        assert!(!decl.disk.detached);
        assert!(!released.load(Ordering::SeqCst));
        d.detach();
        assert!(
            released.load(Ordering::SeqCst),
            "detach ejects the slot's medium"
        );
        assert!(
            d.slot_decl().is_none(),
            "a detached disk is no longer in a slot"
        );
        d.detach(); // idempotent: nothing left to release
    }

    fn disk(env: Arc<FileEnv>, fill: u8) -> (Disk, tempfile::NamedTempFile, DiskList) {
        let f = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(f.path(), vec![fill; 8 * 512]).unwrap();
        let list: DiskList = Arc::new(Mutex::new(Vec::new()));
        let opts = AttachOpts {
            id: "vda".into(),
            size_bytes: 8 * 512,
            image: Some(f.path().to_path_buf()),
        };
        let d = Disk::new(env, "v", opts, &list);
        list.locked().push(d.clone());
        (d, f, list)
    }

    fn int(i: i64) -> Value {
        Value::Integer(i)
    }

    #[test]
    fn eio_is_checked_before_the_slow_sleep() {
        // A cancelled file's sleep fails at once: so a read that reports EIO
        // never reached the sleep, and one that reports the cancellation did.
        let env = env();
        let (d, _f, _l) = disk(env.clone(), 0);
        env.cancel(CancelReason::TestTimeout(Duration::from_secs(1)));
        d.faults().set("slow", true);
        let e = error_message(&d.read_sectors(&int(0), &int(1)).unwrap_err());
        assert!(
            e.contains("test timed out"),
            "slow sleeps through the file's env: {e}"
        );
        d.faults().set("eio_read", true);
        let e = error_message(&d.read_sectors(&int(0), &int(1)).unwrap_err());
        assert_eq!(e, "disk:read_sectors: EIO (fault_inject)");
    }

    #[test]
    fn slow_delays_and_keeps_the_outcome() {
        let (d, f, _l) = disk(env(), 0);
        d.faults().set("slow", true);
        let lua = Lua::new();
        let data = Value::String(lua.create_string("abc").unwrap());
        let t0 = Instant::now();
        d.write_sectors(&int(1), &data).unwrap();
        let took = t0.elapsed();
        assert!(
            took >= Duration::from_millis(SLOW_COMPLETION_MS),
            "{took:?}"
        );
        assert_eq!(&std::fs::read(f.path()).unwrap()[512..515], b"abc");
    }

    #[test]
    fn a_fault_set_during_the_slow_sleep_still_counts() {
        // The fault lands ~20 ms into the 50 ms sleep (from another thread,
        // as the VMM or a second handle could): the re-check after the sleep
        // sees it. For a write, that is before the I/O: nothing lands.
        for (mode, write) in [("eio_read", false), ("eio_write", true)] {
            let (d, f, _l) = disk(env(), b'-');
            d.faults().set("slow", true);
            let faults = d.faults().clone();
            let setter = std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(20));
                faults.set(mode, true);
            });
            let lua = Lua::new();
            let data = Value::String(lua.create_string("new").unwrap());
            let r = if write {
                d.write_sectors(&int(0), &data)
            } else {
                d.read_sectors(&int(0), &int(1)).map(|_| ())
            };
            setter.join().unwrap();
            let e = error_message(&r.unwrap_err());
            assert!(e.ends_with(": EIO (fault_inject)"), "{mode}: {e}");
            assert_eq!(std::fs::read(f.path()).unwrap(), vec![b'-'; 8 * 512]);
        }
    }

    fn decl(id: &str, image: &Path) -> DiskDecl {
        DiskDecl {
            id: id.into(),
            image: image.to_path_buf(),
            size_bytes: 8 * 512,
            detached: false,
        }
    }

    #[test]
    fn the_snapshots_disks_come_back_with_their_images_and_detached_state() {
        let env = env();
        let (d, f, list) = disk(env.clone(), 7);
        d.detach();
        let recorded = disk_decls(std::slice::from_ref(&d));
        assert_eq!(
            recorded,
            [DiskDecl {
                id: "vda".into(),
                image: f.path().to_path_buf(),
                size_bytes: 8 * 512,
                detached: true,
            }]
        );
        let back = Disk::from_decl(env.clone(), "v", &recorded[0], &list).unwrap();
        assert_eq!(back.id(), "vda");
        assert_eq!(back.image(), Some(std::fs::canonicalize(f.path()).unwrap()));
        assert!(back.is_detached(), "detached before the snapshot: still so");
        // A detached disk is still a device of the snapshot's machine.
        let drives = drives_of("v", vec![back.clone()]).unwrap();
        assert_eq!(drives.specs.len(), 1);
        assert!(boot_drives("v", &[back]).unwrap().specs.is_empty());
        // The image is gone: say so, and how to go on.
        let gone = decl("vdb", Path::new("/nonexistent/gone.img"));
        let e = Disk::from_decl(env, "v", &gone, &list)
            .err()
            .unwrap()
            .to_string();
        assert!(
            e.starts_with(
                "disk `vdb`: the snapshot's disk: image /nonexistent/gone.img: No such file"
            ) && e.contains("a snapshot does not hold its disks' contents"),
            "{e}"
        );
    }

    #[test]
    fn guest_device_names_follow_linux() {
        assert_eq!(guest_device_name(0), "/dev/vda");
        assert_eq!(guest_device_name(1), "/dev/vdb");
        assert_eq!(guest_device_name(25), "/dev/vdz");
        assert_eq!(guest_device_name(26), "/dev/vdaa");
        assert_eq!(guest_device_name(27), "/dev/vdab");
        assert_eq!(guest_device_name(26 + 26 * 26), "/dev/vdaaa");
    }

    #[test]
    fn sector_args_are_whole_non_negative_numbers() {
        assert_eq!(sector_arg("m", "offset", &Value::Integer(3)).unwrap(), 3);
        assert_eq!(sector_arg("m", "offset", &Value::Number(2.0)).unwrap(), 2);
        for bad in [
            Value::Integer(-1),
            Value::Number(1.5),
            Value::Number(f64::NAN),
            Value::Number(-0.5),
            Value::Boolean(true),
            Value::Nil,
        ] {
            let e = super::super::error_message(&sector_arg("m", "offset", &bad).unwrap_err());
            assert!(e.starts_with("m: offset must be a whole number"), "{e}");
        }
    }

    #[test]
    fn attach_opts_defaults_and_errors() {
        let lua = Lua::new();
        let o = AttachOpts::parse("v", &Value::Nil).unwrap();
        assert_eq!(
            o,
            AttachOpts {
                id: "attached-v".into(),
                size_bytes: DEFAULT_SIZE_BYTES,
                image: None
            }
        );
        let t: Value = lua.load("{id = 'vdb', size = '1M'}").eval().unwrap();
        let o = AttachOpts::parse("v", &t).unwrap();
        assert_eq!((o.id.as_str(), o.size_bytes), ("vdb", 1 << 20));
        for (src, want) in [
            (
                "{sise = 1}",
                "unknown option `sise` (accepted: id, size, image)",
            ),
            (
                "{size = 1000}",
                "size 1000 is not a positive multiple of the 512-byte sector (round it, e.g. 1024)",
            ),
            ("{size = -512}", "size must be a positive number of bytes"),
            ("{id = ''}", "id must be a non-empty name"),
            ("{id = 3}", "id must be a string"),
            (
                "{image = '/nonexistent/x.img'}",
                "image /nonexistent/x.img: No such file",
            ),
            ("{image = '/'}", "image / is not a regular file"),
            ("{[1] = 'x'}", "opts keys must be names"),
            ("'vda'", "opts must be a table"),
        ] {
            let v: Value = lua.load(src).eval().unwrap();
            let e = super::super::error_message(&AttachOpts::parse("v", &v).unwrap_err());
            assert!(e.starts_with("vm:attach_disk: "), "{e}");
            assert!(e.contains(want), "{src}: {e}");
        }
    }
}
