//! On-disk snapshot format (memory image + device state) and the fixture
//! cache store.
//!
//! - [`format`]: the self-describing snapshot container. A fixed header
//!   (magic, [`SNAPSHOT_FORMAT_VERSION`], the wire `PROTOCOL_VERSION` the
//!   writer spoke, a SHA-256 over the section table) and typed sections
//!   (`vcpu`, `devices`, `memory`, `fs-upper`, `console`, ...), each with its
//!   own SHA-256, so a reader verifies only what it reads. Reading is strict:
//!   every problem is an error that names it, never a panic.
//! - [`memory`]: the sparse guest-memory image carried in a section (zero
//!   pages are not written) and its streaming decoder.
//! - [`image`]: the uncompressed, sparse restore image kept beside a
//!   snapshot and mapped copy-on-write as a restored guest's RAM.
//! - [`cache`]: the fixture cache directory: SHA-256 keys, per-key build
//!   locks, atomic install, LRU eviction by atime and corrupt-entry eviction.
//! - [`lab_index`]: `lab.json`, the per-VM index of a lab snapshot.
//! - [`persist`]: the `Persist` trait each stateful component implements.
//!
//! This crate depends on no workspace crate: callers pass the protocol
//! version in.
#![deny(missing_docs)]

pub mod cache;
pub mod format;
pub mod image;
pub mod install;
pub mod lab_index;
pub mod memory;
pub mod persist;

pub use cache::{CacheError, CacheKey, EntryKind, FixtureCache, KeyBuilder};
pub use format::{
    Expect, Section, Shape, Snapshot, SnapshotBuilder, SnapshotError, HEADER_LEN, MAGIC,
    SNAPSHOT_FORMAT_VERSION,
};
pub use image::{image_path, ImageDigest, RestoreImage};
pub use lab_index::{LabBridge, LabImpairment, LabIndex, LabPairImpairment, LabVm};
pub use persist::Persist;
