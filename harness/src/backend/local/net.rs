//! Network interfaces of a sandbox: one TAP per bridge attachment, created
//! inside the sandbox's network namespace.
//!
//! A sandbox's network namespace starts with only `lo`. Attaching it to a
//! bridge creates a TAP there (named `eth0`, `eth1`, … by the caller), gives
//! it the NIC's MAC and sets it up; the fd comes back to the host, where the
//! bridge's userspace switch holds it (`provium_netsetup::TapPort`). Only the
//! network namespace is entered, from a short-lived helper thread, so the
//! rest of the process (and `/dev/net/tun`, opened from the host's mount
//! namespace) is untouched. Closing the fd removes the interface; a detach,
//! a shutdown or a closing bridge parks it instead (`TapPort::park`: it
//! stays, link down, until the sandbox's namespace goes), and the next TAP
//! opened under its name replaces it (`Tap::open`).

use std::ffi::CString;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;

use provium_netsetup::tap::{set_link_up, Tap, TapError};
use provium_netsetup::MacAddr;

/// What can go wrong creating a sandbox NIC.
#[derive(Debug, thiserror::Error)]
pub enum NetError {
    /// The sandbox's network namespace could not be opened or entered.
    #[error("cannot enter the network namespace of sandbox init pid {pid} ({what}); is the sandbox still running?")]
    Netns {
        pid: i32,
        what: &'static str,
        #[source]
        source: io::Error,
    },
    /// The TAP could not be created or set up inside the namespace.
    #[error("cannot create tap `{name}` in the sandbox")]
    Tap {
        name: String,
        #[source]
        source: TapError,
    },
    /// Setting the MAC address failed.
    #[error("cannot set mac {mac} on `{name}` in the sandbox (SIOCSIFHWADDR)")]
    Mac {
        name: String,
        mac: MacAddr,
        #[source]
        source: io::Error,
    },
    /// The helper thread could not be started or died.
    #[error("cannot run the namespace helper thread")]
    Thread(#[source] io::Error),
}

/// Creates TAP `name` with `mac` inside the network namespace of the process
/// `init_pid` (a sandbox's init), sets it up, and returns its fd (already
/// `IFF_TAP | IFF_NO_PI | IFF_VNET_HDR`, non-blocking, close-on-exec; the
/// `TapPort` it is handed to turns on the TSO/checksum offloads).
pub fn open_tap_in_netns(init_pid: i32, name: &str, mac: MacAddr) -> Result<OwnedFd, NetError> {
    let ns_path = format!("/proc/{init_pid}/ns/net");
    let ns = File::options()
        .read(true)
        .custom_flags(libc::O_CLOEXEC)
        .open(&ns_path)
        .map_err(|source| NetError::Netns {
            pid: init_pid,
            what: "open /proc/<pid>/ns/net",
            source,
        })?;
    let name = name.to_owned();
    // A fresh thread: setns changes only the calling thread's namespace, and
    // the thread ends right after, so no other code ever runs in the sandbox's
    // namespace by accident.
    std::thread::Builder::new()
        .name("sandbox-netns".into())
        .spawn(move || -> Result<OwnedFd, NetError> {
            // SAFETY: setns on an fd we own; it affects only this thread.
            if unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) } < 0 {
                return Err(NetError::Netns {
                    pid: init_pid,
                    what: "setns(CLONE_NEWNET)",
                    source: io::Error::last_os_error(),
                });
            }
            let tap = Tap::open(&name).map_err(|source| NetError::Tap {
                name: name.clone(),
                source,
            })?;
            set_mac(&name, mac).map_err(|source| NetError::Mac {
                name: name.clone(),
                mac,
                source,
            })?;
            set_link_up(&name).map_err(|source| NetError::Tap {
                name: name.clone(),
                source,
            })?;
            Ok(tap.into_fd())
        })
        .map_err(NetError::Thread)?
        .join()
        .map_err(|_| NetError::Thread(io::Error::other("the namespace helper thread panicked")))?
}

/// Sets interface `name`'s hardware address (calling thread's namespace).
fn set_mac(name: &str, mac: MacAddr) -> io::Result<()> {
    let cname = CString::new(name).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    let bytes = cname.as_bytes_with_nul();
    if bytes.len() > libc::IFNAMSIZ {
        return Err(io::Error::from(io::ErrorKind::InvalidInput));
    }
    // SAFETY: ifreq is plain old data; all-zero is a valid value.
    let mut ifr: libc::ifreq = unsafe { std::mem::zeroed() };
    for (d, s) in ifr.ifr_name.iter_mut().zip(bytes) {
        *d = *s as libc::c_char;
    }
    // SAFETY: writing the hwaddr member of a zeroed union.
    unsafe {
        ifr.ifr_ifru.ifru_hwaddr.sa_family = libc::ARPHRD_ETHER;
        for (d, s) in ifr.ifr_ifru.ifru_hwaddr.sa_data.iter_mut().zip(mac.0) {
            *d = s as libc::c_char;
        }
    }
    // SAFETY: plain socket(2); the result is checked.
    let s = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if s < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `s` is a fresh fd we own.
    let sock = unsafe { OwnedFd::from_raw_fd(s) };
    // SAFETY: SIOCSIFHWADDR reads one ifreq, which outlives the call.
    if unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCSIFHWADDR as _, &ifr) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_namespace_names_the_pid() {
        // Pid 0 has no /proc entry.
        let e = open_tap_in_netns(0, "eth0", MacAddr::local(1)).unwrap_err();
        let msg = e.to_string();
        assert!(msg.contains("init pid 0"), "{msg}");
        assert!(matches!(e, NetError::Netns { .. }));
    }

    #[test]
    fn tap_in_a_fresh_namespace() {
        if super::super::sys::geteuid() != 0 || !std::path::Path::new("/dev/net/tun").exists() {
            eprintln!("SKIP tap_in_a_fresh_namespace: needs root and /dev/net/tun");
            return;
        }
        // A child process in its own network namespace stands in for a
        // sandbox init.
        let mut child = std::process::Command::new("unshare")
            .args(["--net", "sleep", "30"])
            .spawn()
            .expect("spawn unshare --net sleep");
        let pid = i32::try_from(child.id()).expect("pid fits i32");
        // unshare execs sleep after creating the namespace: wait until the
        // child's namespace differs from ours.
        let ours = std::fs::read_link("/proc/self/ns/net").unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while std::fs::read_link(format!("/proc/{pid}/ns/net"))
            .ok()
            .as_ref()
            == Some(&ours)
        {
            assert!(std::time::Instant::now() < deadline, "no new netns");
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        let mac: MacAddr = "02:aa:bb:cc:dd:ee".parse().unwrap();
        let fd = open_tap_in_netns(pid, "eth0", mac).expect("open tap");
        let out = std::process::Command::new("nsenter")
            .args([
                "-t",
                &pid.to_string(),
                "-n",
                "ip",
                "-o",
                "link",
                "show",
                "eth0",
            ])
            .output()
            .expect("nsenter ip link");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.contains("02:aa:bb:cc:dd:ee"), "{text}");
        assert!(text.contains("UP"), "{text}");
        // Not in our namespace.
        assert!(
            !std::path::Path::new("/sys/class/net/eth0").exists() || {
                let ours =
                    std::fs::read_to_string("/sys/class/net/eth0/address").unwrap_or_default();
                ours.trim() != "02:aa:bb:cc:dd:ee"
            }
        );
        drop(fd);
        let _ = child.kill();
        let _ = child.wait();
    }
}
