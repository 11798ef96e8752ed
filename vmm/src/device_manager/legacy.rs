//! The legacy PIO devices: COM1 (IRQ 4), i8042 (ports 0x60/0x64, IRQ 1),
//! PM1a_CNT (0x604).

use std::sync::{Arc, Mutex};

use crate::bus::{Bus, BusError};
use crate::console::{Console, ConsoleInputSink};
use crate::devices::legacy::i8042::{I8042, I8042_KBD_IRQ, I8042_PORT, I8042_PORT_COUNT};
use crate::devices::legacy::pm_control::{PmControl, PM1A_CNT_LEN, PM1A_CNT_PORT};
use crate::devices::legacy::serial::{
    SerialConstructorArgs, SerialDevice, SerialDeviceState, SerialError, COM1_IRQ, COM1_PORT,
    UART_PORT_COUNT,
};
use crate::devices::legacy::EventFdTrigger;
use crate::devices::GuestRequestSink;
use crate::vstate::vm::{KvmVm, KvmVmError};
use provium_snapshot::Persist;

/// An error attaching legacy devices.
#[derive(Debug, thiserror::Error)]
pub enum LegacyDevicesError {
    /// Creating an interrupt eventfd failed.
    #[error("cannot create the interrupt eventfd for IRQ {irq}")]
    EventFd {
        /// The ISA IRQ.
        irq: u32,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// Wiring an interrupt failed.
    #[error("cannot route a legacy device's interrupt to IRQ {irq}")]
    Irq {
        /// The ISA IRQ.
        irq: u32,
        /// Cause.
        #[source]
        source: KvmVmError,
    },
    /// The snapshot's COM1 state was refused.
    #[error("cannot restore COM1 from the snapshot")]
    SerialState(#[source] SerialError),
    /// A bus range clashed.
    #[error("cannot place a legacy device on the PIO bus")]
    Bus(#[source] BusError),
}

/// The legacy devices of one boot.
pub struct LegacyDevices {
    /// COM1.
    pub serial: Arc<Mutex<SerialDevice>>,
    /// COM1 as the console's input sink (the console holds a weak reference).
    pub serial_input: Arc<dyn ConsoleInputSink>,
    /// The keyboard controller (the host's power button presses keys on it).
    pub i8042: Arc<Mutex<I8042<EventFdTrigger>>>,
}

/// An eventfd registered as the irqfd of ISA `irq`.
fn irq_line(vm: &KvmVm, irq: u32) -> Result<EventFdTrigger, LegacyDevicesError> {
    let t = EventFdTrigger::new().map_err(|source| LegacyDevicesError::EventFd { irq, source })?;
    vm.register_irqfd(&t.0, irq)
        .map_err(|source| LegacyDevicesError::Irq { irq, source })?;
    Ok(t)
}

/// Creates the legacy devices, puts them on `pio` and wires COM1's IRQ.
/// With `serial_state` (a restore), COM1 starts with those registers; the
/// i8042 and PM control port hold no state.
pub fn attach_legacy_devices(
    vm: &KvmVm,
    pio: &mut Bus,
    console: &Arc<Console>,
    requests: Arc<dyn GuestRequestSink>,
    serial_state: Option<&SerialDeviceState>,
) -> Result<LegacyDevices, LegacyDevicesError> {
    let irq = irq_line(vm, COM1_IRQ)?;
    let serial = match serial_state {
        None => SerialDevice::new(irq, console.clone()),
        Some(st) => {
            let args = SerialConstructorArgs {
                irq,
                console: console.clone(),
            };
            SerialDevice::restore(args, st).map_err(LegacyDevicesError::SerialState)?
        }
    };
    let serial = Arc::new(Mutex::new(serial));
    pio.insert(COM1_PORT, UART_PORT_COUNT, serial.clone())
        .map_err(LegacyDevicesError::Bus)?;
    let i8042 = Arc::new(Mutex::new(I8042::new(
        requests.clone(),
        irq_line(vm, I8042_KBD_IRQ)?,
    )));
    pio.insert(I8042_PORT, I8042_PORT_COUNT, i8042.clone())
        .map_err(LegacyDevicesError::Bus)?;
    pio.insert(
        PM1A_CNT_PORT,
        PM1A_CNT_LEN,
        Arc::new(Mutex::new(PmControl::new(requests))),
    )
    .map_err(LegacyDevicesError::Bus)?;
    let serial_input: Arc<dyn ConsoleInputSink> = serial.clone();
    console.set_input_sink(Arc::downgrade(&serial_input));
    // Input typed before this boot's UART existed goes in now.
    serial_input.pump();
    Ok(LegacyDevices {
        serial,
        serial_input,
        i8042,
    })
}
