//! The i8042 keyboard controller, as far as reset goes: vm-superio's model,
//! whose reset trigger (command 0xFE on port 0x64) becomes a
//! `GuestRequest::Reset`. Linux's `reboot=k` (its default order tries the
//! keyboard controller) takes this path.

use std::sync::Arc;

use vm_superio::{I8042Device, Trigger};

use crate::devices::bus::BusDevice;
use crate::devices::{GuestRequest, GuestRequestSink};

/// The controller's base port (data 0x60, command/status 0x64).
pub const I8042_PORT: u64 = 0x60;
/// Ports spanned (0x60..=0x64).
pub const I8042_PORT_COUNT: u64 = 5;

/// Turns vm-superio's reset event into a guest request.
pub struct ResetTrigger(pub Arc<dyn GuestRequestSink>);

impl Trigger for ResetTrigger {
    type E = std::convert::Infallible;
    fn trigger(&self) -> Result<(), Self::E> {
        self.0.request(GuestRequest::Reset);
        Ok(())
    }
}

/// The i8042 on the bus.
pub struct I8042 {
    dev: I8042Device<ResetTrigger>,
}

impl I8042 {
    /// A controller reporting resets to `sink`.
    pub fn new(sink: Arc<dyn GuestRequestSink>) -> I8042 {
        I8042 {
            dev: I8042Device::new(ResetTrigger(sink)),
        }
    }
}

impl BusDevice for I8042 {
    fn read(&mut self, offset: u64, data: &mut [u8]) {
        let v = u8::try_from(offset).map_or(0xff, |o| self.dev.read(o));
        data.fill(v);
    }

    fn write(&mut self, offset: u64, data: &[u8]) {
        let Ok(off) = u8::try_from(offset) else {
            return;
        };
        for b in data {
            let Ok(()) = self.dev.write(off, *b);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    #[derive(Default)]
    pub(crate) struct Requests(pub Mutex<Vec<GuestRequest>>);
    impl GuestRequestSink for Requests {
        fn request(&self, req: GuestRequest) {
            self.0.lock().expect("not poisoned").push(req);
        }
    }

    #[test]
    fn command_fe_requests_reset() {
        let reqs = Arc::new(Requests::default());
        let mut d = I8042::new(reqs.clone());
        d.write(0, &[0xfe]); // data port: ignored
        d.write(4, &[0x20]); // another command: ignored
        assert!(reqs.0.lock().expect("ok").is_empty());
        d.write(4, &[0xfe]);
        assert_eq!(*reqs.0.lock().expect("ok"), vec![GuestRequest::Reset]);
        let mut b = [1u8; 2];
        d.read(u64::MAX, &mut b);
        assert_eq!(b, [0xff; 2]);
    }
}
