//! A sandbox's interface configuration, for local snapshots of bridged
//! sandboxes: the addresses, link states and routes the test set up on the
//! sandbox's NICs (`eth0`, `eth1`, … in bridge-name order, see `net.rs`).
//!
//! Captured from the host with `nsenter --net=/proc/<init>/ns/net ip -j …`
//! (iproute2, which the networking tier already needs), so nothing runs in
//! the sandbox. What the kernel makes by itself is left out (routes with
//! `proto kernel`, IPv6 link-local addresses): the restored sandbox gets
//! those again when its addresses come back. Restore runs after the
//! restored sandbox's NICs were re-created on its bridges (same names, same
//! MACs): per interface the addresses, then the link state, then the routes.
//!
//! The JSON that `ip` prints comes from the sandbox's own namespace, which a
//! test controls: every field is checked, and a value that is not what
//! `ip` prints is an error naming it, never a panic.

use std::process::Command;

use serde::{Deserialize, Serialize};

/// One interface's configuration.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IfaceConfig {
    /// The interface name inside the sandbox (`eth0`).
    pub name: String,
    /// Administratively up.
    pub up: bool,
    /// `address/prefix` (IPv4 and non-link-local IPv6).
    pub addrs: Vec<String>,
}

/// One route the test added.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RouteConfig {
    /// `4` or `6`.
    pub family: u8,
    /// `default` or `prefix/len`.
    pub dst: String,
    pub gateway: Option<String>,
    pub dev: String,
}

/// Everything captured besides `lo`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SandboxNet {
    pub interfaces: Vec<IfaceConfig>,
    pub routes: Vec<RouteConfig>,
}

impl SandboxNet {
    pub fn is_empty(&self) -> bool {
        self.interfaces.is_empty() && self.routes.is_empty()
    }
}

/// What capturing or restoring a sandbox's interface configuration fails
/// with (what `ip` said, or which of its JSON fields is not what it prints).
#[derive(Debug, thiserror::Error)]
pub enum NetConfigError {
    #[error("cannot run `nsenter … ip` (install util-linux and iproute2)")]
    Spawn(#[source] std::io::Error),
    #[error("`ip {args}` in the sandbox failed: {stderr}")]
    Ip { args: String, stderr: String },
    #[error("`ip -j {what}` printed unexpected JSON")]
    Json {
        what: &'static str,
        #[source]
        source: serde_json::Error,
    },
    #[error("`ip -j {what}`: an entry has no string `{key}`")]
    MissingField {
        what: &'static str,
        key: &'static str,
    },
    #[error("`ip -j addr`: an address has no prefixlen")]
    NoPrefixLen,
    #[error("interface `{name}`")]
    Interface {
        name: String,
        #[source]
        source: Box<NetConfigError>,
    },
    #[error("route to {dst}")]
    Route {
        dst: String,
        #[source]
        source: Box<NetConfigError>,
    },
}

/// Runs `ip args…` in the network namespace of `init_pid`; its stdout.
fn ip_in(init_pid: i32, args: &[&str]) -> Result<String, NetConfigError> {
    let out = Command::new("nsenter")
        .arg(format!("--net=/proc/{init_pid}/ns/net"))
        .arg("--")
        .arg("ip")
        .args(args)
        .output()
        .map_err(NetConfigError::Spawn)?;
    if !out.status.success() {
        return Err(NetConfigError::Ip {
            args: args.join(" "),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn json(text: &str, what: &'static str) -> Result<Vec<serde_json::Value>, NetConfigError> {
    if text.trim().is_empty() {
        return Ok(Vec::new());
    }
    serde_json::from_str(text).map_err(|source| NetConfigError::Json { what, source })
}

fn str_field<'a>(
    v: &'a serde_json::Value,
    key: &'static str,
    what: &'static str,
) -> Result<&'a str, NetConfigError> {
    v.get(key)
        .and_then(|x| x.as_str())
        .ok_or(NetConfigError::MissingField { what, key })
}

/// Parses `ip -j addr show` output (interfaces besides `lo`).
pub fn parse_addrs(text: &str) -> Result<Vec<IfaceConfig>, NetConfigError> {
    let mut out = Vec::new();
    for link in json(text, "addr")? {
        let name = str_field(&link, "ifname", "addr")?.to_string();
        // Our kernel paths' wire ends come back with the bridge, not here.
        if name == "lo" || provium_netsetup::kernel_path::is_wire_end(&name) {
            continue;
        }
        let up = link
            .get("flags")
            .and_then(|f| f.as_array())
            .is_some_and(|f| f.iter().any(|x| x.as_str() == Some("UP")));
        let mut addrs = Vec::new();
        for a in link
            .get("addr_info")
            .and_then(|a| a.as_array())
            .into_iter()
            .flatten()
        {
            let family = str_field(a, "family", "addr")?;
            if a.get("scope").and_then(|s| s.as_str()) == Some("link") && family == "inet6" {
                continue;
            }
            let local = str_field(a, "local", "addr")?;
            let prefix = a
                .get("prefixlen")
                .and_then(|p| p.as_u64())
                .ok_or(NetConfigError::NoPrefixLen)?;
            addrs.push(format!("{local}/{prefix}"));
        }
        out.push(IfaceConfig { name, up, addrs });
    }
    Ok(out)
}

/// Parses `ip -j -<family> route show` output, leaving out the kernel's own.
pub fn parse_routes(text: &str, family: u8) -> Result<Vec<RouteConfig>, NetConfigError> {
    let mut out = Vec::new();
    for r in json(text, "route")? {
        if r.get("protocol").and_then(|p| p.as_str()) == Some("kernel") {
            continue;
        }
        let dst = str_field(&r, "dst", "route")?.to_string();
        if family == 6 && (dst.starts_with("fe80:") || dst.starts_with("ff00:")) {
            continue;
        }
        out.push(RouteConfig {
            family,
            dst,
            gateway: r.get("gateway").and_then(|g| g.as_str()).map(String::from),
            dev: str_field(&r, "dev", "route")?.to_string(),
        });
    }
    Ok(out)
}

/// The configuration of every interface of the sandbox whose init is
/// `init_pid`, besides `lo`.
pub fn capture(init_pid: i32) -> Result<SandboxNet, NetConfigError> {
    let interfaces = parse_addrs(&ip_in(init_pid, &["-j", "addr", "show"])?)?;
    let mut routes = parse_routes(&ip_in(init_pid, &["-j", "-4", "route", "show"])?, 4)?;
    routes.extend(parse_routes(
        &ip_in(init_pid, &["-j", "-6", "route", "show"])?,
        6,
    )?);
    Ok(SandboxNet { interfaces, routes })
}

/// Puts `net` back in the sandbox whose init is `init_pid` (its NICs exist
/// again). An interface the restored sandbox lacks is an error naming it.
pub fn apply(init_pid: i32, net: &SandboxNet) -> Result<(), NetConfigError> {
    let on_iface = |name: &str| {
        let name = name.to_string();
        move |e| NetConfigError::Interface {
            name,
            source: Box::new(e),
        }
    };
    for i in &net.interfaces {
        for a in &i.addrs {
            let mut args = vec!["addr", "add", a.as_str(), "dev", i.name.as_str()];
            if a.contains(':') {
                args.push("nodad");
            }
            ip_in(init_pid, &args).map_err(on_iface(&i.name))?;
        }
        let state = if i.up { "up" } else { "down" };
        ip_in(init_pid, &["link", "set", "dev", &i.name, state]).map_err(on_iface(&i.name))?;
    }
    for r in &net.routes {
        let fam = if r.family == 6 { "-6" } else { "-4" };
        let mut args = vec![fam, "route", "replace", r.dst.as_str()];
        if let Some(g) = &r.gateway {
            args.extend(["via", g.as_str()]);
        }
        args.extend(["dev", r.dev.as_str()]);
        ip_in(init_pid, &args).map_err(|e| NetConfigError::Route {
            dst: r.dst.clone(),
            source: Box::new(e),
        })?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ip_json_parses_and_leaves_the_kernels_own_out() {
        let addrs = r#"[{"ifindex":1,"ifname":"lo","flags":["LOOPBACK","UP"],"addr_info":[]},
            {"ifindex":2,"ifname":"eth0","flags":["BROADCAST","UP","LOWER_UP"],"addr_info":[
              {"family":"inet","local":"10.0.0.2","prefixlen":24,"scope":"global"},
              {"family":"inet6","local":"fe80::1","prefixlen":64,"scope":"link"},
              {"family":"inet6","local":"fd00::2","prefixlen":64,"scope":"global"}]},
            {"ifindex":3,"ifname":"eth1","flags":["BROADCAST"],"addr_info":[]}]"#;
        assert_eq!(
            parse_addrs(addrs).unwrap(),
            vec![
                IfaceConfig {
                    name: "eth0".into(),
                    up: true,
                    addrs: vec!["10.0.0.2/24".into(), "fd00::2/64".into()],
                },
                IfaceConfig {
                    name: "eth1".into(),
                    up: false,
                    addrs: vec![],
                },
            ]
        );
        let routes = r#"[{"dst":"default","gateway":"10.0.0.1","dev":"eth0","flags":[]},
            {"dst":"10.0.0.0/24","dev":"eth0","protocol":"kernel","scope":"link"}]"#;
        assert_eq!(
            parse_routes(routes, 4).unwrap(),
            vec![RouteConfig {
                family: 4,
                dst: "default".into(),
                gateway: Some("10.0.0.1".into()),
                dev: "eth0".into(),
            }]
        );
        assert!(parse_addrs("[{\"flags\": []}]")
            .unwrap_err()
            .to_string()
            .contains("no string `ifname`"));
        let e = crate::error_chain::flatten(&parse_routes("not json", 4).unwrap_err());
        assert!(
            e.starts_with("`ip -j route` printed unexpected JSON: "),
            "{e}"
        );
        assert!(parse_addrs("").unwrap().is_empty());
    }

    #[test]
    fn a_failed_step_names_its_interface_or_route() {
        let e = NetConfigError::Interface {
            name: "eth0".into(),
            source: Box::new(NetConfigError::Ip {
                args: "link set dev eth0 up".into(),
                stderr: "Cannot find device".into(),
            }),
        };
        assert_eq!(
            crate::error_chain::flatten(&e),
            "interface `eth0`: `ip link set dev eth0 up` in the sandbox failed: Cannot find device"
        );
    }
}
