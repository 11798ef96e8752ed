//! Devices a running kvm guest is given: slots made at boot.
//!
//! The guests this VMM boots find virtio-mmio devices only on their kernel
//! command line (no ACPI hotplug yet), so a device added after boot must
//! exist at boot. Each machine gets the profile's `disk_slots` empty
//! virtio-blk devices (after its disks: the guest's next `/dev/vdX`, size 0)
//! and `nic_slots` virtio-net devices on a parked port whose link is down
//! (after its NICs: the guest's next `ethN`, no carrier). Adding a disk
//! inserts a medium into the lowest free disk slot (capacity change plus
//! config interrupt: Linux's virtio_blk resizes `/dev/vdX`); adding a NIC
//! replugs the NIC slot onto a port of the bridge's switch (link up plus
//! config interrupt: virtio_net turns the carrier on). Dropping the
//! returned [`DeviceLease`] takes it back: the medium is ejected (size 0)
//! or the NIC replugged onto its parked port (link down); the guest's
//! device stays, empty, for the next add.

use std::sync::{Arc, Mutex};

use crate::lock::Locked;

use provium_netsetup::{MacAddr, Port, Switch, SwitchConfig};
use provium_vmm::devices::virtio::block::{BlockConfig, BlockSlot, DiskImage};
use provium_vmm::devices::virtio::net::PortPlug;
use provium_vmm::vmm_config::NicSlot;

use crate::backend::{AddedDisk, AddedNic, ConnectPort, DeviceLease, DiskSpec, SlotDisk, SlotNic};

/// Why a device could not be added to a running guest.
#[derive(Debug, thiserror::Error)]
pub enum SlotError {
    #[error(
        "vm `{vm}` has all {limit} disk slot(s) of profile `{profile}` in use (a running kvm \
         guest takes new disks only into slots made at boot); raise `disk_slots` in \
         [profiles.{profile}] (at most {max}), detach a disk added after boot, or attach the disk \
         before vm:boot()"
    )]
    NoFreeDiskSlot {
        vm: String,
        profile: String,
        limit: usize,
        max: u32,
    },
    #[error(
        "vm `{vm}` has all {limit} NIC slot(s) of profile `{profile}` in use (a running kvm \
         guest takes new NICs only into slots made at boot); raise `nic_slots` in \
         [profiles.{profile}] (at most {max}), detach it from a bridge joined after boot, or \
         attach the bridge before vm:boot()"
    )]
    NoFreeNicSlot {
        vm: String,
        profile: String,
        limit: usize,
        max: u32,
    },
    #[error("disk `{id}`: cannot open image {image}")]
    Open {
        id: String,
        image: String,
        #[source]
        source: provium_vmm::devices::virtio::block::BlockError,
    },
    #[error(
        "the snapshot's vm `{vm}` had a disk in disk slot {slot}, and profile `{profile}` gives \
         {limit} disk slot(s); restore with the snapshot's `disk_slots`"
    )]
    NoSuchSlot {
        vm: String,
        profile: String,
        slot: usize,
        limit: usize,
    },
    #[error(
        "the snapshot's vm `{vm}` had NIC slot {slot} on bridge `{bridge}`, and profile \
         `{profile}` gives {limit} NIC slot(s); restore with the snapshot's `nic_slots`"
    )]
    NoSuchNicSlot {
        vm: String,
        profile: String,
        bridge: String,
        slot: usize,
        limit: usize,
    },
    #[error("cannot make the parked port of a NIC slot")]
    Park(#[source] provium_netsetup::SwitchError),
    /// The caller could not make the bridge's port for the slot's MAC.
    #[error("NIC {ifname}: no port on the bridge")]
    Connect {
        ifname: String,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

struct DiskSlotState {
    slot: Arc<BlockSlot>,
    /// `/dev/vdX`.
    device: String,
    /// The id of the disk in it.
    holder: Mutex<Option<String>>,
}

struct NicSlotState {
    plug: Arc<PortPlug>,
    mac: MacAddr,
    ifname: String,
    parked: Arc<Port>,
    /// Keeps the parked port's switch (a switch of its own, link down).
    _switch: Switch,
    in_use: Mutex<bool>,
}

/// Puts `disk` into the (free) slot `state`, index `index`: inserted while
/// the guest runs (`signal`), or present from the start (a restore).
fn fill(
    state: &Arc<DiskSlotState>,
    disk: &DiskSpec,
    index: usize,
    signal: bool,
) -> Result<AddedDisk, SlotError> {
    let image =
        DiskImage::open(&disk.image, false, &disk.id).map_err(|source| SlotError::Open {
            id: disk.id.clone(),
            image: disk.image.display().to_string(),
            source,
        })?;
    let medium = BlockConfig {
        disk: Arc::new(image),
        faults: disk.faults.clone(),
    };
    let mut holder = state.holder.locked();
    *holder = Some(disk.id.clone());
    if signal {
        // Free (no holder) means empty: the insert cannot find a medium.
        let _ = state.slot.insert(medium);
    } else {
        state.slot.restore_medium(medium);
    }
    drop(holder);
    let slot = state.clone();
    Ok(AddedDisk {
        guest_device: state.device.clone(),
        slot: index,
        lease: DeviceLease::new(move || {
            slot.slot.eject();
            *slot.holder.locked() = None;
        }),
    })
}

/// A machine's slots.
pub struct Slots {
    vm: String,
    profile: String,
    disks: Vec<Arc<DiskSlotState>>,
    nics: Vec<Arc<NicSlotState>>,
    /// What a restore put back ([`Slots::new`]'s `filled`), until taken.
    restored: Mutex<Vec<AddedDisk>>,
    /// The NICs a restore plugged back ([`Slots::new`]'s `plugged`), with
    /// their bridges' names, until taken.
    restored_nics: Mutex<Vec<(String, AddedNic)>>,
}

/// The lease of NIC slot `slot` (index `index`), now plugged into a port
/// of MAC `port_mac`: its release parks the slot again (link down, config
/// interrupt) and frees it.
fn plugged(slot: &Arc<NicSlotState>, index: usize, port_mac: MacAddr) -> AddedNic {
    *slot.in_use.locked() = true;
    let s = slot.clone();
    AddedNic {
        slot: index,
        ifname: slot.ifname.clone(),
        mac: port_mac,
        slot_mac: slot.mac,
        lease: DeviceLease::new(move || {
            s.plug.replug(s.parked.clone());
            *s.in_use.locked() = false;
        }),
    }
}

impl Slots {
    /// `disk_slots` empty disk slots after `boot_disks` disks and
    /// `nic_slots` parked NIC slots after `boot_nics` NICs, for VM `vm` of
    /// profile `profile`; returns them with the VMM's configs.
    /// `filled` puts disks back into their slots (a restore).
    #[allow(clippy::type_complexity, clippy::too_many_arguments)]
    pub fn new(
        vm: &str,
        profile: &str,
        boot_disks: usize,
        boot_nics: usize,
        disk_slots: u32,
        nic_slots: u32,
        filled: &[SlotDisk],
        plugged_nics: &[SlotNic],
    ) -> Result<(Slots, Vec<Arc<BlockSlot>>, Vec<NicSlot>), SlotError> {
        let mut disks = Vec::new();
        for i in 0..disk_slots as usize {
            disks.push(Arc::new(DiskSlotState {
                slot: BlockSlot::empty(),
                device: crate::backend::guest_device_name(boot_disks + i),
                holder: Mutex::new(None),
            }));
        }
        let mut nics = Vec::new();
        for i in 0..nic_slots as usize {
            // The same for every VM (not of its name): a snapshot restored
            // into a VM of another name (a fixture's copy) has the device
            // the snapshot's guest probed. A port with another MAC is
            // given to the guest interface on attach (`add_nic`'s caller).
            let mac = provium_netsetup::mac::nic_mac("@slots", &format!("{i}"), &[]);
            let switch = Switch::new(&format!("@slot{i}"), SwitchConfig::default());
            let parked = Arc::new(switch.attach(vm, mac).map_err(SlotError::Park)?);
            switch.disconnect(vm).map_err(SlotError::Park)?;
            // A restore plugs the slot into its port from the start: the
            // device reads the link state at construction, as at boot.
            let start = plugged_nics
                .iter()
                .find(|p| p.slot == i)
                .map_or_else(|| parked.clone(), |p| p.port.clone());
            nics.push(Arc::new(NicSlotState {
                plug: PortPlug::new(start),
                mac,
                ifname: format!("eth{}", boot_nics + i),
                parked,
                _switch: switch,
                in_use: Mutex::new(false),
            }));
        }
        let mut restored = Vec::new();
        for f in filled {
            let Some(state) = disks.get(f.slot) else {
                return Err(SlotError::NoSuchSlot {
                    vm: vm.to_string(),
                    profile: profile.to_string(),
                    slot: f.slot,
                    limit: disks.len(),
                });
            };
            restored.push(fill(state, &f.disk, f.slot, false)?);
        }
        let mut restored_nics = Vec::new();
        for p in plugged_nics {
            let Some(state) = nics.get(p.slot) else {
                return Err(SlotError::NoSuchNicSlot {
                    vm: vm.to_string(),
                    profile: profile.to_string(),
                    bridge: p.bridge.clone(),
                    slot: p.slot,
                    limit: nics.len(),
                });
            };
            restored_nics.push((p.bridge.clone(), plugged(state, p.slot, p.port.mac())));
        }
        let block = disks.iter().map(|d| d.slot.clone()).collect();
        let net = nics
            .iter()
            .map(|n| NicSlot {
                mac: n.mac,
                plug: n.plug.clone(),
            })
            .collect();
        Ok((
            Slots {
                vm: vm.to_string(),
                profile: profile.to_string(),
                disks,
                nics,
                restored: Mutex::new(restored),
                restored_nics: Mutex::new(restored_nics),
            },
            block,
            net,
        ))
    }

    /// Puts `disk` into the lowest free disk slot.
    pub fn add_disk(&self, disk: &DiskSpec) -> Result<AddedDisk, SlotError> {
        let free = self
            .disks
            .iter()
            .find(|d| d.holder.locked().is_none())
            .ok_or_else(|| SlotError::NoFreeDiskSlot {
                vm: self.vm.clone(),
                profile: self.profile.clone(),
                limit: self.disks.len(),
                max: crate::config::profile::MAX_SLOTS,
            })?;
        let index = self
            .disks
            .iter()
            .position(|d| Arc::ptr_eq(d, free))
            .expect("found in the list");
        fill(free, disk, index, true)
    }

    /// The disks [`Slots::new`] put back, once.
    pub fn take_restored(&self) -> Vec<AddedDisk> {
        std::mem::take(&mut *self.restored.locked())
    }

    /// The NICs [`Slots::new`] plugged back, with their bridges, once.
    pub fn take_restored_nics(&self) -> Vec<(String, AddedNic)> {
        std::mem::take(&mut *self.restored_nics.locked())
    }

    /// Plugs a free NIC slot into the port `connect` makes for its MAC:
    /// the slot named `want` when free (the interface naming rule's name),
    /// else the lowest free one.
    pub fn add_nic(
        &self,
        want: &str,
        connect: &mut ConnectPort<'_>,
    ) -> Result<AddedNic, SlotError> {
        let free = |n: &&Arc<NicSlotState>| !*n.in_use.locked();
        let slot = self
            .nics
            .iter()
            .filter(free)
            .find(|n| n.ifname == want)
            .or_else(|| self.nics.iter().find(free))
            .ok_or_else(|| SlotError::NoFreeNicSlot {
                vm: self.vm.clone(),
                profile: self.profile.clone(),
                limit: self.nics.len(),
                max: crate::config::profile::MAX_SLOTS,
            })?
            .clone();
        let port = connect(slot.mac).map_err(|source| SlotError::Connect {
            ifname: slot.ifname.clone(),
            source,
        })?;
        let index = self
            .nics
            .iter()
            .position(|n| Arc::ptr_eq(n, &slot))
            .expect("found in the list");
        let added = plugged(&slot, index, port.mac());
        slot.plug.replug(port);
        Ok(added)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_follow_the_boot_devices_and_refuse_past_the_limit() {
        let (slots, block, net) = Slots::new("v", "p", 1, 2, 1, 1, &[], &[]).unwrap();
        assert_eq!((block.len(), net.len()), (1, 1));
        let dir = tempfile::tempdir().unwrap();
        let img = dir.path().join("d.img");
        std::fs::write(&img, vec![1u8; 4096]).unwrap();
        let spec = DiskSpec {
            id: "late".into(),
            image: img,
            faults: Default::default(),
        };
        let added = slots.add_disk(&spec).unwrap();
        assert_eq!(added.guest_device, "/dev/vdb", "after the boot disk");
        assert_eq!(block[0].capacity_sectors(), 8);
        let e = crate::error_chain::flatten(&slots.add_disk(&spec).err().unwrap());
        assert!(
            e.contains("all 1 disk slot(s) of profile `p`") && e.contains("raise `disk_slots`"),
            "{e}"
        );
        drop(added);
        assert_eq!(block[0].capacity_sectors(), 0, "ejected");
        assert!(slots.add_disk(&spec).is_ok(), "the slot is free again");

        let lan = Switch::new("lan", SwitchConfig::default());
        let mut connect = |mac| {
            Ok(Arc::new(lan.attach("v", mac)?))
                as Result<Arc<Port>, Box<dyn std::error::Error + Send + Sync>>
        };
        assert!(!net[0].plug.port().is_link_up(), "parked: link down");
        let nic = slots.add_nic("eth0", &mut connect).unwrap();
        assert_eq!(nic.ifname, "eth2", "after the two boot NICs");
        assert_eq!(nic.mac, net[0].mac);
        assert_eq!(net[0].plug.port().bridge(), "lan");
        let e = crate::error_chain::flatten(&slots.add_nic("eth2", &mut connect).err().unwrap());
        assert!(e.contains("raise `nic_slots`"), "{e}");
        drop(nic);
        assert!(!net[0].plug.port().is_link_up(), "parked again");
    }

    #[test]
    fn a_restore_plugs_its_nic_slots_back_and_refuses_a_missing_slot() {
        let lan = Switch::new("lan", SwitchConfig::default());
        let mac = crate::network::nic_mac("v", "lan", &[]);
        let port = Arc::new(lan.attach("v", mac).unwrap());
        let back = SlotNic {
            slot: 1,
            bridge: "lan".into(),
            port: port.clone(),
        };
        let (slots, _, net) =
            Slots::new("v", "p", 0, 0, 0, 2, &[], std::slice::from_ref(&back)).unwrap();
        assert!(
            Arc::ptr_eq(&net[1].plug.port(), &port),
            "plugged from the start"
        );
        assert!(!net[0].plug.port().is_link_up(), "the other slot is parked");
        let mut restored = slots.take_restored_nics();
        assert!(slots.take_restored_nics().is_empty(), "taken once");
        let (bridge, nic) = restored.pop().unwrap();
        assert_eq!(
            (bridge.as_str(), nic.slot, nic.ifname.as_str(), nic.mac),
            ("lan", 1, "eth1", mac)
        );
        // The slot is in use until its lease goes: an add takes the other.
        let mut connect = |m| {
            Ok(Arc::new(lan.attach("w", m)?))
                as Result<Arc<Port>, Box<dyn std::error::Error + Send + Sync>>
        };
        let other = slots.add_nic("eth1", &mut connect).unwrap();
        assert_eq!(other.slot, 0);
        drop(nic);
        assert!(!net[1].plug.port().is_link_up(), "parked again");
        drop(other);
        let e = Slots::new("v", "p", 0, 0, 0, 1, &[], &[back])
            .err()
            .unwrap()
            .to_string();
        assert!(
            e.contains("NIC slot 1 on bridge `lan`") && e.contains("gives 1 NIC slot(s)"),
            "{e}"
        );
    }
}
