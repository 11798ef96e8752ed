//! TAP devices: opening one, and attaching its file descriptor to a switch.
//!
//! [`Tap::open`] creates (or opens) a TAP interface in the *calling thread's*
//! network namespace through `/dev/net/tun` with `IFF_TAP | IFF_NO_PI |
//! IFF_VNET_HDR`, so every read is one virtio-net header plus one Ethernet
//! frame and every write sends one. It needs CAP_NET_ADMIN in that namespace.
//!
//! # Offloads
//! With the header, [`TapPort`] turns on `TUNSETOFFLOAD` checksum, TSO4,
//! TSO6 and (kernels ≥ 6.2) USO4/USO6: the kernel then hands over 64 KiB
//! TCP super-frames with the checksum left to fill, and takes the same from
//! us. They cross the switch whole to ports that take them (another TAP, a
//! guest NIC that negotiated them) and are cut into wire packets, checksums
//! filled, for any other (see [`crate::offload`]). The header the kernel
//! hands us is validated like a guest's. An fd opened without
//! `IFF_VNET_HDR` still works, frame by frame, with no offloads.
//!
//! [`TapPort`] owns a TAP fd opened elsewhere (the local backend opens it inside
//! a sandbox's namespace and hands it over). A [`TapPoller`] thread reads it
//! and feeds its frames to the switch: one poller per bridge serves all of
//! the bridge's TAPs ([`TapPort::attach_on`]; the module docs of
//! `tap/poller.rs` say why), or each port gets its own ([`TapPort::attach`]).
//! A writer thread per port blocks on the port's receive queue and writes
//! frames out. No thread spins. While the port's queue is idle, a sender
//! writes its frames straight into the fd from its own thread (the switch's
//! direct path, [`crate::DirectWriter`]): a frame from one TAP to another
//! then crosses no thread at all, and the writer thread only drains what
//! the direct path queued because the fd would block or the queue was busy.
//! Link changes from [`crate::Switch::disconnect`] set the
//! carrier with `TUNSETCARRIER` (Linux ≥ 4.9), so the interface shows
//! NO-CARRIER inside the sandbox.

use std::ffi::CStr;
use std::fs::OpenOptions;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use crate::mac::MacAddr;
use crate::offload::{Offloads, VnetHdr, VNET_HDR_BYTES};
use crate::switch::{Port, Switch, SwitchError};

mod poller;
mod vanish;
pub use poller::TapPoller;
use vanish::VanishingInterface;

// From <linux/if_tun.h>: _IOW('T', 202, int), _IOR('T', 210, unsigned int),
// _IOW('T', 226, int).
const TUNSETIFF: libc::c_ulong = 0x4004_54ca;
const TUNGETIFF: libc::c_ulong = 0x8004_54d2;
const TUNSETCARRIER: libc::c_ulong = 0x4004_54e2;
// _IOW('T', 203, int).
const TUNSETPERSIST: libc::c_ulong = 0x4004_54cb;
// _IOW('T', 208, unsigned int), _IOW('T', 216, int).
const TUNSETOFFLOAD: libc::c_ulong = 0x4004_54d0;
const TUNSETVNETHDRSZ: libc::c_ulong = 0x4004_54d8;
const IFF_TAP: libc::c_short = 0x0002;
const IFF_NO_PI: libc::c_short = 0x1000;
const IFF_VNET_HDR: libc::c_short = 0x4000;
const IFF_PERSIST: libc::c_short = 0x0800;
const TUN_F_CSUM: libc::c_uint = 0x01;
const TUN_F_TSO4: libc::c_uint = 0x02;
const TUN_F_TSO6: libc::c_uint = 0x04;
const TUN_F_TSO_ECN: libc::c_uint = 0x08;
const TUN_F_USO4: libc::c_uint = 0x20;
const TUN_F_USO6: libc::c_uint = 0x40;

/// How long [`Tap::open`] waits for a parked TAP it replaces to be gone
/// (see there).
const REPLACE_BOUND: std::time::Duration = std::time::Duration::from_secs(2);

/// Frames read from a TAP per round of its poller and forwarded as one batch.
const RX_BATCH: usize = 16;

/// Errors opening or configuring a TAP.
#[derive(Debug, thiserror::Error)]
pub enum TapError {
    /// The name does not fit IFNAMSIZ or has a NUL.
    #[error("`{0}` is not a valid interface name (1 to 15 bytes, no NUL or '/')")]
    BadName(String),
    /// `/dev/net/tun` could not be opened.
    #[error("cannot open /dev/net/tun (load the `tun` module and run with CAP_NET_ADMIN)")]
    OpenTun(#[source] io::Error),
    /// An ioctl on the TAP failed.
    #[error("{op} on tap `{name}` failed (CAP_NET_ADMIN in this network namespace is required)")]
    Ioctl {
        /// Which request.
        op: &'static str,
        /// The interface.
        name: String,
        /// The errno.
        #[source]
        source: io::Error,
    },
    /// Attaching to the switch failed.
    #[error("cannot attach tap to the switch")]
    Attach(#[source] SwitchError),
    /// Spawning a port thread failed.
    #[error("cannot start the tap port threads")]
    Spawn(#[source] io::Error),
}

fn ifreq_for(name: &str) -> Result<libc::ifreq, TapError> {
    let bytes = name.as_bytes();
    if bytes.is_empty()
        || bytes.len() >= libc::IFNAMSIZ
        || bytes.contains(&0)
        || bytes.contains(&b'/')
    {
        return Err(TapError::BadName(name.to_owned()));
    }
    // SAFETY: ifreq is plain old data; all-zero is a valid value.
    let mut ifr: libc::ifreq = unsafe { std::mem::zeroed() };
    for (d, s) in ifr.ifr_name.iter_mut().zip(bytes) {
        *d = *s as libc::c_char;
    }
    Ok(ifr)
}

fn ifr_name(ifr: &libc::ifreq) -> String {
    // SAFETY: the kernel NUL-terminates ifr_name within IFNAMSIZ, and we
    // zero-initialised it, so a NUL is always present.
    unsafe { CStr::from_ptr(ifr.ifr_name.as_ptr()) }
        .to_string_lossy()
        .into_owned()
}

/// An open TAP device.
#[derive(Debug)]
pub struct Tap {
    fd: OwnedFd,
    name: String,
}

impl Tap {
    /// Creates or opens TAP `name` in the calling thread's network namespace.
    ///
    /// A TAP of that name found persistent is a NIC a closed bridge parked
    /// there ([`TapPort::park`]): it is removed and a fresh one made, so a
    /// NIC attached again starts as new (no addresses, routes or qdiscs
    /// from before), as one whose bridge removed it would.
    pub fn open(name: &str) -> Result<Tap, TapError> {
        let tap = Tap::open_once(name)?;
        let flags = tun_flags(tap.as_fd()).map_err(|source| TapError::Ioctl {
            op: "TUNGETIFF",
            name: name.to_owned(),
            source,
        })?;
        if flags & IFF_PERSIST == 0 {
            return Ok(tap);
        }
        set_persist(tap.as_fd(), false).map_err(|source| TapError::Ioctl {
            op: "TUNSETPERSIST",
            name: name.to_owned(),
            source,
        })?;
        // Ours is now the last reference to a TAP that is not persistent:
        // closing it unregisters the interface before `close` returns,
        // unless a process another thread forked this instant holds a copy
        // until it execs; the name is then busy for that long.
        drop(tap);
        let deadline = std::time::Instant::now() + REPLACE_BOUND;
        loop {
            match Tap::open_once(name) {
                Err(TapError::Ioctl { source, .. })
                    if source.raw_os_error() == Some(libc::EBUSY)
                        && std::time::Instant::now() < deadline =>
                {
                    std::thread::sleep(std::time::Duration::from_millis(1));
                }
                other => return other,
            }
        }
    }

    /// `TUNSETIFF`: creates TAP `name`, or attaches to the one that exists.
    fn open_once(name: &str) -> Result<Tap, TapError> {
        let mut ifr = ifreq_for(name)?;
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_CLOEXEC | libc::O_NONBLOCK)
            .open("/dev/net/tun")
            .map_err(TapError::OpenTun)?;
        ifr.ifr_ifru.ifru_flags = IFF_TAP | IFF_NO_PI | IFF_VNET_HDR;
        // SAFETY: TUNSETIFF reads and writes one ifreq, which outlives the call.
        let r = unsafe { libc::ioctl(file.as_raw_fd(), TUNSETIFF as _, &mut ifr) };
        if r < 0 {
            return Err(TapError::Ioctl {
                op: "TUNSETIFF",
                name: name.to_owned(),
                source: io::Error::last_os_error(),
            });
        }
        Ok(Tap {
            name: ifr_name(&ifr),
            fd: file.into(),
        })
    }

    /// The interface name the kernel assigned.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Gives up the fd (to hand to [`TapPort::attach`]).
    pub fn into_fd(self) -> OwnedFd {
        self.fd
    }
}

impl AsFd for Tap {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

/// The interface name behind a TAP fd (`TUNGETIFF`).
pub fn tap_name(fd: BorrowedFd<'_>) -> io::Result<String> {
    // SAFETY: plain old data; all-zero is valid.
    let mut ifr: libc::ifreq = unsafe { std::mem::zeroed() };
    // SAFETY: TUNGETIFF writes one ifreq, which outlives the call.
    let r = unsafe { libc::ioctl(fd.as_raw_fd(), TUNGETIFF as _, &mut ifr) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(ifr_name(&ifr))
}

/// The TAP's flags (`TUNGETIFF`): `IFF_TAP`, `IFF_VNET_HDR`, `IFF_PERSIST`, ….
fn tun_flags(fd: BorrowedFd<'_>) -> io::Result<libc::c_short> {
    // SAFETY: plain old data; all-zero is valid.
    let mut ifr: libc::ifreq = unsafe { std::mem::zeroed() };
    // SAFETY: TUNGETIFF writes one ifreq, which outlives the call.
    let r = unsafe { libc::ioctl(fd.as_raw_fd(), TUNGETIFF as _, &mut ifr) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel wrote the flags member of the union.
    Ok(unsafe { ifr.ifr_ifru.ifru_flags })
}

/// True when the TAP fd was opened with `IFF_VNET_HDR`.
pub fn has_vnet_hdr(fd: BorrowedFd<'_>) -> io::Result<bool> {
    Ok(tun_flags(fd)? & IFF_VNET_HDR != 0)
}

/// Makes the TAP persistent or not (`TUNSETPERSIST`): a persistent TAP's
/// interface stays when its last descriptor closes.
fn set_persist(fd: BorrowedFd<'_>, on: bool) -> io::Result<()> {
    // SAFETY: TUNSETPERSIST takes its argument by value.
    let r = unsafe { libc::ioctl(fd.as_raw_fd(), TUNSETPERSIST as _, libc::c_ulong::from(on)) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Sets a 10-byte virtio-net header and turns on checksum, TSO4/TSO6 and,
/// where the kernel has them, USO4/USO6 offloads on a TAP opened with
/// `IFF_VNET_HDR`; returns what the port may then be handed.
pub fn enable_offloads(fd: BorrowedFd<'_>) -> io::Result<Offloads> {
    let sz: libc::c_int = VNET_HDR_BYTES as libc::c_int;
    // SAFETY: TUNSETVNETHDRSZ reads one int, which outlives the call.
    if unsafe { libc::ioctl(fd.as_raw_fd(), TUNSETVNETHDRSZ as _, &sz) } < 0 {
        return Err(io::Error::last_os_error());
    }
    let base = TUN_F_CSUM | TUN_F_TSO4 | TUN_F_TSO6 | TUN_F_TSO_ECN;
    let set = |flags: libc::c_uint| {
        // SAFETY: TUNSETOFFLOAD takes the flags by value.
        unsafe { libc::ioctl(fd.as_raw_fd(), TUNSETOFFLOAD as _, flags as libc::c_ulong) }
    };
    if set(base | TUN_F_USO4 | TUN_F_USO6) == 0 {
        return Ok(Offloads::ALL);
    }
    // Kernels before 6.2 know no USO (EINVAL).
    if set(base) < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(Offloads {
        uso: false,
        ..Offloads::ALL
    })
}

/// Sets the TAP's carrier on or off (`TUNSETCARRIER`).
pub fn set_carrier(fd: BorrowedFd<'_>, on: bool) -> io::Result<()> {
    let v: libc::c_int = on.into();
    // SAFETY: TUNSETCARRIER reads one int, which outlives the call.
    let r = unsafe { libc::ioctl(fd.as_raw_fd(), TUNSETCARRIER as _, &v) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Sets interface `name` up (IFF_UP) in the calling thread's namespace.
pub fn set_link_up(name: &str) -> Result<(), TapError> {
    let mut ifr = ifreq_for(name)?;
    let ioctl_err = |op| TapError::Ioctl {
        op,
        name: name.to_owned(),
        source: io::Error::last_os_error(),
    };
    // SAFETY: plain socket(2); the result is checked.
    let s = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if s < 0 {
        return Err(ioctl_err("socket"));
    }
    // SAFETY: `s` is a fresh fd we own.
    let sock = unsafe { OwnedFd::from_raw_fd(s) };
    // SAFETY: SIOCGIFFLAGS fills one ifreq, which outlives the call.
    if unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCGIFFLAGS as _, &mut ifr) } < 0 {
        return Err(ioctl_err("SIOCGIFFLAGS"));
    }
    // SAFETY: the kernel just wrote the flags member of the union.
    let flags = unsafe { ifr.ifr_ifru.ifru_flags };
    ifr.ifr_ifru.ifru_flags = flags | libc::IFF_UP as libc::c_short;
    // SAFETY: SIOCSIFFLAGS reads one ifreq, which outlives the call.
    if unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCSIFFLAGS as _, &ifr) } < 0 {
        return Err(ioctl_err("SIOCSIFFLAGS"));
    }
    Ok(())
}

/// A TAP fd attached to a switch. Dropping it detaches the port, takes
/// the fd off its poller, stops its writer thread and closes the fd.
pub struct TapPort {
    port: Arc<Port>,
    fd: Arc<OwnedFd>,
    poller: TapPoller,
    /// This fd's registration on `poller`.
    token: u64,
    write_errors: Arc<AtomicU64>,
    writer: Option<JoinHandle<()>>,
    /// The TAP's interface, waited for when the port goes (see
    /// `tap/vanish.rs`); `None` where the kernel cannot name it (Linux <
    /// 5.2). Declared after `fd`: fields drop in declaration order, so the
    /// wait starts once our descriptor is closed.
    vanishing: Option<VanishingInterface>,
}

impl std::fmt::Debug for TapPort {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TapPort").field("port", &self.port).finish()
    }
}

impl TapPort {
    /// Attaches `fd` (a TAP opened with IFF_TAP|IFF_NO_PI, anywhere) to
    /// `switch` as port `name` with `mac`, read by a poller thread of its
    /// own. The fd is made non-blocking.
    pub fn attach(
        switch: &Switch,
        name: &str,
        mac: MacAddr,
        fd: OwnedFd,
    ) -> Result<TapPort, TapError> {
        let poller = TapPoller::new(name).map_err(TapError::Spawn)?;
        TapPort::attach_on(&poller, switch, name, mac, fd)
    }

    /// As [`TapPort::attach`], read by `poller` together with the other
    /// TAPs on it (one poller per bridge: see [`TapPoller`] for why).
    pub fn attach_on(
        poller: &TapPoller,
        switch: &Switch,
        name: &str,
        mac: MacAddr,
        fd: OwnedFd,
    ) -> Result<TapPort, TapError> {
        // SAFETY: F_GETFL/F_SETFL on an fd we own.
        unsafe {
            let fl = libc::fcntl(fd.as_raw_fd(), libc::F_GETFL);
            if fl >= 0 {
                libc::fcntl(fd.as_raw_fd(), libc::F_SETFL, fl | libc::O_NONBLOCK);
            }
        }
        let port = Arc::new(switch.attach(name, mac).map_err(TapError::Attach)?);
        let vnet = has_vnet_hdr(fd.as_fd()).unwrap_or(false);
        if vnet {
            let offloads = enable_offloads(fd.as_fd()).map_err(|source| TapError::Ioctl {
                op: "TUNSETOFFLOAD",
                name: name.to_owned(),
                source,
            })?;
            port.set_offloads(offloads);
        }
        let fd = Arc::new(fd);
        let write_errors = Arc::new(AtomicU64::new(0));
        {
            let fd = Arc::clone(&fd);
            port.set_link_watcher(Some(Arc::new(move |up| {
                // Kernels without TUNSETCARRIER (< 4.9) keep the carrier on;
                // frames are still dropped by the switch.
                let _ = set_carrier(fd.as_fd(), up);
            })));
        }
        let _ = set_carrier(fd.as_fd(), true);
        {
            let (fd, errs) = (Arc::clone(&fd), Arc::clone(&write_errors));
            port.set_direct_writer(Some(Arc::new(move |hdr, frame| {
                write_one(fd.as_fd(), vnet, hdr, frame, &errs) != Written::WouldBlock
            })));
        }
        let writer = {
            let (port, fd, errs) = (
                Arc::clone(&port),
                Arc::clone(&fd),
                Arc::clone(&write_errors),
            );
            std::thread::Builder::new()
                .name(format!("tap-tx-{name}"))
                .spawn(move || writer_loop(&port, fd.as_fd(), &errs, vnet))
                .map_err(TapError::Spawn)?
        };
        let token = poller.add(Arc::clone(&port), Arc::clone(&fd), vnet);
        let vanishing = crate::KernelNic::of_tap(fd.as_fd(), mac)
            .ok()
            .map(VanishingInterface::new);
        Ok(TapPort {
            port,
            fd,
            poller: poller.clone(),
            token,
            write_errors,
            writer: Some(writer),
            vanishing,
        })
    }

    /// The switch port (counters, link state).
    pub fn port(&self) -> &Port {
        &self.port
    }

    /// Lets the kernel forward this port's plain directions to the other
    /// ports of its switch that did the same (see [`crate::kernel_path`]):
    /// for a TAP whose interface is a sandbox's NIC, not for the uplink
    /// (whose frames must reach the host's NAT through us). Errors when
    /// the TAP's namespace or name cannot be read (not root, Linux < 5.2);
    /// the port then stays on the switch.
    pub fn offer_kernel_path(&self) -> Result<(), crate::KernelPathError> {
        let nic = crate::KernelNic::of_tap(self.fd.as_fd(), self.port.mac())?;
        // The TAP's clsact qdisc, which every wire's redirect filter hangs
        // on, is added now, before the guest sends: a wire is built later,
        // lazily, while traffic flows, and changing a live interface's
        // qdiscs then can lose a frame before it reaches the switch (a loss
        // no seed accounts for).
        nic.prepare_for_wires()?;
        self.port.set_kernel_nic(nic);
        Ok(())
    }

    /// The TAP fd.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// Frames the kernel refused on write (interface down, queue full).
    pub fn write_errors(&self) -> u64 {
        self.write_errors.load(Ordering::Relaxed)
    }
}

impl TapPort {
    /// Lets the port go, as a drop does, but leaves its interface where it
    /// is, without carrier and with no reader: the TAP is made persistent,
    /// so closing our descriptor does not unregister it. Why: a closing
    /// bridge lets go of every member at once, and each TAP's own
    /// unregistration waits for RCU under the kernel's rtnl lock (1.6 s
    /// for 100 from one thread, 0.2 s from 24, on the 2-vCPU development
    /// machine), while a parked one goes with its sandbox's network
    /// namespace, which the kernel takes down together with every other
    /// namespace dying then, in one batch (100 parked TAPs' closes: 1 ms).
    /// The interface is then what a VM's NIC is once its host side is gone:
    /// there, link down, until the sandbox ends or [`Tap::open`] takes its
    /// name again (which replaces it with a fresh one). Where the TAP
    /// cannot be made persistent, this is a drop: the interface goes now.
    pub fn park(mut self) {
        if set_persist(self.fd.as_fd(), true).is_ok() {
            let _ = set_carrier(self.fd.as_fd(), false);
            // Nothing to wait for: the interface stays by design.
            if let Some(v) = self.vanishing.as_mut() {
                v.disarm();
            }
        }
    }
}

impl Drop for TapPort {
    fn drop(&mut self) {
        // Detaching closes the receive queue, which ends the writer.
        self.port.detach();
        self.poller.remove(self.token);
        if let Some(t) = self.writer.take() {
            let _ = t.join();
        }
        // Then the fields drop: our descriptor closes, and `vanishing`
        // waits until the interface is gone.
    }
}

/// One readv into a header and a frame buffer; the frame's length, `None`
/// when drained (or on an error poll will report).
fn read_one(
    fd: BorrowedFd<'_>,
    vnet: bool,
    hdr: &mut [u8; VNET_HDR_BYTES],
    buf: &mut [u8],
) -> Option<usize> {
    let mut iov = [
        libc::iovec {
            iov_base: hdr.as_mut_ptr().cast(),
            iov_len: hdr.len(),
        },
        libc::iovec {
            iov_base: buf.as_mut_ptr().cast(),
            iov_len: buf.len(),
        },
    ];
    let (iov, skip) = if vnet {
        (&mut iov[..], VNET_HDR_BYTES)
    } else {
        (&mut iov[1..], 0)
    };
    loop {
        // SAFETY: readv into our buffers, each at most its length.
        let n = unsafe { libc::readv(fd.as_raw_fd(), iov.as_ptr(), iov.len() as libc::c_int) };
        if n < 0 {
            if io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {
                continue;
            }
            // WouldBlock: drained; anything else: wait for poll.
            return None;
        }
        let n = usize::try_from(n).unwrap_or(0);
        // A read shorter than the header carries no frame: skip it.
        return if n == 0 {
            None
        } else {
            Some(n.saturating_sub(skip))
        };
    }
}

/// What became of one write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Written {
    /// Written, or refused for good (counted in `errors`).
    Done,
    /// EAGAIN: the fd is non-blocking and its queue is full.
    WouldBlock,
}

/// One writev of a header and a frame, never blocking.
fn write_one(
    fd: BorrowedFd<'_>,
    vnet: bool,
    hdr: &VnetHdr,
    frame: &[u8],
    errors: &AtomicU64,
) -> Written {
    let h = hdr.to_bytes();
    let iov = [
        libc::iovec {
            iov_base: h.as_ptr() as *mut libc::c_void,
            iov_len: h.len(),
        },
        libc::iovec {
            iov_base: frame.as_ptr() as *mut libc::c_void,
            iov_len: frame.len(),
        },
    ];
    let iov = if vnet { &iov[..] } else { &iov[1..] };
    loop {
        // SAFETY: writev from our buffers, each at most its length; the
        // kernel does not write through iov_base.
        let n = unsafe { libc::writev(fd.as_raw_fd(), iov.as_ptr(), iov.len() as libc::c_int) };
        if n >= 0 {
            return Written::Done;
        }
        match io::Error::last_os_error().kind() {
            io::ErrorKind::Interrupted => continue,
            io::ErrorKind::WouldBlock => return Written::WouldBlock,
            _ => {
                errors.fetch_add(1, Ordering::Relaxed);
                return Written::Done;
            }
        }
    }
}

fn writer_loop(port: &Port, fd: BorrowedFd<'_>, errors: &AtomicU64, vnet: bool) {
    // Wait for one frame, then write everything queued before waiting
    // again; the last, empty pop hands the fd back to the direct path. A
    // full TAP queue (EAGAIN) drops the frame, as the kernel would.
    while let Some((hdr, frame)) = port.recv_offload() {
        if write_one(fd, vnet, &hdr, &frame, errors) == Written::WouldBlock {
            errors.fetch_add(1, Ordering::Relaxed);
        }
        port.recycle(frame);
        while let Some((hdr, frame)) = port.try_recv_or_idle() {
            if write_one(fd, vnet, &hdr, &frame, errors) == Written::WouldBlock {
                errors.fetch_add(1, Ordering::Relaxed);
            }
            port.recycle(frame);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_checked() {
        assert!(matches!(ifreq_for(""), Err(TapError::BadName(_))));
        assert!(matches!(ifreq_for("a/b"), Err(TapError::BadName(_))));
        assert!(matches!(
            ifreq_for("sixteen-bytes-xx"),
            Err(TapError::BadName(_))
        ));
        let ifr = ifreq_for("tap0").unwrap();
        assert_eq!(ifr_name(&ifr), "tap0");
    }

    #[test]
    fn ioctl_numbers_match_linux() {
        // _IOW('T', n, int) = 1<<30 | 4<<16 | 'T'<<8 | n; _IOR sets bit 31.
        let iow = |n: libc::c_ulong| (1 << 30) | (4 << 16) | (0x54 << 8) | n;
        assert_eq!(TUNSETIFF, iow(202));
        assert_eq!(TUNSETCARRIER, iow(226));
        assert_eq!(TUNSETPERSIST, iow(203));
        assert_eq!(TUNSETOFFLOAD, iow(208));
        assert_eq!(TUNSETVNETHDRSZ, iow(216));
        assert_eq!(TUNGETIFF, (2 << 30) | (4 << 16) | (0x54 << 8) | 210);
    }
}
