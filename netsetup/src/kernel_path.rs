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
//! here runs `ip` and `tc` (iproute2) inside the TAPs' namespaces; the
//! switch decides which directions are enabled (see
//! [`Switch`](crate::Switch)).

use std::collections::HashMap;
use std::io;
use std::io::Write;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use crate::mac::MacAddr;

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
    /// `ip` or `tc` could not be started (iproute2 missing?).
    #[error("cannot run `{command}` (is iproute2 installed? `apt-get install iproute2`)")]
    Spawn {
        /// The command line.
        command: String,
        /// Why it did not start.
        #[source]
        source: io::Error,
    },
    /// `ip` or `tc` failed.
    #[error("`{command}` failed: {stderr}")]
    Command {
        /// The command line.
        command: String,
        /// What it printed on stderr (trimmed).
        stderr: String,
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
    /// `tc` printed counts this module cannot read.
    #[error("cannot read the counts of `{command}` in: {output}")]
    Counts {
        /// The command line.
        command: String,
        /// What it printed.
        output: String,
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
        crate::netns::run_in(self.netns(), || crate::rtnl::replace_clsact(&self.ifname))
            .and_then(|r| r)
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

    /// Runs `line` (a program and its arguments, split at whitespace: our
    /// names, MACs and paths have none) inside this NIC's namespace;
    /// returns stdout.
    fn run(&self, line: &str) -> Result<String, KernelPathError> {
        let mut words = line.split_whitespace();
        let prog = words.next().unwrap_or_default();
        let inv = Invocation {
            prog,
            args: words.collect(),
            stdin: None,
        };
        run_in(&self.netns, inv)
    }

    /// Runs `prog -batch -` (`ip` or `tc`) on `lines` inside this NIC's
    /// namespace: one process for several commands. The tool stops at the
    /// first that fails and names its line.
    fn run_batch(&self, prog: &str, lines: &[String]) -> Result<String, KernelPathError> {
        let inv = Invocation {
            prog,
            args: vec!["-batch", "-"],
            stdin: Some(lines.iter().map(|l| format!("{l}\n")).collect()),
        };
        run_in(&self.netns, inv)
    }
}

/// What a command runs and reads: its arguments, and for `-batch -` the
/// lines it reads from stdin.
struct Invocation<'a> {
    prog: &'a str,
    args: Vec<&'a str>,
    stdin: Option<String>,
}

impl Invocation<'_> {
    fn describe(&self) -> String {
        match &self.stdin {
            None => format!("{} {}", self.prog, self.args.join(" ")),
            Some(lines) => format!(
                "{} -batch: {}",
                self.prog,
                lines.trim_end().replace('\n', "; ")
            ),
        }
    }
}

fn run_in(netns: &OwnedFd, inv: Invocation<'_>) -> Result<String, KernelPathError> {
    let command = inv.describe();
    let out = spawn_in(netns, inv)?;
    if !out.status.success() {
        return Err(KernelPathError::Command {
            command,
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Runs `inv` inside `netns` and returns what it did, whatever its exit
/// status (an error only when it could not run).
fn spawn_in(netns: &OwnedFd, inv: Invocation<'_>) -> Result<Output, KernelPathError> {
    let command = inv.describe();
    let ns = netns.as_raw_fd();
    let mut cmd = Command::new(inv.prog);
    cmd.args(&inv.args)
        .stdin(if inv.stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    // SAFETY: only setns, async-signal-safe, runs between fork and exec;
    // it moves the child alone into the NIC's namespace.
    unsafe {
        cmd.pre_exec(move || {
            if libc::setns(ns, libc::CLONE_NEWNET) != 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let spawn_error = |source| KernelPathError::Spawn {
        command: command.clone(),
        source,
    };
    let mut child = cmd.spawn().map_err(spawn_error)?;
    if let (Some(mut input), Some(lines)) = (child.stdin.take(), inv.stdin) {
        // A short write means the tool stopped reading: its exit status
        // and stderr below say why.
        let _ = input.write_all(lines.as_bytes());
    }
    child.wait_with_output().map_err(spawn_error)
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

/// Reads `Sent N bytes M pkt` from `tc -s` output.
fn parse_sent(out: &str) -> Option<WireCount> {
    let rest = &out[out.find("Sent ")? + 5..];
    let mut words = rest.split_whitespace();
    let bytes = words.next()?.parse().ok()?;
    (words.next()? == "bytes").then_some(())?;
    let packets = words.next()?.parse().ok()?;
    (words.next()? == "pkt").then_some(())?;
    Some(WireCount { packets, bytes })
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
        let peer_ns = format!("/proc/{}/fd/{}", std::process::id(), b.netns.as_raw_fd());
        let [end_a, end_b] = &wire.ends;
        // Four processes per wire, one `ip` and one `tc` batch in each
        // namespace. Address generation off before the link is up, so it
        // never gets an IPv6 link-local address to speak from.
        let link = |end: &str| {
            [
                format!("link set {end} addrgenmode none"),
                format!("link set {end} arp off up"),
            ]
        };
        let mut lines = vec![format!(
            "link add {end_a} address {} type veth peer name {end_b} address {} netns {peer_ns}",
            a.mac, b.mac
        )];
        lines.extend(link(end_a));
        a.run_batch("ip", &lines)?;
        b.run_batch("ip", &link(end_b))?;
        // The TAPs' clsact is there from the port's attach
        // (`KernelNic::prepare_for_wires`): a live TAP's qdiscs are not
        // touched here.
        for (nic, end) in wire.nics.iter().zip(&wire.ends) {
            let tap = &nic.ifname;
            nic.run_batch(
                "tc",
                &[
                    format!("qdisc add dev {end} clsact"),
                    format!(
                        "filter add dev {end} ingress pref 1 protocol all u32 match u32 0 0 \
                         action mirred ingress redirect dev {tap}"
                    ),
                ],
            )?;
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
        let (tap, end, pref) = (&nic.ifname, &self.ends[from], self.pref);
        let index = self.dirs[from].action_index;
        let mut lines = Vec::new();
        if !self.dirs[from].created {
            lines.push(format!(
                "actions add action mirred egress redirect dev {end} index {index}"
            ));
        }
        lines.push(format!(
            "filter add dev {tap} egress pref {pref} protocol all u32 match ether dst {} \
             action mirred index {index}",
            to.mac
        ));
        if let Err(e) = nic.run_batch("tc", &lines) {
            // The action may exist although its filter failed; a later
            // enable must not add it twice.
            if !self.dirs[from].created && self.action_exists(from) {
                self.dirs[from].created = true;
            }
            return Err(e);
        }
        self.dirs[from].created = true;
        self.dirs[from].enabled = true;
        Ok(())
    }

    /// Whether side `from`'s egress filter is on its TAP (false when the
    /// TAP is gone: nothing is left to redirect).
    fn filter_present(&self, from: usize) -> bool {
        let nic = &self.nics[from];
        let line = format!(
            "tc filter show dev {} egress pref {}",
            nic.ifname, self.pref
        );
        nic.run(&line).is_ok_and(|out| !out.trim().is_empty())
    }

    fn action_exists(&self, from: usize) -> bool {
        let line = format!(
            "tc actions get action mirred index {}",
            self.dirs[from].action_index
        );
        self.nics[from].run(&line).is_ok()
    }

    /// What the kernel forwarded from side `from` over this wire's life,
    /// enabled or not now.
    pub fn count(&self, from: usize) -> Result<WireCount, KernelPathError> {
        if !self.dirs[from].created {
            return Ok(WireCount::default());
        }
        let line = format!(
            "tc -s actions get action mirred index {}",
            self.dirs[from].action_index
        );
        let out = self.nics[from].run(&line)?;
        parse_sent(&out).ok_or_else(|| KernelPathError::Counts {
            command: line,
            output: out.trim().to_owned(),
        })
    }

    /// Stops forwarding side `from`'s frames in the kernel: when this
    /// returns, the next frame goes to the switch. Its count stays.
    pub fn disable(&mut self, from: usize) -> Result<(), KernelPathError> {
        if !self.dirs[from].enabled {
            return Ok(());
        }
        let nic = &self.nics[from];
        let (tap, pref) = (&nic.ifname, self.pref);
        let del = nic.run(&format!(
            "tc filter del dev {tap} egress pref {pref} protocol all u32"
        ));
        if let Err(e) = del {
            // The filter must go, whatever else it takes: without the TAP's
            // clsact no filter is left on it. Other wires' directions from
            // this TAP then go through the switch (always correct) while
            // their actions, and so their counts, stay.
            nic.run(&format!("tc qdisc del dev {tap} clsact"))
                .map_err(|_| e)?;
        }
        self.dirs[from].enabled = false;
        Ok(())
    }
}

impl Drop for Wire {
    fn drop(&mut self) {
        if self.down {
            return;
        }
        for from in 0..2 {
            let _ = self.disable(from);
        }
        // Deleting one end deletes the pair, its qdiscs and filters.
        let _ = self.nics[0].run(&format!("ip link del {}", self.ends[0]));
        for (nic, dir) in self.nics.iter().zip(&self.dirs) {
            if dir.created {
                let index = dir.action_index;
                let _ = nic.run(&format!("tc actions del action mirred index {index}"));
            }
        }
    }
}

/// Commands gathered per namespace, run as one `-batch` process per
/// namespace: the cost of a change to many wires is a process per
/// namespace touched, not several per wire.
struct PerNamespace {
    prog: &'static str,
    groups: Vec<(KernelNic, Vec<String>)>,
}

impl PerNamespace {
    fn new(prog: &'static str) -> PerNamespace {
        PerNamespace {
            prog,
            groups: Vec::new(),
        }
    }

    fn push(&mut self, nic: &KernelNic, line: String) {
        match self.groups.iter_mut().find(|(n, _)| n.ns_id == nic.ns_id) {
            Some((_, lines)) => lines.push(line),
            None => self.groups.push((nic.clone(), vec![line])),
        }
    }

    /// Runs each namespace's lines with `-force` (every line is tried,
    /// whatever fails before it); returns per namespace whether every
    /// line succeeded, and stdout. The namespaces' processes run from up to
    /// [`BATCHES_AT_ONCE`] threads: each is a fork, an exec and a few
    /// netlink round trips, and a bridge closing touches every member's
    /// namespace.
    fn run(&self, stats: bool) -> Vec<(bool, String)> {
        let one = |(nic, lines): &(KernelNic, Vec<String>)| {
            let mut args = vec!["-force", "-batch", "-"];
            if stats {
                args.insert(0, "-s");
            }
            let inv = Invocation {
                prog: self.prog,
                args,
                stdin: Some(lines.iter().map(|l| format!("{l}\n")).collect()),
            };
            match spawn_in(&nic.netns, inv) {
                Ok(out) => (
                    out.status.success(),
                    String::from_utf8_lossy(&out.stdout).into_owned(),
                ),
                Err(_) => (false, String::new()),
            }
        };
        if self.groups.len() < 2 {
            return self.groups.iter().map(one).collect();
        }
        let per_thread = self.groups.len().div_ceil(BATCHES_AT_ONCE);
        std::thread::scope(|s| {
            let workers: Vec<_> = self
                .groups
                .chunks(per_thread)
                .map(|chunk| {
                    let work = move || chunk.iter().map(one).collect::<Vec<_>>();
                    (chunk, std::thread::Builder::new().spawn_scoped(s, work))
                })
                .collect();
            // A chunk whose thread could not start (or that panicked) runs
            // (again) here, so every namespace gets its batch: its lines are
            // deletes and reads, which may run twice.
            workers
                .into_iter()
                .flat_map(|(chunk, worker)| match worker.map(|w| w.join()) {
                    Ok(Ok(results)) => results,
                    _ => chunk.iter().map(one).collect(),
                })
                .collect()
        })
    }
}

/// How many namespaces' `-batch` processes run at once.
const BATCHES_AT_ONCE: usize = 8;

/// Reads every `index I` and the `Sent N bytes M pkt` after it from `tc -s
/// actions` output (several actions, one after another).
fn parse_sent_by_index(out: &str) -> HashMap<u32, WireCount> {
    let mut counts = HashMap::new();
    let mut rest = out;
    while let Some(at) = rest.find("index ") {
        rest = &rest[at + 6..];
        let Some(index) = rest
            .split_whitespace()
            .next()
            .and_then(|w| w.parse::<u32>().ok())
        else {
            continue;
        };
        let next = rest.find("index ").unwrap_or(rest.len());
        if let Some(n) = parse_sent(&rest[..next]) {
            counts.insert(index, n);
        }
    }
    counts
}

impl Wire {
    /// What `wires` forwarded over their lives, per side as in
    /// [`Wire::count`]: one `tc -s -batch` per namespace touched. A count
    /// that cannot be read is zero.
    pub fn counts(wires: &[&Wire]) -> Vec<[WireCount; 2]> {
        let mut batch = PerNamespace::new("tc");
        for w in wires {
            w.push_gets(&mut batch);
        }
        Wire::read_counts(wires, &batch.run(true))
    }

    /// `actions get` lines for this wire's actions, each in its side's
    /// namespace.
    fn push_gets(&self, batch: &mut PerNamespace) {
        for (nic, dir) in self.nics.iter().zip(&self.dirs) {
            if dir.created {
                let index = dir.action_index;
                batch.push(nic, format!("actions get action mirred index {index}"));
            }
        }
    }

    /// The counts of `wires` in the outputs of batches with `-s`: a failed
    /// line (an action gone) leaves the others' output, and a count not
    /// read is zero.
    fn read_counts(wires: &[&Wire], outputs: &[(bool, String)]) -> Vec<[WireCount; 2]> {
        let mut read = HashMap::new();
        for (_, out) in outputs {
            read.extend(parse_sent_by_index(out));
        }
        wires
            .iter()
            .map(|w| {
                [0, 1].map(|d| {
                    read.get(&w.dirs[d].action_index)
                        .copied()
                        .unwrap_or_default()
                })
            })
            .collect()
    }

    /// Removes `wires` with a few processes per namespace touched instead
    /// of several per wire, and returns what each forwarded over its life
    /// (as [`Wire::counts`]). In each namespace one `tc` batch deletes the
    /// egress filters (so each direction is the switch's again when this
    /// returns) and reads the counts, one `ip` batch deletes the veth pairs
    /// (the ends' qdiscs and filters go with them), and a last `tc` batch
    /// deletes the actions.
    pub fn take_down(mut wires: Vec<Wire>) -> Vec<[WireCount; 2]> {
        let mut filters = PerNamespace::new("tc");
        let mut links = PerNamespace::new("ip");
        let mut actions = PerNamespace::new("tc");
        for w in &wires {
            for (d, nic) in w.nics.iter().enumerate() {
                let dir = &w.dirs[d];
                if dir.enabled {
                    filters.push(
                        nic,
                        format!(
                            "filter del dev {} egress pref {} protocol all u32",
                            nic.ifname, w.pref
                        ),
                    );
                }
                if dir.created {
                    let index = dir.action_index;
                    actions.push(nic, format!("actions del action mirred index {index}"));
                }
            }
            links.push(&w.nics[0], format!("link del {}", w.ends[0]));
        }
        // After the filter deletes, so the counts include every frame the
        // filters redirected.
        for w in &wires {
            w.push_gets(&mut filters);
        }
        let outputs = filters.run(true);
        let counts = Wire::read_counts(&wires.iter().collect::<Vec<_>>(), &outputs);
        if outputs.iter().any(|(ok, _)| !ok) {
            // Some line failed (a TAP already gone, or worse): a filter
            // still there goes the one-by-one way, which takes the TAP's
            // clsact away if it must.
            for w in &mut wires {
                for from in 0..2 {
                    if w.dirs[from].enabled && w.filter_present(from) {
                        let _ = w.disable(from);
                    }
                }
            }
        }
        let _ = links.run(false);
        // A filter lets go of its action only after an RCU grace period:
        // the actions still there after a delete that came too soon are
        // deleted again a little later.
        let mut round = actions;
        for pause_ms in [5, 20, 100, 0] {
            let results = round.run(false);
            let failed: Vec<&(KernelNic, Vec<String>)> = round
                .groups
                .iter()
                .zip(&results)
                .filter(|(_, (ok, _))| !ok)
                .map(|(g, _)| g)
                .collect();
            if failed.is_empty() || pause_ms == 0 {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(pause_ms));
            let mut retry = PerNamespace::new("tc");
            for (nic, lines) in failed {
                let Ok(left) = nic.run("tc actions ls action mirred") else {
                    continue;
                };
                for l in lines {
                    let index = l.rsplit(' ').next().unwrap_or_default();
                    if left.contains(&format!("index {index} ")) {
                        retry.push(nic, l.clone());
                    }
                }
            }
            round = retry;
        }
        for w in &mut wires {
            w.down = true;
        }
        counts
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sent_counts_are_read_from_tc_output() {
        let out = "\taction order 1: mirred (Egress Redirect to device pvk0a) stolen\n\
                   \tindex 1000 ref 1 bind 0\n\tAction statistics:\n\
                   \tSent 294 bytes 3 pkt (dropped 0, overlimits 0 requeues 0) \n";
        assert_eq!(
            parse_sent(out),
            Some(WireCount {
                packets: 3,
                bytes: 294
            })
        );
        assert_eq!(parse_sent("total acts 0"), None);
        assert_eq!(parse_sent("Sent x bytes 3 pkt"), None);
    }

    #[test]
    fn sent_counts_of_several_actions_are_read_by_index() {
        let out = "total acts 0\n\n\taction order 1: mirred (Egress Redirect to device pvk0a) stolen\n\
                   \tindex 1073741824 ref 1 bind 0\n\tAction statistics:\n\
                   \tSent 294 bytes 3 pkt (dropped 0, overlimits 0 requeues 0) \n\
                   \tbacklog 0b 0p requeues 0\n\
                   total acts 0\n\n\taction order 1: mirred (Egress Redirect to device pvk1b) stolen\n\
                   \tindex 1073741827 ref 1 bind 1\n\tAction statistics:\n\
                   \tSent 0 bytes 0 pkt (dropped 0, overlimits 0 requeues 0) \n";
        let counts = parse_sent_by_index(out);
        assert_eq!(counts.len(), 2);
        assert_eq!(
            counts[&0x4000_0000],
            WireCount {
                packets: 3,
                bytes: 294
            }
        );
        assert_eq!(counts[&0x4000_0003], WireCount::default());
    }

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
