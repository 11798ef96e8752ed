//! Uplink: error paths everywhere, the happy path as root in a fresh network
//! namespace when `nft` is installed (skipped with a printed reason otherwise).

mod common;

use std::ffi::OsString;
use std::fs::File;
use std::os::fd::AsFd;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use common::{have, in_fresh_netns, sh};
use provium_netsetup::{disable_uplink, enable_uplink, tap, Tap, UplinkEnv, UplinkError};

fn env_dir(tools: &[(&str, &str)]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for (name, script) in tools {
        let p = dir.path().join(name);
        std::fs::write(&p, script).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    dir
}

/// The test process's own PATH, as the harness's `Settings` would pass it.
fn path_env() -> UplinkEnv {
    UplinkEnv::from_path(std::env::var_os("PATH"))
}

fn env_of(dir: &Path) -> UplinkEnv {
    UplinkEnv {
        path: OsString::from(dir),
    }
}

#[test]
fn missing_nft_is_named() {
    let dir = env_dir(&[("ip", "#!/bin/sh\nexit 0\n")]);
    let devnull = File::open("/dev/null").unwrap();
    let e = enable_uplink("lan", devnull.as_fd(), "10.0.2.1/24", &env_of(dir.path())).unwrap_err();
    assert!(
        matches!(e, UplinkError::ToolNotFound { tool: "nft", .. }),
        "{e:?}"
    );
    let msg = e.to_string();
    assert!(
        msg.contains("`nft` not found") && msg.contains("nftables"),
        "{msg}"
    );
}

#[test]
fn missing_ip_is_named() {
    let dir = env_dir(&[("nft", "#!/bin/sh\nexit 0\n")]);
    let devnull = File::open("/dev/null").unwrap();
    let e = enable_uplink("lan", devnull.as_fd(), "10.0.2.1/24", &env_of(dir.path())).unwrap_err();
    assert!(
        matches!(e, UplinkError::ToolNotFound { tool: "ip", .. }),
        "{e:?}"
    );
}

#[test]
fn bad_address_and_non_tap_fd() {
    let ok = "#!/bin/sh\nexit 0\n";
    let dir = env_dir(&[("ip", ok), ("nft", ok)]);
    let devnull = File::open("/dev/null").unwrap();
    let env = env_of(dir.path());
    let e = enable_uplink("lan", devnull.as_fd(), "10.0.2.1", &env).unwrap_err();
    assert!(matches!(e, UplinkError::BadAddress(_)), "{e:?}");
    let e = enable_uplink("lan", devnull.as_fd(), "10.0.2.1/24", &env).unwrap_err();
    assert!(matches!(e, UplinkError::NotTap(_)), "{e:?}");
}

#[test]
fn command_failures_carry_their_stderr() {
    // A fake `ip` that knows a default route but refuses changes, as `ip`
    // without CAP_NET_ADMIN does.
    let fake_ip = "#!/bin/sh\ncase \"$*\" in\n*route*) echo 'default via 192.0.2.1 dev wan0 proto static';;\n*) echo 'RTNETLINK answers: Operation not permitted' >&2; exit 2;;\nesac\n";
    let dir = env_dir(&[("ip", fake_ip), ("nft", "#!/bin/sh\nexit 1\n")]);
    let path = dir.path().to_owned();
    in_fresh_netns("command_failures_carry_their_stderr", move || {
        let t = Tap::open("ptap1").expect("open tap");
        let e = enable_uplink("lan", t.as_fd(), "10.0.2.1/24", &env_of(&path)).unwrap_err();
        let msg = e.to_string();
        assert!(matches!(e, UplinkError::Command { .. }), "{e:?}");
        assert!(msg.contains("Operation not permitted"), "{msg}");
        assert!(msg.contains("addr replace 10.0.2.1/24 dev ptap1"), "{msg}");
    });
}

#[test]
fn no_default_route_is_an_error() {
    if !have("nft") {
        eprintln!(
            "SKIP no_default_route_is_an_error: `nft` not installed (apt-get install nftables)"
        );
        return;
    }
    in_fresh_netns("no_default_route_is_an_error", || {
        let t = Tap::open("ptap2").expect("open tap");
        let e = enable_uplink("lan", t.as_fd(), "10.0.2.1/24", &path_env()).unwrap_err();
        assert!(matches!(e, UplinkError::NoDefaultRoute(_)), "{e:?}");
        assert!(e.to_string().contains("no default route"));
    });
}

#[test]
fn enable_installs_nat_and_disable_removes_everything() {
    if !have("nft") {
        eprintln!("SKIP enable_installs_nat_and_disable_removes_everything: `nft` not installed (apt-get install nftables)");
        return;
    }
    in_fresh_netns("enable_installs_nat", || {
        // A stand-in "internet" link with a default route through it.
        sh("ip link add wan0 type veth peer name wan1 && ip addr add 192.0.2.2/24 dev wan0 \
            && ip link set wan0 up && ip link set wan1 up && ip route add default via 192.0.2.1 dev wan0");
        let fwd = || {
            sh("cat /proc/sys/net/ipv4/conf/wan0/forwarding")
                .trim()
                .to_owned()
        };
        assert_eq!(fwd(), "0");
        let t = Tap::open("ptap3").expect("open tap");

        let up =
            enable_uplink("lan", t.as_fd(), "10.0.2.1/24", &path_env()).expect("enable uplink");
        assert_eq!(up.wan(), "wan0");
        assert_eq!(up.tap(), "ptap3");
        assert_eq!(up.subnet(), "10.0.2.0/24");
        let rules = sh(&format!("nft list table ip {}", up.table()));
        assert!(
            rules.contains("ip saddr 10.0.2.0/24 oifname \"wan0\" masquerade"),
            "{rules}"
        );
        assert!(
            rules.contains("iifname \"ptap3\" oifname \"wan0\" accept"),
            "{rules}"
        );
        assert!(sh("ip -o -4 addr show dev ptap3").contains("10.0.2.1/24"));
        assert!(sh("ip -o link show ptap3").contains("UP"));
        assert_eq!(fwd(), "1");
        assert_eq!(
            sh("cat /proc/sys/net/ipv4/conf/ptap3/forwarding").trim(),
            "1"
        );

        // Enabling again for the same bridge replaces the table, not
        // duplicates it; disabling both is clean in either order.
        let table = up.table().to_owned();
        let up2 = enable_uplink("lan", t.as_fd(), "10.0.2.1/24", &path_env())
            .expect("enable uplink again");
        assert_eq!(sh("nft list tables").matches(&table).count(), 1);
        disable_uplink(up2).expect("disable second");
        disable_uplink(up).expect("disable uplink");
        assert!(!sh("nft list tables").contains(&table));
        assert!(!sh("ip -o -4 addr show dev ptap3").contains("10.0.2.1"));
        assert_eq!(fwd(), "0", "forwarding restored");
        assert_eq!(tap::tap_name(t.as_fd()).unwrap(), "ptap3");
    });
}
