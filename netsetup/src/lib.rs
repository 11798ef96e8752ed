//! Networking for Provium: the userspace L2 switch behind every bridge, its
//! impairments and pcap captures, TAP devices, and uplink NAT.
//!
//! One [`Switch`] per bridge. Ports are in-process frame channels ([`Port`],
//! for the VMM's virtio-net and for tests) or TAP fds ([`TapPort`], for local
//! sandboxes and the uplink). Partitions, isolation, latency, drop rate and
//! bandwidth apply per (from, to) pair exactly as declared and per whole
//! bridge, all at once; drops are reproducible from the run seed. Captures are
//! pcap streams written by the switch. Only [`uplink`] needs host privileges.
//!
//! This crate depends on no other workspace crate. See `docs/networking.md`.

#![warn(missing_docs)]

pub mod clock;
pub mod impair;
pub mod mac;
pub mod pcap;
mod port;
pub mod switch;
pub mod tap;
pub mod uplink;

pub use clock::{Clock, ManualClock, SystemClock};
pub use impair::Impairment;
pub use mac::{MacAddr, MAX_FRAME_BYTES};
pub use pcap::{Capture, CaptureScope};
pub use port::{LinkWatcher, RxWaker};
pub use switch::{
    Port, PortCounters, SendError, Switch, SwitchConfig, SwitchError, SwitchStats, Timer,
};
pub use tap::{Tap, TapError, TapPort};
pub use uplink::{disable_uplink, enable_uplink, Uplink, UplinkEnv, UplinkError};
