//! The virtio-net `VirtioDevice`: features, config space (MAC and link
//! status), and a device worker per activation (`worker_slot::WorkerSlot`)
//! that moves frames.
//!
//! The worker owns the queues ([`ActiveNet`], `active.rs`). A notify from a vCPU and the
//! port's RX waker (run by the switch after it queued a frame for us) only
//! write an eventfd each (an eventfd is a counter: wake-ups coalesce, so a
//! flood of frames or notifies costs no memory); the worker then drains TX
//! and RX. The link
//! watcher runs on whichever thread called `Switch::disconnect`/`reconnect`:
//! it flips the status bit and raises the configuration interrupt. Both hooks
//! hold only a weak reference, so a device dropped on reset leaves no live
//! callback on the port; the next device's `new` replaces them.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use provium_netsetup::{MacAddr, Offloads, Port};
use virtio_bindings::virtio_config::VIRTIO_F_VERSION_1;
use virtio_bindings::virtio_ids::VIRTIO_ID_NET;
use virtio_bindings::virtio_net::{
    VIRTIO_NET_F_CSUM, VIRTIO_NET_F_GUEST_CSUM, VIRTIO_NET_F_GUEST_TSO4, VIRTIO_NET_F_GUEST_TSO6,
    VIRTIO_NET_F_HOST_TSO4, VIRTIO_NET_F_HOST_TSO6, VIRTIO_NET_F_MAC, VIRTIO_NET_F_MRG_RXBUF,
    VIRTIO_NET_F_STATUS, VIRTIO_NET_S_LINK_UP,
};
use virtio_queue::Queue;
use vmm_sys_util::eventfd::EventFd;

use super::active::ActiveNet;
use super::defs::{
    CONFIG_BYTES, CONFIG_STATUS_OFFSET, HDR_LEGACY_BYTES, HDR_V1_BYTES, QUEUE_SIZE, RXQ, TXQ,
};
use super::packet::{NetFeatures, NetMetrics, NetQueues};
use super::persist::{NetConstructorArgs, NetState};
use super::plug::PortPlug;
use crate::devices::virtio::persist::{
    check_queue_count, decode_state, encode_state, ActiveArgs, DeviceSnapshot, QueueSnapshot,
    VirtioPersistError,
};
use crate::devices::virtio::worker_slot::WorkerSlot;
use crate::devices::virtio::{read_config_bytes, ActivateError, VirtioDevice, VirtioInterrupt};
use crate::guest_memory::GuestMemoryMmap;
use provium_snapshot::Persist;

/// What the hooks on the port and the device share.
struct Shared {
    link_up: AtomicBool,
    /// Set while activated: where link changes raise a config interrupt.
    interrupt: Mutex<Option<Arc<dyn VirtioInterrupt>>>,
    /// Set while activated: the worker's port-RX eventfd (a clone).
    port_rx: Mutex<Option<EventFd>>,
}

fn locked<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Shared {
    /// Wakes the worker for frames the switch queued on the port.
    fn wake_for_port_rx(&self) {
        if let Some(fd) = locked(&self.port_rx).as_ref() {
            // Only fails when the counter would overflow: a wake-up is
            // pending then, which is all we need.
            let _ = fd.write(1);
        }
    }

    fn set_link(&self, up: bool) {
        let was = self.link_up.swap(up, Ordering::SeqCst);
        if was == up {
            return;
        }
        let irq = locked(&self.interrupt).clone();
        if let Some(irq) = irq {
            irq.signal_config();
        }
    }
}

/// A virtio-net device on a switch port.
pub struct Net {
    mac: MacAddr,
    plug: Arc<PortPlug>,
    shared: Arc<Shared>,
    metrics: Arc<NetMetrics>,
    acked_features: u64,
    /// The activated device, on its worker or parked by a save.
    worker: WorkerSlot<ActiveNet>,
}

impl Net {
    /// A device with MAC `mac` whose frames go through `port`. Installs the
    /// port's RX waker and link watcher (replacing earlier ones: after a
    /// reset, the new device takes the port over).
    pub fn new(mac: MacAddr, port: Arc<Port>) -> Net {
        Net::on_plug(mac, PortPlug::new(port))
    }

    /// A device with MAC `mac` on whatever port `plug` holds, now and after
    /// a [`PortPlug::replug`] (a NIC slot, see `plug.rs`).
    pub fn on_plug(mac: MacAddr, plug: Arc<PortPlug>) -> Net {
        let shared = Arc::new(Shared {
            link_up: AtomicBool::new(true),
            interrupt: Mutex::new(None),
            port_rx: Mutex::new(None),
        });
        let w = Arc::downgrade(&shared);
        let link: provium_netsetup::LinkWatcher = Arc::new(move |up| {
            if let Some(s) = w.upgrade() {
                s.set_link(up);
            }
        });
        let w = Arc::downgrade(&shared);
        let rx: provium_netsetup::RxWaker = Arc::new(move || {
            if let Some(s) = w.upgrade() {
                s.wake_for_port_rx();
            }
        });
        plug.set_hooks(rx, link);
        // Read after the watcher is in place so no change is missed.
        shared
            .link_up
            .store(plug.port().is_link_up(), Ordering::SeqCst);
        Net {
            mac,
            plug,
            shared,
            metrics: Arc::new(NetMetrics::default()),
            acked_features: 0,
            worker: WorkerSlot::new("virtio-net"),
        }
    }

    /// The device's counters (shared; they survive activation and reset).
    pub fn metrics(&self) -> Arc<NetMetrics> {
        self.metrics.clone()
    }

    /// Whether config space reports the link up.
    pub fn link_up(&self) -> bool {
        self.shared.link_up.load(Ordering::SeqCst)
    }

    fn config_space(&self) -> [u8; CONFIG_BYTES] {
        let mut c = [0u8; CONFIG_BYTES];
        c[..6].copy_from_slice(&self.mac.0);
        let status = if self.link_up() {
            VIRTIO_NET_S_LINK_UP as u16
        } else {
            0
        };
        c[CONFIG_STATUS_OFFSET..CONFIG_STATUS_OFFSET + 2].copy_from_slice(&status.to_le_bytes());
        c
    }

    fn stop_worker(&mut self) {
        self.unhook();
        drop(self.worker.stop());
    }

    /// Parts the port's hooks from the worker: until one runs again, link
    /// changes raise no interrupt and frames on the port wake nobody.
    fn unhook(&self) {
        *locked(&self.shared.port_rx) = None;
        *locked(&self.shared.interrupt) = None;
    }

    fn acked(&self, bit: u32) -> bool {
        self.acked_features & (1u64 << bit) != 0
    }

    /// What the guest takes whole from the switch (GUEST_* features).
    fn guest_offloads(&self) -> Offloads {
        let csum = self.acked(VIRTIO_NET_F_GUEST_CSUM);
        Offloads {
            csum,
            tso4: csum && self.acked(VIRTIO_NET_F_GUEST_TSO4),
            tso6: csum && self.acked(VIRTIO_NET_F_GUEST_TSO6),
            uso: false,
        }
    }

    /// What the queues act on (HOST_* features and MRG_RXBUF).
    fn net_features(&self) -> NetFeatures {
        NetFeatures {
            csum: self.acked(VIRTIO_NET_F_CSUM),
            host_tso4: self.acked(VIRTIO_NET_F_HOST_TSO4),
            host_tso6: self.acked(VIRTIO_NET_F_HOST_TSO6),
            mrg_rxbuf: self.acked(VIRTIO_NET_F_MRG_RXBUF),
        }
    }

    /// Queues for an activation with the negotiated features; tells the
    /// switch port what the guest takes.
    fn queues(&self, mem: GuestMemoryMmap, rxq: Queue, txq: Queue) -> NetQueues {
        self.plug.set_offloads(self.guest_offloads());
        let mut q = NetQueues::on_plug(
            mem,
            rxq,
            txq,
            self.plug.clone(),
            self.hdr_bytes(),
            self.metrics.clone(),
        );
        q.set_features(self.net_features());
        q
    }

    fn hdr_bytes(&self) -> usize {
        if self.acked_features & (1u64 << VIRTIO_F_VERSION_1) != 0 {
            HDR_V1_BYTES
        } else {
            HDR_LEGACY_BYTES
        }
    }

    /// Runs `q` on a new worker thread, wired to the port's hooks.
    fn start_worker(
        &mut self,
        q: NetQueues,
        interrupt: Arc<dyn VirtioInterrupt>,
    ) -> Result<(), ActivateError> {
        let active = ActiveNet::new(self.mac.0, q, interrupt).map_err(ActivateError::Worker)?;
        self.start_active(active)
    }

    fn start_active(&mut self, active: ActiveNet) -> Result<(), ActivateError> {
        let port_rx = active.port_rx.try_clone().map_err(ActivateError::Worker)?;
        let interrupt = active.interrupt.clone();
        self.worker.start(active)?;
        *locked(&self.shared.interrupt) = Some(interrupt);
        *locked(&self.shared.port_rx) = Some(port_rx);
        // Frames may have queued on the port while no worker ran.
        self.shared.wake_for_port_rx();
        Ok(())
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        self.stop_worker();
    }
}

impl VirtioDevice for Net {
    fn device_type(&self) -> u32 {
        VIRTIO_ID_NET
    }

    fn queue_max_sizes(&self) -> &[u16] {
        &[QUEUE_SIZE; 2]
    }

    fn avail_features(&self) -> u64 {
        [
            VIRTIO_F_VERSION_1,
            VIRTIO_NET_F_MAC,
            VIRTIO_NET_F_STATUS,
            VIRTIO_NET_F_CSUM,
            VIRTIO_NET_F_GUEST_CSUM,
            VIRTIO_NET_F_HOST_TSO4,
            VIRTIO_NET_F_HOST_TSO6,
            VIRTIO_NET_F_GUEST_TSO4,
            VIRTIO_NET_F_GUEST_TSO6,
            VIRTIO_NET_F_MRG_RXBUF,
        ]
        .iter()
        .fold(0, |f, b| f | (1u64 << b))
    }

    fn set_acked_features(&mut self, features: u64) {
        self.acked_features = features & self.avail_features();
    }

    fn read_config(&self, offset: u64, data: &mut [u8]) {
        read_config_bytes(&self.config_space(), offset, data);
    }

    fn write_config(&mut self, _offset: u64, _data: &[u8]) {
        // The MAC is ours (no CTRL_MAC_ADDR) and status is read-only.
    }

    fn activate(
        &mut self,
        mem: GuestMemoryMmap,
        mut queues: Vec<Queue>,
        interrupt: Arc<dyn VirtioInterrupt>,
    ) -> Result<(), ActivateError> {
        ActivateError::check_queue_count(&queues, 2)?;
        self.stop_worker();
        let txq = queues.remove(TXQ);
        let rxq = queues.remove(RXQ);
        let q = self.queues(mem, rxq, txq);
        self.start_worker(q, interrupt)
    }

    fn queue_notify(&mut self, _index: u32) {
        // Any index: the worker drains both queues.
        self.worker.notify();
    }

    fn reset(&mut self) {
        self.stop_worker();
        self.acked_features = 0;
        self.plug.set_offloads(Offloads::default());
    }

    fn save(&mut self) -> DeviceSnapshot {
        self.unhook();
        let Some(active) = self.worker.park() else {
            return DeviceSnapshot {
                queues: Vec::new(),
                state: encode_state(&NetState {
                    mac: self.mac.0,
                    pending_rx: None,
                    pending_rx_hdr: [0; 10],
                }),
            };
        };
        let q = &active.queues;
        DeviceSnapshot {
            queues: vec![QueueSnapshot::of(q.rxq()), QueueSnapshot::of(q.txq())],
            state: encode_state(&active.save()),
        }
    }

    fn resume_after_save(&mut self) {
        // The same queues (and held frame) go to a new worker. A failed
        // spawn leaves the device stopped, as a failed activate would.
        if let Some(active) = self.worker.unpark() {
            let _ = self.start_active(active);
        }
    }

    fn restore(
        &mut self,
        active: Option<ActiveArgs>,
        state: &[u8],
    ) -> Result<(), VirtioPersistError> {
        let state: NetState = decode_state("virtio-net", state)?;
        state.validate(self.mac.0)?;
        let Some(mut a) = active else {
            return Ok(());
        };
        check_queue_count("virtio-net", &a.queues, 2)?;
        let txq = a.queues.remove(TXQ);
        let rxq = a.queues.remove(RXQ);
        let args = NetConstructorArgs {
            mac: self.mac.0,
            queues: self.queues(a.mem, rxq, txq),
            interrupt: a.interrupt,
        };
        let active = ActiveNet::restore(args, &state)?;
        self.stop_worker();
        self.start_active(active)
            .map_err(VirtioPersistError::Activate)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::devices::virtio::test_utils::{guest_memory, CountingInterrupt};
    use provium_netsetup::{Switch, SwitchConfig};
    use std::time::{Duration, Instant};
    use virtio_bindings::virtio_ring::VRING_DESC_F_WRITE;
    use virtio_queue::desc::{split::Descriptor as SplitDescriptor, RawDescriptor};
    use virtio_queue::mock::MockSplitQueue;
    use vm_memory::{Address, Bytes, GuestAddress};

    const GUEST: MacAddr = MacAddr([0x02, 0x11, 0x22, 0x33, 0x44, 0x55]);
    const PEER: MacAddr = MacAddr([0x02, 0, 0, 0, 0, 2]);

    fn wait(what: &str, mut f: impl FnMut() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !f() {
            assert!(Instant::now() < deadline, "timed out waiting for {what}");
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    /// The guest queues one 60-byte frame (GUEST to PEER, behind the
    /// 12-byte virtio-net header) on the TX queue and notifies; the peer
    /// receives exactly the frame, the header stripped.
    fn guest_sends_a_frame_the_peer_gets(
        mem: &GuestMemoryMmap,
        tx: &MockSplitQueue<'_, GuestMemoryMmap>,
        dev: &mut Net,
        peer: &provium_netsetup::Port,
    ) {
        let mut out = vec![0u8; 12];
        out.extend_from_slice(&PEER.0);
        out.extend_from_slice(&GUEST.0);
        out.extend_from_slice(&[0x88, 0xb5]);
        out.resize(12 + 60, 0xbb);
        mem.write_slice(&out, GuestAddress(0x10_0000))
            .expect("write");
        tx.add_desc_chains(
            &[RawDescriptor::from(SplitDescriptor::new(
                0x10_0000, 72, 0, 0,
            ))],
            0,
        )
        .expect("tx chain");
        dev.queue_notify(TXQ as u32);
        assert_eq!(
            peer.recv_timeout(Duration::from_secs(10)).as_deref(),
            Some(&out[12..])
        );
    }

    /// Activates `dev` with an RX queue at 0 and a TX queue at 0x1_0000 of
    /// `mem` (16 entries each) and `irq`; returns the two queues, for the
    /// test to add buffers and read used entries.
    fn activate<'a>(
        dev: &mut Net,
        mem: &'a GuestMemoryMmap,
        irq: &Arc<CountingInterrupt>,
    ) -> (
        MockSplitQueue<'a, GuestMemoryMmap>,
        MockSplitQueue<'a, GuestMemoryMmap>,
    ) {
        let rx = MockSplitQueue::create(mem, GuestAddress(0), 16);
        let tx = MockSplitQueue::create(mem, GuestAddress(0x1_0000), 16);
        dev.activate(
            mem.clone(),
            vec![
                rx.create_queue().expect("rx"),
                tx.create_queue().expect("tx"),
            ],
            irq.clone(),
        )
        .expect("activate");
        (rx, tx)
    }

    fn status(dev: &Net) -> u16 {
        let mut b = [0u8; 2];
        dev.read_config(CONFIG_STATUS_OFFSET as u64, &mut b);
        u16::from_le_bytes(b)
    }

    #[test]
    fn features_and_config_space() {
        let sw = Switch::new("lan", SwitchConfig::default());
        let port = Arc::new(sw.attach("vm", GUEST).expect("attach"));
        let mut dev = Net::new(GUEST, port);
        assert_eq!(dev.device_type(), 1);
        assert_eq!(dev.queue_max_sizes(), &[256, 256]);
        // VERSION_1, MAC, STATUS, CSUM, GUEST_CSUM, GUEST_TSO4/6,
        // HOST_TSO4/6, MRG_RXBUF (virtio 1.2, 5.1.3).
        let bits = [32, 5, 16, 0, 1, 7, 8, 11, 12, 15];
        assert_eq!(
            dev.avail_features(),
            bits.iter().fold(0, |f, b| f | (1u64 << b))
        );
        dev.set_acked_features(u64::MAX);
        assert_eq!(dev.acked_features, dev.avail_features());
        assert_eq!(
            dev.guest_offloads(),
            Offloads {
                uso: false,
                ..Offloads::ALL
            }
        );
        // GUEST_TSO4 without GUEST_CSUM is no offload at all.
        dev.set_acked_features((1 << 32) | (1 << 7));
        assert_eq!(dev.guest_offloads(), Offloads::default());
        let mut cfg = [0xffu8; 12];
        dev.read_config(0, &mut cfg);
        assert_eq!(cfg, [0x02, 0x11, 0x22, 0x33, 0x44, 0x55, 1, 0, 0, 0, 0, 0]);
        dev.write_config(0, &[0; 6]);
        let mut mac = [0u8; 6];
        dev.read_config(0, &mut mac);
        assert_eq!(mac, GUEST.0, "the guest cannot change the MAC");
        dev.read_config(u64::MAX, &mut cfg);
        assert_eq!(cfg, [0; 12]);
        dev.queue_notify(9); // before activation: nothing to wake
        assert!(dev
            .activate(
                guest_memory(),
                vec![],
                Arc::new(CountingInterrupt::default())
            )
            .is_err());
    }

    #[test]
    fn link_follows_the_switch_port_with_config_interrupts() {
        let sw = Switch::new("lan", SwitchConfig::default());
        let port = Arc::new(sw.attach("vm", GUEST).expect("attach"));
        sw.disconnect("vm").expect("disconnect");
        // Created on a port that is already down: reports down.
        let mut dev = Net::new(GUEST, port);
        assert_eq!(status(&dev), 0);
        sw.reconnect("vm").expect("reconnect");
        assert_eq!(
            status(&dev),
            1,
            "not activated: status changes, no interrupt"
        );
        let mem = guest_memory();
        let irq = Arc::new(CountingInterrupt::default());
        let _queues = activate(&mut dev, &mem, &irq);
        sw.disconnect("vm").expect("disconnect");
        assert_eq!(status(&dev), 0);
        assert_eq!(irq.config.load(Ordering::SeqCst), 1);
        sw.disconnect("vm").expect("disconnect twice");
        assert_eq!(
            irq.config.load(Ordering::SeqCst),
            1,
            "no change, no interrupt"
        );
        sw.reconnect("vm").expect("reconnect");
        assert_eq!(status(&dev), 1);
        assert_eq!(irq.config.load(Ordering::SeqCst), 2);
        dev.reset();
        sw.disconnect("vm").expect("disconnect after reset");
        assert_eq!(status(&dev), 0);
        assert_eq!(
            irq.config.load(Ordering::SeqCst),
            2,
            "reset device raises nothing"
        );
    }

    #[test]
    fn a_nic_slot_joins_a_switch_and_leaves_it_while_the_guest_runs() {
        // Made at boot on a port of its own, link down.
        let lone = Switch::new("slot", SwitchConfig::default());
        let parked = Arc::new(lone.attach("vm", GUEST).expect("attach"));
        lone.disconnect("vm").expect("down");
        let plug = PortPlug::new(parked.clone());
        let mut dev = Net::on_plug(GUEST, plug.clone());
        assert_eq!(status(&dev), 0, "a down ethN until attached");
        let mem = guest_memory();
        let irq = Arc::new(CountingInterrupt::default());
        dev.set_acked_features(dev.avail_features());
        let (rx, tx) = activate(&mut dev, &mem, &irq);
        // Attach: a port on the bridge's switch, with the slot's MAC.
        let lan = Switch::new("lan", SwitchConfig::default());
        let peer = lan.attach("peer", PEER).expect("peer");
        let on_lan = Arc::new(lan.attach("vm", GUEST).expect("attach"));
        let old = plug.replug(on_lan.clone());
        assert!(Arc::ptr_eq(&old, &parked));
        assert_eq!(status(&dev), 1, "link up");
        assert_eq!(irq.config.load(Ordering::SeqCst), 1, "config interrupt");
        assert!(
            on_lan.offloads().tso4,
            "the new port takes the guest's offloads"
        );
        assert_eq!(parked.offloads(), Offloads::default());
        // Frames flow on the new port, both ways.
        let w = VRING_DESC_F_WRITE as u16;
        rx.add_desc_chains(
            &[RawDescriptor::from(SplitDescriptor::new(
                0x20_0000, 2048, w, 0,
            ))],
            0,
        )
        .expect("rx chain");
        let mut frame = GUEST.0.to_vec();
        frame.extend_from_slice(&PEER.0);
        frame.extend_from_slice(&[0x88, 0xb5]);
        frame.resize(60, 0xaa);
        peer.send(&frame).expect("send");
        let used_idx = |q: &MockSplitQueue<'_, GuestMemoryMmap>| -> u16 {
            mem.read_obj(q.used_addr().unchecked_add(2)).expect("idx")
        };
        wait("the frame in the RX ring", || used_idx(&rx) == 1);
        guest_sends_a_frame_the_peer_gets(&mem, &tx, &mut dev, &peer);
        // A hostile guest's config writes change neither MAC nor status.
        dev.write_config(0, &[0xff; 8]);
        dev.write_config(u64::MAX, &[1; 2]);
        let mut mac = [0u8; 6];
        dev.read_config(0, &mut mac);
        assert_eq!((mac, status(&dev)), (GUEST.0, 1));
        // Detach: back to the parked port, link down.
        plug.replug(parked);
        assert_eq!(status(&dev), 0);
        assert_eq!(irq.config.load(Ordering::SeqCst), 2);
        dev.reset();
    }

    #[test]
    fn worker_moves_frames_both_ways_and_interrupts() {
        let sw = Switch::new("lan", SwitchConfig::default());
        let port = Arc::new(sw.attach("vm", GUEST).expect("attach"));
        let peer = sw.attach("peer", PEER).expect("peer");
        let mut dev = Net::new(GUEST, port);
        let mem = guest_memory();
        // A frame queued before the driver is up is delivered once it is.
        let mut early = PEER.0.to_vec();
        early.splice(0..0, GUEST.0);
        early.extend_from_slice(&[0x88, 0xb5]);
        early.resize(60, 0xaa);
        peer.send(&early).expect("send");
        let irq = Arc::new(CountingInterrupt::default());
        dev.set_acked_features(dev.avail_features());
        let (rx, tx) = activate(&mut dev, &mem, &irq);
        assert!(
            dev.plug.port().offloads().tso4 && dev.plug.port().offloads().tso6,
            "the port takes what the guest negotiated"
        );
        let w = VRING_DESC_F_WRITE as u16;
        rx.add_desc_chains(
            &[RawDescriptor::from(SplitDescriptor::new(
                0x20_0000, 2048, w, 0,
            ))],
            0,
        )
        .expect("rx chain");
        dev.queue_notify(RXQ as u32);
        let used_idx = |q: &MockSplitQueue<'_, GuestMemoryMmap>| -> u16 {
            mem.read_obj(q.used_addr().unchecked_add(2)).expect("idx")
        };
        wait("the early frame in the RX ring", || used_idx(&rx) == 1);
        let mut got = vec![0u8; 72];
        mem.read_slice(&mut got, GuestAddress(0x20_0000))
            .expect("read");
        assert_eq!(&got[12..], &early[..]);
        wait("a used-queue interrupt", || {
            irq.used.load(Ordering::SeqCst) >= 1
        });

        guest_sends_a_frame_the_peer_gets(&mem, &tx, &mut dev, &peer);
        wait("the TX chain returned", || used_idx(&tx) == 1);
        let m = dev.metrics().snapshot();
        assert_eq!(m, [1, 0, 0, 1, 0, 0]);
        dev.reset();
        assert!(!dev.worker.is_running());
        assert_eq!(
            dev.plug.port().offloads(),
            Offloads::default(),
            "reset drops offloads"
        );
    }

    fn frame_to_guest(tag: u8) -> Vec<u8> {
        let mut f = GUEST.0.to_vec();
        f.extend_from_slice(&PEER.0);
        f.extend_from_slice(&[0x88, 0xb5]);
        f.resize(60, tag);
        f
    }

    #[test]
    fn save_quiesces_resume_continues_restore_rebuilds() {
        let sw = Switch::new("lan", SwitchConfig::default());
        let port = Arc::new(sw.attach("vm", GUEST).expect("attach"));
        let peer = sw.attach("peer", PEER).expect("peer");
        let mut dev = Net::new(GUEST, port.clone());
        let mem = guest_memory();
        let irq = Arc::new(CountingInterrupt::default());
        dev.set_acked_features(dev.avail_features());
        let (rx, _tx) = activate(&mut dev, &mem, &irq);
        // No RX buffer: the first frame ends up held inside the device.
        peer.send(&frame_to_guest(1)).expect("send");
        wait("the frame taken from the port", || port.pending() == 0);
        let snap = dev.save();
        assert_eq!(snap.queues.len(), 2);
        let state: NetState = decode_state("virtio-net", &snap.state).expect("decodes");
        assert_eq!(state.mac, GUEST.0);
        assert_eq!(state.pending_rx, Some(frame_to_guest(1)));
        // Quiesced: a buffer and a notify do nothing until resume.
        let w = VRING_DESC_F_WRITE as u16;
        rx.add_desc_chains(
            &[
                RawDescriptor::from(SplitDescriptor::new(0x20_0000, 2048, w, 0)),
                RawDescriptor::from(SplitDescriptor::new(0x21_0000, 2048, w, 0)),
            ],
            0,
        )
        .expect("rx chains");
        dev.queue_notify(0);
        std::thread::sleep(Duration::from_millis(50));
        let used_idx = || -> u16 { mem.read_obj(rx.used_addr().unchecked_add(2)).expect("idx") };
        assert_eq!(used_idx(), 0, "no guest memory written while saved");
        dev.resume_after_save();
        wait("the held frame delivered after resume", || used_idx() == 1);

        // Restore into a fresh device on another switch and fresh memory
        // laid out as at save time (rings empty, next_avail 0): the queues
        // come back from the snapshot and the held frame with them.
        let mem2 = guest_memory();
        let rx2 = MockSplitQueue::create(&mem2, GuestAddress(0), 16);
        let _tx2 = MockSplitQueue::create(&mem2, GuestAddress(0x1_0000), 16);
        rx2.add_desc_chains(
            &[RawDescriptor::from(SplitDescriptor::new(
                0x20_0000, 2048, w, 0,
            ))],
            0,
        )
        .expect("rx chain");
        let sw2 = Switch::new("lan2", SwitchConfig::default());
        let port2 = Arc::new(sw2.attach("vm", GUEST).expect("attach"));
        let mut dev2 = Net::new(GUEST, port2);
        dev2.set_acked_features(dev2.avail_features());
        let queues = snap
            .queues
            .iter()
            .enumerate()
            .map(|(i, q)| {
                q.to_queue(i, 16, &mem2)
                    .expect("queue (the mock rings are 16 long)")
            })
            .collect();
        dev2.restore(
            Some(ActiveArgs {
                mem: mem2.clone(),
                queues,
                interrupt: irq.clone(),
            }),
            &snap.state,
        )
        .expect("restore");
        wait("the restored device delivering", || {
            mem2.read_obj::<u16>(rx2.used_addr().unchecked_add(2))
                .expect("idx")
                == 1
        });
        let mut got = vec![0u8; 60];
        mem2.read_slice(&mut got, GuestAddress(0x20_000c))
            .expect("read");
        assert_eq!(got, frame_to_guest(1));
        // A snapshot naming another MAC is refused.
        let mut dev3 = Net::new(PEER, Arc::new(sw2.attach("x", PEER).expect("x")));
        let e = dev3.restore(None, &snap.state).unwrap_err().to_string();
        assert!(e.contains("MAC"), "{e}");
        assert!(dev3.restore(None, &[0xc1]).is_err());
    }
}
