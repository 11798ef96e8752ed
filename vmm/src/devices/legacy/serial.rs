//! COM1: vm-superio's 16550A model, its output feeding the `Console` and its
//! receive FIFO fed from the console's pending input.
//!
//! The guest drives every register; `vm_superio::Serial` bounds its FIFO (64
//! bytes) and the console bounds everything else, so no guest behaviour grows
//! host memory. Input moves into the FIFO when the host writes and again each
//! time the guest drains a byte.

use std::io;
use std::sync::{Arc, Mutex};

use provium_snapshot::Persist;
use serde::{Deserialize, Serialize};
use vm_superio::serial::{NoEvents, SerialState};
use vm_superio::Serial;

use super::EventFdTrigger;
use crate::bus::BusDevice;
use crate::console::{Console, ConsoleInputSink};

/// COM1's base port.
pub const COM1_PORT: u64 = 0x3f8;
/// Registers per UART.
pub const UART_PORT_COUNT: u64 = 8;
/// COM1's ISA IRQ.
pub const COM1_IRQ: u32 = 4;
const DATA_OFFSET: u8 = 0;

/// `io::Write` into the console log.
pub struct ConsoleWriter(pub Arc<Console>);

impl io::Write for ConsoleWriter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.push_output(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// The serial device on the bus.
pub struct SerialDevice {
    serial: Serial<EventFdTrigger, NoEvents, ConsoleWriter>,
    console: Arc<Console>,
    /// Trigger/IO errors seen (the guest cannot act on them; counted for tests and logs).
    pub error_count: u64,
}

impl SerialDevice {
    /// A UART raising `irq` and writing to `console`.
    pub fn new(irq: EventFdTrigger, console: Arc<Console>) -> SerialDevice {
        SerialDevice {
            serial: Serial::new(irq, ConsoleWriter(console.clone())),
            console,
            error_count: 0,
        }
    }

    /// The interrupt trigger (its eventfd is registered as an irqfd).
    pub fn interrupt(&self) -> &EventFdTrigger {
        self.serial.interrupt_evt()
    }

    /// Moves pending console input into the receive FIFO, as much as fits.
    pub fn fill_from_console(&mut self) {
        let room = self.serial.fifo_capacity();
        if room == 0 {
            return;
        }
        let bytes = self.console.take_input(room);
        if bytes.is_empty() {
            return;
        }
        match self.serial.enqueue_raw_bytes(&bytes) {
            Ok(n) if n < bytes.len() => self.console.unread_input(&bytes[n..]),
            Ok(_) => {}
            Err(_) => {
                self.error_count += 1;
                self.console.unread_input(&bytes);
            }
        }
    }
}

/// COM1's registers and receive FIFO, as a snapshot stores them: a serde
/// mirror of vm-superio's `SerialState` (that crate has no serde). Not
/// saved: the console (log and input queue belong to the `Vm`, and the
/// snapshot carries the log's tail separately).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SerialDeviceState {
    /// DLL.
    pub baud_divisor_low: u8,
    /// DLM.
    pub baud_divisor_high: u8,
    /// IER.
    pub interrupt_enable: u8,
    /// IIR.
    pub interrupt_identification: u8,
    /// LCR.
    pub line_control: u8,
    /// LSR.
    pub line_status: u8,
    /// MCR.
    pub modem_control: u8,
    /// MSR.
    pub modem_status: u8,
    /// SCR.
    pub scratch: u8,
    /// Received bytes the guest has not read (at most the 64-byte FIFO).
    pub in_buffer: Vec<u8>,
}

/// COM1 state from a snapshot that the UART refuses.
#[derive(Debug, thiserror::Error)]
pub enum SerialError {
    /// vm-superio refused the registers or FIFO (an over-full FIFO).
    #[error("COM1: {detail}")]
    State {
        /// What vm-superio said.
        detail: String,
    },
}

/// What COM1 is rebuilt from besides its registers.
pub struct SerialConstructorArgs {
    /// Its interrupt line.
    pub irq: EventFdTrigger,
    /// Where its output goes and its input comes from.
    pub console: Arc<Console>,
}

impl Persist for SerialDevice {
    type State = SerialDeviceState;
    type ConstructorArgs = SerialConstructorArgs;
    type Error = SerialError;

    /// Saves the UART's registers and FIFO.
    fn save(&self) -> SerialDeviceState {
        let s = self.serial.state();
        SerialDeviceState {
            baud_divisor_low: s.baud_divisor_low,
            baud_divisor_high: s.baud_divisor_high,
            interrupt_enable: s.interrupt_enable,
            interrupt_identification: s.interrupt_identification,
            line_control: s.line_control,
            line_status: s.line_status,
            modem_control: s.modem_control,
            modem_status: s.modem_status,
            scratch: s.scratch,
            in_buffer: s.in_buffer,
        }
    }

    /// A UART on `args.irq` writing to `args.console` with `state`'s
    /// registers (from a file: vm-superio refuses an over-full FIFO).
    fn restore(
        args: SerialConstructorArgs,
        state: &SerialDeviceState,
    ) -> Result<SerialDevice, SerialError> {
        let SerialConstructorArgs { irq, console } = args;
        let s = SerialState {
            baud_divisor_low: state.baud_divisor_low,
            baud_divisor_high: state.baud_divisor_high,
            interrupt_enable: state.interrupt_enable,
            interrupt_identification: state.interrupt_identification,
            line_control: state.line_control,
            line_status: state.line_status,
            modem_control: state.modem_control,
            modem_status: state.modem_status,
            scratch: state.scratch,
            in_buffer: state.in_buffer.clone(),
        };
        let serial = Serial::from_state(&s, irq, NoEvents, ConsoleWriter(console.clone()))
            .map_err(|e| SerialError::State {
                detail: format!("{e:?}"),
            })?;
        Ok(SerialDevice {
            serial,
            console,
            error_count: 0,
        })
    }
}

impl BusDevice for SerialDevice {
    fn read(&mut self, offset: u64, data: &mut [u8]) {
        let Ok(off) = u8::try_from(offset) else {
            data.fill(0xff);
            return;
        };
        for b in data.iter_mut() {
            *b = self.serial.read(off);
        }
        if off == DATA_OFFSET {
            self.fill_from_console();
        }
    }

    fn write(&mut self, offset: u64, data: &[u8]) {
        let Ok(off) = u8::try_from(offset) else {
            return;
        };
        for b in data {
            if self.serial.write(off, *b).is_err() {
                self.error_count += 1;
            }
        }
    }
}

impl ConsoleInputSink for Mutex<SerialDevice> {
    fn pump(&self) {
        self.lock()
            .unwrap_or_else(|e| e.into_inner())
            .fill_from_console();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LSR: u64 = 5;

    /// The device, its console, and the strong sink reference the console's
    /// weak one needs (the machine holds it in real use).
    fn device() -> (
        Arc<Mutex<SerialDevice>>,
        Arc<Console>,
        Arc<dyn ConsoleInputSink>,
    ) {
        let console = Console::new(4096);
        let dev = Arc::new(Mutex::new(SerialDevice::new(
            EventFdTrigger::new().expect("eventfd"),
            console.clone(),
        )));
        let sink: Arc<dyn ConsoleInputSink> = dev.clone();
        console.set_input_sink(Arc::downgrade(&sink));
        (dev, console, sink)
    }

    #[test]
    fn output_reaches_console_and_raises_irq() {
        let (dev, console, _sink) = device();
        let mut d = dev.lock().expect("fresh");
        d.write(1, &[0x02]); // IER: THR empty interrupt
        d.write(0, b"hi");
        assert_eq!(console.log(), b"hi");
        assert!(d.interrupt().0.read().expect("irq raised") >= 1);
    }

    #[test]
    fn input_flows_through_the_fifo() {
        let (dev, console, _sink) = device();
        let input: Vec<u8> = (0..100u8).collect();
        console.write_input(&input).expect("fits");
        let mut got = Vec::new();
        let mut d = dev.lock().expect("fresh");
        for _ in 0..200 {
            let mut lsr = [0];
            d.read(LSR, &mut lsr);
            if lsr[0] & 1 == 0 {
                break;
            }
            let mut b = [0];
            d.read(0, &mut b);
            got.push(b[0]);
        }
        assert_eq!(got, input, "100 bytes pass a 64-byte FIFO in order");
        assert_eq!(console.pending_input_bytes(), 0);
    }

    #[test]
    fn state_round_trips_through_msgpack() {
        let (dev, console, _sink) = device();
        console.write_input(b"abc").expect("fits");
        let mut d = dev.lock().expect("fresh");
        d.write(3, &[0x03]); // LCR: 8 data bits
        d.write(7, &[0x5a]); // scratch
        d.fill_from_console();
        let st = d.save();
        assert_eq!(st.in_buffer, b"abc");
        let bytes = rmp_serde::to_vec(&st).expect("encodes");
        let back: SerialDeviceState = rmp_serde::from_slice(&bytes).expect("decodes");
        let args = || SerialConstructorArgs {
            irq: EventFdTrigger::new().expect("eventfd"),
            console: Console::new(64),
        };
        let mut r = SerialDevice::restore(args(), &back).expect("valid");
        let mut b = [0];
        r.read(7, &mut b);
        assert_eq!(b, [0x5a]);
        r.read(0, &mut b);
        assert_eq!(b, [b'a'], "the FIFO came back");
        let full = SerialDeviceState {
            in_buffer: vec![0; 65],
            ..back
        };
        let e = SerialDevice::restore(args(), &full)
            .err()
            .expect("an over-full FIFO is refused");
        assert!(e.to_string().starts_with("COM1: "), "{e}");
    }

    #[test]
    fn hostile_accesses_are_harmless() {
        let (dev, _console, _sink) = device();
        let mut d = dev.lock().expect("fresh");
        let mut big = [0u8; 4];
        d.read(u64::MAX, &mut big);
        assert_eq!(big, [0xff; 4]);
        d.write(u64::MAX, &[1]);
        for off in 0..16 {
            d.write(off, &[0xff, 0x00, 0x80]);
            d.read(off, &mut big);
        }
    }
}
