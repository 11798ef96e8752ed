//! The virtio-net ports of a kvm machine: one per attached bridge at boot
//! ([`vmm_ports`]), the ones a restore puts back ([`restore_ports`],
//! [`restore_slot_ports`]), and what a snapshot records of them
//! ([`NicDecl`], [`nic_decls`], [`slot_nic_decls`]). Which bridge each
//! recorded NIC goes back on is the kvm backend's plan
//! (`backend::plan_nics`); this module carries it out on the bridges.

use provium_netsetup::{MacAddr, Switch};

use super::bridge::{sorted_bridges, Bridge, NetMember, WeakBridge};
use super::error::{NetworkError, NicMacError};
use super::realise::create_nic_error;
use crate::backend::{lone_port, plan_nics, NicSource, NicSpec};

/// A NIC in NIC slot `slot` of a snapshotted kvm VM, plugged into bridge
/// `nic.bridge` with `nic.mac` (docs/networking.md). `nic.attached` is
/// always true: a slot whose bridge was left is parked, and not recorded.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SlotNicDecl {
    pub slot: usize,
    pub nic: NicDecl,
}

/// One NIC of a snapshotted VM: its port was on bridge `bridge`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct NicDecl {
    /// The bridge's name.
    pub bridge: String,
    /// The guest NIC's MAC ("02:..."): a restored NIC must keep it (the
    /// guest's stack has it cached; the VMM refuses another).
    pub mac: String,
    /// The VM was still a member of the bridge at the snapshot (false:
    /// `bridge:detach` after boot left the device without a network; it is
    /// restored on a port of its own, link down).
    #[serde(default = "yes")]
    pub attached: bool,
    /// The link was up (`nic:disconnect()` not in effect).
    #[serde(default = "yes")]
    pub connected: bool,
    /// For a lab snapshot: the sub-lab path, below the snapshotted lab, of
    /// the lab holding the bridge. `None` for a VM snapshot, or a bridge
    /// outside the snapshotted lab.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bridge_lab: Option<Vec<String>>,
}

fn yes() -> bool {
    true
}

impl NicDecl {
    /// The recorded MAC.
    pub fn mac_addr(&self) -> Result<MacAddr, NicMacError> {
        self.mac.parse().map_err(|source| NicMacError {
            bridge: self.bridge.clone(),
            source,
        })
    }
}

/// One virtio-net device of a VM's kvm machine, in device order: what a
/// snapshot of it records ([`NicDecl`]).
#[derive(Clone)]
pub struct MachineNic {
    /// The bridge its port was on (weak: bridges hold their VMs). A NIC
    /// restored without a network (see [`NicDecl::attached`]) has none.
    pub bridge: Option<WeakBridge>,
    pub bridge_name: String,
    pub mac: MacAddr,
}

/// The virtio-net devices of a kvm machine about to be built.
#[derive(Default)]
pub struct VmmNics {
    /// For `MachineSpec::nics`, in device order.
    pub configs: Vec<NicSpec>,
    /// The same NICs as the VM records them.
    pub record: Vec<MachineNic>,
    /// Private switches of NICs restored without a network (their ports
    /// need them alive; see [`lone_port`]).
    pub lone: Vec<Switch>,
    /// Bridges a restore made the VM a member of (undone if it fails).
    pub added: Vec<Bridge>,
}

impl VmmNics {
    pub fn is_empty(&self) -> bool {
        self.configs.is_empty()
    }

    /// Undoes the memberships a failed restore added.
    pub fn undo(&self, vm: &NetMember) {
        for b in &self.added {
            b.vm_gone(vm);
        }
    }
}

/// For a kvm boot: one virtio-net device per attached bridge, in bridge-name
/// order, so the guest kernel (which numbers NICs in probe order, i.e. the
/// order of `virtio_mmio.device=` entries) names them eth0, eth1, … exactly
/// like the local backend's TAPs. Each port is attached to its bridge's
/// switch now; dropping the list (a failed boot) detaches them again.
pub fn vmm_ports(vm: &NetMember) -> Result<VmmNics, NetworkError> {
    let mut out = VmmNics::default();
    for b in sorted_bridges(vm) {
        let cfg = b.vmm_port(vm).map_err(|e| create_nic_error(&b, e))?;
        out.record.push(MachineNic {
            bridge: Some(b.downgrade()),
            bridge_name: b.name().to_string(),
            mac: cfg.mac(),
        });
        out.configs.push(cfg);
    }
    Ok(out)
}

/// For a kvm restore from a snapshot that recorded its NICs (`want`, in
/// device order): the ports, on the bridges [`plan_nics`] picks (`left`:
/// the bridges the VM left at shutdown, which it joins again with the
/// snapshot's MAC and link state). The memberships it adds are listed in
/// `added`; on an error they are undone here.
pub fn restore_ports(
    vm: &NetMember,
    want: &[NicDecl],
    left: &[Bridge],
    slot_bridges: &[String],
) -> Result<VmmNics, NetworkError> {
    // The bridges the snapshot's NIC slots go back on are theirs
    // ([`restore_slot_ports`]), not a boot NIC's.
    let theirs = |b: &Bridge| slot_bridges.iter().any(|n| n == b.name());
    let current: Vec<Bridge> = sorted_bridges(vm)
        .into_iter()
        .filter(|b| !theirs(b))
        .collect();
    let left: Vec<Bridge> = left
        .iter()
        .filter(|b| !b.is_closed() && !theirs(b) && !current.iter().any(|c| c.ptr_eq(b)))
        .cloned()
        .collect();
    let names = |bs: &[Bridge]| bs.iter().map(|b| b.name().to_string()).collect::<Vec<_>>();
    let wanted: Vec<(String, bool)> = want
        .iter()
        .map(|n| (n.bridge.clone(), n.attached))
        .collect();
    let plan = plan_nics(vm.name(), &wanted, &names(&current), &names(&left))?;
    let mut out = VmmNics::default();
    let r = (|| -> Result<(), NetworkError> {
        for (n, src) in want.iter().zip(plan) {
            let mac = n.mac_addr()?;
            let bridge = match src {
                NicSource::Lone => {
                    let (sw, cfg) = lone_port(&n.bridge, vm.name(), mac)?;
                    out.lone.push(sw);
                    out.record.push(MachineNic {
                        bridge: None,
                        bridge_name: n.bridge.clone(),
                        mac,
                    });
                    out.configs.push(cfg);
                    continue;
                }
                NicSource::Current(i) => current[i].clone(),
                NicSource::Rejoin(i) => left[i].clone(),
            };
            let connected = matches!(src, NicSource::Rejoin(_)).then_some(n.connected);
            if bridge.restore_member(vm, mac, connected)? {
                out.added.push(bridge.clone());
            }
            let cfg = bridge
                .vmm_port(vm)
                .map_err(|e| create_nic_error(&bridge, e))?;
            out.record.push(MachineNic {
                bridge: Some(bridge.downgrade()),
                bridge_name: bridge.name().to_string(),
                mac: cfg.mac(),
            });
            out.configs.push(cfg);
        }
        Ok(())
    })();
    match r {
        Ok(()) => Ok(out),
        Err(e) => {
            out.undo(vm);
            Err(e)
        }
    }
}

/// What a snapshot of `vm` records for its machine's NICs `nics`:
/// `bridge_lab` maps a bridge to its sub-lab path in the snapshotted lab.
pub fn nic_decls(
    vm: &NetMember,
    nics: &[MachineNic],
    bridge_lab: &dyn Fn(&Bridge) -> Option<Vec<String>>,
) -> Vec<NicDecl> {
    nics.iter()
        .map(|n| {
            let bridge = n.bridge.as_ref().and_then(WeakBridge::upgrade);
            let attached = bridge.as_ref().is_some_and(|b| b.has_vm(vm));
            NicDecl {
                bridge: n.bridge_name.clone(),
                mac: n.mac.to_string(),
                attached,
                connected: attached && bridge.as_ref().is_some_and(|b| b.is_connected(vm.name())),
                bridge_lab: bridge.as_ref().filter(|_| attached).and_then(bridge_lab),
            }
        })
        .collect()
}

/// What a snapshot of `vm` records of the NICs it was given after boot
/// (NIC slots plugged into the bridges it is on).
pub fn slot_nic_decls(
    vm: &NetMember,
    bridge_lab: &dyn Fn(&Bridge) -> Option<Vec<String>>,
) -> Vec<SlotNicDecl> {
    let mut out = Vec::new();
    for b in sorted_bridges(vm) {
        let (Some(slot), Some(mac)) = (b.slot_of(vm), b.mac_of(vm.name())) else {
            continue;
        };
        out.push(SlotNicDecl {
            slot,
            nic: NicDecl {
                bridge: b.name().to_string(),
                mac: mac.to_string(),
                attached: true,
                connected: b.is_connected(vm.name()),
                bridge_lab: bridge_lab(&b),
            },
        });
    }
    out
}

/// For a kvm restore from a snapshot whose VM had NICs in NIC slots
/// (`want`): each goes back on the bridge of its recorded name, one `vm` is
/// on (keeping its link state) or one it left at shutdown (joining again
/// with the recorded MAC and link state), on a port with the recorded MAC
/// that the machine's slot is plugged into from the start. A recorded
/// bridge `vm` has no way to (a fixture's copy in a file without it) leaves
/// its slot parked: the guest's interface is there with its link down.
/// Memberships added are returned with the ports; on an error they are
/// undone here.
pub fn restore_slot_ports(
    vm: &NetMember,
    want: &[SlotNicDecl],
    left: &[Bridge],
) -> Result<(Vec<crate::backend::SlotNic>, Vec<Bridge>), NetworkError> {
    let current = sorted_bridges(vm);
    let mut ports = Vec::new();
    let mut added: Vec<Bridge> = Vec::new();
    let r = (|| -> Result<(), NetworkError> {
        for w in want {
            let mac = w.nic.mac_addr()?;
            let (bridge, connected) =
                if let Some(b) = current.iter().find(|b| b.name() == w.nic.bridge) {
                    (b.clone(), None)
                } else if let Some(b) = left
                    .iter()
                    .find(|b| !b.is_closed() && b.name() == w.nic.bridge)
                {
                    (b.clone(), Some(w.nic.connected))
                } else {
                    continue;
                };
            if bridge.restore_member(vm, mac, connected)? {
                added.push(bridge.clone());
            }
            let cfg = bridge.vmm_port(vm)?;
            ports.push(crate::backend::SlotNic {
                slot: w.slot,
                bridge: bridge.name().to_string(),
                port: cfg.port,
            });
        }
        Ok(())
    })();
    match r {
        Ok(()) => Ok((ports, added)),
        Err(e) => {
            for b in &added {
                b.vm_gone(vm);
            }
            Err(e)
        }
    }
}
