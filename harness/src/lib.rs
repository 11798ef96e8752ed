//! The `provium` library: everything the `provium` binary is built from.
//!
//! - [`client`]: the typed agent client, spoken over any byte stream
//!   (a Unix socket to a local sandbox today, vsock to a KVM guest next).
//! - [`backend`]: the ways a test VM is created; today the `local` sandbox.

pub mod backend;
pub mod cli;
pub mod client;
pub mod config;
pub mod discover;
pub mod events;
pub mod fixture;
pub mod host_memory;
pub mod lua;
pub mod machine;
pub mod partition;
pub mod report;
pub mod runner;
