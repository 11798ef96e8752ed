//! How a kvm restore's NICs find their ports. A kvm machine's virtio-net
//! devices are fixed when it is built, so a restore must give it exactly
//! the snapshot's device list: [`plan_nics`] matches the snapshot's NICs
//! against the bridges the VM is on now and those it left at shutdown, and
//! [`lone_port`] makes the port of a NIC whose VM had been detached. Both
//! are pure of the Lua layer (bridge names in, plan out); the Lua layer's
//! `restore_ports` applies the plan to its bridges.

use std::sync::Arc;

use provium_netsetup::{MacAddr, Switch, SwitchConfig, SwitchError};

use crate::backend::NicSpec;

/// Why the snapshot's NICs do not fit the VM (a configuration mismatch),
/// each naming the bridge and the fix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NicPlanError {
    #[error(
        "the snapshot's VM had a NIC on bridge `{bridge}` (its NICs: {snapshot_nics}), and vm `{vm}` is not \
         attached to a bridge of that name; attach it (lab:bridge(\"{bridge}\"):attach(vm)) before \
         vm:restore"
    )]
    NoSuchBridge {
        bridge: String,
        vm: String,
        snapshot_nics: String,
    },
    #[error(
        "vm `{vm}` is attached to bridge(s) {extra} but the snapshot's VM had no NIC there (its \
         NICs: {snapshot_nics}); a kvm machine's NICs are fixed when it is built, so detach it \
         (bridge:detach(vm)) before vm:restore"
    )]
    ExtraBridges {
        vm: String,
        extra: String,
        snapshot_nics: String,
    },
}

/// Where a restored NIC's port comes from (see [`plan_nics`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NicSource {
    /// The bridge at this index of the VM's current bridges.
    Current(usize),
    /// The bridge at this index of the bridges the VM left at shutdown:
    /// the VM joins it again.
    Rejoin(usize),
    /// A port on a switch of its own, link down (the snapshot's VM had been
    /// detached from that bridge).
    Lone,
}

/// Matches the snapshot's NICs `want` (bridge name, attached) against the
/// bridges the VM is attached to now (`current`, by name) and those it left
/// when it shut down (`left`): each wanted NIC takes a current bridge of
/// its name, else a left one (each bridge once). Errors, as a configuration
/// mismatch, when a wanted bridge is in neither, or when the VM is attached
/// to a bridge the snapshot's VM was not on (the restored machine would
/// have another device list).
pub fn plan_nics(
    vm_name: &str,
    want: &[(String, bool)],
    current: &[String],
    left: &[String],
) -> Result<Vec<NicSource>, NicPlanError> {
    let mut cur_used = vec![false; current.len()];
    let mut left_used = vec![false; left.len()];
    let mut out = Vec::with_capacity(want.len());
    let snap_names = || {
        let names: Vec<&str> = want.iter().map(|(n, _)| n.as_str()).collect();
        if names.is_empty() {
            "none".to_string()
        } else {
            names.join(", ")
        }
    };
    for (name, attached) in want {
        if !attached {
            out.push(NicSource::Lone);
            continue;
        }
        let pick = |names: &[String], used: &mut [bool]| {
            let i = names
                .iter()
                .enumerate()
                .position(|(i, n)| n == name && !used[i])?;
            used[i] = true;
            Some(i)
        };
        if let Some(i) = pick(current, &mut cur_used) {
            out.push(NicSource::Current(i));
        } else if let Some(i) = pick(left, &mut left_used) {
            out.push(NicSource::Rejoin(i));
        } else {
            return Err(NicPlanError::NoSuchBridge {
                bridge: name.clone(),
                vm: vm_name.to_owned(),
                snapshot_nics: snap_names(),
            });
        }
    }
    let extra: Vec<&str> = current
        .iter()
        .zip(&cur_used)
        .filter(|(_, used)| !**used)
        .map(|(n, _)| n.as_str())
        .collect();
    if !extra.is_empty() {
        return Err(NicPlanError::ExtraBridges {
            vm: vm_name.to_owned(),
            extra: extra.join(", "),
            snapshot_nics: snap_names(),
        });
    }
    Ok(out)
}

/// A port for a restored NIC whose VM had been detached from `bridge_name`:
/// on a switch of its own (no other member), link down, as the detached
/// NIC was. Keep the switch alive as long as the machine.
pub fn lone_port(
    bridge_name: &str,
    vm_name: &str,
    mac: MacAddr,
) -> Result<(Switch, NicSpec), SwitchError> {
    let sw = Switch::new(&format!("{bridge_name}-detached"), SwitchConfig::default());
    let port = sw.attach(vm_name, mac)?;
    sw.disconnect(vm_name)?;
    Ok((sw, NicSpec::on_port(Arc::new(port))))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn want(list: &[(&str, bool)]) -> Vec<(String, bool)> {
        list.iter().map(|(n, a)| (n.to_string(), *a)).collect()
    }

    fn names(list: &[&str]) -> Vec<String> {
        list.iter().map(|n| n.to_string()).collect()
    }

    #[test]
    fn restored_nics_take_current_bridges_then_the_ones_left_at_shutdown() {
        use NicSource::{Current, Lone, Rejoin};
        // Attached now: as at boot.
        assert_eq!(
            plan_nics(
                "v",
                &want(&[("lan", true), ("wan", true)]),
                &names(&["lan", "wan"]),
                &[]
            )
            .unwrap(),
            vec![Current(0), Current(1)]
        );
        // `vm:shutdown(); vm:restore(s)`: the VM left its bridges.
        assert_eq!(
            plan_nics(
                "v",
                &want(&[("lan", true), ("wan", true)]),
                &[],
                &names(&["wan", "lan"])
            )
            .unwrap(),
            vec![Rejoin(1), Rejoin(0)]
        );
        // Mixed, and a NIC that had been detached from its bridge.
        assert_eq!(
            plan_nics(
                "v",
                &want(&[("a", true), ("b", false), ("c", true)]),
                &names(&["c"]),
                &names(&["a", "c"])
            )
            .unwrap(),
            vec![Rejoin(0), Lone, Current(0)]
        );
        // Two NICs on bridges of one name (different labs): each once.
        assert_eq!(
            plan_nics(
                "v",
                &want(&[("lan", true), ("lan", true)]),
                &names(&["lan"]),
                &names(&["lan"])
            )
            .unwrap(),
            vec![Current(0), Rejoin(0)]
        );
        assert_eq!(
            plan_nics("v", &[], &[], &names(&["lan"])).unwrap(),
            Vec::<NicSource>::new()
        );
    }

    #[test]
    fn a_nic_mismatch_names_the_bridge_and_the_fix() {
        let e = plan_nics("v", &want(&[("lan", true)]), &[], &[])
            .unwrap_err()
            .to_string();
        assert_eq!(
            e,
            "the snapshot's VM had a NIC on bridge `lan` (its NICs: lan), and vm `v` is not attached to a \
             bridge of that name; attach it (lab:bridge(\"lan\"):attach(vm)) before vm:restore"
        );
        let e = plan_nics("v", &want(&[("lan", true)]), &names(&["lan", "wan"]), &[])
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("vm `v` is attached to bridge(s) wan but the snapshot's VM had no NIC there (its NICs: lan)"),
            "{e}"
        );
        let e = plan_nics("v", &[], &names(&["wan"]), &[])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("(its NICs: none)") && e.contains("bridge:detach(vm)"),
            "{e}"
        );
    }

    #[test]
    fn a_lone_port_is_link_down_with_the_snapshot_mac() {
        let mac: MacAddr = "02:00:00:00:00:07".parse().unwrap();
        let (sw, nic) = lone_port("lan", "v", mac).unwrap();
        assert_eq!(nic.mac(), mac);
        assert_eq!(sw.is_connected("v").ok(), Some(false));
        assert_eq!(sw.members(), ["v"]);
    }
}
