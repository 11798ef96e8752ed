//! The legacy PIO devices: COM1 (IRQ 4), i8042 (ports 0x60/0x64), PM1a_CNT (0x604).

use std::sync::{Arc, Mutex};

use crate::console::{Console, ConsoleInputSink};
use crate::devices::bus::{Bus, BusError};
use crate::devices::legacy::i8042::{I8042, I8042_PORT, I8042_PORT_COUNT};
use crate::devices::legacy::pm_control::{PmControl, PM1A_CNT_LEN, PM1A_CNT_PORT};
use crate::devices::legacy::serial::{
    SerialDevice, SerialDeviceState, COM1_IRQ, COM1_PORT, UART_PORT_COUNT,
};
use crate::devices::legacy::EventFdTrigger;
use crate::devices::GuestRequestSink;
use crate::vstate::vm::{KvmVm, KvmVmError};

/// An error attaching legacy devices.
#[derive(Debug, thiserror::Error)]
pub enum LegacyDevicesError {
    /// Creating the serial interrupt eventfd failed.
    #[error("cannot create the COM1 interrupt eventfd")]
    EventFd(#[source] std::io::Error),
    /// Wiring the interrupt failed.
    #[error("cannot route COM1's interrupt to IRQ {COM1_IRQ}")]
    Irq(#[source] KvmVmError),
    /// The snapshot's COM1 state was refused.
    #[error("cannot restore COM1 from the snapshot: {0}")]
    SerialState(String),
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
    let irq = EventFdTrigger::new().map_err(LegacyDevicesError::EventFd)?;
    vm.register_irqfd(&irq.0, COM1_IRQ)
        .map_err(LegacyDevicesError::Irq)?;
    let serial = match serial_state {
        None => SerialDevice::new(irq, console.clone()),
        Some(st) => SerialDevice::restore(irq, console.clone(), st)
            .map_err(LegacyDevicesError::SerialState)?,
    };
    let serial = Arc::new(Mutex::new(serial));
    pio.insert(COM1_PORT, UART_PORT_COUNT, serial.clone())
        .map_err(LegacyDevicesError::Bus)?;
    pio.insert(
        I8042_PORT,
        I8042_PORT_COUNT,
        Arc::new(Mutex::new(I8042::new(requests.clone()))),
    )
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
    })
}
