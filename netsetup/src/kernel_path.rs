//! The kernel path: unimpaired traffic between two TAP NICs forwarded by
//! the kernel, in the sender's own context, without passing our switch.
//!
//! Why: a frame through the userspace switch is read from one TAP and
//! written into the other by our poller thread: two copies and a thread
//! wake-up per batch, and a third busy thread beside the two endpoints.
//! That costs the throughput and round-trip time a Linux bridge does not
//! pay (docs/networking.md, "Numbers"). For a direction with nothing to
//! impose (no impairment, partition, isolation, capture, link down) the
//! switch has nothing to do but forward, so the kernel does it.
//!
//! How, for a pair of TAPs `A` and `B` (each in its own network namespace):
//!
//! - one veth pair, the *wire*, with its `a` end in A's namespace and its
//!   `b` end in B's. Each end carries the MAC of the TAP beside it, so a
//!   frame for that TAP arrives as `PACKET_HOST`; it has no addresses, no
//!   IPv6 address generation and no ARP, so the kernel sends nothing on it;
//! - on each wire end, a tc ingress filter that redirects every frame into
//!   its TAP's ingress: the stack sees it arrive on the TAP, as from us;
//! - per enabled direction A -> B, a tc egress filter on A's TAP matching
//!   B's MAC as destination, whose action (a `mirred` egress redirect to
//!   the wire's `a` end) is created standalone with its own index, once
//!   per wire. Disabling deletes only the filter; the action, and so its
//!   count of everything the direction ever forwarded, lives as long as
//!   the wire, and enabling again binds the same action. (Deleting the
//!   action right after its filter fails anyway: the filter lets go of it
//!   only after an RCU grace period.)
//!
//! Frames to other destinations (broadcast, other ports, a MAC the guest
//! changed to) match no filter and reach our switch as before. Everything
//! here (a port's clsact, building a wire, enabling and disabling a
//! direction, counts, taking wires down) is an rtnetlink request of our
//! own ([`crate::rtnl`]) sent from a socket opened inside the namespace it
//! acts on; no `ip` or `tc` process runs. The switch decides which
//! directions are enabled (see [`Switch`](crate::Switch)).

use std::collections::HashMap;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use crate::mac::MacAddr;
use crate::rtnl::{ActionCount, Rtnl};

/// `TUNGETDEVNETNS` (`_IO('T', 227)`, Linux 5.2): an fd of the namespace
/// a TAP's interface lives in.
const TUNGETDEVNETNS: libc::c_ulong = 0x54e3;
/// `TUNGETIFF` (`_IOR('T', 210, unsigned int)`): the interface's name.
const TUNGETIFF: libc::c_ulong = 0x8004_54d2;

/// Why a kernel path could not be set up or changed.
#[derive(Debug, thiserror::Error)]
pub enum KernelPathError {
    /// An ioctl on the TAP fd failed.
    #[error("{op} on the TAP fd")]
    Ioctl {
        /// The ioctl.
        op: &'static str,
        /// The errno.
        #[source]
        source: io::Error,
    },
    /// An rtnetlink request of ours failed.
    #[error("cannot {request} (rtnetlink)")]
    Rtnetlink {
        /// What it asked.
        request: String,
        /// The kernel's answer, or why it could not be asked.
        #[source]
        source: io::Error,
    },
}

/// A TAP NIC as the kernel path needs it: its namespace, name and MAC.
#[derive(Clone, Debug)]
pub struct KernelNic {
    netns: Arc<OwnedFd>,
    /// The namespace's identity (device and inode of its nsfs file): NICs
    /// with equal ids share one batch of commands.
    ns_id: (u64, u64),
    ifname: String,
    mac: MacAddr,
}

impl KernelNic {
    /// The NIC behind TAP `fd` (root; Linux 5.2 or later), with `mac` the
    /// MAC its guest uses (the port's).
    pub fn of_tap(fd: BorrowedFd<'_>, mac: MacAddr) -> Result<KernelNic, KernelPathError> {
        // SAFETY: TUNGETDEVNETNS takes no argument and returns a new fd.
        let ns = unsafe { libc::ioctl(fd.as_raw_fd(), TUNGETDEVNETNS as _) };
        if ns < 0 {
            return Err(KernelPathError::Ioctl {
                op: "TUNGETDEVNETNS",
                source: io::Error::last_os_error(),
            });
        }
        // SAFETY: the kernel just gave us this fd; nothing else owns it.
        let netns = Arc::new(unsafe { OwnedFd::from_raw_fd(ns) });
        // SAFETY: `struct stat` is plain data; all zeroes is a valid value.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: fstat writes a `struct stat` into `st`.
        if unsafe { libc::fstat(netns.as_raw_fd(), &mut st) } != 0 {
            return Err(KernelPathError::Ioctl {
                op: "fstat of the namespace",
                source: io::Error::last_os_error(),
            });
        }
        let mut ifr = [0u8; 40];
        // SAFETY: TUNGETIFF writes a `struct ifreq` (40 bytes) into `ifr`.
        if unsafe { libc::ioctl(fd.as_raw_fd(), TUNGETIFF as _, ifr.as_mut_ptr()) } < 0 {
            return Err(KernelPathError::Ioctl {
                op: "TUNGETIFF",
                source: io::Error::last_os_error(),
            });
        }
        let len = ifr[..16].iter().position(|b| *b == 0).unwrap_or(16);
        Ok(KernelNic {
            netns,
            ns_id: (st.st_dev, st.st_ino),
            ifname: String::from_utf8_lossy(&ifr[..len]).into_owned(),
            mac,
        })
    }

    /// Adds the clsact qdisc that wires' egress filters hang on
    /// (idempotent), with one rtnetlink request from inside the namespace
    /// rather than a `tc` process (`rtnl.rs` says why).
    pub(crate) fn prepare_for_wires(&self) -> Result<(), KernelPathError> {
        let failed = |source| KernelPathError::Rtnetlink {
            request: format!("add the clsact qdisc of {}", self.ifname),
            source,
        };
        let mut rtnl = Rtnl::open_in(self.netns()).map_err(failed)?;
        rtnl.ifindex(&self.ifname)
            .and_then(|tap| rtnl.replace_clsact(tap))
            .map_err(failed)
    }

    /// Whether `other` is this NIC (its namespace and name).
    pub(crate) fn same(&self, other: &KernelNic) -> bool {
        self.ns_id == other.ns_id && self.ifname == other.ifname
    }

    /// The interface name inside its namespace.
    pub fn ifname(&self) -> &str {
        &self.ifname
    }

    /// The network namespace the interface lives in.
    pub(crate) fn netns(&self) -> BorrowedFd<'_> {
        self.netns.as_fd()
    }
}

/// Frames and bytes the kernel forwarded in one direction. A GSO frame
/// counts as the wire packets it stands for, and its bytes as theirs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WireCount {
    /// Wire packets.
    pub packets: u64,
    /// Their bytes, Ethernet headers included.
    pub bytes: u64,
}

impl From<ActionCount> for WireCount {
    /// A direction's count is its redirect action's.
    fn from(c: ActionCount) -> WireCount {
        WireCount {
            packets: c.packets,
            bytes: c.bytes,
        }
    }
}

/// Whether `ifname` is an end of a kernel path's wire (`pvk` and nine
/// more characters: eight hex digits and the side): the host's plumbing
/// inside a sandbox, not one of its interfaces, so a snapshot of the
/// sandbox's network leaves it out.
pub fn is_wire_end(ifname: &str) -> bool {
    let Some(rest) = ifname.strip_prefix("pvk") else {
        return false;
    };
    rest.len() == 9
        && rest[..8].bytes().all(|b| b.is_ascii_hexdigit())
        && matches!(&rest[8..], "a" | "b")
}

/// Where [`Wire`]s get their numbers. The number names the veth ends
/// (unique in each namespace, whatever bridge made them), the filter
/// preference on the TAPs and the action indices. Clones share one
/// counter: switches whose kernel NICs may share a network namespace (a
/// sandbox on two bridges) must share one ([`SwitchConfig::wire_numbers`];
/// the harness gives every bridge of a test file the file's). No
/// process-wide counter: each run context passes its own (STYLE.md §5).
///
/// [`SwitchConfig::wire_numbers`]: crate::SwitchConfig::wire_numbers
#[derive(Clone, Debug, Default)]
pub struct WireNumbers(Arc<AtomicU32>);

impl WireNumbers {
    /// The next wire's number.
    fn next(&self) -> u32 {
        self.0.fetch_add(1, Ordering::Relaxed)
    }
}

/// One direction of a [`Wire`]: from the TAP at one end to the other.
#[derive(Debug)]
struct Direction {
    enabled: bool,
    /// The action exists (from the first enable to the wire's drop).
    created: bool,
    action_index: u32,
}

/// The veth pair between two TAP NICs and the filters on it (see the
/// module docs). Dropping it disables both directions and deletes it.
#[derive(Debug)]
pub struct Wire {
    nics: [KernelNic; 2],
    /// From [`WireNumbers`]: names the ends, and the device group they are
    /// deleted in.
    number: u32,
    ends: [String; 2],
    pref: u32,
    dirs: [Direction; 2],
    /// [`Wire::take_down`] removed it: dropping it runs nothing.
    down: bool,
}

impl Wire {
    /// Builds the wire between `a` and `b`; both directions start
    /// disabled. On an error nothing is left behind.
    pub fn create(
        a: &KernelNic,
        b: &KernelNic,
        numbers: &WireNumbers,
    ) -> Result<Wire, KernelPathError> {
        let n = numbers.next();
        let wire = Wire {
            nics: [a.clone(), b.clone()],
            number: n,
            ends: [format!("pvk{n:08x}a"), format!("pvk{n:08x}b")],
            // tc preferences are 16-bit and 0 means "any".
            pref: n % 0xfff0 + 1,
            dirs: [0, 1].map(|d| Direction {
                enabled: false,
                created: false,
                // Clear of the small indices `tc` picks for actions of its own.
                action_index: 0x4000_0000 | (n.wrapping_mul(2) + d) & 0x3fff_ffff,
            }),
            down: false,
        };
        // Dropped on an error below: deletes the veth (and its filters).
        let [end_a, end_b] = &wire.ends;
        let failed = |source| KernelPathError::Rtnetlink {
            request: format!(
                "build the kernel path between {} and {} ({end_a}, {end_b})",
                a.ifname, b.ifname
            ),
            source,
        };
        let mut rtnl_a = Rtnl::open_in(a.netns()).map_err(failed)?;
        let mut rtnl_b = Rtnl::open_in(b.netns()).map_err(failed)?;
        rtnl_a
            .add_veth((end_a, a.mac.0), (end_b, b.mac.0), b.netns())
            .map_err(failed)?;
        // Each end: up without ARP or an IPv6 address to speak from, and
        // everything it receives handed to its TAP's ingress, so that it
        // reaches the sandbox as if the TAP had received it. The TAPs'
        // clsact is there from the port's attach
        // (`KernelNic::prepare_for_wires`): a live TAP's qdiscs are not
        // touched here.
        for (rtnl, nic, end) in [(&mut rtnl_a, a, end_a), (&mut rtnl_b, b, end_b)] {
            let ready = (|| {
                rtnl.set_up_silent(end)?;
                let (end, tap) = (rtnl.ifindex(end)?, rtnl.ifindex(&nic.ifname)?);
                rtnl.replace_clsact(end)?;
                rtnl.add_ingress_redirect(end, tap)
            })();
            ready.map_err(failed)?;
        }
        Ok(wire)
    }

    /// Whether the direction from side `from` (0 for `a`, 1 for `b`) is
    /// forwarded by the kernel.
    pub fn is_enabled(&self, from: usize) -> bool {
        self.dirs[from].enabled
    }

    /// Forwards frames from side `from` to the other side's MAC in the
    /// kernel from now on.
    pub fn enable(&mut self, from: usize) -> Result<(), KernelPathError> {
        if self.dirs[from].enabled {
            return Ok(());
        }
        let (nic, to) = (&self.nics[from], &self.nics[1 - from]);
        let (end, index) = (&self.ends[from], self.dirs[from].action_index);
        let failed = |source| KernelPathError::Rtnetlink {
            request: format!("redirect {}'s frames to {} into {end}", nic.ifname, to.mac),
            source,
        };
        let mut rtnl = Rtnl::open_in(nic.netns()).map_err(failed)?;
        if !self.dirs[from].created {
            let end_index = rtnl.ifindex(end).map_err(failed)?;
            match rtnl.add_redirect_action(index, end_index) {
                // EEXIST: an earlier enable made it and then failed on its
                // filter.
                Err(e) if e.raw_os_error() != Some(libc::EEXIST) => return Err(failed(e)),
                _ => self.dirs[from].created = true,
            }
        }
        let tap = rtnl.ifindex(&nic.ifname).map_err(failed)?;
        rtnl.add_egress_filter(tap, self.pref as u16, to.mac.0, index)
            .map_err(failed)?;
        self.dirs[from].enabled = true;
        Ok(())
    }

    /// What the kernel forwarded from side `from` over this wire's life,
    /// enabled or not now.
    pub fn count(&self, from: usize) -> Result<WireCount, KernelPathError> {
        let dir = &self.dirs[from];
        if !dir.created {
            return Ok(WireCount::default());
        }
        Rtnl::open_in(self.nics[from].netns())
            .and_then(|mut r| r.action_count(dir.action_index))
            .map(WireCount::from)
            .map_err(|source| KernelPathError::Rtnetlink {
                request: format!("read the count of mirred action {}", dir.action_index),
                source,
            })
    }

    /// Stops forwarding side `from`'s frames in the kernel: when this
    /// returns, the next frame goes to the switch. Its count stays.
    pub fn disable(&mut self, from: usize) -> Result<(), KernelPathError> {
        if !self.dirs[from].enabled {
            return Ok(());
        }
        let nic = &self.nics[from];
        let pref = self.pref as u16;
        let deleted = Rtnl::open_in(nic.netns()).and_then(|mut rtnl| {
            let tap = rtnl.ifindex(&nic.ifname)?;
            rtnl.del_egress_filter(tap, pref)
        });
        match deleted {
            // No filter (ENOENT) or no TAP (ENODEV): nothing redirects.
            Err(e) if !matches!(e.raw_os_error(), Some(libc::ENOENT | libc::ENODEV)) => {
                // The filter must go, whatever else it takes: without the
                // TAP's clsact no filter is left on it. Other wires'
                // directions from this TAP then go through the switch
                // (always correct) while their actions, and so their
                // counts, stay.
                Rtnl::open_in(nic.netns())
                    .and_then(|mut rtnl| {
                        let tap = rtnl.ifindex(&nic.ifname)?;
                        rtnl.del_clsact(tap)
                    })
                    .map_err(|_| KernelPathError::Rtnetlink {
                        request: format!("delete {}'s egress filter {pref}", nic.ifname),
                        source: e,
                    })?;
            }
            _ => {}
        }
        self.dirs[from].enabled = false;
        Ok(())
    }
}

impl Drop for Wire {
    fn drop(&mut self) {
        if !self.down {
            Wire::take_down_all(std::slice::from_mut(self));
        }
    }
}

/// The device groups wire ends are deleted in ([`Wire::delete_links`]):
/// this bit set, and the first wire's number below it. Clear of group 0,
/// where every interface starts, and of the small numbers `ip` users pick.
const WIRE_GROUPS: u32 = 0x4000_0000;

/// One rtnetlink socket per network namespace a take-down or a count
/// touches, opened on first use ([`Rtnl::open_in`]), and the TAP indices
/// looked up through them. A namespace whose socket cannot be opened (it is
/// gone with its sandbox, or the thread could not enter it) has nothing
/// left to delete or count: its requests fail and are skipped.
#[derive(Default)]
struct Sockets {
    open: HashMap<(u64, u64), Option<Rtnl>>,
    ifindices: HashMap<((u64, u64), String), u32>,
}

impl Sockets {
    /// Runs `f` with `nic`'s namespace's socket; an error when it has
    /// none.
    fn with<T>(
        &mut self,
        nic: &KernelNic,
        f: impl FnOnce(&mut Rtnl) -> io::Result<T>,
    ) -> io::Result<T> {
        let socket = self
            .open
            .entry(nic.ns_id)
            .or_insert_with(|| Rtnl::open_in(nic.netns()).ok());
        match socket {
            Some(rtnl) => f(rtnl),
            None => Err(io::Error::other("no rtnetlink socket in the namespace")),
        }
    }

    /// The index of `nic`'s TAP.
    fn ifindex(&mut self, nic: &KernelNic) -> io::Result<u32> {
        let key = (nic.ns_id, nic.ifname.clone());
        if let Some(index) = self.ifindices.get(&key) {
            return Ok(*index);
        }
        let index = self.with(nic, |r| r.ifindex(&nic.ifname))?;
        self.ifindices.insert(key, index);
        Ok(index)
    }
}

impl Wire {
    /// What `wires` forwarded over their lives, per side as in
    /// [`Wire::count`]: one rtnetlink request per action, a socket per
    /// namespace touched. A count that cannot be read is zero.
    pub fn counts(wires: &[&Wire]) -> Vec<[WireCount; 2]> {
        let mut sockets = Sockets::default();
        wires.iter().map(|w| w.read_counts(&mut sockets)).collect()
    }

    /// This wire's counts per side, through `sockets`; zero where a
    /// direction's action was never created or cannot be read.
    fn read_counts(&self, sockets: &mut Sockets) -> [WireCount; 2] {
        [0, 1].map(|d| {
            let dir = &self.dirs[d];
            if !dir.created {
                return WireCount::default();
            }
            sockets
                .with(&self.nics[d], |r| r.action_count(dir.action_index))
                .map(WireCount::from)
                .unwrap_or_default()
        })
    }

    /// Removes `wires` and returns what each forwarded over its life (as
    /// [`Wire::counts`]), with rtnetlink requests from this thread rather
    /// than `ip` and `tc` processes (`rtnl.rs` says why). First every
    /// enabled direction's egress filter goes (so each direction is the
    /// switch's again when this returns) and the counts are read after it,
    /// so they include every frame the filters redirected; then the veth
    /// pairs (their ends' qdiscs and filters go with them); then the
    /// actions.
    pub fn take_down(mut wires: Vec<Wire>) -> Vec<[WireCount; 2]> {
        Wire::take_down_all(&mut wires)
    }

    fn take_down_all(wires: &mut [Wire]) -> Vec<[WireCount; 2]> {
        let mut sockets = Sockets::default();
        for w in wires.iter_mut() {
            for from in 0..2 {
                if w.dirs[from].enabled {
                    w.remove_filter(from, &mut sockets);
                }
            }
        }
        let counts = wires.iter().map(|w| w.read_counts(&mut sockets)).collect();
        Wire::delete_links(wires, &mut sockets);
        // A filter lets go of its action only after an RCU grace period:
        // an action still bound when its delete comes is deleted again a
        // little later.
        let mut left: Vec<(&KernelNic, u32)> = wires
            .iter()
            .flat_map(|w| w.nics.iter().zip(&w.dirs))
            .filter(|(_, dir)| dir.created)
            .map(|(nic, dir)| (nic, dir.action_index))
            .collect();
        for pause_ms in [5, 20, 100, 0] {
            left.retain(|(nic, index)| {
                match sockets.with(nic, |r| r.del_action(*index)) {
                    Ok(()) => false,
                    // Gone already, or its namespace with it.
                    Err(e) => {
                        e.raw_os_error() != Some(libc::ENOENT)
                            && sockets.open.get(&nic.ns_id).is_some_and(Option::is_some)
                    }
                }
            });
            if left.is_empty() || pause_ms == 0 {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(pause_ms));
        }
        for w in wires.iter_mut() {
            w.down = true;
        }
        counts
    }

    /// Deletes the veth pairs of `wires`. In each namespace holding more
    /// than one `a` end, the ends are put in a device group of this
    /// take-down's own and deleted as one group: the kernel then waits one
    /// RCU grace period for all of them instead of one each (`rtnl.rs`,
    /// [`Rtnl::del_group`]), which is most of a bridge's close where one
    /// member talks with all the others. The group is named after the
    /// first wire's number, unique in the run: no other take-down's ends
    /// share it. An end the group missed goes alone.
    fn delete_links(wires: &[Wire], sockets: &mut Sockets) {
        let mut by_namespace: HashMap<(u64, u64), Vec<&Wire>> = HashMap::new();
        for w in wires {
            by_namespace.entry(w.nics[0].ns_id).or_default().push(w);
        }
        for group in by_namespace.values() {
            let nic = &group[0].nics[0];
            if group.len() > 1 {
                let id = WIRE_GROUPS | group[0].number & !WIRE_GROUPS;
                let grouped = sockets.with(nic, |r| {
                    for w in group {
                        r.set_group(&w.ends[0], id)?;
                    }
                    r.del_group(id)
                });
                if grouped.is_ok() {
                    continue;
                }
            }
            for w in group {
                let _ = sockets.with(nic, |r| r.del_link(&w.ends[0]));
            }
        }
    }

    /// Deletes side `from`'s egress filter through `sockets`; when that
    /// fails with the filter maybe still there, the one-by-one way, which
    /// takes the TAP's clsact away if it must ([`Wire::disable`]).
    fn remove_filter(&mut self, from: usize, sockets: &mut Sockets) {
        let nic = &self.nics[from];
        let pref = self.pref as u16;
        let removed = sockets
            .ifindex(nic)
            .and_then(|tap| sockets.with(nic, |r| r.del_egress_filter(tap, pref)));
        match removed {
            // No TAP (ENODEV) or no filter (ENOENT): nothing redirects.
            Ok(()) => self.dirs[from].enabled = false,
            Err(e) if matches!(e.raw_os_error(), Some(libc::ENODEV | libc::ENOENT)) => {
                self.dirs[from].enabled = false
            }
            Err(_) => {
                let _ = self.disable(from);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wire_ends_are_told_from_other_interfaces() {
        assert!(is_wire_end("pvk0000001fa"));
        assert!(is_wire_end("pvkdeadbeefb"));
        for other in [
            "eth0",
            "pvk0000001fc",
            "pvk000001fa",
            "pvkxx00001fa",
            "pvup00000000",
        ] {
            assert!(!is_wire_end(other), "{other}");
        }
    }
}
