//! Hostile-guest fuzzing of the virtio device models behind the real
//! virtio-mmio transport.
//!
//! The input picks a device (blk: a disk slot holding a small temp file, which
//! the host ejects and inserts between the guest's actions; rng, vsock, net on
//! a switch port, console), then is read as a list of guest actions against a 64 KiB
//! guest memory: raw MMIO register/config reads and writes at any offset and
//! width, bytes written anywhere in guest memory (descriptor tables, rings,
//! buffers: addresses, lengths, flags and `next` links are whatever the
//! input says, so loops, out-of-range addresses and absurd lengths occur), a
//! driver-init shortcut that sets up every queue at input-chosen addresses
//! and sets DRIVER_OK (activating the device and its worker thread), queue
//! notifications, snapshot `save`/`resume_after_save`, and reset. For net,
//! vsock and console an action also runs the device's queue processing
//! (`NetQueues::run_once`, `Muxer::work`, `ActiveConsole::after_event`
//! with the console's port state and a host session's bytes input-chosen) synchronously on this thread over
//! queues at input-chosen addresses, so their TX/RX parsing is exercised
//! deterministically, not only when the worker thread gets to it.
//!
//! A panic on any thread (worker threads included) aborts the process, which
//! libFuzzer reports as a crash.

#![no_main]

use std::io::Write;
use std::sync::Arc;

use event_manager::{EventManager, SubscriberOps};
use libfuzzer_sys::fuzz_target;
use provium_netsetup::{MacAddr, Offloads, Port, Switch, SwitchConfig, VnetHdr};
use provium_vmm::bus::BusDevice;
use provium_vmm::devices::legacy::EventFdTrigger;
use provium_vmm::devices::virtio::console::active::{ActiveConsole, PortState};
use provium_vmm::devices::virtio::console::{ConsoleHost, VirtioConsole};
use provium_vmm::devices::virtio::block::{Block, BlockConfig, BlockFaults, BlockSlot, DiskImage};
use provium_vmm::devices::virtio::mmio::{MmioInterrupt, MmioTransport};
use provium_vmm::devices::virtio::net::defs::{HDR_LEGACY_BYTES, HDR_V1_BYTES};
use provium_vmm::devices::virtio::net::packet::{NetFeatures, NetQueues};
use provium_vmm::devices::virtio::net::{Net, NetMetrics};
use provium_vmm::devices::virtio::rng::{Rng, RngConfig};
use provium_vmm::devices::virtio::vsock::muxer::Muxer;
use provium_vmm::devices::virtio::vsock::{Vsock, VsockHost};
use provium_vmm::devices::virtio::{VirtioDevice, VirtioInterrupt};
use provium_vmm::guest_memory::GuestMemoryMmap;
use virtio_queue::{Queue, QueueT};
use vm_memory::{Bytes, GuestAddress};
use vmm_sys_util::eventfd::EventFd;

/// Guest RAM: small, so nothing the guest does can make the host touch much.
const MEM_BYTES: usize = 64 << 10;
/// Actions per input, so one input cannot run for long.
const MAX_OPS: usize = 256;
const GUEST_MAC: MacAddr = MacAddr([0x02, 0x11, 0x22, 0x33, 0x44, 0x55]);
const PEER_MAC: MacAddr = MacAddr([0x02, 0, 0, 0, 0, 2]);

struct Input<'a>(&'a [u8]);

impl Input<'_> {
    fn u8(&mut self) -> Option<u8> {
        let (&b, rest) = self.0.split_first()?;
        self.0 = rest;
        Some(b)
    }
    fn u16(&mut self) -> Option<u16> {
        Some(u16::from_le_bytes([self.u8()?, self.u8()?]))
    }
    fn u32(&mut self) -> Option<u32> {
        Some(u32::from_le_bytes([
            self.u8()?,
            self.u8()?,
            self.u8()?,
            self.u8()?,
        ]))
    }
    fn bytes(&mut self, n: usize) -> &[u8] {
        let n = n.min(self.0.len());
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        a
    }
}

/// What lives across inputs: a disk file and a switch with the guest's and
/// a peer's port (the peer sends frames to the guest).
struct Fixtures {
    _file: tempfile::NamedTempFile,
    disk: Arc<DiskImage>,
    _switch: Switch,
    port: Arc<Port>,
    peer: Port,
}

fn fixtures() -> Fixtures {
    let mut f = tempfile::NamedTempFile::new().expect("tempfile");
    f.write_all(&vec![0x5a; 64 * 512]).expect("write disk");
    let disk = Arc::new(DiskImage::open(f.path(), false, "fuzz-vda").expect("open disk"));
    let switch = Switch::new("fuzz", SwitchConfig::default());
    let port = Arc::new(switch.attach("vm", GUEST_MAC).expect("attach vm"));
    let peer = switch.attach("peer", PEER_MAC).expect("attach peer");
    Fixtures {
        _file: f,
        disk,
        _switch: switch,
        port,
        peer,
    }
}

thread_local! {
    static FIX: Fixtures = fixtures();
}

#[derive(Default)]
struct NoInterrupt;

impl VirtioInterrupt for NoInterrupt {
    fn signal_used_queue(&self, _queue: u16) {}
    fn signal_config(&self) {}
}

/// A queue of up to `max` entries at input-chosen addresses, if it is valid.
fn queue_from(input: &mut Input<'_>, mem: &GuestMemoryMmap, max: u16) -> Option<Queue> {
    let mut q = Queue::new(max).ok()?;
    q.set_size(1u16 << (input.u8()? % 9));
    q.set_desc_table_address(Some(u32::from(input.u16()?)), Some(0));
    q.set_avail_ring_address(Some(u32::from(input.u16()?)), Some(0));
    q.set_used_ring_address(Some(u32::from(input.u16()?)), Some(0));
    q.set_ready(true);
    q.is_valid(mem).then_some(q)
}

fn run(data: &[u8]) {
    let mut input = Input(data);
    let Some(which) = input.u8() else { return };
    let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), MEM_BYTES)]).expect("guest memory");
    FIX.with(|fix| {
        // The block device is a disk slot: op 9 has the host eject or
        // insert its medium while the guest drives it (docs/disks.md).
        let medium = BlockConfig {
            disk: fix.disk.clone(),
            faults: Arc::new(BlockFaults::default()),
        };
        let slot = BlockSlot::holding(medium.clone());
        let device: Box<dyn VirtioDevice> = match which % 5 {
            0 => Box::new(Block::in_slot(slot.clone())),
            1 => Box::new(Rng::new(RngConfig { seed: Some(1) })),
            2 => Box::new(Vsock::new(VsockHost::new(3).expect("vsock host"))),
            3 => Box::new(Net::new(GUEST_MAC, fix.port.clone())),
            _ => Box::new(VirtioConsole::new(ConsoleHost::new().expect("console host"))),
        };
        let queue_count = device.queue_max_sizes().len();
        let irq = Arc::new(MmioInterrupt::new(EventFdTrigger::new().expect("eventfd")));
        let mut t = MmioTransport::new(device, mem.clone(), irq);
        let wr = |t: &mut MmioTransport, off: u64, v: u32| t.write(off, &v.to_le_bytes());
        for _ in 0..MAX_OPS {
            let Some(op) = input.u8() else { break };
            let r = (|| -> Option<()> {
                match op % 10 {
                    0 => {
                        let off = u64::from(input.u16()? % 0x200);
                        let v = input.u32()?;
                        wr(&mut t, off, v);
                    }
                    1 => {
                        let off = u64::from(input.u16()? % 0x200);
                        let mut b = [0u8; 8];
                        let n = usize::from(input.u8()? % 9);
                        t.read(off, &mut b[..n]);
                    }
                    2 => {
                        let off = u64::from(input.u16()?);
                        let n = usize::from(input.u8()? % 9);
                        let b = input.bytes(n).to_vec();
                        t.write(off, &b);
                    }
                    3 => {
                        let addr = u64::from(input.u16()?);
                        let n = usize::from(input.u8()?);
                        let b = input.bytes(n).to_vec();
                        let _ = mem.write_slice(&b, GuestAddress(addr));
                    }
                    4 => {
                        // The driver's init sequence, queues at input-chosen addresses.
                        wr(&mut t, 0x070, 0);
                        wr(&mut t, 0x070, 1);
                        wr(&mut t, 0x070, 3);
                        wr(&mut t, 0x024, 0);
                        wr(&mut t, 0x020, input.u32()?);
                        wr(&mut t, 0x024, 1);
                        wr(&mut t, 0x020, input.u32()? & 1);
                        wr(&mut t, 0x070, 0xb);
                        for i in 0..queue_count {
                            wr(&mut t, 0x030, i as u32);
                            wr(&mut t, 0x038, 1u32 << (input.u8()? % 9));
                            wr(&mut t, 0x080, u32::from(input.u16()?));
                            wr(&mut t, 0x090, u32::from(input.u16()?));
                            wr(&mut t, 0x0a0, u32::from(input.u16()?));
                            wr(&mut t, 0x044, 1);
                        }
                        wr(&mut t, 0x070, 0xf);
                    }
                    5 => wr(&mut t, 0x050, u32::from(input.u8()? % 4)),
                    6 => {
                        let _ = t.save();
                        t.resume_after_save();
                    }
                    7 => wr(&mut t, 0x070, 0),
                    8 => {
                        // A frame from the peer towards the guest.
                        let n = usize::from(input.u16()? % 2048);
                        let mut frame = input.bytes(n).to_vec();
                        if frame.len() >= 12 {
                            frame[..6].copy_from_slice(&GUEST_MAC.0);
                            frame[6..12].copy_from_slice(&PEER_MAC.0);
                        }
                        let _ = fix.peer.send(&frame);
                    }
                    9 if which % 5 == 0 => {
                        if slot.eject().is_none() {
                            let _ = slot.insert(medium.clone());
                        }
                    }
                    _ => sync_drive(&mut input, &mem, which % 5, fix),
                }
                Some(())
            })();
            if r.is_none() {
                break;
            }
        }
        // Dropping the transport stops the device's worker (joins it).
        drop(t);
        while fix.peer.try_recv().is_some() {}
        fix.port.set_offloads(Offloads::default());
    });
}

/// Runs net's or vsock's queue processing on this thread.
fn sync_drive(input: &mut Input<'_>, mem: &GuestMemoryMmap, which: u8, fix: &Fixtures) {
    let (Some(rxq), Some(txq)) = (queue_from(input, mem, 256), queue_from(input, mem, 256)) else {
        return;
    };
    let rounds = input.u8().map_or(1, |r| r % 4 + 1);
    match which {
        2 => {
            let host = VsockHost::new(3).expect("vsock host");
            let kick = Arc::new(EventFd::new(0).expect("eventfd"));
            let mut m = Muxer::new(
                Arc::new(host),
                mem.clone(),
                rxq,
                txq,
                Arc::new(NoInterrupt),
                kick,
            )
            .expect("muxer fds");
            for _ in 0..rounds {
                m.work();
            }
            // One round of the worker's event loop, without waiting.
            let mut em = EventManager::new().expect("event manager");
            em.add_subscriber(m);
            let _ = em.run_with_timeout(0);
        }
        3 => {
            let hdr = if input.u8().unwrap_or(0) & 1 == 0 {
                HDR_V1_BYTES
            } else {
                HDR_LEGACY_BYTES
            };
            let mut q = NetQueues::new(
                mem.clone(),
                rxq,
                txq,
                fix.port.clone(),
                hdr,
                Arc::new(NetMetrics::default()),
            );
            // Offloads as negotiated by the input: TX headers read and
            // validated, RX headers carrying GSO, mergeable RX buffers.
            let f = input.u8().unwrap_or(0);
            q.set_features(NetFeatures {
                csum: f & 1 != 0,
                host_tso4: f & 2 != 0,
                host_tso6: f & 4 != 0,
                mrg_rxbuf: f & 8 != 0,
            });
            let all = f & 16 != 0;
            fix.port.set_offloads(if all {
                Offloads::ALL
            } else {
                Offloads::default()
            });
            fix.peer.set_offloads(Offloads::ALL);
            // The peer sends the guest a frame with an input-chosen header.
            if f & 32 != 0 {
                if let Some(h) = VnetHdr::from_bytes(input.bytes(10)) {
                    let len = usize::from(input.u16().unwrap_or(0)) % 9000;
                    let mut frame = GUEST_MAC.0.to_vec();
                    frame.extend_from_slice(&PEER_MAC.0);
                    frame.extend_from_slice(input.bytes(len));
                    let _ = fix.peer.send_offload(h, &frame);
                }
            }
            for _ in 0..rounds {
                q.run_once();
            }
        }
        4 => {
            let (Some(cq_rx), Some(cq_tx)) =
                (queue_from(input, mem, 64), queue_from(input, mem, 64))
            else {
                return;
            };
            let f = input.u8().unwrap_or(0);
            let port = PortState {
                driver_ready: f & 1 != 0,
                port_ready: f & 2 != 0,
                guest_open: f & 4 != 0,
                guest_open_fresh: f & 8 != 0,
                host_open_sent: f & 16 != 0,
            };
            let host = ConsoleHost::new().expect("console host");
            host.set_active(true);
            let mut a = ActiveConsole::new(
                host.clone(),
                mem.clone(),
                vec![rxq, txq, cq_rx, cq_tx],
                Arc::new(NoInterrupt),
                port,
                Default::default(),
            )
            .expect("console fds");
            // A host session whose bytes the input chooses (it starts only
            // if the port state lets it).
            let n = usize::from(input.u16().unwrap_or(0) % 4096);
            let payload = input.bytes(n).to_vec();
            let h = host.clone();
            let t = std::thread::spawn(move || {
                let s = h.connect(std::time::Duration::from_millis(5));
                if let Ok(mut s) = s {
                    let _ = s.write_all(&payload);
                    return Some(s);
                }
                None
            });
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(1);
            while !host.connect_waiting() && !t.is_finished() && std::time::Instant::now() < deadline {
                std::thread::yield_now();
            }
            a.after_event();
            let session = t.join().expect("connect thread");
            for _ in 0..rounds {
                a.after_event();
            }
            drop(session);
            a.after_event();
        }
        _ => {}
    }
}

fuzz_target!(|data: &[u8]| run(data));
