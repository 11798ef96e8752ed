//! Users' own kernels (issue 25, docs/kernels.md): what a kernel image and
//! its module tree say, read on the host without booting anything.
//!
//! - [`image`]: a bzImage's setup header, or an ELF vmlinux's banner;
//! - [`kconfig`]: the kernel's config (IKCONFIG, or a file beside it);
//! - [`modinfo`]: a module's `.modinfo` (`name=`, `depends=`, `vermagic=`);
//! - [`modtree`]: where `lib/modules/<release>` is, and dependency order;
//! - [`needs`]: what Provium needs, the one source of `kernel check`'s rows
//!   and `provium kconfig`'s fragment;
//! - [`check`]: the verdict, and the modules the agent loads.

pub mod check;
pub mod image;
pub mod kconfig;
pub mod modinfo;
pub mod modtree;
pub mod needs;

pub use check::{check, CheckError, KernelReport, Status};
