//! Realising a member: the NIC its running VM gets on a bridge. Local
//! sandboxes get a TAP inside their network namespace; a kvm VM gets the
//! port its virtio-net device was given before boot ([`Bridge::vmm_port`]),
//! or, joining after boot, one of its NIC slots.

use std::sync::Arc;

use provium_netsetup::TapPort;

use super::bridge::{sorted_bridges, tap_poller, Bridge, BridgeState, NetMember, NicEnd};
use super::error::NetworkError;
use super::naming::ifname_for;
use crate::backend::{Guest, NicSpec};

impl Bridge {
    /// Realises `vm`'s NIC as guest interface `ifname` on `machine`; a no-op
    /// when already realised.
    pub fn realise(
        &self,
        vm: &NetMember,
        machine: &dyn Guest,
        ifname: &str,
    ) -> Result<(), NetworkError> {
        let mut st = self.lock();
        if st.closed {
            return Err(NetworkError::Closed {
                bridge: self.0.name.clone(),
            });
        }
        let name = vm.name();
        let BridgeState {
            members,
            taps,
            kernel_path_warned,
            ..
        } = &mut *st;
        let Some(m) = members.get_mut(name) else {
            return Err(self.not_attached(name));
        };
        if m.nic.is_some() {
            return Ok(());
        }
        let mac = m.mac;
        let mut ifname = ifname.to_owned();
        let caps = machine.capabilities();
        let end = if caps.has_vmm_nics() && self.0.switch.port_mac(name).is_ok() {
            // The virtio-net device got its port before boot (`vmm_port`).
            NicEnd::Vmm
        } else if caps.has_vmm_nics() && caps.nics_after_boot.is_yes() {
            // A running kvm guest: one of its NIC slots (made at boot, with
            // its own MAC) gets a port on this switch.
            let switch = &self.0.switch;
            // The member keeps its own MAC (vm, bridge): the backend gives
            // the guest interface the port's.
            let added = machine.add_nic(&ifname, &mut |_slot_mac| {
                Ok(Arc::new(switch.attach(name, mac)?))
            })?;
            ifname = added.ifname.clone();
            NicEnd::Slot {
                slot: added.slot,
                _lease: added.lease,
            }
        } else {
            let poller = tap_poller(taps, &self.0.name)?;
            let fd = machine.open_nic(&ifname, mac)?;
            let port = TapPort::attach_on(&poller, &self.0.switch, name, mac, fd)?;
            // The kernel forwards this NIC's plain directions to the other
            // sandboxes' (docs/networking.md, "The kernel path"). Without
            // it traffic still flows, through the switch.
            if let Err(e) = port.offer_kernel_path() {
                if !std::mem::replace(kernel_path_warned, true) {
                    eprintln!(
                        "provium: warning: bridge `{}`: vm `{name}`'s NIC gets no kernel path, \
                         so its traffic goes through the userspace switch: {}",
                        self.0.name,
                        crate::error_chain::flatten(&e)
                    );
                }
            }
            NicEnd::Tap { port }
        };
        if m.link_down {
            let _ = self.0.switch.disconnect(name);
        }
        m.nic = Some((ifname, end));
        Ok(())
    }

    /// For a restore: `vm`'s member takes the NIC slot the machine plugged
    /// back into this bridge's port ([`super::restore_slot_ports`]), as its
    /// realised NIC; the lease parks the slot when the member goes.
    pub fn adopt_slot_nic(&self, vm: &NetMember, added: crate::backend::AddedNic) {
        let mut st = self.lock();
        if let Some(m) = st.members.get_mut(vm.name()) {
            m.nic = Some((
                added.ifname,
                NicEnd::Slot {
                    slot: added.slot,
                    _lease: added.lease,
                },
            ));
        }
    }

    /// The NIC slot `vm`'s realised NIC on this bridge is in, if it joined
    /// after boot.
    pub(super) fn slot_of(&self, vm: &NetMember) -> Option<usize> {
        match self.lock().members.get(vm.name())?.nic {
            Some((_, NicEnd::Slot { slot, .. })) => Some(slot),
            _ => None,
        }
    }

    /// For a kvm VM about to boot: attaches the switch port its virtio-net
    /// device will hold (named after the VM, with the member's MAC) and
    /// returns the device's config. A NIC disconnected before boot starts
    /// with its link down. `vm:boot()` realises the member afterwards.
    pub fn vmm_port(&self, vm: &NetMember) -> Result<NicSpec, NetworkError> {
        let st = self.lock();
        if st.closed {
            return Err(NetworkError::Closed {
                bridge: self.0.name.clone(),
            });
        }
        let name = vm.name();
        let m = st
            .members
            .get(name)
            .ok_or_else(|| self.not_attached(name))?;
        let port = self.0.switch.attach(name, m.mac)?;
        if m.link_down {
            let _ = self.0.switch.disconnect(name);
        }
        Ok(NicSpec::on_port(Arc::new(port)))
    }
}

/// The interface name for `bridge` on `vm`: its rule name (index among the
/// VM's bridges by name) if free, else the lowest free `ethN`.
fn choose_ifname(vm: &NetMember, bridge: &Bridge) -> String {
    let bridges = sorted_bridges(vm);
    let taken: Vec<String> = bridges
        .iter()
        .filter(|b| !b.ptr_eq(bridge))
        .filter_map(|b| b.ifname_of(vm.name()))
        .collect();
    let rule = bridges
        .iter()
        .position(|b| b.ptr_eq(bridge))
        .unwrap_or(bridges.len());
    ifname_for(rule, &taken)
}

/// Realises `vm`'s NIC on `bridge` (the VM is booted).
pub fn realise_on(vm: &NetMember, bridge: &Bridge) -> Result<(), NetworkError> {
    let machine = vm
        .running_machine()
        .ok_or_else(|| NetworkError::NoMachine {
            vm: vm.name().to_owned(),
        })?;
    let ifname = choose_ifname(vm, bridge);
    bridge.realise(vm, machine.as_ref(), &ifname)
}

/// The error of a NIC that could not be made on `bridge` while booting.
pub(super) fn create_nic_error(bridge: &Bridge, e: NetworkError) -> NetworkError {
    NetworkError::CreateNic {
        bridge: bridge.name().to_string(),
        source: Box::new(e),
    }
}

/// Called by `vm:boot()` once the guest is up: one NIC per attached bridge,
/// `eth0`, `eth1`, … in bridge-name order.
pub fn realise_all(vm: &NetMember) -> Result<(), NetworkError> {
    for b in sorted_bridges(vm) {
        realise_on(vm, &b).map_err(|e| create_nic_error(&b, e))?;
    }
    Ok(())
}
