//! The file's virtual networks as plain rules, with no Lua in them: how a
//! NIC's MAC is chosen, how a guest interface is named, what a bridge may
//! be created with. The bridge model that applies them (its switch,
//! members and their NICs) is `lua::network`, below the `bridge` and `nic`
//! userdata; it moves here once its members stop being Lua-layer VM
//! contexts.
//!
//! # Guest interface names
//! A VM's bridges, sorted by bridge name, are `eth0`, `eth1`, … (the
//! reference's rule). A NIC made while the VM runs takes its rule name if
//! that is free, else the lowest free `ethN` ([`ifname_for`]): an existing
//! interface is never renamed under a running guest.

use provium_netsetup::fnv1a::fnv1a;
use provium_netsetup::MacAddr;

/// The switch port name of a bridge's uplink (not a valid VM name on any
/// backend, so it never collides with a member).
pub const UPLINK_PORT: &str = "@uplink";
/// The uplink's default address (the guests' gateway).
pub const DEFAULT_UPLINK_ADDR: &str = "10.0.2.1/24";

/// A deterministic, locally administered unicast MAC for (vm, bridge),
/// salted until it differs from every MAC in `taken`.
pub fn nic_mac(vm: &str, bridge: &str, taken: &[MacAddr]) -> MacAddr {
    let mut salt: u32 = 0;
    loop {
        let h = fnv1a(&[
            b"provium-nic",
            vm.as_bytes(),
            b"\0",
            bridge.as_bytes(),
            &salt.to_le_bytes(),
        ])
        .to_le_bytes();
        let mac = MacAddr([0x02, h[0], h[1], h[2], h[3], h[4]]);
        if !taken.contains(&mac) {
            return mac;
        }
        salt += 1;
    }
}

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

/// What `provium:bridge(name, opts)` may set on a bridge it creates.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BridgeOpts {
    /// Let the kernel forward the plain directions between sandbox NICs
    /// (docs/networking.md, "The kernel path"); `{kernel_path = false}`
    /// sends every frame through the switch.
    pub kernel_path: bool,
}

impl Default for BridgeOpts {
    fn default() -> Self {
        BridgeOpts { kernel_path: true }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn macs_are_deterministic_local_unicast_and_distinct() {
        let a = nic_mac("a", "lan", &[]);
        assert_eq!(a, nic_mac("a", "lan", &[]));
        assert_eq!(a.0[0], 0x02, "locally administered, unicast");
        assert_ne!(a, nic_mac("b", "lan", &[]));
        assert_ne!(a, nic_mac("a", "wan", &[]));
        let salted = nic_mac("a", "lan", &[a]);
        assert_ne!(salted, a);
        assert_eq!(salted.0[0], 0x02);
    }

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
