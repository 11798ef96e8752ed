//! Port and switch counters: the plain structs callers read and their
//! atomic mirrors the forwarding path counts into without a lock.

use std::sync::atomic::{AtomicU64, Ordering};

/// Per-port counters, from the guest's perspective.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PortCounters {
    /// Frames queued to the guest.
    pub rx_packets: u64,
    /// Bytes queued to the guest.
    pub rx_bytes: u64,
    /// Frames the guest sent that the switch accepted.
    pub tx_packets: u64,
    /// Bytes the guest sent that the switch accepted.
    pub tx_bytes: u64,
    /// Frames for the guest dropped at this port: receive queue full or link down.
    pub rx_dropped: u64,
    /// Frames from the guest refused: link down, malformed or oversized.
    pub tx_dropped: u64,
    /// Malformed frames from the guest (runt, oversized, bad source MAC,
    /// bad offload header).
    pub errors: u64,
    /// Frames from the guest refused for their offload header (bogus
    /// gso_type, gso_size 0, hdr_len or checksum offsets outside the
    /// frame, headers that do not match the GSO type); also in `errors`.
    pub offload_errors: u64,
}

/// Switch-wide counters; each frame offered to a destination ends in exactly
/// one of `delivered` or a `dropped_*` bucket (or is still delayed).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SwitchStats {
    /// Frames accepted from ports.
    pub frames_in: u64,
    /// Frames flooded (group or unknown destination).
    pub flooded: u64,
    /// Frames queued to a destination port.
    pub delivered: u64,
    /// Frames that waited in a delay queue.
    pub delayed: u64,
    /// Frames refused at ingress as malformed.
    pub dropped_invalid: u64,
    /// Dropped because the sender's or receiver's link was down, or the
    /// receiver was detached (frames it had waiting in a delay queue
    /// included).
    pub dropped_link_down: u64,
    /// Dropped because either end was isolated.
    pub dropped_isolated: u64,
    /// Dropped by a partition.
    pub dropped_partition: u64,
    /// Dropped by a drop-rate impairment.
    pub dropped_impairment: u64,
    /// Dropped because the destination's receive queue was full.
    pub dropped_rx_queue_full: u64,
    /// Dropped because the delay queues held
    /// [`SwitchConfig::delay_queue_bytes`](super::SwitchConfig::delay_queue_bytes)
    /// already.
    pub dropped_delay_queue_full: u64,
    /// Unicast to a destination behind the ingress port itself.
    pub dropped_hairpin: u64,
    /// Learned MAC entries evicted by the per-port bound.
    pub mac_evictions: u64,
    /// Offloaded frames (GSO or checksum-pending) finished in software for
    /// a destination or capture that could not take them as they were.
    pub segmented: u64,
    /// Wire packets those frames became.
    pub segments: u64,
    /// Offloaded frames handed to a destination whole (both ends offload).
    pub offloaded: u64,
    /// Wire packets the kernel forwarded on a plain direction between
    /// kernel NICs (also in `frames_in` and `delivered`; a GSO frame there
    /// counts as its wire packets).
    pub kernel_path: u64,
}

pub(super) fn bump(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

pub(super) fn add(counter: &AtomicU64, n: u64) {
    counter.fetch_add(n, Ordering::Relaxed);
}

fn load(counter: &AtomicU64) -> u64 {
    counter.load(Ordering::Relaxed)
}

/// A struct of atomics mirroring a plain counter struct field for field,
/// with `read()` giving the plain one.
macro_rules! counter_cells {
    ($(#[$doc:meta])* $cells:ident => $plain:ident { $($field:ident),* $(,)? }) => {
        $(#[$doc])*
        #[derive(Default)]
        pub(super) struct $cells {
            $(pub(super) $field: AtomicU64,)*
        }

        impl $cells {
            pub(super) fn read(&self) -> $plain {
                $plain {
                    $($field: load(&self.$field),)*
                }
            }
        }
    };
}

counter_cells!(
    /// [`PortCounters`] as atomics, so that senders on different ports count
    /// into a shared destination without a lock.
    PortCounterCells => PortCounters {
        rx_packets, rx_bytes, tx_packets, tx_bytes, rx_dropped, tx_dropped, errors,
        offload_errors,
    }
);

counter_cells!(
    /// [`SwitchStats`] as atomics.
    SwitchStatCells => SwitchStats {
        frames_in, flooded, delivered, delayed, dropped_invalid, dropped_link_down,
        dropped_isolated, dropped_partition, dropped_impairment, dropped_rx_queue_full,
        dropped_delay_queue_full, dropped_hairpin, mac_evictions, segmented, segments,
        offloaded, kernel_path,
    }
);
