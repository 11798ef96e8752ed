//! The one rtnetlink request the kernel path sends itself rather than
//! through `tc`: adding a TAP's clsact qdisc when its port is offered.
//!
//! Why not `tc qdisc replace dev TAP clsact`: it runs at every sandbox
//! NIC's attach, and a process per NIC made attaching 100 sandboxes take
//! 1.5 s where the Linux peer's whole setup takes 0.1-0.2 s
//! (docs/benchmarking.md, "Scale"). The request is one fixed message of
//! 48 bytes and its acknowledgement, sent from a thread inside the TAP's
//! namespace ([`crate::netns::run_in`]); everything else the kernel path
//! does stays with `ip` and `tc` batches, whose cost is per namespace
//! touched, not per port.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// From <linux/rtnetlink.h>, <linux/netlink.h> and <linux/pkt_sched.h>.
const RTM_NEWQDISC: u16 = 36;
const NLMSG_ERROR: u16 = 2;
const NLM_F_REQUEST: u16 = 0x1;
const NLM_F_ACK: u16 = 0x4;
const NLM_F_REPLACE: u16 = 0x100;
const NLM_F_CREATE: u16 = 0x400;
const TCA_KIND: u16 = 1;
/// `TC_H_CLSACT` (= `TC_H_INGRESS`): the clsact qdisc's parent.
const TC_H_CLSACT: u32 = 0xFFFF_FFF1;
/// `TC_H_MAKE(TC_H_CLSACT, 0)`: its handle, as `tc` sends it.
const CLSACT_HANDLE: u32 = 0xFFFF_0000;

/// `struct nlmsghdr` (16 bytes) + `struct tcmsg` (20) + a `TCA_KIND`
/// attribute holding "clsact\0" (4 + 7, padded to 12).
const REQUEST_BYTES: usize = 48;

/// The request `tc qdisc replace dev <ifindex> clsact` sends.
fn clsact_request(ifindex: u32, seq: u32) -> [u8; REQUEST_BYTES] {
    let mut m = [0u8; REQUEST_BYTES];
    // nlmsghdr: length, type, flags, sequence, port id (0: the kernel).
    m[0..4].copy_from_slice(&(REQUEST_BYTES as u32).to_ne_bytes());
    m[4..6].copy_from_slice(&RTM_NEWQDISC.to_ne_bytes());
    let flags = NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_REPLACE;
    m[6..8].copy_from_slice(&flags.to_ne_bytes());
    m[8..12].copy_from_slice(&seq.to_ne_bytes());
    // tcmsg: family AF_UNSPEC and padding (zero), ifindex, handle, parent,
    // info (zero).
    m[20..24].copy_from_slice(&ifindex.to_ne_bytes());
    m[24..28].copy_from_slice(&CLSACT_HANDLE.to_ne_bytes());
    m[28..32].copy_from_slice(&TC_H_CLSACT.to_ne_bytes());
    // rtattr: length (header + "clsact\0"), type, then the kind.
    m[36..38].copy_from_slice(&11u16.to_ne_bytes());
    m[38..40].copy_from_slice(&TCA_KIND.to_ne_bytes());
    m[40..46].copy_from_slice(b"clsact");
    m
}

/// The errno of the acknowledgement in `reply` for request `seq`: `Ok(())`
/// for 0, the error otherwise, or one saying the reply is not an answer.
fn read_ack(reply: &[u8], seq: u32) -> io::Result<()> {
    let u16_at = |at: usize| {
        reply
            .get(at..at + 2)
            .map(|b| u16::from_ne_bytes([b[0], b[1]]))
    };
    let u32_at = |at: usize| {
        reply
            .get(at..at + 4)
            .map(|b| u32::from_ne_bytes([b[0], b[1], b[2], b[3]]))
    };
    let not_ack = || io::Error::new(io::ErrorKind::InvalidData, "rtnetlink: no acknowledgement");
    if u16_at(4) != Some(NLMSG_ERROR) || u32_at(8) != Some(seq) {
        return Err(not_ack());
    }
    // struct nlmsgerr: a negative errno, then the request's header.
    let errno = u32_at(16).ok_or_else(not_ack)? as i32;
    if errno == 0 {
        Ok(())
    } else {
        Err(io::Error::from_raw_os_error(-errno))
    }
}

/// Adds (or keeps) the clsact qdisc on interface `ifname` of the calling
/// thread's network namespace, as `tc qdisc replace dev IFNAME clsact`.
pub(crate) fn replace_clsact(ifname: &str) -> io::Result<()> {
    let name = CString::new(ifname).map_err(io::Error::other)?;
    // SAFETY: `name` is a NUL-terminated string.
    let ifindex = unsafe { libc::if_nametoindex(name.as_ptr()) };
    if ifindex == 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: plain socket(2); the result is checked and owned below.
    let raw = unsafe {
        libc::socket(
            libc::AF_NETLINK,
            libc::SOCK_RAW | libc::SOCK_CLOEXEC,
            libc::NETLINK_ROUTE,
        )
    };
    if raw < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor nothing else owns.
    let sock = unsafe { OwnedFd::from_raw_fd(raw) };
    let seq = 1;
    let req = clsact_request(ifindex, seq);
    // SAFETY: zeroed sockaddr_nl is the kernel's address (pid 0, no groups).
    let mut kernel: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
    kernel.nl_family = libc::AF_NETLINK as u16;
    // SAFETY: sends `req` to the kernel's address, both valid for the call.
    let sent = unsafe {
        libc::sendto(
            sock.as_raw_fd(),
            req.as_ptr().cast(),
            req.len(),
            0,
            (&raw const kernel).cast(),
            std::mem::size_of::<libc::sockaddr_nl>() as u32,
        )
    };
    if sent < 0 {
        return Err(io::Error::last_os_error());
    }
    // An error acknowledgement carries the request back: room for both.
    let mut reply = [0u8; 256];
    // SAFETY: receives into `reply`, valid for its length.
    let got = unsafe { libc::recv(sock.as_raw_fd(), reply.as_mut_ptr().cast(), reply.len(), 0) };
    if got < 0 {
        return Err(io::Error::last_os_error());
    }
    read_ack(&reply[..got as usize], seq)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_request_is_what_tc_sends_for_clsact() {
        let m = clsact_request(7, 9);
        assert_eq!(u32::from_ne_bytes(m[0..4].try_into().unwrap()), 48);
        assert_eq!(u16::from_ne_bytes(m[4..6].try_into().unwrap()), 36);
        assert_eq!(u16::from_ne_bytes(m[6..8].try_into().unwrap()), 0x505);
        assert_eq!(u32::from_ne_bytes(m[8..12].try_into().unwrap()), 9);
        assert_eq!(i32::from_ne_bytes(m[20..24].try_into().unwrap()), 7);
        assert_eq!(&m[40..47], b"clsact\0");
    }

    #[test]
    fn acknowledgements_are_read_with_their_errno() {
        let mut ack = [0u8; 36];
        ack[4..6].copy_from_slice(&NLMSG_ERROR.to_ne_bytes());
        ack[8..12].copy_from_slice(&5u32.to_ne_bytes());
        assert!(read_ack(&ack, 5).is_ok());
        assert_eq!(
            read_ack(&ack, 6).unwrap_err().kind(),
            io::ErrorKind::InvalidData
        );
        ack[16..20].copy_from_slice(&(-libc::ENODEV).to_ne_bytes());
        assert_eq!(
            read_ack(&ack, 5).unwrap_err().raw_os_error(),
            Some(libc::ENODEV)
        );
        assert!(read_ack(&ack[..12], 5).is_err());
    }
}
