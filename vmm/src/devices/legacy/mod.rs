//! Legacy PC devices on the PIO bus: the COM1 8250 UART, the i8042 controller
//! (keyboard, reset, the power button's Ctrl+Alt+Del) and the PM1a control
//! port (power off).

pub mod i8042;
pub mod pm_control;
pub mod serial;

use vm_superio::Trigger;
use vmm_sys_util::eventfd::EventFd;

/// An interrupt line: an `EventFd` the VMM registers as a KVM irqfd, so a
/// `trigger` injects the IRQ without a trip through the VMM.
#[derive(Debug)]
pub struct EventFdTrigger(pub EventFd);

impl Trigger for EventFdTrigger {
    type E = std::io::Error;
    fn trigger(&self) -> std::io::Result<()> {
        self.0.write(1)
    }
}

impl EventFdTrigger {
    /// A non-blocking eventfd trigger.
    pub fn new() -> std::io::Result<EventFdTrigger> {
        Ok(EventFdTrigger(EventFd::new(libc::EFD_NONBLOCK)?))
    }
}
