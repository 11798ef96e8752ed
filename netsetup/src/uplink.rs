//! Uplink: NAT from a bridge to the host's default-route interface.
//!
//! The switch side of an uplink is just a [`crate::TapPort`] on a host TAP.
//! This module does the host side, with the `ip` and `nft` commands (run via
//! `std::process`, found on the [`UplinkEnv::path`] given, never through a
//! shell):
//! 1. find the default-route interface (`ip -o -4 route show default`),
//! 2. give the TAP its address (`ip addr replace ADDR dev TAP`) and set it up,
//! 3. enable IPv4 forwarding on the TAP and on that interface
//!    (`/proc/sys/net/ipv4/conf/<if>/forwarding`; per interface, not the global
//!    `ip_forward`),
//! 4. load one nft table, `ip provium_uplink_<bridge>_<hash>`, holding a
//!    masquerade rule for the TAP's subnet out of the default-route interface
//!    and forward-accept rules for the TAP's traffic and its replies.
//!
//! [`disable_uplink`] deletes the table and the address and puts the
//! default-route interface's forwarding flag back when this uplink turned it
//! on and no other Provium uplink table remains in the namespace. Everything
//! needs CAP_NET_ADMIN in the current network namespace; failures carry the
//! command's own stderr. A host whose own firewall drops forwarded traffic
//! (a `drop` policy in another forward chain) still drops it: nft evaluates
//! every base chain.

use std::ffi::{OsStr, OsString};
use std::io::{self, Write};
use std::net::Ipv4Addr;
use std::os::fd::BorrowedFd;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::fnv1a::fnv1a;
use crate::tap::{set_link_up, tap_name, TapError};

/// Errors from enabling or disabling an uplink.
#[derive(Debug, thiserror::Error)]
pub enum UplinkError {
    /// A required command is not on the search path.
    #[error(
        "`{tool}` not found on PATH `{path}` (uplink needs {package}: apt-get install {package})"
    )]
    ToolNotFound {
        /// `ip` or `nft`.
        tool: &'static str,
        /// The Debian package providing it.
        package: &'static str,
        /// The searched path.
        path: String,
    },
    /// The address is not `a.b.c.d/len`.
    #[error("uplink address `{0}` is not an IPv4 address with prefix length, like 10.0.2.1/24")]
    BadAddress(String),
    /// The fd is not a TAP.
    #[error("the uplink fd is not a tap device")]
    NotTap(#[source] io::Error),
    /// Setting the TAP up failed.
    #[error("cannot set the uplink tap up")]
    LinkUp(#[source] TapError),
    /// No default route in this namespace.
    #[error("no default route in this network namespace (`ip -o -4 route show default` printed {0:?}); uplink NATs toward the default-route interface, so add one")]
    NoDefaultRoute(String),
    /// A command could not be started.
    #[error("cannot run `{cmd}`")]
    Spawn {
        /// The command line.
        cmd: String,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// A command exited non-zero; its stderr is the detail.
    #[error("`{cmd}` failed ({status}): {stderr} (uplink needs CAP_NET_ADMIN)")]
    Command {
        /// The command line.
        cmd: String,
        /// Exit status.
        status: String,
        /// What the command printed on stderr.
        stderr: String,
    },
    /// A forwarding sysctl could not be read or written.
    #[error("cannot set `{path}`")]
    Sysctl {
        /// The /proc/sys path.
        path: String,
        /// Why.
        #[source]
        source: io::Error,
    },
}

/// Where to find `ip` and `nft`: the PATH, read once by the caller.
#[derive(Clone, Debug)]
pub struct UplinkEnv {
    /// A PATH-style, colon-separated list of directories.
    pub path: OsString,
}

impl UplinkEnv {
    /// `path` (a PATH as the caller read it: the harness's `Settings`),
    /// or the usual sbin/bin dirs when unset. The library reads no
    /// environment of its own (harness/tests/workspace_edges.rs holds it).
    pub fn from_path(path: Option<OsString>) -> UplinkEnv {
        UplinkEnv {
            path: path.unwrap_or_else(|| OsString::from("/usr/sbin:/usr/bin:/sbin:/bin")),
        }
    }

    fn find(&self, tool: &'static str, package: &'static str) -> Result<PathBuf, UplinkError> {
        for dir in std::env::split_paths(&self.path) {
            let p = dir.join(tool);
            if is_executable(&p) {
                return Ok(p);
            }
        }
        Err(UplinkError::ToolNotFound {
            tool,
            package,
            path: self.path.to_string_lossy().into_owned(),
        })
    }
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    p.metadata()
        .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// An enabled uplink; pass it to [`disable_uplink`] to remove it.
#[derive(Debug)]
pub struct Uplink {
    bridge: String,
    tap: String,
    addr: String,
    subnet: String,
    wan: String,
    table: String,
    ip: PathBuf,
    nft: PathBuf,
    /// The default-route interface's forwarding value before we set it.
    wan_forwarding_before: Option<String>,
}

impl Uplink {
    /// The bridge.
    pub fn bridge(&self) -> &str {
        &self.bridge
    }
    /// The host TAP's interface name.
    pub fn tap(&self) -> &str {
        &self.tap
    }
    /// The address given to the TAP (`a.b.c.d/len`).
    pub fn addr(&self) -> &str {
        &self.addr
    }
    /// The NATed subnet (`network/len`).
    pub fn subnet(&self) -> &str {
        &self.subnet
    }
    /// The default-route interface traffic leaves by.
    pub fn wan(&self) -> &str {
        &self.wan
    }
    /// The nft table holding this uplink's rules (family `ip`).
    pub fn table(&self) -> &str {
        &self.table
    }
}

/// The nft table name for `bridge`: `provium_uplink_` + the name with
/// non-alphanumerics as `_` + `_` + 8 hex digits of its hash (so `a-b` and
/// `a_b` differ).
pub fn table_name(bridge: &str) -> String {
    let clean: String = bridge
        .chars()
        .take(32)
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect();
    let h = fnv1a(&[bridge.as_bytes()]) & 0xffff_ffff;
    format!("provium_uplink_{clean}_{h:08x}")
}

/// Parses `a.b.c.d/len`; returns the address, the prefix and the subnet.
fn parse_cidr(s: &str) -> Option<(Ipv4Addr, u8, String)> {
    let (a, l) = s.split_once('/')?;
    let addr: Ipv4Addr = a.parse().ok()?;
    let len: u8 = l.parse().ok()?;
    if len > 32 || l.starts_with('+') {
        return None;
    }
    let mask = if len == 0 { 0 } else { u32::MAX << (32 - len) };
    let net = Ipv4Addr::from(u32::from(addr) & mask);
    Some((addr, len, format!("{net}/{len}")))
}

fn run(bin: &Path, args: &[&str], stdin: Option<&str>) -> Result<String, UplinkError> {
    let cmd_line = std::iter::once(bin.as_os_str())
        .chain(args.iter().map(OsStr::new))
        .map(|s| s.to_string_lossy().into_owned())
        .collect::<Vec<_>>()
        .join(" ");
    let mut child = Command::new(bin)
        .args(args)
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|source| UplinkError::Spawn {
            cmd: cmd_line.clone(),
            source,
        })?;
    if let (Some(text), Some(mut pipe)) = (stdin, child.stdin.take()) {
        pipe.write_all(text.as_bytes())
            .map_err(|source| UplinkError::Spawn {
                cmd: cmd_line.clone(),
                source,
            })?;
    }
    let out = child
        .wait_with_output()
        .map_err(|source| UplinkError::Spawn {
            cmd: cmd_line.clone(),
            source,
        })?;
    if !out.status.success() {
        return Err(UplinkError::Command {
            cmd: cmd_line,
            status: out.status.to_string(),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn forwarding_path(iface: &str) -> String {
    format!("/proc/sys/net/ipv4/conf/{iface}/forwarding")
}

fn read_sysctl(path: &str) -> Result<String, UplinkError> {
    std::fs::read_to_string(path)
        .map(|s| s.trim().to_owned())
        .map_err(|source| UplinkError::Sysctl {
            path: path.to_owned(),
            source,
        })
}

fn write_sysctl(path: &str, v: &str) -> Result<(), UplinkError> {
    std::fs::write(path, v).map_err(|source| UplinkError::Sysctl {
        path: path.to_owned(),
        source,
    })
}

/// The interface of the first IPv4 default route, from `ip -o -4 route show default`.
fn default_route_iface(ip: &Path) -> Result<String, UplinkError> {
    let out = run(ip, &["-o", "-4", "route", "show", "default"], None)?;
    out.lines()
        .find_map(|l| {
            let mut it = l.split_whitespace();
            it.by_ref().find(|w| *w == "dev")?;
            it.next().map(str::to_owned)
        })
        .ok_or(UplinkError::NoDefaultRoute(out.trim().to_owned()))
}

/// Enables NAT for `bridge`: gives the TAP behind `tap` the address `addr`
/// (`a.b.c.d/len`; the guests use it as their gateway) and masquerades the
/// subnet toward the default-route interface. See the module docs.
pub fn enable_uplink(
    bridge: &str,
    tap: BorrowedFd<'_>,
    addr: &str,
    env: &UplinkEnv,
) -> Result<Uplink, UplinkError> {
    let ip = env.find("ip", "iproute2")?;
    let nft = env.find("nft", "nftables")?;
    let (_, _, subnet) =
        parse_cidr(addr).ok_or_else(|| UplinkError::BadAddress(addr.to_owned()))?;
    let tap = tap_name(tap).map_err(UplinkError::NotTap)?;
    let wan = default_route_iface(&ip)?;
    let table = table_name(bridge);

    run(&ip, &["addr", "replace", addr, "dev", &tap], None)?;
    let mut up = Uplink {
        bridge: bridge.to_owned(),
        tap,
        addr: addr.to_owned(),
        subnet,
        wan,
        table,
        ip,
        nft,
        wan_forwarding_before: None,
    };
    // From here on, undo what was done if a later step fails.
    match finish_enable(&mut up) {
        Ok(()) => Ok(up),
        Err(e) => {
            let _ = teardown(&up);
            Err(e)
        }
    }
}

fn finish_enable(up: &mut Uplink) -> Result<(), UplinkError> {
    set_link_up(&up.tap).map_err(UplinkError::LinkUp)?;
    let wan_path = forwarding_path(&up.wan);
    let before = read_sysctl(&wan_path)?;
    if before != "1" {
        write_sysctl(&wan_path, "1")?;
        up.wan_forwarding_before = Some(before);
    }
    write_sysctl(&forwarding_path(&up.tap), "1")?;
    let script = format!(
        "table ip {t}\n\
         delete table ip {t}\n\
         table ip {t} {{\n\
         \tchain postrouting {{\n\
         \t\ttype nat hook postrouting priority 100; policy accept;\n\
         \t\tip saddr {sub} oifname \"{wan}\" masquerade\n\
         \t}}\n\
         \tchain forward {{\n\
         \t\ttype filter hook forward priority 0; policy accept;\n\
         \t\tiifname \"{tap}\" oifname \"{wan}\" accept\n\
         \t\tiifname \"{wan}\" oifname \"{tap}\" ct state established,related accept\n\
         \t}}\n\
         }}\n",
        t = up.table,
        sub = up.subnet,
        wan = up.wan,
        tap = up.tap,
    );
    run(&up.nft, &["-f", "-"], Some(&script))?;
    Ok(())
}

/// Removes every trace of `uplink`: the nft table, the TAP's address, and
/// (when this uplink turned it on and no other Provium uplink remains) the
/// default-route interface's forwarding flag. Tries every step; returns the
/// first failure.
pub fn disable_uplink(uplink: Uplink) -> Result<(), UplinkError> {
    teardown(&uplink)
}

fn teardown(up: &Uplink) -> Result<(), UplinkError> {
    let mut first: Option<UplinkError> = None;
    let mut note = |r: Result<(), UplinkError>| {
        if let Err(e) = r {
            first.get_or_insert(e);
        }
    };
    let listed = run(&up.nft, &["list", "tables", "ip"], None);
    let ours_present = listed
        .as_ref()
        .map(|s| {
            s.lines()
                .any(|l| l.trim() == format!("table ip {}", up.table))
        })
        .unwrap_or(true);
    if ours_present {
        note(run(&up.nft, &["delete", "table", "ip", &up.table], None).map(drop));
    }
    match run(&up.ip, &["addr", "del", &up.addr, "dev", &up.tap], None) {
        // Already gone (the TAP was deleted, or the address removed) is fine.
        Err(UplinkError::Command { stderr, .. })
            if stderr.contains("Cannot find device")
                || stderr.contains("Cannot assign")
                || stderr.contains("Address not found") => {}
        r => note(r.map(drop)),
    }
    if let Some(before) = &up.wan_forwarding_before {
        let others = run(&up.nft, &["list", "tables", "ip"], None)
            .map(|s| s.contains("provium_uplink_"))
            .unwrap_or(true);
        if !others {
            note(write_sysctl(&forwarding_path(&up.wan), before));
        }
    }
    match first {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cidr_parsing() {
        assert_eq!(
            parse_cidr("10.0.2.1/24"),
            Some((Ipv4Addr::new(10, 0, 2, 1), 24, "10.0.2.0/24".into()))
        );
        assert_eq!(
            parse_cidr("10.0.2.1/0").map(|c| c.2),
            Some("0.0.0.0/0".into())
        );
        assert_eq!(
            parse_cidr("10.0.2.1/32").map(|c| c.2),
            Some("10.0.2.1/32".into())
        );
        assert_eq!(parse_cidr("10.0.2.1"), None);
        assert_eq!(parse_cidr("10.0.2.1/33"), None);
        assert_eq!(parse_cidr("10.0.2.1/+3"), None);
        assert_eq!(parse_cidr("host/24"), None);
    }

    #[test]
    fn table_names_are_nft_identifiers_and_distinct() {
        let a = table_name("a-b");
        let b = table_name("a_b");
        assert_ne!(a, b);
        assert!(a.starts_with("provium_uplink_a_b_"));
        assert!(a.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'));
    }

    #[test]
    fn missing_tools_are_named() {
        let env = UplinkEnv {
            path: OsString::from("/nonexistent-provium-dir"),
        };
        let e = env.find("nft", "nftables").unwrap_err();
        let msg = e.to_string();
        assert!(msg.contains("`nft` not found"), "{msg}");
        assert!(msg.contains("nftables"), "{msg}");
    }
}
