//! The spec's devices as the VMM's: each [`NicSpec`] becomes a virtio-net
//! `NetConfig` on the same switch port, each [`DiskSpec`] a virtio-blk
//! `DriveConfig` on the same image and the same shared fault set. The one
//! place the harness's device vocabulary turns into the VMM's (the rest of
//! `VmConfig` is `config.rs`'s).

use provium_vmm::vmm_config::{DriveConfig, NetConfig};

use crate::backend::{DiskSpec, NicSpec};

/// The virtio-net devices of `nics`, in the same order (the guest's eth0,
/// eth1, …: the VMM announces them in list order).
pub fn net_configs(nics: &[NicSpec]) -> Vec<NetConfig> {
    nics.iter()
        .map(|n| NetConfig::on_port(n.port.clone()))
        .collect()
}

/// The virtio-blk devices of `disks`, in the same order (the guest's vda,
/// vdb, …), writable, each sharing its disk's fault set.
pub fn drive_configs(disks: &[DiskSpec]) -> Vec<DriveConfig> {
    disks
        .iter()
        .map(|d| DriveConfig {
            path: d.image.clone(),
            read_only: false,
            id: d.id.clone(),
            faults: d.faults.clone(),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    #[test]
    fn devices_keep_their_order_port_and_fault_set() {
        let sw = provium_netsetup::Switch::new("lan", Default::default());
        let a = NicSpec::on_port(Arc::new(
            sw.attach("a", provium_netsetup::MacAddr::local(1)).unwrap(),
        ));
        let b = NicSpec::on_port(Arc::new(
            sw.attach("b", provium_netsetup::MacAddr::local(2)).unwrap(),
        ));
        let nets = net_configs(&[a.clone(), b]);
        assert_eq!(nets.len(), 2);
        assert_eq!(nets[0].mac, a.mac());
        assert!(Arc::ptr_eq(&nets[0].port, &a.port), "the same port");
        let disk = DiskSpec {
            id: "vda".into(),
            image: "/img/a".into(),
            faults: Default::default(),
        };
        let drives = drive_configs(std::slice::from_ref(&disk));
        assert_eq!(drives[0].path, disk.image);
        assert_eq!(drives[0].id, "vda");
        assert!(!drives[0].read_only);
        assert!(
            Arc::ptr_eq(&drives[0].faults, &disk.faults),
            "one fault set"
        );
    }
}
