//! A lab's network topology across its sub-labs: which bridges it holds
//! (recorded by `lab:snapshot()` with each bridge's sub-lab path) and, on
//! a restore, which bridge each recorded NIC joins again, so VMs that shared
//! a bridge when snapshotted share one after.

use super::{Lab, LabError};
use crate::lua::snapshot::VmDevices;
use crate::lua::vm::{RestoreError, Vm};
use crate::network::Bridge;

impl Lab {
    /// Bridges of this lab and its sub-labs (downward), with their sub-lab
    /// path: the topology `lab:snapshot()` records.
    pub(super) fn bridges_downward(
        &self,
        path: &mut Vec<String>,
        out: &mut Vec<(Vec<String>, Bridge)>,
    ) {
        self.collect_downward(path, out, &|st| st.bridges.values().cloned().collect());
    }

    /// The bridge a restored VM's NIC on bridge `name` joins, for a restore
    /// into this lab: the one of that name in `lab` (the lab that held the
    /// bridge when the snapshot was taken, mapped onto the restoring tree;
    /// this lab for a VM fixture) or up its scope chain (so a test scope
    /// finds the file's bridges); if there is none, a new bridge of that
    /// name is made in `lab` (closed with the current scope, like any
    /// bridge). The NICs of VMs restored together thus share the bridges
    /// they shared when snapshotted.
    pub(super) fn bridge_for_restore(lab: &Lab, name: &str) -> Result<Bridge, LabError> {
        if let Some(b) = lab.find_bridge(name) {
            return Ok(b);
        }
        lab.check_new_name("bridge", name)
            .map_err(|e| LabError::NoRoomForBridge {
                name: name.to_string(),
                lab: lab.0.name.clone(),
                reason: crate::lua::error_message(&e),
            })?;
        let b = Bridge::create(&lab.0.env, name);
        lab.put_bridge(name.to_string(), &b);
        Ok(b)
    }

    /// kvm: makes `vm` (created or shut down) a member of the bridges its
    /// snapshot's NICs were on, with the recorded MACs and link states.
    /// For each recorded NIC, in this order: a bridge of that name the VM
    /// is on, or one it left when it last shut down (`lab:restore` shuts a
    /// running VM down first), is kept (`vm.restore_checked` puts the NIC
    /// there); else [`Lab::bridge_for_restore`] finds or makes one, from
    /// the NIC's recorded sub-lab path below this lab.
    pub(super) fn join_recorded_bridges(
        &self,
        vm: &Vm,
        devices: &VmDevices,
    ) -> Result<(), RestoreError> {
        if !self.0.env.machines().capabilities().has_vmm_nics() {
            return Ok(());
        }
        let mismatch = |e: String| {
            RestoreError::Mismatch(format!(
                "vm `{}`: the snapshot's NICs do not fit this lab (a configuration mismatch): {e}",
                vm.name()
            ))
        };
        let left = vm.left_bridges();
        // NICs from boot and NICs given after boot (NIC slots) alike.
        let recorded = devices
            .nics
            .iter()
            .chain(devices.slot_nics.iter().map(|s| &s.nic));
        for n in recorded.filter(|n| n.attached) {
            // On one of that name, or left one at its shutdown (a running
            // VM that `lab:restore` shut down): `restore_checked` uses it.
            let on = vm
                .bridges()
                .iter()
                .any(|b| b.name() == n.bridge && b.has_vm(&vm.net()));
            if on || left.iter().any(|b| b.name() == n.bridge && !b.is_closed()) {
                continue;
            }
            let lab = match &n.bridge_lab {
                Some(p) => self
                    .sub_lab_at(p)
                    .map_err(|e| mismatch(crate::lua::error_message(&e)))?,
                None => self.clone(),
            };
            let b = Lab::bridge_for_restore(&lab, &n.bridge)
                .map_err(|e| mismatch(crate::error_chain::flatten(&e)))?;
            let mac = n
                .mac_addr()
                .map_err(|e| mismatch(crate::error_chain::flatten(&e)))?;
            b.restore_member(&vm.net(), mac, Some(n.connected))
                .map_err(|e| {
                    mismatch(format!(
                        "bridge `{}`: {}",
                        n.bridge,
                        crate::error_chain::flatten(&e)
                    ))
                })?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_utils::{kvm_env, vm};
    use super::*;
    use crate::lua::snapshot::NicDecl;

    fn decl(nics: Vec<NicDecl>) -> VmDevices {
        VmDevices {
            disks: vec![],
            nics,
            slot_disks: vec![],
            slot_nics: vec![],
        }
    }

    fn nic(bridge: &str, mac: &str, lab: Option<&[&str]>) -> NicDecl {
        NicDecl {
            bridge: bridge.into(),
            mac: mac.into(),
            attached: true,
            connected: true,
            bridge_lab: lab.map(|p| p.iter().map(|s| s.to_string()).collect()),
        }
    }

    /// A VM fixture's NICs: a bridge of the recorded name is made in the
    /// lab when it has none, with the recorded MAC and link state; VMs
    /// restored together share it.
    #[test]
    fn a_restored_vm_joins_a_new_bridge_of_the_recorded_name() {
        let root = Lab::root(kvm_env());
        let v = vm(&root, "v");
        let mut n = nic("lan", "02:00:00:00:00:0a", None);
        n.connected = false;
        root.join_recorded_bridges(&v, &decl(vec![n])).unwrap();
        assert_eq!(root.bridge_names(), ["lan"]);
        let lan = root.find_bridge("lan").unwrap();
        assert!(lan.has_vm(&v.net()));
        assert_eq!(lan.mac_of("v").unwrap().to_string(), "02:00:00:00:00:0a");
        assert!(!lan.is_connected("v"));
        let w = vm(&root, "w");
        root.join_recorded_bridges(&w, &decl(vec![nic("lan", "02:00:00:00:00:0b", None)]))
            .unwrap();
        assert_eq!(lan.members_sorted(), ["v", "w"], "one bridge, shared");
        // Idempotent: already on a bridge of that name.
        root.join_recorded_bridges(&w, &decl(vec![nic("lan", "02:00:00:00:00:0b", None)]))
            .unwrap();
        assert_eq!(root.bridge_names(), ["lan"]);
    }

    /// From a test scope the file's bridge of that name is found; a lab
    /// snapshot's NIC names the sub-lab that held its bridge.
    #[test]
    fn recorded_bridges_are_found_up_the_scope_chain_and_at_their_sub_lab() {
        let root = Lab::root(kvm_env());
        let lan = Bridge::create(&root.0.env, "lan");
        root.put_bridge("lan".into(), &lan);
        let scope = root.child("provium".into(), Some(root.clone()));
        let v = vm(&scope, "v");
        scope
            .join_recorded_bridges(&v, &decl(vec![nic("lan", "02:00:00:00:00:0a", None)]))
            .unwrap();
        assert!(lan.has_vm(&v.net()), "the file's bridge");
        assert!(
            scope.bridge_names().is_empty(),
            "no new bridge in the test scope"
        );
        let w = vm(&scope, "w");
        scope
            .join_recorded_bridges(
                &w,
                &decl(vec![nic("dmz", "02:00:00:00:00:0b", Some(&["site"]))]),
            )
            .unwrap();
        let site = scope.find_sub_lab("site").expect("the sub-lab is made");
        assert_eq!(site.bridge_names(), ["dmz"]);
        assert!(site.find_bridge("dmz").unwrap().has_vm(&w.net()));
        // A name taken by a VM of that lab cannot be a bridge: a mismatch.
        let x = vm(&scope, "x");
        scope.put_vm("wan".into(), &x);
        match scope.join_recorded_bridges(&x, &decl(vec![nic("wan", "02:00:00:00:00:0c", None)])) {
            Err(RestoreError::Mismatch(m)) => assert!(
                m.contains("cannot make bridge `wan` for the restored NICs in lab `provium`"),
                "{m}"
            ),
            _ => panic!("a mismatch expected"),
        }
    }

    /// `site:restore(s)` of a VM on a bridge outside `site`: `lab:restore`
    /// shuts it down, and it goes back to the bridge it left rather than
    /// to a new one of that name in `site`.
    #[test]
    fn a_vm_restored_by_its_lab_keeps_the_bridges_it_left() {
        let root = Lab::root(kvm_env());
        let lan = Bridge::create(&root.0.env, "lan");
        root.put_bridge("lan".into(), &lan);
        let site = root.sub_lab_at(&["site".into()]).unwrap();
        let v = vm(&site, "v");
        let mac = crate::network::nic_mac("v", "lan", &[]);
        lan.restore_member(&v.net(), mac, None).unwrap();
        v.shutdown().unwrap();
        let devices = decl(vec![nic("lan", &mac.to_string(), None)]);
        site.join_recorded_bridges(&v, &devices).unwrap();
        assert!(site.bridge_names().is_empty(), "no second `lan`");
        let ports =
            crate::network::restore_ports(&v.net(), &devices.nics, &v.left_bridges(), &[]).unwrap();
        assert_eq!(ports.configs.len(), 1);
        assert!(lan.has_vm(&v.net()), "back on the bridge it left");
    }

    /// `lab:snapshot()` records each bridge's sub-lab path.
    #[test]
    fn bridges_are_listed_with_their_sub_lab_paths() {
        let root = Lab::root(kvm_env());
        let lan = Bridge::create(&root.0.env, "lan");
        root.put_bridge("lan".into(), &lan);
        let site = root.sub_lab_at(&["site".into()]).unwrap();
        let dmz = Bridge::create(&root.0.env, "dmz");
        site.put_bridge("dmz".into(), &dmz);
        let mut out = Vec::new();
        root.bridges_downward(&mut Vec::new(), &mut out);
        let got: Vec<(Vec<String>, String)> = out
            .iter()
            .map(|(p, b)| (p.clone(), b.name().to_string()))
            .collect();
        assert_eq!(
            got,
            [
                (vec![], "lan".to_string()),
                (vec!["site".to_string()], "dmz".to_string())
            ]
        );
    }
}
