//! Kernel image, initrd and command line.

use std::path::PathBuf;
use std::sync::Arc;

/// A kernel: a bzImage or an ELF vmlinux, detected by content.
#[derive(Clone, Debug)]
pub enum KernelImage {
    /// A file on the host.
    Path(PathBuf),
    /// An image in memory (the tiny test guest).
    Bytes(Arc<[u8]>),
}

/// What to boot.
#[derive(Clone, Debug)]
pub struct BootSource {
    /// The kernel.
    pub kernel: KernelImage,
    /// An optional initrd file, placed high in low memory.
    pub initrd: Option<PathBuf>,
    /// The full kernel command line (the device manager appends its devices).
    pub cmdline: String,
}
