//! The `provium` library: everything the `provium` binary is built from.
//!
//! - [`client`]: the typed agent client, spoken over any byte stream (a
//!   Unix socket to a local sandbox, vsock to a kvm guest).
//! - [`backend`]: the ways a test VM is created: the `local` sandbox
//!   (namespaces over an overlay root, filesystem snapshots) and `kvm` (a
//!   Linux guest on the in-process microVMM, with memory snapshots and
//!   restores), behind one boundary: a `Backend` boots or restores a
//!   `MachineSpec` into a `Guest` that reports its `Capabilities`.
//! - [`lua`]: the Lua API and test framework; [`runner`]: what a file
//!   needs from the run (its environment, filter, outcome);
//!   [`scheduler`]: the dispatcher (the pool) and the executor (one
//!   file's run); [`fixture`]: the fixture cache;
//!   [`report`] and [`events`]: output and the event stream; [`cli`]: the
//!   subcommands.
//! - [`config`]: provium.toml, one module per table; [`settings`]: the
//!   environment, read once by `cli::main`; [`agent_search`]: where the
//!   agent binary is.

pub mod agent_search;
pub mod backend;
pub mod cli;
pub mod client;
pub mod config;
pub mod discover;
pub mod error_chain;
pub mod events;
pub mod file_digest;
pub mod fixture;
pub mod host_memory;
pub mod lock;
pub mod lua;
pub mod network;
pub mod partition;
pub mod report;
pub mod runner;
pub mod scheduler;
pub mod script_error;
pub mod settings;
#[cfg(test)]
mod source_scan;
pub mod verified_entries;
