//! The scheduler, as two actors that share no state and talk only through
//! [`messages::ExecutorMessage`]:
//!
//! - [`dispatcher`] owns the run: the queue, the pool and each file's
//!   reservation, PSI, cancellation on a signal or `--fail-fast`. It emits
//!   the pool events and is the only caller of the reporters.
//! - [`executor`] runs one file on its own thread: its runtime (the Lua
//!   state, behind `runner::file::FileRuntime`), its VMs, its watchdog; it
//!   decides how each test ends and emits the test events.
//!
//! The scheduler names no Lua type: the CLI hands it the Lua layer's
//! runtime factory (`lua::test_file::LuaRuntimeFactory`).

pub mod dispatcher;
pub mod executor;
pub mod messages;
#[cfg(test)]
pub mod test_utils;
