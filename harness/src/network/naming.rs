//! The names and addresses a network gives out, as pure functions: a NIC's
//! MAC (netsetup's rule), a guest interface's name, the uplink TAP's name.
//!
//! # Guest interface names
//! A VM's bridges, sorted by bridge name, are `eth0`, `eth1`, … (the
//! reference's rule). A NIC made while the VM runs takes its rule name if
//! that is free, else the lowest free `ethN` ([`ifname_for`]): an existing
//! interface is never renamed under a running guest.

use provium_netsetup::fnv1a::fnv1a;

/// A NIC's MAC: deterministic per (vm, bridge), unique on its bridge. The
/// rule lives with `MacAddr` in netsetup, so the kvm backend's NIC slots
/// derive theirs without depending on this model.
pub use provium_netsetup::mac::nic_mac;

/// The guest interface name for the NIC whose bridge is `rule`th among
/// the VM's bridges by name, when the VM already has the interfaces
/// `taken`: `eth{rule}` if free, else the lowest free `ethN`.
pub fn ifname_for(rule: usize, taken: &[String]) -> String {
    let rule_name = format!("eth{rule}");
    if !taken.contains(&rule_name) {
        return rule_name;
    }
    (0..)
        .map(|i| format!("eth{i}"))
        .find(|n| !taken.contains(n))
        .expect("an unbounded range always has a free name")
}

/// The host TAP of bridge `bridge`'s uplink in process `pid`: unique per
/// bridge name and process, and short enough for an interface name
/// (`pvup` and 8 hex digits, 12 bytes of Linux's 15).
pub fn uplink_tap_name(bridge: &str, pid: u32) -> String {
    format!(
        "pvup{:08x}",
        fnv1a(&[bridge.as_bytes(), &pid.to_le_bytes()]) as u32
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_interface_takes_its_rule_name_or_the_lowest_free_one() {
        let taken = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(ifname_for(0, &[]), "eth0");
        assert_eq!(ifname_for(1, &taken(&["eth0"])), "eth1");
        assert_eq!(ifname_for(0, &taken(&["eth0", "eth2"])), "eth1");
        assert_eq!(ifname_for(2, &taken(&["eth0", "eth2"])), "eth1");
    }

    #[test]
    fn an_uplink_tap_name_fits_an_interface_name() {
        let n = uplink_tap_name("a-long-bridge-name", 4_000_000);
        assert!(n.starts_with("pvup") && n.len() == 12, "{n}");
        assert_eq!(n, uplink_tap_name("a-long-bridge-name", 4_000_000));
        assert_ne!(n, uplink_tap_name("a-long-bridge-name", 4_000_001));
    }
}
