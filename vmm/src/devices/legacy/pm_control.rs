//! A PM1a control register (ACPI 6.5, 4.8.3.2.1) at port 0x604: writing SLP_EN
//! (bit 13) powers the machine off. The port is where QEMU's PIIX4/ICH9 PM
//! block puts PM1a_CNT, so guests and tools that know that convention work; an
//! ACPI FADT pointing at it can come later. The tiny test guest's `P` command
//! uses it. Linux without ACPI cannot power off through it (its
//! `pm_power_off` stays unset); the host-side `shutdown` is the way there.

use std::sync::Arc;

use crate::bus::BusDevice;
use crate::devices::{GuestRequest, GuestRequestSink};

/// PM1a_CNT port.
pub const PM1A_CNT_PORT: u64 = 0x604;
/// Width of the register.
pub const PM1A_CNT_LEN: u64 = 2;
/// SLP_EN.
pub const PM1_SLP_EN: u16 = 1 << 13;

/// The register.
pub struct PmControl {
    sink: Arc<dyn GuestRequestSink>,
    value: u16,
}

impl PmControl {
    /// A register reporting power-off to `sink`.
    pub fn new(sink: Arc<dyn GuestRequestSink>) -> PmControl {
        PmControl { sink, value: 0 }
    }
}

impl BusDevice for PmControl {
    fn read(&mut self, offset: u64, data: &mut [u8]) {
        let bytes = self.value.to_le_bytes();
        for (i, b) in data.iter_mut().enumerate() {
            let idx = offset
                .checked_add(i as u64)
                .and_then(|x| usize::try_from(x).ok());
            *b = idx.and_then(|x| bytes.get(x)).copied().unwrap_or(0xff);
        }
    }

    fn write(&mut self, offset: u64, data: &[u8]) {
        let mut bytes = self.value.to_le_bytes();
        for (i, b) in data.iter().enumerate() {
            let idx = offset
                .checked_add(i as u64)
                .and_then(|x| usize::try_from(x).ok());
            if let Some(slot) = idx.and_then(|x| bytes.get_mut(x)) {
                *slot = *b;
            }
        }
        let v = u16::from_le_bytes(bytes);
        if v & PM1_SLP_EN != 0 {
            self.sink.request(GuestRequest::PowerOff);
            self.value = v & !PM1_SLP_EN; // SLP_EN reads as 0
        } else {
            self.value = v;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::devices::test_requests::Requests;

    #[test]
    fn slp_en_powers_off() {
        let reqs = Arc::new(Requests::default());
        let mut d = PmControl::new(reqs.clone());
        d.write(0, &[0x00, 0x10]);
        assert!(reqs.0.lock().expect("ok").is_empty());
        d.write(1, &[0x20]); // high byte: SLP_EN
        assert_eq!(*reqs.0.lock().expect("ok"), vec![GuestRequest::PowerOff]);
        let mut b = [0u8; 4];
        d.read(0, &mut b);
        assert_eq!(b, [0, 0, 0xff, 0xff]);
        d.write(u64::MAX, &[0xff; 8]);
        d.read(u64::MAX, &mut b);
    }
}
