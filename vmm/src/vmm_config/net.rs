//! A NIC given to the VM: a virtio-net device on a port of a bridge's switch.

use std::sync::Arc;

use provium_netsetup::{MacAddr, Port};

/// One virtio-net device. The builder announces net devices after every other
/// virtio device, in this list's order, so a Linux guest names them eth0,
/// eth1, ... in that order (the harness lists them by bridge name).
#[derive(Clone, Debug)]
pub struct NetConfig {
    /// The guest NIC's MAC (config space). Usually the port's own MAC.
    pub mac: MacAddr,
    /// The switch port the device sends into and receives from. Shared, so a
    /// warm reset builds the new device on the same port; the port stays
    /// attached while this config lives. `Switch::disconnect` on it drops the
    /// guest's link (status bit + config interrupt).
    pub port: Arc<Port>,
}

impl NetConfig {
    /// A NIC on `port` with the port's MAC.
    pub fn on_port(port: Arc<Port>) -> NetConfig {
        NetConfig {
            mac: port.mac(),
            port,
        }
    }
}

use crate::devices::virtio::net::PortPlug;

/// One NIC slot: a virtio-net device with a fixed MAC (config space is read
/// once, at probe) on whatever port its plug holds.
#[derive(Clone, Debug)]
pub struct NicSlot {
    /// The guest NIC's MAC.
    pub mac: MacAddr,
    /// The port now; `PortPlug::replug` moves the device to another.
    pub plug: Arc<PortPlug>,
}
