//! Hostile-guest fuzzing of the PCI root complex and the virtio-pci
//! transport: every access a guest can make to them, from input bytes.
//!
//! The machine is bus 0 (host bridge plus a virtio-rng function with its
//! MSI-X vectors) behind the three views the buses see: the ECAM window,
//! ports 0xCF8/0xCFC and the 32-bit BAR window. Each input op is one
//! access with an input-chosen view, offset (inside, at the edges of and
//! past each window) and width (1-8 bytes, aligned or not), or a device
//! signalling an input-chosen MSI-X vector. Checked: nothing panics, the
//! host bridge's identity never changes, and every read fills its buffer.

#![no_main]

use std::sync::{Arc, Mutex};

use libfuzzer_sys::fuzz_target;
use provium_vmm::bus::BusDevice;
use provium_vmm::devices::pci::{
    MsiMessage, MsiRouter, MsixVectors, PciBarWindow, PciConfigIo, PciDevice, PciEcam, PciRoot,
};
use provium_vmm::devices::virtio::pci::{vectors_needed, VirtioPciDevice, BAR_BYTES};
use provium_vmm::devices::virtio::rng::{Rng, RngConfig};
use provium_vmm::guest_memory::GuestMemoryMmap;
use vm_memory::GuestAddress;
use vmm_sys_util::eventfd::EventFd;

const ECAM: (u64, u64) = (0xe000_0000, 1 << 20);
const WINDOW: (u64, u64) = (0xc000_0000, 0x1000_0000);
const MEM_BYTES: usize = 1 << 20;
const MAX_OPS: usize = 512;

/// Routes nowhere, as a KVM that refuses every other route would.
struct Router(Mutex<u32>);

impl MsiRouter for Router {
    fn route(&self, _gsi: u32, _msg: Option<MsiMessage>) -> std::io::Result<()> {
        let mut n = self.0.lock().expect("not poisoned");
        *n = n.wrapping_add(1);
        if *n % 7 == 0 {
            return Err(std::io::Error::other("refused"));
        }
        Ok(())
    }
}

struct Input<'a>(&'a [u8]);

impl Input<'_> {
    fn u8(&mut self) -> Option<u8> {
        let (&b, rest) = self.0.split_first()?;
        self.0 = rest;
        Some(b)
    }
    fn u32(&mut self) -> Option<u32> {
        Some(u32::from_le_bytes([
            self.u8()?,
            self.u8()?,
            self.u8()?,
            self.u8()?,
        ]))
    }
    fn u64(&mut self) -> Option<u64> {
        Some(u64::from(self.u32()?) | u64::from(self.u32()?) << 32)
    }
}

/// An offset for a window of `len` bytes: mostly inside, sometimes at
/// or past the edges.
fn offset(input: &mut Input<'_>, len: u64) -> Option<u64> {
    let raw = input.u32()?;
    Some(match raw >> 30 {
        0 | 1 => u64::from(raw) % len,
        2 => len.saturating_sub(u64::from(raw & 0xf)),
        _ => u64::from(raw) << 8,
    })
}

fuzz_target!(|data: &[u8]| {
    let mut input = Input(data);
    let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), MEM_BYTES)]).expect("guest memory");
    let mut root = PciRoot::new(ECAM, WINDOW);
    let slot = root.next_slot().expect("an empty bus");
    let bar = root.allocate_bar(BAR_BYTES).expect("room");
    let rng = Box::new(Rng::new(RngConfig { seed: Some(1) }));
    let n = vectors_needed(rng.as_ref());
    let fds = (0..n)
        .map(|_| EventFd::new(libc_nonblock()).expect("eventfd"))
        .collect();
    let gsis = (0..u32::from(n)).map(|i| 24 + i).collect();
    let msix = Arc::new(MsixVectors::new(fds, gsis, Arc::new(Router(Mutex::new(0)))));
    let dev = VirtioPciDevice::new(rng, mem, bar, msix.clone()).expect("valid function");
    let dev = Arc::new(Mutex::new(dev));
    root.insert(slot, dev.clone()).expect("free slot");
    let root = Arc::new(Mutex::new(root));
    let mut ecam = PciEcam(root.clone());
    let mut io = PciConfigIo(root.clone());
    let mut window = PciBarWindow(root.clone());
    // Memory decoding on, so BAR accesses reach the function (unless the
    // input turns it off again).
    io.write(
        0,
        &(0x8000_0000u32 | u32::from(slot) << 11 | 4).to_le_bytes(),
    );
    io.write(4, &[0x06, 0x00]);

    for _ in 0..MAX_OPS {
        let Some(op) = input.u8() else {
            break;
        };
        let width = usize::from(op >> 4) % 8 + 1;
        let write = op & 8 != 0;
        let Some(value) = input.u64() else {
            break;
        };
        let bytes = value.to_le_bytes();
        let mut buf = [0x5au8; 8];
        match op & 7 {
            0 => {
                // 0xCF8: the address register, often a valid bus-0 address.
                let v = if value & 1 == 0 {
                    0x8000_0000 | (value as u32 & 0x00ff_fffc)
                } else {
                    value as u32
                };
                io.write(0, &v.to_le_bytes()[..width.min(4)]);
            }
            1 => {
                let Some(off) = offset(&mut input, 8) else {
                    break;
                };
                if write {
                    io.write(off, &bytes[..width]);
                } else {
                    io.read(off, &mut buf[..width]);
                }
            }
            2 | 3 => {
                let Some(off) = offset(&mut input, ECAM.1) else {
                    break;
                };
                // Half the time the virtio function's own 4 KiB.
                let off = if op & 1 == 0 {
                    off
                } else {
                    (u64::from(slot) << 15) | (off & 0xff)
                };
                if write {
                    ecam.write(off, &bytes[..width]);
                } else {
                    ecam.read(off, &mut buf[..width]);
                }
            }
            4 | 5 => {
                // The BAR: common config, ISR, device config, notify,
                // MSI-X table and PBA, and the rest of the window.
                let Some(off) = offset(&mut input, if op & 1 == 0 { BAR_BYTES } else { WINDOW.1 })
                else {
                    break;
                };
                let off = if op & 1 == 0 {
                    bar - WINDOW.0 + off
                } else {
                    off
                };
                if write {
                    window.write(off, &bytes[..width]);
                } else {
                    window.read(off, &mut buf[..width]);
                }
            }
            6 => msix.signal(value as u16),
            _ => {
                // Straight at the function, bypassing the root's checks.
                let mut d = dev.lock().expect("not poisoned");
                let off = value % (BAR_BYTES + 16);
                if write {
                    d.write_bar(usize::from(op >> 7), off, &bytes[..width]);
                } else {
                    d.read_bar(usize::from(op >> 7), off, &mut buf[..width]);
                }
            }
        }
    }
    // The host bridge's identity is read-only whatever was written.
    let mut id = [0u8; 4];
    ecam.read(0, &mut id);
    assert_eq!(u32::from_le_bytes(id), 0x0d57_8086);
    // Stop the device (a reset) before it drops.
    let mut d = dev.lock().expect("not poisoned");
    let mut common = [0u8; 1];
    d.write_bar(0, 0x14, &[0]);
    d.read_bar(0, 0x14, &mut common);
    assert_eq!(common[0], 0, "reset status reads 0");
});

fn libc_nonblock() -> i32 {
    // EFD_NONBLOCK, without a libc dependency in this crate.
    0o4000
}
