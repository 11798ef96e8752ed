//! End-to-end tests of the built agent over a Unix socket: every test starts
//! its own `provium-agent --listen unix:... --no-clock` and drives it with raw
//! protocol frames (see `client.rs`).

mod client;

mod conn;
mod exec;
mod files;
mod pid1;
mod process;
mod syscall;
mod tail;
mod workers;
