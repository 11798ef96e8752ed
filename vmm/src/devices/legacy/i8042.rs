//! The i8042 keyboard controller with one PS/2 keyboard behind it: enough
//! for Linux's i8042 and atkbd drivers to find a keyboard, for the guest's
//! reset request (command 0xFE on port 0x64, the path Linux's `reboot=k`
//! takes) and for the host's power button.
//!
//! vm-superio's `I8042Device` only knows the reset command and cannot queue
//! a key, so this model follows Firecracker's `devices/legacy/i8042.rs`
//! (status, command byte, output port, a 16-byte output buffer, IRQ 1) and
//! adds what Linux's probe asks of a keyboard: GETID answers `AB 83`, reset
//! answers `AA`, every other keyboard byte is acknowledged with `FA`.
//!
//! **Power button.** Without ACPI there is no power-button event, so
//! `trigger_ctrl_alt_del` queues Ctrl+Alt+Del (press and release) and raises
//! IRQ 1, as Firecracker's `SendCtrlAltDel` does. Linux's keyboard handler
//! turns it into `ctrl_alt_del()`: with C-A-D off (init called
//! `reboot(LINUX_REBOOT_CMD_CAD_OFF)`) the kernel sends SIGINT to PID 1,
//! otherwise it reboots. The scancodes are set 2, or set 1 when the guest
//! turned on the controller's translation (command byte bit 6); Linux leaves
//! translation off here because our power-on command byte has it off.
//!
//! **No AUX port.** The AUX loop-back answers on the keyboard side, which
//! Linux's `i8042_check_aux` reads as "no AUX port" at once (instead of
//! timing out 500 ms per probe in an emulated guest).
//!
//! Everything the guest writes is a register access on a fixed-size state;
//! the output buffer is bounded, and a full buffer drops (and counts) bytes.

use std::collections::VecDeque;
use std::sync::Arc;

use vm_superio::Trigger;

use crate::bus::BusDevice;
use crate::devices::{GuestRequest, GuestRequestSink};

/// The controller's base port (data 0x60, command/status 0x64).
pub const I8042_PORT: u64 = 0x60;
/// Ports spanned (0x60..=0x64).
pub const I8042_PORT_COUNT: u64 = 5;
/// The keyboard's ISA IRQ.
pub const I8042_KBD_IRQ: u32 = 1;

const OFS_DATA: u64 = 0;
const OFS_STATUS: u64 = 4;

/// Controller commands (port 0x64).
const CMD_READ_CTR: u8 = 0x20;
const CMD_WRITE_CTR: u8 = 0x60;
const CMD_AUX_DISABLE: u8 = 0xA7;
const CMD_AUX_ENABLE: u8 = 0xA8;
const CMD_AUX_TEST: u8 = 0xA9;
const CMD_SELF_TEST: u8 = 0xAA;
const CMD_KBD_TEST: u8 = 0xAB;
const CMD_KBD_DISABLE: u8 = 0xAD;
const CMD_KBD_ENABLE: u8 = 0xAE;
const CMD_READ_OUTP: u8 = 0xD0;
const CMD_WRITE_OUTP: u8 = 0xD1;
const CMD_WRITE_KBD_OUTBUF: u8 = 0xD2;
const CMD_AUX_LOOP: u8 = 0xD3;
const CMD_WRITE_AUX: u8 = 0xD4;
const CMD_RESET_CPU: u8 = 0xFE;

/// Status register bits.
const SB_OUT_DATA_AVAIL: u8 = 0x01;
const SB_SYSTEM_FLAG: u8 = 0x04;
const SB_LAST_WAS_COMMAND: u8 = 0x08;
const SB_KBD_UNLOCKED: u8 = 0x10;

/// Command byte ("CTR") bits.
const CB_KBD_INT: u8 = 0x01;
const CB_POST_OK: u8 = 0x04;
const CB_KBD_DISABLE: u8 = 0x10;
const CB_AUX_DISABLE: u8 = 0x20;
const CB_TRANSLATE: u8 = 0x40;

/// Controller answers.
const SELF_TEST_OK: u8 = 0x55;
const KBD_TEST_OK: u8 = 0x00;
/// "AUX clock line stuck low": not one of the answers Linux takes for a port.
const AUX_TEST_NO_PORT: u8 = 0x01;

/// Keyboard commands and answers (PS/2).
const KBD_ACK: u8 = 0xFA;
const KBD_BAT_OK: u8 = 0xAA;
const KBD_CMD_ECHO: u8 = 0xEE;
const KBD_CMD_GET_ID: u8 = 0xF2;
const KBD_CMD_RESET: u8 = 0xFF;
/// An MF2 keyboard.
const KBD_ID: [u8; 2] = [0xAB, 0x83];

/// The output buffer (bytes the guest has not read yet).
pub const BUF_SIZE: usize = 16;

/// Ctrl+Alt+Del pressed and released, scancode set 2 (untranslated).
pub const CTRL_ALT_DEL_SET2: &[u8] = &[
    0x14, // left Ctrl
    0x11, // left Alt
    0xE0, 0x71, // Delete
    0xE0, 0xF0, 0x71, // Delete released
    0xF0, 0x11, // Alt released
    0xF0, 0x14, // Ctrl released
];
/// The same in scancode set 1 (what a translating controller delivers).
pub const CTRL_ALT_DEL_SET1: &[u8] = &[
    0x1D, // left Ctrl
    0x38, // left Alt
    0xE0, 0x53, // Delete
    0xE0, 0xD3, // Delete released
    0xB8, // Alt released
    0x9D, // Ctrl released
];

/// Why a key could not be delivered.
#[derive(Debug, thiserror::Error)]
pub enum I8042Error {
    /// The guest has not read earlier bytes.
    #[error(
        "the i8042 output buffer has {pending_bytes} unread bytes, no room for {len_bytes} more \
         (the guest is not reading its keyboard; is its i8042/atkbd driver running?)"
    )]
    BufferFull {
        /// Bytes still queued.
        pending_bytes: usize,
        /// Bytes offered.
        len_bytes: usize,
    },
    /// Raising IRQ 1 failed.
    #[error("cannot raise the keyboard interrupt (IRQ {I8042_KBD_IRQ})")]
    Interrupt(#[source] std::io::Error),
}

/// Counters a test or log can read.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct I8042Metrics {
    /// Keyboard interrupts raised.
    pub kbd_irqs: u64,
    /// Bytes dropped because the output buffer was full.
    pub dropped_bytes: u64,
    /// Interrupt triggers that failed.
    pub irq_errors: u64,
    /// Accesses to an offset or width the controller does not have.
    pub bad_accesses: u64,
}

/// The controller. `T` raises IRQ 1 (an irqfd in the VMM).
pub struct I8042<T: Trigger> {
    requests: Arc<dyn GuestRequestSink>,
    kbd_irq: T,
    status: u8,
    control: u8,
    outp: u8,
    /// A controller command waiting for its data byte on port 0x60.
    pending_cmd: Option<u8>,
    buf: VecDeque<u8>,
    metrics: I8042Metrics,
}

impl<T: Trigger> I8042<T> {
    /// A controller after power-on: keyboard enabled with its interrupt on,
    /// no translation, empty buffer. Resets go to `requests`.
    pub fn new(requests: Arc<dyn GuestRequestSink>, kbd_irq: T) -> I8042<T> {
        I8042 {
            requests,
            kbd_irq,
            status: SB_KBD_UNLOCKED | SB_SYSTEM_FLAG,
            control: CB_POST_OK | CB_KBD_INT,
            outp: 0,
            pending_cmd: None,
            buf: VecDeque::with_capacity(BUF_SIZE),
            metrics: I8042Metrics::default(),
        }
    }

    /// The counters.
    pub fn metrics(&self) -> I8042Metrics {
        self.metrics
    }

    /// The command byte as the guest last set it.
    pub fn control(&self) -> u8 {
        self.control
    }

    /// Queues Ctrl+Alt+Del (press and release) and raises IRQ 1: the power
    /// button of a machine without ACPI. Nothing is queued when the whole
    /// sequence does not fit.
    pub fn trigger_ctrl_alt_del(&mut self) -> Result<(), I8042Error> {
        let seq = if self.control & CB_TRANSLATE != 0 {
            CTRL_ALT_DEL_SET1
        } else {
            CTRL_ALT_DEL_SET2
        };
        self.queue_keys(seq)
    }

    /// Queues `bytes` as keyboard data, all or nothing, and raises IRQ 1.
    pub fn queue_keys(&mut self, bytes: &[u8]) -> Result<(), I8042Error> {
        if BUF_SIZE - self.buf.len() < bytes.len() {
            return Err(I8042Error::BufferFull {
                pending_bytes: self.buf.len(),
                len_bytes: bytes.len(),
            });
        }
        for b in bytes {
            self.push(*b);
        }
        self.kbd_interrupt().map_err(I8042Error::Interrupt)
    }

    /// Raises IRQ 1 when the guest left keyboard interrupts on and a byte waits.
    fn kbd_interrupt(&mut self) -> std::io::Result<()> {
        if self.control & CB_KBD_INT == 0 || self.buf.is_empty() {
            return Ok(());
        }
        self.metrics.kbd_irqs += 1;
        self.kbd_irq
            .trigger()
            .map_err(|e| std::io::Error::other(format!("{e:?}")))
    }

    fn kbd_interrupt_from_guest_access(&mut self) {
        if self.kbd_interrupt().is_err() {
            self.metrics.irq_errors += 1;
        }
    }

    fn push(&mut self, b: u8) {
        if self.buf.len() >= BUF_SIZE {
            self.metrics.dropped_bytes += 1;
            return;
        }
        self.buf.push_back(b);
        self.status |= SB_OUT_DATA_AVAIL;
    }

    fn pop(&mut self) -> Option<u8> {
        let b = self.buf.pop_front();
        if self.buf.is_empty() {
            self.status &= !SB_OUT_DATA_AVAIL;
        }
        b
    }

    /// A controller answer replaces whatever was queued: the guest reads it
    /// with the next `inb(0x60)`.
    fn answer(&mut self, b: u8) {
        self.buf.clear();
        self.status &= !SB_OUT_DATA_AVAIL;
        self.push(b);
    }

    fn command(&mut self, cmd: u8) {
        self.status |= SB_LAST_WAS_COMMAND;
        self.pending_cmd = None;
        match cmd {
            CMD_READ_CTR => self.answer(self.control),
            CMD_READ_OUTP => self.answer(self.outp),
            CMD_SELF_TEST => self.answer(SELF_TEST_OK),
            CMD_KBD_TEST => self.answer(KBD_TEST_OK),
            CMD_AUX_TEST => self.answer(AUX_TEST_NO_PORT),
            CMD_AUX_DISABLE => self.control |= CB_AUX_DISABLE,
            CMD_AUX_ENABLE => self.control &= !CB_AUX_DISABLE,
            CMD_KBD_DISABLE => self.control |= CB_KBD_DISABLE,
            CMD_KBD_ENABLE => self.control &= !CB_KBD_DISABLE,
            CMD_WRITE_CTR | CMD_WRITE_OUTP | CMD_WRITE_KBD_OUTBUF | CMD_AUX_LOOP
            | CMD_WRITE_AUX => self.pending_cmd = Some(cmd),
            CMD_RESET_CPU => self.requests.request(GuestRequest::Reset),
            // Pulse-output-line and vendor commands: nothing to do.
            _ => {}
        }
    }

    fn data(&mut self, b: u8) {
        self.status &= !SB_LAST_WAS_COMMAND;
        match self.pending_cmd.take() {
            Some(CMD_WRITE_CTR) => {
                self.control = b;
                // Bytes queued while interrupts were off are announced now.
                self.kbd_interrupt_from_guest_access();
            }
            Some(CMD_WRITE_OUTP) => self.outp = b,
            Some(CMD_WRITE_KBD_OUTBUF) | Some(CMD_AUX_LOOP) => {
                // Keyboard side, without the AUX status bit: a loop-back
                // that fails, so the guest finds no AUX port.
                self.push(b);
                self.kbd_interrupt_from_guest_access();
            }
            // No AUX device listens.
            Some(_) => {}
            None => self.keyboard_command(b),
        }
    }

    /// A byte for the keyboard itself.
    fn keyboard_command(&mut self, b: u8) {
        match b {
            KBD_CMD_ECHO => self.push(KBD_CMD_ECHO),
            KBD_CMD_GET_ID => {
                self.push(KBD_ACK);
                for id in KBD_ID {
                    self.push(id);
                }
            }
            KBD_CMD_RESET => {
                self.push(KBD_ACK);
                self.push(KBD_BAT_OK);
            }
            // Parameter bytes (LEDs, rate, scancode set) and every other
            // command: acknowledged, as a keyboard does.
            _ => self.push(KBD_ACK),
        }
        self.kbd_interrupt_from_guest_access();
    }
}

impl<T: Trigger + Send> BusDevice for I8042<T> {
    fn read(&mut self, offset: u64, data: &mut [u8]) {
        if data.len() != 1 {
            self.metrics.bad_accesses += 1;
            data.fill(0xff);
            return;
        }
        data[0] = match offset {
            OFS_STATUS => self.status,
            OFS_DATA => {
                let b = self.pop().unwrap_or(0);
                // Linux reads one byte per interrupt: announce the next one.
                self.kbd_interrupt_from_guest_access();
                b
            }
            _ => {
                self.metrics.bad_accesses += 1;
                0xff
            }
        };
    }

    fn write(&mut self, offset: u64, data: &[u8]) {
        let [b] = data else {
            self.metrics.bad_accesses += 1;
            return;
        };
        match offset {
            OFS_STATUS => self.command(*b),
            OFS_DATA => self.data(*b),
            _ => self.metrics.bad_accesses += 1,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::devices::test_requests::Requests;
    use std::sync::atomic::{AtomicU64, Ordering};

    #[derive(Clone, Default)]
    struct Irq(Arc<AtomicU64>);
    impl Trigger for Irq {
        type E = std::io::Error;
        fn trigger(&self) -> std::io::Result<()> {
            self.0.fetch_add(1, Ordering::SeqCst);
            Ok(())
        }
    }

    fn dev() -> (I8042<Irq>, Arc<Requests>, Irq) {
        let reqs = Arc::new(Requests::default());
        let irq = Irq::default();
        (I8042::new(reqs.clone(), irq.clone()), reqs, irq)
    }

    fn inb(d: &mut I8042<Irq>, off: u64) -> u8 {
        let mut b = [0u8];
        d.read(off, &mut b);
        b[0]
    }

    /// Reads the output buffer the way Linux's interrupt handler does: one
    /// byte per IRQ, while the status says a byte waits.
    fn drain(d: &mut I8042<Irq>) -> Vec<u8> {
        let mut out = Vec::new();
        while inb(d, OFS_STATUS) & SB_OUT_DATA_AVAIL != 0 {
            out.push(inb(d, OFS_DATA));
        }
        out
    }

    #[test]
    fn command_fe_requests_reset() {
        let (mut d, reqs, _) = dev();
        d.write(OFS_DATA, &[0xfe]); // a keyboard byte, not a reset
        d.write(OFS_STATUS, &[0x20]); // another command
        assert!(reqs.0.lock().expect("ok").is_empty());
        d.write(OFS_STATUS, &[0xfe]);
        assert_eq!(*reqs.0.lock().expect("ok"), vec![GuestRequest::Reset]);
    }

    #[test]
    fn ctrl_alt_del_is_set2_press_and_release_with_one_irq_per_byte() {
        let (mut d, _, irq) = dev();
        d.trigger_ctrl_alt_del().expect("room");
        assert_eq!(irq.0.load(Ordering::SeqCst), 1, "IRQ 1 raised once queued");
        let got = drain(&mut d);
        assert_eq!(
            got,
            [0x14, 0x11, 0xE0, 0x71, 0xE0, 0xF0, 0x71, 0xF0, 0x11, 0xF0, 0x14]
        );
        // One more interrupt per byte that still waited after a read.
        assert_eq!(irq.0.load(Ordering::SeqCst), got.len() as u64);
        assert_eq!(inb(&mut d, OFS_STATUS) & SB_OUT_DATA_AVAIL, 0);
        assert_eq!(inb(&mut d, OFS_DATA), 0, "empty buffer reads 0");
    }

    #[test]
    fn translation_on_gives_set1() {
        let (mut d, _, _) = dev();
        d.write(OFS_STATUS, &[CMD_WRITE_CTR]);
        d.write(OFS_DATA, &[CB_POST_OK | CB_KBD_INT | CB_TRANSLATE]);
        d.trigger_ctrl_alt_del().expect("room");
        assert_eq!(drain(&mut d), CTRL_ALT_DEL_SET1);
    }

    #[test]
    fn interrupts_off_queue_silently_until_enabled() {
        let (mut d, _, irq) = dev();
        d.write(OFS_STATUS, &[CMD_WRITE_CTR]);
        d.write(OFS_DATA, &[CB_POST_OK]);
        d.trigger_ctrl_alt_del().expect("room");
        assert_eq!(irq.0.load(Ordering::SeqCst), 0);
        d.write(OFS_STATUS, &[CMD_WRITE_CTR]);
        d.write(OFS_DATA, &[CB_POST_OK | CB_KBD_INT]);
        assert_eq!(irq.0.load(Ordering::SeqCst), 1, "announced on enable");
        assert_eq!(drain(&mut d), CTRL_ALT_DEL_SET2);
    }

    #[test]
    fn a_full_buffer_refuses_the_whole_sequence() {
        let (mut d, _, _) = dev();
        d.trigger_ctrl_alt_del().expect("room");
        let e = d.trigger_ctrl_alt_del().expect_err("no room for 11 more");
        assert!(
            matches!(
                e,
                I8042Error::BufferFull {
                    pending_bytes: 11,
                    len_bytes: 11
                }
            ),
            "{e}"
        );
        assert_eq!(drain(&mut d), CTRL_ALT_DEL_SET2, "the first press intact");
    }

    #[test]
    fn linux_probe_sequence() {
        let (mut d, _, _) = dev();
        // i8042_controller_init: read the command byte, write it back with
        // the keyboard disabled, then enable it.
        d.write(OFS_STATUS, &[CMD_READ_CTR]);
        let ctr = inb(&mut d, OFS_DATA);
        assert_eq!(ctr, CB_POST_OK | CB_KBD_INT);
        assert_eq!(
            ctr & CB_TRANSLATE,
            0,
            "Linux then drives the keyboard untranslated"
        );
        d.write(OFS_STATUS, &[CMD_WRITE_CTR]);
        assert_ne!(inb(&mut d, OFS_STATUS) & SB_LAST_WAS_COMMAND, 0);
        d.write(OFS_DATA, &[ctr | CB_KBD_DISABLE]);
        assert_eq!(d.control(), ctr | CB_KBD_DISABLE);
        d.write(OFS_STATUS, &[CMD_SELF_TEST]);
        assert_eq!(drain(&mut d), [SELF_TEST_OK]);
        // i8042_check_aux: the loop-back comes back without the AUX bit
        // (Linux: "auxerr"), and the AUX test reports a stuck line.
        d.write(OFS_STATUS, &[CMD_AUX_LOOP]);
        d.write(OFS_DATA, &[0x5a]);
        assert_eq!(inb(&mut d, OFS_STATUS) & 0x20, 0, "not AUX data");
        assert_eq!(drain(&mut d), [0x5a]);
        d.write(OFS_STATUS, &[CMD_AUX_TEST]);
        assert_eq!(drain(&mut d), [AUX_TEST_NO_PORT]);
        // atkbd_probe: GETID, then set LEDs with a parameter byte.
        d.write(OFS_DATA, &[KBD_CMD_GET_ID]);
        assert_eq!(drain(&mut d), [KBD_ACK, 0xAB, 0x83]);
        d.write(OFS_DATA, &[0xED]);
        d.write(OFS_DATA, &[0x00]);
        assert_eq!(drain(&mut d), [KBD_ACK, KBD_ACK]);
        d.write(OFS_DATA, &[KBD_CMD_RESET]);
        assert_eq!(drain(&mut d), [KBD_ACK, KBD_BAT_OK]);
        d.write(OFS_STATUS, &[CMD_WRITE_OUTP]);
        d.write(OFS_DATA, &[0xdf]); // A20 on
        d.write(OFS_STATUS, &[CMD_READ_OUTP]);
        assert_eq!(drain(&mut d), [0xdf]);
    }

    #[test]
    fn hostile_accesses_are_harmless() {
        let (mut d, _, _) = dev();
        let mut wide = [0u8; 4];
        d.read(OFS_DATA, &mut wide);
        assert_eq!(wide, [0xff; 4]);
        d.write(OFS_DATA, &[1, 2]);
        d.read(u64::MAX, &mut [0u8]);
        d.write(2, &[1]);
        assert_eq!(d.metrics().bad_accesses, 4);
        // A guest that never reads: the buffer stays bounded.
        for _ in 0..100 {
            d.write(OFS_DATA, &[KBD_CMD_GET_ID]);
        }
        assert_eq!(drain(&mut d).len(), BUF_SIZE);
        assert!(d.metrics().dropped_bytes > 0);
        for v in 0..=255u8 {
            d.write(OFS_STATUS, &[v]);
            d.write(OFS_DATA, &[v]);
            inb(&mut d, OFS_DATA);
        }
    }
}
