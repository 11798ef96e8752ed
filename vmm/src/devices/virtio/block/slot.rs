//! A disk slot: a virtio-blk device made at boot whose medium (image and
//! fault set) the host inserts and ejects while the guest runs.
//!
//! Why slots and not hotplug: the guests this VMM boots find virtio-mmio
//! devices only on their kernel command line (no ACPI hotplug), so a device
//! must exist at boot. An empty slot reports capacity 0 (Linux's
//! virtio_blk makes an empty `/dev/vdX` of size 0); [`BlockSlot::insert`]
//! sets the medium and raises the configuration-change interrupt, which
//! virtio_blk's `virtblk_config_changed_work` turns into
//! `set_capacity_and_notify` ("detected capacity change from 0 to N");
//! [`BlockSlot::eject`] sets it back to 0 the same way. While a slot is
//! empty every request completes with VIRTIO_BLK_S_IOERR, as on a
//! surprise-removed disk.
//!
//! A slot never offers VIRTIO_BLK_F_RO (features are fixed once the driver
//! negotiated them): a read-only medium fails the guest's writes instead.

use std::sync::{Arc, Mutex, MutexGuard};

use super::io::BlockConfig;
use crate::devices::virtio::VirtioInterrupt;

/// Why a medium change was refused.
#[derive(Debug, thiserror::Error)]
pub enum SlotError {
    /// The slot already holds a medium.
    #[error("the disk slot already holds disk `{id}`; eject it first")]
    Occupied {
        /// The GET_ID string of the medium in the slot.
        id: String,
    },
}

#[derive(Default)]
struct Inner {
    medium: Option<BlockConfig>,
    /// Set while the device is activated: where a change is signalled.
    interrupt: Option<Arc<dyn VirtioInterrupt>>,
}

/// A disk slot's medium, shared by the device (which reads it on every
/// request batch and config read) and the host (which changes it).
#[derive(Default)]
pub struct BlockSlot {
    inner: Mutex<Inner>,
}

impl std::fmt::Debug for BlockSlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BlockSlot")
            .field("sectors", &self.capacity_sectors())
            .finish()
    }
}

fn id_of(cfg: &BlockConfig) -> String {
    let end = cfg
        .disk
        .id
        .iter()
        .position(|b| *b == 0)
        .unwrap_or(cfg.disk.id.len());
    String::from_utf8_lossy(&cfg.disk.id[..end]).into_owned()
}

impl BlockSlot {
    /// An empty slot.
    pub fn empty() -> Arc<BlockSlot> {
        Arc::new(BlockSlot::default())
    }

    /// A slot holding `cfg` from the start (a restore of a snapshot taken
    /// while the slot held it).
    pub fn holding(cfg: BlockConfig) -> Arc<BlockSlot> {
        let slot = BlockSlot::empty();
        slot.lock().medium = Some(cfg);
        slot
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The medium now in the slot.
    pub fn medium(&self) -> Option<BlockConfig> {
        self.lock().medium.clone()
    }

    /// The capacity the guest reads: the medium's, 0 when empty.
    pub fn capacity_sectors(&self) -> u64 {
        self.lock().medium.as_ref().map_or(0, |m| m.disk.sectors)
    }

    /// Puts `cfg` in the empty slot and tells the guest (config interrupt).
    pub fn insert(&self, cfg: BlockConfig) -> Result<(), SlotError> {
        let mut g = self.lock();
        if let Some(m) = &g.medium {
            return Err(SlotError::Occupied { id: id_of(m) });
        }
        g.medium = Some(cfg);
        let irq = g.interrupt.clone();
        drop(g);
        if let Some(irq) = irq {
            irq.signal_config();
        }
        Ok(())
    }

    /// Puts `cfg` in without telling the guest: for a device not yet
    /// running (a restore whose snapshot had it in), replacing any medium.
    pub fn restore_medium(&self, cfg: BlockConfig) {
        self.lock().medium = Some(cfg);
    }

    /// Takes the medium out (requests fail from now on) and tells the
    /// guest; returns it (`None` when the slot was empty: nothing signalled).
    pub fn eject(&self) -> Option<BlockConfig> {
        let mut g = self.lock();
        let m = g.medium.take()?;
        let irq = g.interrupt.clone();
        drop(g);
        if let Some(irq) = irq {
            irq.signal_config();
        }
        Some(m)
    }

    /// Where changes are signalled from now on (`None` when the device
    /// stops).
    pub(super) fn set_interrupt(&self, irq: Option<Arc<dyn VirtioInterrupt>>) {
        self.lock().interrupt = irq;
    }
}

/// Where a block device's medium comes from.
#[derive(Clone)]
pub enum Media {
    /// Fixed at build time.
    Fixed(BlockConfig),
    /// Whatever the slot holds at each request batch.
    Slot(Arc<BlockSlot>),
}

impl From<BlockConfig> for Media {
    fn from(cfg: BlockConfig) -> Media {
        Media::Fixed(cfg)
    }
}

impl Media {
    /// The medium now (`None`: an empty slot).
    pub fn current(&self) -> Option<BlockConfig> {
        match self {
            Media::Fixed(c) => Some(c.clone()),
            Media::Slot(s) => s.medium(),
        }
    }

    /// The capacity the guest reads, in sectors.
    pub fn capacity_sectors(&self) -> u64 {
        match self {
            Media::Fixed(c) => c.disk.sectors,
            Media::Slot(s) => s.capacity_sectors(),
        }
    }

    /// Whether writes are refused for good (only a fixed medium offers
    /// VIRTIO_BLK_F_RO).
    pub fn fixed_read_only(&self) -> bool {
        matches!(self, Media::Fixed(c) if c.disk.read_only)
    }

    pub(super) fn set_interrupt(&self, irq: Option<Arc<dyn VirtioInterrupt>>) {
        if let Media::Slot(s) = self {
            s.set_interrupt(irq);
        }
    }
}
