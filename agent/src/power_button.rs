//! The ACPI power button, for the agent as PID 1 (`pid1`, step 3).
//!
//! On a guest with ACPI the VMM's power button is an ACPI event (a GED
//! notifying `\_SB.PWRB`, docs/vmm.md "Power button"), not Ctrl+Alt+Del:
//! the kernel's ACPI button driver reports it as KEY_POWER on an input
//! device named "Power Button", and leaves the rest to user space (acpid,
//! systemd-logind). On a plain initrd nothing else is there, so PID 1
//! watches every `/dev/input/event*` device of that name and takes a
//! KEY_POWER press as it takes the SIGINT of Ctrl+Alt+Del: a graceful
//! power-off.
//!
//! Devices are looked for again while none is found (a button driver that
//! is a module appears after PID 1 starts); no threads: PID 1 polls these
//! fds together with a signalfd.

use std::fs::File;
use std::io::Read;
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// The input device name Linux's ACPI button driver gives a power button
/// (drivers/acpi/button.c, both the `PNP0C0C` and the fixed-feature one).
pub const POWER_BUTTON_NAME: &str = "Power Button";
/// `EV_KEY` (include/uapi/linux/input-event-codes.h).
pub const EV_KEY: u16 = 0x01;
/// `KEY_POWER`.
pub const KEY_POWER: u16 = 116;
/// Bytes of one `struct input_event` on 64-bit Linux: a `struct timeval`
/// (two 64-bit fields), type, code (16 bits each), value (32 bits).
pub const INPUT_EVENT_BYTES: usize = 24;

/// `EVIOCGNAME(len)`: `_IOC(_IOC_READ, 'E', 0x06, len)`.
fn eviocgname(len: usize) -> libc::c_ulong {
    const IOC_READ: libc::c_ulong = 2;
    (IOC_READ << 30) | ((len as libc::c_ulong & 0x3fff) << 16) | (0x45 << 8) | 0x06
}

/// The device name of an open evdev node.
fn device_name(f: &File) -> Option<String> {
    let mut buf = [0u8; 256];
    // SAFETY: EVIOCGNAME writes at most `buf.len()` bytes into `buf`,
    // which is alive and writable for the call.
    let n = unsafe { libc::ioctl(f.as_raw_fd(), eviocgname(buf.len()), buf.as_mut_ptr()) };
    let n = usize::try_from(n).ok()?;
    let raw = buf.get(..n.min(buf.len()))?;
    let end = raw.iter().position(|b| *b == 0).unwrap_or(raw.len());
    Some(String::from_utf8_lossy(&raw[..end]).into_owned())
}

/// The `/dev/input/event*` nodes under `dir`, sorted.
fn event_nodes(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(Result::ok)
                .map(|e| e.path())
                .filter(|p| {
                    p.file_name()
                        .and_then(|n| n.to_str())
                        .is_some_and(|n| n.starts_with("event"))
                })
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

/// Every power-button input device, opened non-blocking.
pub fn open_power_buttons() -> Vec<File> {
    event_nodes(Path::new("/dev/input"))
        .into_iter()
        .filter_map(|p| {
            std::fs::OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
                .open(&p)
                .ok()
        })
        .filter(|f| device_name(f).as_deref() == Some(POWER_BUTTON_NAME))
        .collect()
}

/// Whether `events` (whole `input_event` records) hold a KEY_POWER press.
pub fn has_key_power_press(events: &[u8]) -> bool {
    events.chunks_exact(INPUT_EVENT_BYTES).any(|e| {
        let ty = u16::from_ne_bytes([e[16], e[17]]);
        let code = u16::from_ne_bytes([e[18], e[19]]);
        let value = i32::from_ne_bytes([e[20], e[21], e[22], e[23]]);
        ty == EV_KEY && code == KEY_POWER && value == 1
    })
}

/// Reads what `f` has (non-blocking): `Some(whether it held a press)`, or
/// `None` when the device is gone (unplugged, driver unbound).
pub fn read_press(f: &mut File) -> Option<bool> {
    let mut buf = [0u8; INPUT_EVENT_BYTES * 16];
    let mut pressed = false;
    loop {
        match f.read(&mut buf) {
            Ok(0) => return None,
            Ok(n) => pressed |= has_key_power_press(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Some(pressed),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return None,
        }
    }
}

/// A signalfd for `set` (blocked already), non-blocking.
pub fn signalfd(set: &libc::sigset_t) -> std::io::Result<File> {
    // SAFETY: a new signalfd (-1) for a valid set; the returned fd is owned
    // by the File from here on.
    let fd = unsafe { libc::signalfd(-1, set, libc::SFD_NONBLOCK | libc::SFD_CLOEXEC) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `fd` is a fresh descriptor nobody else owns.
    Ok(unsafe { File::from_raw_fd(fd) })
}

/// The next signal number waiting on a signalfd, if any.
pub fn read_signal(f: &mut File) -> Option<u32> {
    let mut buf = [0u8; std::mem::size_of::<libc::signalfd_siginfo>()];
    match f.read(&mut buf) {
        Ok(n) if n == buf.len() => Some(u32::from_ne_bytes([buf[0], buf[1], buf[2], buf[3]])),
        _ => None,
    }
}

/// Waits until one of `fds` is readable or `timeout_ms` passes; returns
/// which are readable (empty on timeout or EINTR).
pub fn poll_readable(fds: &[&File], timeout_ms: i32) -> Vec<bool> {
    let mut p: Vec<libc::pollfd> = fds
        .iter()
        .map(|f| libc::pollfd {
            fd: f.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    // SAFETY: `p` is a live array of `p.len()` pollfds.
    let n = unsafe { libc::poll(p.as_mut_ptr(), p.len() as libc::nfds_t, timeout_ms) };
    if n <= 0 {
        return vec![false; fds.len()];
    }
    p.iter()
        .map(|x| x.revents & (libc::POLLIN | libc::POLLHUP | libc::POLLERR) != 0)
        .collect()
}

/// For the initrd's own init, which PID 1 execs and which reads no input
/// devices: a thread that sends PID 1 SIGINT for each KEY_POWER press, the
/// signal the kernel gives init for Ctrl+Alt+Del once init turned the
/// kernel's C-A-D reboot off. So an init that powers off on Ctrl+Alt+Del
/// (the test initrd's /init, busybox init's `ctrlaltdel` action) powers off
/// on the ACPI button too, as it would with acpid. Not for systemd (its
/// SIGINT means ctrl-alt-del.target, a reboot, and logind already handles
/// the key): PID 1 named `systemd` gets nothing.
pub fn forward_presses_to_init() {
    let spawned = std::thread::Builder::new()
        .name("power-button".into())
        .spawn(|| loop {
            let comm = std::fs::read_to_string("/proc/1/comm").unwrap_or_default();
            if comm.trim() == "systemd" {
                return;
            }
            let mut buttons = open_power_buttons();
            if buttons.is_empty() {
                // A button driver that is a module appears later.
                std::thread::sleep(std::time::Duration::from_secs(5));
                continue;
            }
            'watch: loop {
                let ready = {
                    let refs: Vec<&File> = buttons.iter().collect();
                    poll_readable(&refs, 5000)
                };
                for (f, r) in buttons.iter_mut().zip(ready) {
                    if !r {
                        continue;
                    }
                    match read_press(f) {
                        Some(true) => {
                            // SAFETY: kill(2) with a constant pid and signal
                            // touches no memory of ours.
                            unsafe { libc::kill(1, libc::SIGINT) };
                        }
                        Some(false) => {}
                        None => break 'watch,
                    }
                }
            }
        });
    if let Err(e) = spawned {
        eprintln!("provium-agent: cannot watch the power button: {e}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(ty: u16, code: u16, value: i32) -> Vec<u8> {
        let mut e = vec![0u8; 16];
        e.extend(ty.to_ne_bytes());
        e.extend(code.to_ne_bytes());
        e.extend(value.to_ne_bytes());
        e
    }

    #[test]
    fn key_power_press_is_found_among_other_events() {
        let mut evs = event(EV_KEY, KEY_POWER, 0); // release
        evs.extend(event(0, 0, 0)); // EV_SYN
        assert!(!has_key_power_press(&evs));
        evs.extend(event(EV_KEY, KEY_POWER, 1));
        assert!(has_key_power_press(&evs));
        assert!(!has_key_power_press(&event(EV_KEY, 115, 1)), "KEY_VOLUMEUP");
        // A partial record is ignored, not misread.
        assert!(!has_key_power_press(&event(EV_KEY, KEY_POWER, 1)[..20]));
    }

    #[test]
    fn eviocgname_matches_the_kernel_macro() {
        // EVIOCGNAME(256) from <linux/input.h> on x86_64.
        assert_eq!(eviocgname(256), 0x8100_4506);
    }

    #[test]
    fn event_nodes_lists_only_event_devices() {
        let d = tempfile::tempdir().expect("tempdir");
        for n in ["event1", "event0", "mice", "js0"] {
            std::fs::write(d.path().join(n), b"").expect("write");
        }
        let names: Vec<String> = event_nodes(d.path())
            .iter()
            .map(|p| p.file_name().expect("name").to_string_lossy().into_owned())
            .collect();
        assert_eq!(names, ["event0", "event1"]);
        assert!(event_nodes(&d.path().join("missing")).is_empty());
    }
}
