//! A disk given to the VM: a host file exposed as virtio-blk.

use std::path::PathBuf;
use std::sync::Arc;

use crate::devices::virtio::block::BlockFaults;

/// One virtio-blk disk.
#[derive(Clone, Debug)]
pub struct DriveConfig {
    /// Backing file (its size, rounded down to 512 bytes, is the capacity).
    pub path: PathBuf,
    /// Refuse guest writes (VIRTIO_BLK_F_RO).
    pub read_only: bool,
    /// GET_ID string (up to 20 bytes).
    pub id: String,
    /// Fault modes; keep a clone to change them while the guest runs. They
    /// persist across resets.
    pub faults: Arc<BlockFaults>,
}
