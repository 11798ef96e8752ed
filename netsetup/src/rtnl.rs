//! The rtnetlink requests the kernel path sends itself rather than through
//! `ip` and `tc` processes: a TAP's clsact qdisc at its port's attach, a
//! wire's veth pair and its ends' redirects when it is built, a
//! direction's redirect action and egress filter when it is enabled, and
//! everything a bridge's close does to its wires (filter deletes, action
//! counts, link and action deletes).
//!
//! Why not `tc` and `ip`: a process is a fork of the whole harness, an
//! exec and iproute2's own start-up, about 1-3 ms here (up to 20 ms under
//! load), against a few microseconds for a netlink round trip. One process
//! per NIC at attach made attaching 100 sandboxes take 1.5 s where the
//! Linux peer's whole setup takes 0.1-0.2 s, three `-batch` processes per
//! namespace at a bridge's close made closing 100 members 8-10x the
//! peer's teardown (docs/benchmarking.md, "Scale"), and the wire builder
//! ran four processes per wire and one per enabled direction, the latter
//! under the switch's control lock.
//!
//! Each request's message is built by a function of its own, which the
//! tests encode and check; root tests have the kernel read back what we
//! made next to the same made by `ip` and `tc`.
//!
//! A socket is opened inside a namespace ([`Rtnl::open_in`]) and works
//! there from any thread afterwards: a netlink socket keeps the namespace
//! it was created in. Messages are built and read with
//! `netlink-packet-route`; this module only sends them and matches
//! acknowledgements.

use std::io;
use std::num::NonZeroI32;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

use netlink_packet_core::{
    NetlinkHeader, NetlinkMessage, NetlinkPayload, NLM_F_ACK, NLM_F_CREATE, NLM_F_EXCL,
    NLM_F_REPLACE, NLM_F_REQUEST,
};
use netlink_packet_route::link::{
    AfSpecInet6, AfSpecUnspec, In6AddrGenMode, InfoData, InfoKind, InfoVeth, LinkAttribute,
    LinkFlags, LinkInfo, LinkMessage,
};
use netlink_packet_route::tc::{
    TcAction, TcActionAttribute, TcActionGeneric, TcActionMessage, TcActionMessageAttribute,
    TcActionMirrorOption, TcActionOption, TcActionType, TcAttribute, TcFilterU32Option, TcHandle,
    TcMessage, TcMirror, TcMirrorActionType, TcOption, TcStats2, TcU32Key, TcU32Selector,
    TcU32SelectorFlags,
};
use netlink_packet_route::RouteNetlinkMessage;

/// The kind of every action the kernel path creates.
const MIRRED: &str = "mirred";

/// `htons(ETH_P_ALL)`, as `tc ... protocol all` puts it in `tcm_info`.
const PROTOCOL_ALL: u16 = (libc::ETH_P_ALL as u16).to_be();

/// The largest reply we read: a netlink message of ours is a few hundred
/// bytes, and an error acknowledgement carries the request back.
const REPLY_BYTES: usize = 16 * 1024;

/// What a tc action counted: `tc -s` prints it as `Sent BYTES bytes
/// PACKETS pkt`. (Its own type, not the kernel path's `WireCount`: this
/// module is below `kernel_path`, which uses it.)
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct ActionCount {
    pub(crate) packets: u64,
    pub(crate) bytes: u64,
}

/// A `NETLINK_ROUTE` socket bound to one network namespace.
pub(crate) struct Rtnl {
    sock: OwnedFd,
    seq: u32,
}

impl Rtnl {
    /// A socket in the calling thread's network namespace.
    pub(crate) fn open() -> io::Result<Rtnl> {
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
        Ok(Rtnl { sock, seq: 0 })
    }

    /// A socket in the network namespace `netns` (opened from a short
    /// thread inside it, [`crate::netns::run_in`]).
    pub(crate) fn open_in(netns: BorrowedFd<'_>) -> io::Result<Rtnl> {
        crate::netns::run_in(netns, Rtnl::open)?
    }

    /// Sends `message` with `flags` (request and ack added) and returns the
    /// messages the kernel answered with before its acknowledgement: an
    /// error with the kernel's errno when it refused.
    fn request(
        &mut self,
        message: RouteNetlinkMessage,
        flags: u16,
    ) -> io::Result<Vec<RouteNetlinkMessage>> {
        self.seq = self.seq.wrapping_add(1);
        let seq = self.seq;
        self.send(&encode(message, flags, seq))?;
        let mut answers = Vec::new();
        let mut reply = vec![0u8; REPLY_BYTES];
        loop {
            let got = self.recv(&mut reply)?;
            let mut at = 0;
            while at < got {
                let rest = &reply[at..got];
                let len = rest
                    .get(..4)
                    .map(|b| u32::from_ne_bytes([b[0], b[1], b[2], b[3]]) as usize)
                    .filter(|len| *len >= 16 && *len <= rest.len())
                    .ok_or_else(|| not_understood("a truncated message"))?;
                let msg = NetlinkMessage::<RouteNetlinkMessage>::deserialize(&rest[..len])
                    .map_err(|e| not_understood(&e.to_string()))?;
                // Netlink messages are 4-byte aligned one after another.
                at += len.next_multiple_of(4);
                if msg.header.sequence_number != seq {
                    // A late answer to an earlier request (none expected:
                    // each request waits for its acknowledgement).
                    continue;
                }
                match msg.payload {
                    NetlinkPayload::Error(e) => {
                        return match e.code.map(NonZeroI32::get) {
                            None => Ok(answers),
                            Some(errno) => Err(io::Error::from_raw_os_error(-errno)),
                        };
                    }
                    NetlinkPayload::InnerMessage(m) => answers.push(m),
                    _ => {}
                }
            }
        }
    }

    fn send(&self, bytes: &[u8]) -> io::Result<()> {
        // SAFETY: zeroed sockaddr_nl is the kernel's address (pid 0, no
        // groups).
        let mut kernel: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
        kernel.nl_family = libc::AF_NETLINK as u16;
        // SAFETY: sends `bytes` to the kernel's address, both valid for the
        // call.
        let sent = unsafe {
            libc::sendto(
                self.sock.as_raw_fd(),
                bytes.as_ptr().cast(),
                bytes.len(),
                0,
                (&raw const kernel).cast(),
                std::mem::size_of::<libc::sockaddr_nl>() as u32,
            )
        };
        if sent < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    fn recv(&self, into: &mut [u8]) -> io::Result<usize> {
        loop {
            // SAFETY: receives into `into`, valid for its length.
            let got = unsafe {
                libc::recv(
                    self.sock.as_raw_fd(),
                    into.as_mut_ptr().cast(),
                    into.len(),
                    0,
                )
            };
            if got >= 0 {
                return Ok(got as usize);
            }
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(e);
            }
        }
    }

    /// The index of interface `ifname` in this socket's namespace.
    pub(crate) fn ifindex(&mut self, ifname: &str) -> io::Result<u32> {
        let mut get = LinkMessage::default();
        get.attributes
            .push(LinkAttribute::IfName(ifname.to_owned()));
        let answers = self.request(RouteNetlinkMessage::GetLink(get), 0)?;
        answers
            .into_iter()
            .find_map(|m| match m {
                RouteNetlinkMessage::NewLink(link) => Some(link.header.index),
                _ => None,
            })
            .ok_or_else(|| not_understood("no link in the answer"))
    }

    /// Adds (or keeps) the clsact qdisc on interface `ifindex`, as `tc
    /// qdisc replace dev IFNAME clsact`.
    pub(crate) fn replace_clsact(&mut self, ifindex: u32) -> io::Result<()> {
        let flags = NLM_F_CREATE | NLM_F_REPLACE;
        self.request(clsact_replace(ifindex), flags).map(drop)
    }

    /// Adds the veth pair `a` (here, with MAC `a_mac`) and `b` (in the
    /// namespace `b_netns`, with `b_mac`), both down, as `ip link add A
    /// address A_MAC type veth peer name B address B_MAC netns B_NETNS`.
    pub(crate) fn add_veth(
        &mut self,
        (a, a_mac): (&str, [u8; 6]),
        (b, b_mac): (&str, [u8; 6]),
        b_netns: BorrowedFd<'_>,
    ) -> io::Result<()> {
        let flags = NLM_F_CREATE | NLM_F_EXCL;
        self.request(veth_add((a, a_mac), (b, b_mac), b_netns), flags)
            .map(drop)
    }

    /// Sets interface `ifname` up without ARP and without IPv6 address
    /// generation, as `ip link set IFNAME addrgenmode none` then `ip link
    /// set IFNAME arp off up`: the mode first, so that the link never has a
    /// link-local address to speak from.
    pub(crate) fn set_up_silent(&mut self, ifname: &str) -> io::Result<()> {
        self.request(no_addrgen(ifname), 0)?;
        self.request(up_without_arp(ifname), 0).map(drop)
    }

    /// Adds a u32 ingress filter (preference 1) on interface `ifindex` that
    /// redirects every frame to the ingress of `to_ifindex`, as `tc filter add dev IFNAME ingress pref 1 protocol
    /// all u32 match u32 0 0 action mirred ingress redirect dev TO`.
    pub(crate) fn add_ingress_redirect(&mut self, ifindex: u32, to_ifindex: u32) -> io::Result<()> {
        let flags = NLM_F_CREATE | NLM_F_EXCL;
        self.request(ingress_redirect_add(ifindex, to_ifindex), flags)
            .map(drop)
    }

    /// Adds mirred action `index` redirecting to the egress of interface
    /// `to_ifindex`, standalone (it lives until deleted, counting, whatever
    /// filter uses it), as `tc actions add action mirred egress redirect
    /// dev IFNAME index INDEX`.
    pub(crate) fn add_redirect_action(&mut self, index: u32, to_ifindex: u32) -> io::Result<()> {
        let flags = NLM_F_CREATE | NLM_F_EXCL;
        self.request(redirect_action_add(index, to_ifindex), flags)
            .map(drop)
    }

    /// Adds a u32 egress filter of preference `pref` on interface `ifindex`
    /// that sends frames to `dst` through mirred action `index` (which must
    /// exist), as `tc filter add dev IFNAME egress pref PREF protocol all
    /// u32 match ether dst DST action mirred index INDEX`.
    pub(crate) fn add_egress_filter(
        &mut self,
        ifindex: u32,
        pref: u16,
        dst: [u8; 6],
        index: u32,
    ) -> io::Result<()> {
        let flags = NLM_F_CREATE | NLM_F_EXCL;
        self.request(egress_filter_add(ifindex, pref, dst, index), flags)
            .map(drop)
    }

    /// Deletes the clsact qdisc of interface `ifindex` and every filter on
    /// it, as `tc qdisc del dev IFNAME clsact`.
    pub(crate) fn del_clsact(&mut self, ifindex: u32) -> io::Result<()> {
        self.request(clsact_del(ifindex), 0).map(drop)
    }

    /// Deletes the u32 egress filter of preference `pref` on interface
    /// `ifindex`, as `tc filter del dev IFNAME egress pref PREF protocol all
    /// u32`.
    pub(crate) fn del_egress_filter(&mut self, ifindex: u32, pref: u16) -> io::Result<()> {
        self.request(egress_filter_del(ifindex, pref), 0).map(drop)
    }

    /// What mirred action `index` counted, as `tc -s actions get action
    /// mirred index INDEX` prints it after `Sent`.
    pub(crate) fn action_count(&mut self, index: u32) -> io::Result<ActionCount> {
        let answers = self.request(RouteNetlinkMessage::GetTrafficAction(mirred(index)), 0)?;
        answers
            .iter()
            .filter_map(|m| match m {
                // The kernel answers a get with its own type (tcf_get_notify).
                RouteNetlinkMessage::GetTrafficAction(a)
                | RouteNetlinkMessage::NewTrafficAction(a) => Some(a),
                _ => None,
            })
            .flat_map(|a| &a.attributes)
            .filter_map(|attr| match attr {
                TcActionMessageAttribute::Actions(actions) => Some(actions),
                _ => None,
            })
            .flatten()
            .flat_map(|action| &action.attributes)
            .filter_map(|attr| match attr {
                TcActionAttribute::Stats(stats) => Some(stats),
                _ => None,
            })
            .flatten()
            .find_map(|s| match s {
                TcStats2::Basic(basic) => Some(ActionCount {
                    packets: u64::from(basic.packets),
                    bytes: basic.bytes,
                }),
                _ => None,
            })
            .ok_or_else(|| not_understood("no counts in the answer"))
    }

    /// Deletes mirred action `index`, as `tc actions del action mirred
    /// index INDEX`.
    pub(crate) fn del_action(&mut self, index: u32) -> io::Result<()> {
        self.request(RouteNetlinkMessage::DelTrafficAction(mirred(index)), 0)
            .map(drop)
    }

    /// Puts interface `ifname` in device group `group`, as `ip link set
    /// IFNAME group GROUP`.
    pub(crate) fn set_group(&mut self, ifname: &str, group: u32) -> io::Result<()> {
        let mut set = LinkMessage::default();
        set.attributes
            .push(LinkAttribute::IfName(ifname.to_owned()));
        set.attributes.push(LinkAttribute::Group(group));
        self.request(RouteNetlinkMessage::SetLink(set), 0).map(drop)
    }

    /// Deletes every interface of device group `group` at once, as `ip
    /// link del group GROUP`: the kernel unregisters them in one batch,
    /// with one RCU grace period for all instead of one each (99 veth
    /// pairs: 0.04 s against 1.6 s one by one, on this machine). Refused
    /// (EOPNOTSUPP) when the group holds a device without a delete of its
    /// own, such as a TAP.
    pub(crate) fn del_group(&mut self, group: u32) -> io::Result<()> {
        let mut del = LinkMessage::default();
        del.attributes.push(LinkAttribute::Group(group));
        self.request(RouteNetlinkMessage::DelLink(del), 0).map(drop)
    }

    /// Deletes interface `ifname` (a veth end takes its peer with it), as
    /// `ip link del IFNAME`.
    pub(crate) fn del_link(&mut self, ifname: &str) -> io::Result<()> {
        let mut del = LinkMessage::default();
        del.attributes
            .push(LinkAttribute::IfName(ifname.to_owned()));
        self.request(RouteNetlinkMessage::DelLink(del), 0).map(drop)
    }
}

/// `message` as one request of sequence number `seq`, acknowledged, with
/// `flags` added: the bytes sent.
fn encode(message: RouteNetlinkMessage, flags: u16, seq: u32) -> Vec<u8> {
    let mut header = NetlinkHeader::default();
    header.flags = NLM_F_REQUEST | NLM_F_ACK | flags;
    header.sequence_number = seq;
    let mut packet = NetlinkMessage::new(header, NetlinkPayload::InnerMessage(message));
    packet.finalize();
    let mut bytes = vec![0u8; packet.buffer_len()];
    packet.serialize(&mut bytes);
    bytes
}

/// The clsact qdisc on interface `ifindex` (`tc qdisc replace dev IFNAME
/// clsact`), to send with create and replace.
fn clsact_replace(ifindex: u32) -> RouteNetlinkMessage {
    RouteNetlinkMessage::NewQueueDiscipline(clsact(ifindex))
}

/// The delete of interface `ifindex`'s clsact qdisc (`tc qdisc del dev
/// IFNAME clsact`).
fn clsact_del(ifindex: u32) -> RouteNetlinkMessage {
    RouteNetlinkMessage::DelQueueDiscipline(clsact(ifindex))
}

/// Interface `ifindex`'s clsact qdisc, by its parent, handle and kind.
fn clsact(ifindex: u32) -> TcMessage {
    let mut qdisc = TcMessage::with_index(ifindex as i32);
    qdisc.header.parent = TcHandle::CLSACT;
    qdisc.header.handle = TcHandle {
        major: u16::MAX,
        minor: 0,
    };
    qdisc.attributes.push(TcAttribute::Kind("clsact".into()));
    qdisc
}

/// The delete of the u32 egress filter of preference `pref` on interface
/// `ifindex` (`tc filter del dev IFNAME egress pref PREF protocol all u32`).
fn egress_filter_del(ifindex: u32, pref: u16) -> RouteNetlinkMessage {
    let mut del = TcMessage::with_index(ifindex as i32);
    del.header.parent = EGRESS;
    del.header.info = u32::from(pref) << 16 | u32::from(PROTOCOL_ALL);
    del.attributes.push(TcAttribute::Kind("u32".into()));
    RouteNetlinkMessage::DelTrafficFilter(del)
}

/// A veth pair (`ip link add A address A_MAC type veth peer name B
/// address B_MAC netns B_NETNS`), to send with create and exclusive.
fn veth_add(
    (a, a_mac): (&str, [u8; 6]),
    (b, b_mac): (&str, [u8; 6]),
    b_netns: BorrowedFd<'_>,
) -> RouteNetlinkMessage {
    let mut peer = LinkMessage::default();
    peer.attributes = vec![
        LinkAttribute::IfName(b.to_owned()),
        LinkAttribute::Address(b_mac.to_vec()),
        LinkAttribute::NetNsFd(b_netns.as_raw_fd()),
    ];
    let mut add = LinkMessage::default();
    add.attributes = vec![
        LinkAttribute::IfName(a.to_owned()),
        LinkAttribute::Address(a_mac.to_vec()),
        LinkAttribute::LinkInfo(vec![
            LinkInfo::Kind(InfoKind::Veth),
            LinkInfo::Data(InfoData::Veth(InfoVeth::Peer(peer))),
        ]),
    ];
    RouteNetlinkMessage::NewLink(add)
}

/// `ip link set IFNAME addrgenmode none`.
fn no_addrgen(ifname: &str) -> RouteNetlinkMessage {
    let mut set = LinkMessage::default();
    set.attributes = vec![
        LinkAttribute::IfName(ifname.to_owned()),
        LinkAttribute::AfSpecUnspec(vec![AfSpecUnspec::Inet6(vec![AfSpecInet6::AddrGenMode(
            In6AddrGenMode::None,
        )])]),
    ];
    RouteNetlinkMessage::SetLink(set)
}

/// `ip link set IFNAME arp off up`.
fn up_without_arp(ifname: &str) -> RouteNetlinkMessage {
    let mut set = LinkMessage::default();
    set.header.flags = LinkFlags::Up | LinkFlags::Noarp;
    set.header.change_mask = LinkFlags::Up | LinkFlags::Noarp;
    set.attributes
        .push(LinkAttribute::IfName(ifname.to_owned()));
    RouteNetlinkMessage::SetLink(set)
}

/// A u32 ingress filter, preference 1, on `ifindex`, redirecting every
/// frame to `to_ifindex`'s ingress through a mirred action of its own
/// (`tc filter add dev IFNAME ingress pref 1 protocol all u32 match u32 0
/// 0 action mirred ingress redirect dev TO`), to send with create and
/// exclusive.
fn ingress_redirect_add(ifindex: u32, to_ifindex: u32) -> RouteNetlinkMessage {
    let mut add = TcMessage::with_index(ifindex as i32);
    add.header.parent = TcHandle {
        major: u16::MAX,
        minor: TcHandle::MIN_INGRESS,
    };
    add.header.info = 1 << 16 | u32::from(PROTOCOL_ALL);
    add.attributes.push(TcAttribute::Kind("u32".into()));
    // `match u32 0 0`: one key that every frame matches.
    let mut selector = TcU32Selector::default();
    selector.keys = vec![TcU32Key::default()];
    selector.nkeys = 1;
    selector.flags = TcU32SelectorFlags::Terminal;
    // Index 0: the kernel numbers this filter's own action.
    let mut parms = mirror_of(0);
    parms.generic.action = TcActionType::Stolen;
    parms.eaction = TcMirrorActionType::IngressRedir;
    parms.ifindex = to_ifindex;
    add.attributes.push(TcAttribute::Options(vec![
        TcOption::U32(TcFilterU32Option::Selector(selector)),
        TcOption::U32(TcFilterU32Option::Action(vec![mirred_action(parms)])),
    ]));
    RouteNetlinkMessage::NewTrafficFilter(add)
}

/// The egress of a clsact qdisc, where a TAP's redirect filters hang.
const EGRESS: TcHandle = TcHandle {
    major: u16::MAX,
    minor: TcHandle::MIN_EGRESS,
};

/// A standalone mirred action `index` redirecting to `to_ifindex`'s egress
/// (`tc actions add action mirred egress redirect dev IFNAME index INDEX`),
/// to send with create and exclusive.
fn redirect_action_add(index: u32, to_ifindex: u32) -> RouteNetlinkMessage {
    let mut parms = mirror_of(index);
    // A redirect takes the frame: nothing after it sees it.
    parms.generic.action = TcActionType::Stolen;
    parms.eaction = TcMirrorActionType::EgressRedir;
    parms.ifindex = to_ifindex;
    let mut message = TcActionMessage::default();
    message
        .attributes
        .push(TcActionMessageAttribute::Actions(vec![mirred_action(
            parms,
        )]));
    RouteNetlinkMessage::NewTrafficAction(message)
}

/// A u32 egress filter of preference `pref` on `ifindex` matching frames
/// to `dst` and using the existing mirred action `index` (`tc filter add
/// dev IFNAME egress pref PREF protocol all u32 match ether dst DST action
/// mirred index INDEX`), to send with create and exclusive.
fn egress_filter_add(ifindex: u32, pref: u16, dst: [u8; 6], index: u32) -> RouteNetlinkMessage {
    let mut add = TcMessage::with_index(ifindex as i32);
    add.header.parent = EGRESS;
    add.header.info = u32::from(pref) << 16 | u32::from(PROTOCOL_ALL);
    add.attributes.push(TcAttribute::Kind("u32".into()));
    // A reference to an action that exists: only its index counts (the
    // kernel binds to it and reads nothing else, as with `tc`).
    let reference = mirror_of(index);
    add.attributes.push(TcAttribute::Options(vec![
        TcOption::U32(TcFilterU32Option::Selector(ether_dst_selector(dst))),
        TcOption::U32(TcFilterU32Option::Action(vec![mirred_action(reference)])),
    ]));
    RouteNetlinkMessage::NewTrafficFilter(add)
}

/// The u32 selector of `match ether dst DST`, keyed as `tc` keys it: u32
/// keys are 32-bit words at 4-byte aligned offsets from the network
/// header, so the destination MAC (14 bytes before it) is the low half of
/// the word at -16 and the whole word at -12. Values and masks are in
/// network order, as the kernel compares them against the frame's bytes.
fn ether_dst_selector(dst: [u8; 6]) -> TcU32Selector {
    let word = |b: [u8; 4]| u32::from_ne_bytes(b);
    let key = |mask, val, off| {
        let mut k = TcU32Key::default();
        (k.mask, k.val, k.off) = (mask, val, off);
        k
    };
    let mut selector = TcU32Selector::default();
    selector.keys = vec![
        key(word([0, 0, 0xff, 0xff]), word([0, 0, dst[0], dst[1]]), -16),
        key(u32::MAX, word([dst[2], dst[3], dst[4], dst[5]]), -12),
    ];
    selector.nkeys = selector.keys.len() as u8;
    // With an action: a match ends the classification.
    selector.flags = TcU32SelectorFlags::Terminal;
    selector
}

/// Mirred parameters naming action `index`, everything else zero.
fn mirror_of(index: u32) -> TcMirror {
    let mut generic = TcActionGeneric::default();
    generic.index = index;
    let mut parms = TcMirror::default();
    parms.generic = generic;
    parms
}

/// Mirred action with `parms`, first (and only) in its list.
fn mirred_action(parms: TcMirror) -> TcAction {
    let mut action = TcAction::default();
    action.tab = 1;
    action.attributes = vec![
        TcActionAttribute::Kind(MIRRED.into()),
        TcActionAttribute::Options(vec![TcActionOption::Mirror(TcActionMirrorOption::Parms(
            parms,
        ))]),
    ];
    action
}

/// A message naming mirred action `index`, for a get or a delete.
fn mirred(index: u32) -> TcActionMessage {
    let mut action = TcAction::default();
    // The action's position in the message (`tab`): the first.
    action.tab = 1;
    action.attributes = vec![
        TcActionAttribute::Kind(MIRRED.into()),
        TcActionAttribute::Index(index),
    ];
    let mut message = TcActionMessage::default();
    message
        .attributes
        .push(TcActionMessageAttribute::Actions(vec![action]));
    message
}

fn not_understood(what: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("rtnetlink answer not understood: {what}"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use netlink_packet_core::Emitable;

    /// Runs `prog` (`ip` or `tc`) with the words of `line`.
    fn iproute2_output(prog: &str, line: &str) -> std::process::Output {
        std::process::Command::new(prog)
            .args(line.split_whitespace())
            .output()
            .unwrap_or_else(|e| panic!("{prog} (iproute2) does not run: {e}"))
    }

    /// Runs `prog` (`ip` or `tc`) with the words of `line`: whether it
    /// succeeded, and its stdout.
    fn iproute2_status(prog: &str, line: &str) -> (bool, String) {
        let out = iproute2_output(prog, line);
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
        )
    }

    /// Runs `prog` (`ip` or `tc`) with the words of `line`, which must
    /// succeed; its stdout.
    fn iproute2(prog: &str, line: &str) -> String {
        let out = iproute2_output(prog, line);
        assert!(
            out.status.success(),
            "{prog} {line}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Runs `body` on a thread of its own moved into a fresh network
    /// namespace (with the `ip` and `tc` it starts), so the test's
    /// interfaces go with the thread. `None`, saying why, where this is
    /// not root.
    fn in_fresh_netns<T: Send + 'static>(
        body: impl FnOnce() -> io::Result<T> + Send + 'static,
    ) -> Option<T> {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("skipped: needs root for a network namespace");
            return None;
        }
        let ran = std::thread::spawn(move || {
            // SAFETY: unshare moves only this thread (and what it runs)
            // into a new namespace; the thread ends with the test.
            if unsafe { libc::unshare(libc::CLONE_NEWNET) } != 0 {
                return Err(io::Error::last_os_error());
            }
            body()
        })
        .join()
        .expect("the namespace thread panicked");
        Some(ran.expect("rtnetlink in a fresh namespace"))
    }

    #[test]
    fn the_clsact_request_is_what_tc_sends() {
        let m = encode(clsact_replace(7), NLM_F_CREATE | NLM_F_REPLACE, 9);
        // `tc qdisc replace dev X clsact`, byte for byte as strace shows
        // it: 16-byte header, 20-byte tcmsg, TCA_KIND "clsact\0".
        assert_eq!(m.len(), 48);
        assert_eq!(u32::from_ne_bytes(m[..4].try_into().unwrap()), 48);
        assert_eq!(u16::from_ne_bytes([m[4], m[5]]), 36, "RTM_NEWQDISC");
        assert_eq!(
            u16::from_ne_bytes([m[6], m[7]]),
            0x505,
            "request ack create replace"
        );
        assert_eq!(u32::from_ne_bytes(m[8..12].try_into().unwrap()), 9, "seq");
        assert_eq!(i32::from_ne_bytes(m[20..24].try_into().unwrap()), 7);
        assert_eq!(
            u32::from_ne_bytes(m[24..28].try_into().unwrap()),
            0xFFFF_0000
        );
        assert_eq!(
            u32::from_ne_bytes(m[28..32].try_into().unwrap()),
            0xFFFF_FFF1
        );
        assert_eq!(&m[40..47], b"clsact\0");
    }

    #[test]
    fn the_filter_delete_names_egress_pref_and_protocol_all() {
        let m = encode(egress_filter_del(3, 258), 0, 9);
        assert_eq!(u16::from_ne_bytes([m[4], m[5]]), 45, "RTM_DELTFILTER");
        assert_eq!(u16::from_ne_bytes([m[6], m[7]]), 0x5, "request ack");
        assert_eq!(i32::from_ne_bytes(m[20..24].try_into().unwrap()), 3);
        assert_eq!(
            u32::from_ne_bytes(m[28..32].try_into().unwrap()),
            0xFFFF_FFF3
        );
        // tcm_info as tc builds it: TC_H_MAKE(pref << 16, htons(ETH_P_ALL)).
        let info = u32::from_ne_bytes(m[32..36].try_into().unwrap());
        assert_eq!(info >> 16, 258);
        assert_eq!((info & 0xffff) as u16, u16::from_be(3u16.to_be()).to_be());
        assert!(m.windows(4).any(|w| w == b"u32\0"), "TCA_KIND u32");
    }

    #[test]
    fn action_messages_name_mirred_and_the_index() {
        let m = encode(
            RouteNetlinkMessage::DelTrafficAction(mirred(0x4000_0005)),
            0,
            9,
        );
        assert_eq!(u16::from_ne_bytes([m[4], m[5]]), 49, "RTM_DELACTION");
        // tcamsg (4 bytes), then TCA_ACT_TAB > order 1 > kind and index.
        let body = &m[20..];
        assert_eq!(u16::from_ne_bytes([body[2], body[3]]), 1, "TCA_ACT_TAB");
        assert_eq!(u16::from_ne_bytes([body[6], body[7]]), 1, "order 1");
        assert!(m.windows(7).any(|w| w == b"mirred\0"));
        assert!(m
            .windows(4)
            .any(|w| w == 0x4000_0005u32.to_ne_bytes().as_slice()));
        assert_eq!(mirred(1).buffer_len() % 4, 0);
    }

    /// Needs root (it asks the kernel): a redirect action and an egress
    /// filter made through us read back from the kernel exactly as the
    /// same ones made by `tc`, in a namespace of its own.
    #[test]
    fn a_redirect_made_by_us_is_the_one_tc_makes() {
        let run = iproute2;
        let Some(compared) = in_fresh_netns(move || {
            // Two veth pairs: `ours0` gets its redirect through us, `tcs0`
            // the same one through tc.
            for (a, b) in [("ours0", "ours1"), ("tcs0", "tcs1")] {
                run("ip", &format!("link add {a} type veth peer name {b}"));
                run("ip", &format!("link set {a} up"));
                run("ip", &format!("link set {b} up"));
                run("tc", &format!("qdisc add dev {a} clsact"));
            }
            let dst = [0x02, 0x5a, 0x01, 0xc3, 0x7e, 0x09];
            let mut rtnl = Rtnl::open()?;
            let (ours0, ours1) = (rtnl.ifindex("ours0")?, rtnl.ifindex("ours1")?);
            rtnl.add_redirect_action(0x4000_0011, ours1)?;
            assert_eq!(
                rtnl.add_redirect_action(0x4000_0011, ours1)
                    .unwrap_err()
                    .raw_os_error(),
                Some(libc::EEXIST),
                "an action index is added once"
            );
            rtnl.add_egress_filter(ours0, 77, dst, 0x4000_0011)?;
            run(
                "tc",
                "actions add action mirred egress redirect dev tcs1 index 1073741842",
            );
            run(
                "tc",
                "filter add dev tcs0 egress pref 77 protocol all u32 match ether dst \
                 02:5a:01:c3:7e:09 action mirred index 1073741842",
            );
            Ok((
                run("tc", "filter show dev ours0 egress"),
                run("tc", "filter show dev tcs0 egress"),
                run("tc", "actions get action mirred index 1073741841"),
                run("tc", "actions get action mirred index 1073741842"),
            ))
        }) else {
            return;
        };
        let (ours_filter, tc_filter, ours_action, tc_action) = compared;
        // The same text but for the names and indices that differ on
        // purpose, and the counters' times.
        let same = |t: &str| {
            t.replace("ours1", "DEV")
                .replace("tcs1", "DEV")
                .replace("ours0", "TAP")
                .replace("tcs0", "TAP")
                .replace("1073741841", "INDEX")
                .replace("1073741842", "INDEX")
                .lines()
                .filter(|l| {
                    !l.contains("installed") && !l.contains("used") && !l.contains("firstused")
                })
                .map(|l| l.trim().to_owned())
                .collect::<Vec<_>>()
        };
        assert!(ours_filter.contains("match 00000"), "{ours_filter}");
        assert_eq!(
            same(&ours_filter),
            same(&tc_filter),
            "{ours_filter}\n---\n{tc_filter}"
        );
        assert!(ours_action.contains("Egress Redirect"), "{ours_action}");
        assert_eq!(
            same(&ours_action),
            same(&tc_action),
            "{ours_action}\n---\n{tc_action}"
        );
    }

    /// Needs root (it asks the kernel): a wire's veth pair, its ends' link
    /// settings and their ingress redirect, made through us, read back as
    /// the same made by `ip` and `tc`, in a namespace of its own.
    #[test]
    fn a_wire_made_by_us_is_the_one_ip_and_tc_make() {
        let run = iproute2;
        let Some(shown) = in_fresh_netns(move || {
            let here = std::fs::File::open("/proc/thread-self/ns/net")?;
            use std::os::fd::AsFd;
            // A TAP stand-in for each wire to redirect into.
            run("ip", "link add tap0 type veth peer name tap0p");
            run("ip", "link set tap0 up");
            let mut rtnl = Rtnl::open()?;
            let (a_mac, b_mac) = ([0x02, 0, 0, 0, 0, 0x0a], [0x02, 0, 0, 0, 0, 0x0b]);
            rtnl.add_veth(("ours0a", a_mac), ("ours0b", b_mac), here.as_fd())?;
            rtnl.set_up_silent("ours0a")?;
            let (end, tap) = (rtnl.ifindex("ours0a")?, rtnl.ifindex("tap0")?);
            rtnl.replace_clsact(end)?;
            rtnl.add_ingress_redirect(end, tap)?;
            run(
                "ip",
                "link add tcs0a address 02:00:00:00:00:0a type veth peer name tcs0b address 02:00:00:00:00:0b",
            );
            run("ip", "link set tcs0a addrgenmode none");
            run("ip", "link set tcs0a arp off up");
            run("tc", "qdisc add dev tcs0a clsact");
            run(
                "tc",
                "filter add dev tcs0a ingress pref 1 protocol all u32 match u32 0 0 action mirred ingress redirect dev tap0",
            );
            let both = |what: &dyn Fn(&str) -> String| (what("ours0a"), what("tcs0a"));
            Ok(vec![
                both(&|dev| run("ip", &format!("-d -o link show dev {dev}"))),
                both(&|dev| {
                    run(
                        "ip",
                        &format!("-d -o link show dev {}b", &dev[..dev.len() - 1]),
                    )
                }),
                both(&|dev| run("ip", &format!("-o addr show dev {dev}"))),
                both(&|dev| run("tc", &format!("filter show dev {dev} ingress"))),
            ])
        }) else {
            return;
        };
        // The same text but for the names and numbers that differ on
        // purpose (interface indices, the filters' own action indices).
        let same = |t: &str| {
            let t = t.replace("ours0", "END").replace("tcs0", "END");
            t.split_whitespace()
                .filter(|w| !w.ends_with(':') || w.starts_with("END"))
                .filter(|w| !w.chars().all(|c| c.is_ascii_digit()) && !w.starts_with("@if"))
                .map(|w| w.split('@').next().unwrap_or(w).to_owned())
                .collect::<Vec<_>>()
        };
        for (ours, tcs) in &shown {
            assert_eq!(same(ours), same(tcs), "{ours}\n---\n{tcs}");
        }
        let (link, _) = &shown[0];
        assert!(link.contains("NOARP") && link.contains(",UP"), "{link}");
        assert!(
            link.contains("addrgenmode none") && link.contains("veth"),
            "{link}"
        );
        assert!(shown[2].0.trim().is_empty(), "no address: {}", shown[2].0);
        assert!(
            shown[3].0.contains("Ingress Redirect to device tap0"),
            "{}",
            shown[3].0
        );
    }

    /// Needs root (it asks the kernel): lo's clsact, a filter and a
    /// mirred action made by `tc`, counted and deleted through us, in a
    /// namespace of its own.
    #[test]
    fn the_kernel_answers_what_tc_would() {
        let tc = |line: &str| iproute2_status("tc", line);
        in_fresh_netns(move || {
            let mut rtnl = Rtnl::open()?;
            let lo = rtnl.ifindex("lo")?;
            assert_eq!(lo, 1, "lo is the first interface of a namespace");
            assert_eq!(
                rtnl.ifindex("nosuch0").unwrap_err().raw_os_error(),
                Some(libc::ENODEV)
            );
            rtnl.replace_clsact(lo)?;
            rtnl.replace_clsact(lo)?;
            assert!(tc("qdisc show dev lo").1.contains("clsact"));
            rtnl.del_clsact(lo)?;
            assert!(!tc("qdisc show dev lo").1.contains("clsact"));
            assert!(rtnl.del_clsact(lo).is_err(), "no clsact left to delete");
            rtnl.replace_clsact(lo)?;
            let index = 0x4000_0007u32;
            assert!(rtnl.action_count(index).is_err(), "no such action yet");
            assert!(
                tc(&format!(
                    "actions add action mirred egress redirect dev lo index {index}"
                ))
                .0
            );
            assert!(tc(&format!(
                "filter add dev lo egress pref 9 protocol all u32 match u32 0 0 action mirred index {index}"
            ))
            .0);
            assert_eq!(rtnl.action_count(index)?, ActionCount::default());
            // Bound to the filter: the kernel refuses, and says so.
            assert!(rtnl.del_action(index).is_err());
            assert!(!tc("filter show dev lo egress").1.is_empty());
            rtnl.del_egress_filter(lo, 9)?;
            assert!(tc("filter show dev lo egress").1.trim().is_empty());
            assert_eq!(
                rtnl.del_egress_filter(lo, 9).unwrap_err().raw_os_error(),
                Some(libc::ENOENT)
            );
            // The filter lets go of its action after an RCU grace period.
            let mut deleted = rtnl.del_action(index);
            for _ in 0..50 {
                if deleted.is_ok() {
                    break;
                }
                std::thread::sleep(std::time::Duration::from_millis(20));
                deleted = rtnl.del_action(index);
            }
            deleted?;
            assert!(!tc(&format!("actions get action mirred index {index}")).0);
            assert_eq!(
                rtnl.del_link("nosuch0").unwrap_err().raw_os_error(),
                Some(libc::ENODEV)
            );
            // Two veth pairs deleted as one group; a third, outside it, stays.
            for pair in ["g1", "g2", "g3"] {
                iproute2(
                    "ip",
                    &format!("link add {pair}a type veth peer name {pair}b"),
                );
            }
            rtnl.set_group("g1a", 0x4000_0009)?;
            rtnl.set_group("g2a", 0x4000_0009)?;
            rtnl.del_group(0x4000_0009)?;
            for gone in ["g1a", "g1b", "g2a", "g2b"] {
                assert!(rtnl.ifindex(gone).is_err(), "{gone} deleted with its group");
            }
            rtnl.ifindex("g3a")?;
            rtnl.del_link("g3a")?;
            assert!(rtnl.ifindex("g3b").is_err(), "a veth end takes its peer");
            Ok(())
        });
    }
}
