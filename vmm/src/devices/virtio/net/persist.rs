//! virtio-net snapshot state.
//!
//! Saved: through the transport, the RX and TX queues; here, the MAC (checked
//! against the restoring VM's, since the guest's stack has it cached) and the
//! one frame that may wait inside the device for an RX buffer. Not saved:
//! the switch port and what waits in its queue (the restoring VM brings its
//! own port; frames in flight on a network may be lost, as on a real one),
//! the link status (it is the restoring port's: a device restored onto a
//! port that is down reports down) and the counters.
//!
//! `Persist` is implemented by the activated device's worker state
//! (`ActiveNet`, `active.rs`); a device that was never activated saves only its MAC.

use std::sync::Arc;

use provium_snapshot::Persist;
use serde::{Deserialize, Serialize};

use provium_netsetup::offload::OffloadMeta;
use provium_netsetup::VnetHdr;

use super::active::ActiveNet;
use super::defs::MAX_FRAME_BYTES;
use super::packet::NetQueues;
use crate::devices::virtio::persist::VirtioPersistError;
use crate::devices::virtio::VirtioInterrupt;

/// The net device's own state.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NetState {
    /// The MAC in config space.
    pub mac: [u8; 6],
    /// A frame taken from the port that no RX buffer has taken yet.
    /// Stored as msgpack `bin`, not an array of integers.
    #[serde(with = "serde_bytes")]
    pub pending_rx: Option<Vec<u8>>,
    /// The virtio-net header of the pending frame (offloads the switch left
    /// to the guest); all zero without offloads. Absent in older files.
    #[serde(default)]
    pub pending_rx_hdr: [u8; 10],
}

impl NetState {
    /// Checks what came from a file against the restoring device.
    pub fn validate(&self, mac: [u8; 6]) -> Result<(), VirtioPersistError> {
        let bad = |detail: String| VirtioPersistError::State {
            what: "virtio-net",
            detail,
        };
        if self.mac != mac {
            return Err(bad(format!(
                "MAC {:02x?} where this VM's NIC has {:02x?} (restore with the same bridges)",
                self.mac, mac
            )));
        }
        if let Some(f) = &self.pending_rx {
            if f.len() > MAX_FRAME_BYTES {
                return Err(bad(format!(
                    "a pending frame of {} bytes (at most {MAX_FRAME_BYTES})",
                    f.len()
                )));
            }
            let hdr = VnetHdr::from_bytes(&self.pending_rx_hdr).unwrap_or_default();
            if let Err(e) = OffloadMeta::parse(hdr, f) {
                return Err(bad(format!("the pending frame's offload header: {e}")));
            }
        }
        Ok(())
    }
}

/// What an activated net device is rebuilt from besides its state.
pub struct NetConstructorArgs {
    /// The restoring VM's MAC for this NIC (the file's must match).
    pub mac: [u8; 6],
    /// The queues, rebuilt and checked from the file, on the restoring port
    /// with the negotiated features.
    pub queues: NetQueues,
    /// The device's interrupt.
    pub interrupt: Arc<dyn VirtioInterrupt>,
}

impl Persist for ActiveNet {
    type State = NetState;
    type ConstructorArgs = NetConstructorArgs;
    type Error = VirtioPersistError;

    fn save(&self) -> NetState {
        let pending = self.queues.pending_rx();
        NetState {
            mac: self.mac,
            pending_rx: pending.map(|(_, f)| f.to_vec()),
            pending_rx_hdr: pending.map(|(h, _)| h.to_bytes()).unwrap_or_default(),
        }
    }

    fn restore(args: NetConstructorArgs, state: &NetState) -> Result<Self, Self::Error> {
        state.validate(args.mac)?;
        let mut queues = args.queues;
        let hdr = VnetHdr::from_bytes(&state.pending_rx_hdr).unwrap_or_default();
        queues.set_pending_rx(state.pending_rx.clone().map(|f| (hdr, f)));
        Ok(ActiveNet::new(args.mac, queues, args.interrupt)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::devices::virtio::net::packet::NetMetrics;
    use crate::devices::virtio::persist::{decode_state, encode_state};
    use crate::devices::virtio::test_utils::{guest_memory, CountingInterrupt};
    use provium_netsetup::{MacAddr, Switch, SwitchConfig};
    use virtio_queue::{Queue, QueueT};

    #[test]
    fn an_active_device_round_trips_through_save_encode_decode_restore() {
        const MAC: [u8; 6] = [2, 1, 2, 3, 4, 5];
        let switch = Switch::new("lan", SwitchConfig::default());
        let port = Arc::new(switch.attach("vm", MacAddr(MAC)).expect("attach"));
        let args = |mac: [u8; 6]| NetConstructorArgs {
            mac,
            queues: NetQueues::new(
                guest_memory(),
                Queue::new(16).expect("queue"),
                Queue::new(16).expect("queue"),
                port.clone(),
                12,
                Arc::new(NetMetrics::default()),
            ),
            interrupt: Arc::new(CountingInterrupt::default()),
        };
        let held = NetState {
            mac: MAC,
            pending_rx: Some(vec![0xab; 60]),
            pending_rx_hdr: [0; 10],
        };
        let original = ActiveNet::restore(args(MAC), &held).expect("restores");
        let bytes = encode_state(&original.save());
        let decoded: NetState = decode_state("virtio-net", &bytes).expect("decodes");
        let restored = ActiveNet::restore(args(MAC), &decoded).expect("restores");
        assert_eq!(restored.save(), held);
        // Restoring onto another NIC is refused.
        let e = ActiveNet::restore(args([2, 0, 0, 0, 0, 1]), &decoded)
            .err()
            .expect("refused")
            .to_string();
        assert!(e.contains("MAC"), "{e}");
    }

    #[test]
    fn state_round_trips_and_is_checked() {
        let s = NetState {
            mac: [2, 1, 2, 3, 4, 5],
            pending_rx: Some(vec![0xab; 60]),
            pending_rx_hdr: [0; 10],
        };
        let bytes = encode_state(&s);
        assert!(bytes.len() < 60 + 30, "the frame is stored as bytes");
        let back: NetState = decode_state("virtio-net", &bytes).expect("decodes");
        assert_eq!(back, s);
        back.validate([2, 1, 2, 3, 4, 5]).expect("valid");
        let e = back.validate([2, 0, 0, 0, 0, 1]).unwrap_err().to_string();
        assert!(e.contains("MAC"), "{e}");
        let huge = NetState {
            pending_rx: Some(vec![0; MAX_FRAME_BYTES + 1]),
            ..s
        };
        let back: NetState = decode_state("virtio-net", &encode_state(&huge)).expect("decodes");
        assert!(back.validate(huge.mac).is_err());
        // A file's offload header is as untrusted as a guest's.
        let bogus = NetState {
            pending_rx_hdr: [0, 0x42, 0, 0, 0, 0, 0, 0, 0, 0],
            ..s.clone()
        };
        let e = bogus.validate(bogus.mac).unwrap_err().to_string();
        assert!(e.contains("offload header"), "{e}");
        // A state written before the field existed still decodes.
        #[derive(serde::Serialize)]
        struct Old {
            mac: [u8; 6],
            #[serde(with = "serde_bytes")]
            pending_rx: Option<Vec<u8>>,
        }
        let old = encode_state(&Old {
            mac: s.mac,
            pending_rx: s.pending_rx.clone(),
        });
        let back: NetState = decode_state("virtio-net", &old).expect("old state decodes");
        assert_eq!(back, s);
    }
}
