//! A NIC slot's plug: which switch port a virtio-net device uses, changed
//! while the guest runs.
//!
//! Why: the guests this VMM boots find virtio-mmio devices only on their
//! kernel command line (no hotplug), so a NIC added after boot is a device
//! made at boot whose port is swapped in later. The slot starts on a port
//! whose link is down (a switch of its own); Linux's virtio_net, which
//! negotiated VIRTIO_NET_F_STATUS, keeps the carrier off. [`PortPlug::replug`]
//! moves the device's hooks (RX waker, link watcher) and offloads to the
//! new port and reports its link state through the device's link watcher,
//! which sets the status bit and raises the config interrupt
//! (`virtnet_config_changed_work` then turns the carrier on or off). The
//! device's queues pick the new port up at their next run (one atomic load
//! per run: [`PortPlug::generation`]).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use provium_netsetup::{LinkWatcher, Offloads, Port, RxWaker};

struct Inner {
    port: Arc<Port>,
    /// The device's hooks, moved along with the port.
    rx_waker: Option<RxWaker>,
    link_watcher: Option<LinkWatcher>,
    /// What the guest takes whole (negotiated features), for the new port.
    offloads: Offloads,
}

/// The port a NIC uses now. Shared by the device, its queues and the host.
pub struct PortPlug {
    inner: Mutex<Inner>,
    generation: AtomicU64,
}

impl std::fmt::Debug for PortPlug {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PortPlug")
            .field("port", &self.port().name().to_string())
            .finish()
    }
}

impl PortPlug {
    /// A plug on `port`.
    pub fn new(port: Arc<Port>) -> Arc<PortPlug> {
        Arc::new(PortPlug {
            inner: Mutex::new(Inner {
                port,
                rx_waker: None,
                link_watcher: None,
                offloads: Offloads::default(),
            }),
            generation: AtomicU64::new(0),
        })
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The port now.
    pub fn port(&self) -> Arc<Port> {
        self.lock().port.clone()
    }

    /// Bumped by every [`PortPlug::replug`].
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// Installs the device's hooks on the port (and remembers them for the
    /// next one), replacing earlier ones.
    pub(super) fn set_hooks(&self, rx_waker: RxWaker, link_watcher: LinkWatcher) {
        let mut g = self.lock();
        g.port.set_link_watcher(Some(link_watcher.clone()));
        g.port.set_rx_waker(Some(rx_waker.clone()));
        g.rx_waker = Some(rx_waker);
        g.link_watcher = Some(link_watcher);
    }

    /// Tells the port (and later ones) what the guest takes whole.
    pub(super) fn set_offloads(&self, offloads: Offloads) {
        let mut g = self.lock();
        g.offloads = offloads;
        g.port.set_offloads(offloads);
    }

    /// Moves the device to `port` and returns the port it leaves (its hooks
    /// removed; frames queued there stay there). The guest learns the new
    /// port's link state through a config interrupt when it differs.
    pub fn replug(&self, port: Arc<Port>) -> Arc<Port> {
        let mut g = self.lock();
        let old = std::mem::replace(&mut g.port, port.clone());
        old.set_rx_waker(None);
        old.set_link_watcher(None);
        old.set_offloads(Offloads::default());
        port.set_offloads(g.offloads);
        if let Some(w) = &g.link_watcher {
            port.set_link_watcher(Some(w.clone()));
        }
        if let Some(w) = &g.rx_waker {
            port.set_rx_waker(Some(w.clone()));
        }
        self.generation.fetch_add(1, Ordering::AcqRel);
        let (link, rx) = (g.link_watcher.clone(), g.rx_waker.clone());
        drop(g);
        // Outside the lock: the watcher raises an interrupt, the waker
        // wakes the worker (which then takes the new port).
        if let Some(link) = link {
            link(port.is_link_up());
        }
        if let Some(rx) = rx {
            rx();
        }
        old
    }
}
