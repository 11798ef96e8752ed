//! Device models. They know nothing of KVM, the builder or the device manager:
//! they see register accesses (`crate::bus::BusDevice`) and call out through small
//! traits (interrupt `Trigger`s, `GuestRequestSink`), so each is unit-tested
//! directly.

pub mod acpi;
pub mod legacy;
pub mod pci;
pub mod virtio;

/// A platform request the guest makes through a device register.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GuestRequest {
    /// Warm reset (i8042 command 0xFE, the path Linux's `reboot=k` takes).
    Reset,
    /// Power off (SLP_EN written to the PM1a control port).
    PowerOff,
}

/// Receives guest requests; implemented by the VM's lifecycle monitor.
pub trait GuestRequestSink: Send + Sync {
    /// Records `req`. Must not block the calling vCPU.
    fn request(&self, req: GuestRequest);
}

/// A [`GuestRequestSink`] that records what it is given: the one test double
/// for the devices that raise guest requests (i8042, PM1a_CNT, the ACPI sleep
/// registers).
#[cfg(test)]
pub(crate) mod test_requests {
    use super::{GuestRequest, GuestRequestSink};
    use std::sync::Mutex;

    /// The requests, in order.
    #[derive(Default)]
    pub(crate) struct Requests(pub Mutex<Vec<GuestRequest>>);

    impl GuestRequestSink for Requests {
        fn request(&self, req: GuestRequest) {
            self.0.lock().expect("not poisoned").push(req);
        }
    }
}
