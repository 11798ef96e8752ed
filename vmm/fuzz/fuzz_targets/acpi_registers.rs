//! Hostile-guest fuzzing of the ACPI register devices: the GED's event
//! register page (MMIO) and the hardware-reduced sleep control/status ports
//! (PIO), exactly as a vCPU exit hands them accesses: any offset, any width
//! (0-8 bytes and beyond), reads and writes interleaved with the host's
//! power-button presses. Refused accesses must be counted, never panic; the
//! only power-off a write may cause is SLP_EN with S5.
//!
//! Input: a list of actions, each a tag byte, an offset (8 bytes) and a
//! length byte, then that many data bytes for a write.

#![no_main]

use std::sync::{Arc, Mutex};

use libfuzzer_sys::fuzz_target;
use provium_vmm::devices::acpi::ged::Ged;
use provium_vmm::devices::acpi::sleep::{
    SleepRegisters, S5_SLP_TYP, SLEEP_CONTROL_SLP_EN, SLEEP_CONTROL_SLP_TYP_MASK,
    SLEEP_CONTROL_SLP_TYP_SHIFT,
};
use provium_vmm::bus::BusDevice;
use provium_vmm::devices::legacy::EventFdTrigger;
use provium_vmm::devices::{GuestRequest, GuestRequestSink};

#[derive(Default)]
struct Requests(Mutex<Vec<GuestRequest>>);
impl GuestRequestSink for Requests {
    fn request(&self, req: GuestRequest) {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).push(req);
    }
}

fuzz_target!(|data: &[u8]| {
    let reqs = Arc::new(Requests::default());
    let mut sleep = SleepRegisters::new(reqs.clone());
    let mut ged = Ged::new(EventFdTrigger::new().expect("eventfd"));
    let mut want_power_offs = 0usize;
    let mut rest = data;
    while let [tag, tail @ ..] = rest {
        let Some((off, tail)) = tail.split_first_chunk::<8>() else {
            break;
        };
        let offset = u64::from_le_bytes(*off);
        let Some((&len, tail)) = tail.split_first() else {
            break;
        };
        let len = usize::from(len % 16);
        rest = tail;
        match tag % 5 {
            0 => {
                let mut buf = vec![0u8; len];
                sleep.read(offset, &mut buf);
            }
            1 => {
                let n = len.min(rest.len());
                let (bytes, tail) = rest.split_at(n);
                if let (0, &[v]) = (offset, bytes) {
                    let typ = (v >> SLEEP_CONTROL_SLP_TYP_SHIFT) & SLEEP_CONTROL_SLP_TYP_MASK;
                    if v & SLEEP_CONTROL_SLP_EN != 0 && typ == S5_SLP_TYP {
                        want_power_offs += 1;
                    }
                }
                sleep.write(offset, bytes);
                rest = tail;
            }
            2 => {
                let mut buf = vec![0u8; len];
                ged.read(offset, &mut buf);
            }
            3 => {
                let n = len.min(rest.len());
                let (bytes, tail) = rest.split_at(n);
                ged.write(offset, bytes);
                rest = tail;
            }
            _ => ged.press_power_button().expect("eventfd write"),
        }
    }
    let got = reqs.0.lock().unwrap_or_else(|e| e.into_inner()).len();
    assert_eq!(got, want_power_offs, "only SLP_EN with S5 powers off");
});
