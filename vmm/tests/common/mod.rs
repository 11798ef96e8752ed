//! Helpers the tiny-guest test binaries (`tiny_guest.rs`, `vsock_flood.rs`)
//! share.

use std::time::Duration;

use provium_vmm::Vm;

/// Waits until `needle` was printed `count` times on `vm`'s console,
/// failing with the console log when `wait` passes first.
pub fn wait_console_within(vm: &Vm, needle: &str, count: usize, wait: Duration) {
    let c = vm.console();
    assert!(
        c.wait_for(needle.as_bytes(), count, wait),
        "expected {needle:?} x{count} on the console within {wait:?}; log:\n{}",
        c.log_string()
    );
}
