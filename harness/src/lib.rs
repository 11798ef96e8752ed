//! The `provium` library: everything the `provium` binary is built from.
//!
//! - [`client`]: the typed agent client, spoken over any byte stream
//!   (a Unix socket to a local sandbox today, vsock to a KVM guest next).

pub mod client;
