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
//!
//! ```
//! use std::time::Duration;
//! use provium_netsetup::{MacAddr, Switch, SwitchConfig};
//!
//! let lan = Switch::new("lan", SwitchConfig { run_seed: 42, ..SwitchConfig::default() });
//! let a = lan.attach("a", MacAddr::local(1)).unwrap();
//! let b = lan.attach("b", MacAddr::local(2)).unwrap();
//! lan.partition_directional("a", "b").unwrap(); // a -> b dropped, b -> a flows
//!
//! let mut frame = vec![0xff; 6]; // broadcast destination
//! frame.extend_from_slice(&MacAddr::local(2).0); // source: b
//! frame.extend_from_slice(&[0x88, 0xb5, 1, 2, 3]);
//! b.send(&frame).unwrap();
//! assert_eq!(a.recv_timeout(Duration::from_secs(5)), Some(frame));
//! assert_eq!(b.counters().tx_packets, 1);
//! ```

#![warn(missing_docs)]

pub mod clock;
pub mod fnv1a;
pub mod impair;
pub mod kernel_path;
pub mod mac;
mod netns;
pub mod offload;
pub mod pcap;
mod port;
mod rtnl;
pub mod switch;
pub mod tap;
pub mod uplink;

pub use clock::{Clock, ManualClock, SystemClock};
pub use impair::Impairment;
pub use kernel_path::{KernelNic, KernelPathError, WireCount, WireNumbers};
pub use mac::{MacAddr, MAX_FRAME_BYTES};
pub use offload::{OffloadError, Offloads, VnetHdr};
pub use pcap::{Capture, CaptureScope};
pub use port::{DirectWriter, LinkWatcher, RxWaker};
pub use switch::{
    Port, PortCounters, SendError, Switch, SwitchConfig, SwitchError, SwitchStats, Timer,
};
pub use tap::{Tap, TapError, TapPoller, TapPort};
pub use uplink::{disable_uplink, enable_uplink, Uplink, UplinkEnv, UplinkError};
