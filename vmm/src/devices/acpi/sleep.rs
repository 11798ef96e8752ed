//! The hardware-reduced ACPI sleep registers (ACPI 6.5, 4.8.3.7 and
//! 4.8.3.8) the FADT's SLEEP_CONTROL_REG and SLEEP_STATUS_REG point at: two
//! 8-bit I/O ports. A guest powers off by writing SLP_TYP (bits 2-4, the
//! first value of the DSDT's `_S5_` package) with SLP_EN (bit 5) to the
//! control register; this is what Linux's `acpi_power_off` does on a
//! hardware-reduced platform, so `poweroff -f` in a guest with ACPI ends
//! the VM. The status register reads 0 (WAK_STS never set: there is no
//! wake from S5). Only S5 is offered (`_S5_` is the only sleep package), so
//! SLP_EN with any other SLP_TYP is refused.
//!
//! The legacy PM1a control port (`legacy::pm_control`, 0x604) stays for
//! guests without ACPI that know QEMU's convention (the tiny test guest).

use std::sync::Arc;

use crate::bus::BusDevice;
use crate::devices::{GuestRequest, GuestRequestSink};

/// SLEEP_CONTROL_REG's port (the first of two; SLEEP_STATUS_REG follows).
pub const SLEEP_CONTROL_PORT: u64 = 0x600;
/// SLEEP_STATUS_REG's port.
pub const SLEEP_STATUS_PORT: u64 = 0x601;
/// Ports the device occupies.
pub const SLEEP_PORTS_LEN: u64 = 2;
/// SLP_EN in the control register.
pub const SLEEP_CONTROL_SLP_EN: u8 = 1 << 5;
/// SLP_TYP's shift in the control register.
pub const SLEEP_CONTROL_SLP_TYP_SHIFT: u8 = 2;
/// SLP_TYP's mask (after the shift).
pub const SLEEP_CONTROL_SLP_TYP_MASK: u8 = 0x7;
/// The SLP_TYP value of S5 (soft off), as the DSDT's `_S5_` package says.
pub const S5_SLP_TYP: u8 = 5;

/// The two registers.
pub struct SleepRegisters {
    sink: Arc<dyn GuestRequestSink>,
    refused: u64,
}

impl SleepRegisters {
    /// Registers reporting power-off to `sink`.
    pub fn new(sink: Arc<dyn GuestRequestSink>) -> SleepRegisters {
        SleepRegisters { sink, refused: 0 }
    }

    /// Guest accesses refused so far (not one byte, outside the two
    /// registers, SLP_EN with a sleep type other than S5).
    pub fn refused(&self) -> u64 {
        self.refused
    }

    fn refuse(&mut self) {
        self.refused = self.refused.saturating_add(1);
    }
}

impl BusDevice for SleepRegisters {
    fn read(&mut self, offset: u64, data: &mut [u8]) {
        if offset >= SLEEP_PORTS_LEN || data.len() != 1 {
            self.refuse();
            data.fill(0xff);
            return;
        }
        // Control: SLP_EN reads as 0, nothing else is kept. Status: no
        // wake, no event.
        data[0] = 0;
    }

    fn write(&mut self, offset: u64, data: &[u8]) {
        let (0, &[v]) = (offset, data) else {
            // The status register's bits are write-1-to-clear and none is
            // ever set, so a byte written there is a no-op, not a refusal.
            if offset != SLEEP_STATUS_PORT - SLEEP_CONTROL_PORT || data.len() != 1 {
                self.refuse();
            }
            return;
        };
        if v & SLEEP_CONTROL_SLP_EN == 0 {
            return;
        }
        let typ = (v >> SLEEP_CONTROL_SLP_TYP_SHIFT) & SLEEP_CONTROL_SLP_TYP_MASK;
        if typ == S5_SLP_TYP {
            self.sink.request(GuestRequest::PowerOff);
        } else {
            self.refuse();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::devices::test_requests::Requests;

    #[test]
    fn s5_with_slp_en_powers_off() {
        let reqs = Arc::new(Requests::default());
        let mut d = SleepRegisters::new(reqs.clone());
        d.write(0, &[S5_SLP_TYP << SLEEP_CONTROL_SLP_TYP_SHIFT]);
        assert!(
            reqs.0.lock().expect("ok").is_empty(),
            "no SLP_EN, no power-off"
        );
        // What Linux writes: ((SLP_TYP << 2) & 0x1c) | SLP_EN = 0x34.
        d.write(0, &[0x34]);
        assert_eq!(*reqs.0.lock().expect("ok"), vec![GuestRequest::PowerOff]);
        let mut b = [0xaau8; 1];
        d.read(1, &mut b);
        assert_eq!(b, [0], "no WAK_STS");
        assert_eq!(d.refused(), 0);
    }

    #[test]
    fn hostile_accesses_are_refused_and_counted() {
        let reqs = Arc::new(Requests::default());
        let mut d = SleepRegisters::new(reqs.clone());
        d.write(
            0,
            &[(3 << SLEEP_CONTROL_SLP_TYP_SHIFT) | SLEEP_CONTROL_SLP_EN],
        ); // S3
        d.write(0, &[0x34, 0x00]); // two bytes
        d.write(2, &[0x34]);
        d.write(u64::MAX, &[0xff; 8]);
        let mut w = [0u8; 2];
        d.read(0, &mut w);
        assert_eq!(w, [0xff, 0xff]);
        d.read(u64::MAX, &mut w[..1]);
        d.write(1, &[0xff]); // W1C on status: accepted
        assert_eq!(d.refused(), 6);
        assert!(reqs.0.lock().expect("ok").is_empty());
    }
}
