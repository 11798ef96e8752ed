//! virtio-net snapshot state.
//!
//! Saved: through the transport, the RX and TX queues; here, the MAC (checked
//! against the restoring VM's, since the guest's stack has it cached) and the
//! one frame that may wait inside the device for an RX buffer. Not saved:
//! the switch port and what waits in its queue (the restoring VM brings its
//! own port; frames in flight on a network may be lost, as on a real one),
//! the link status (it is the restoring port's: a device restored onto a
//! port that is down reports down) and the counters.

use serde::{Deserialize, Serialize};

use provium_netsetup::offload::OffloadMeta;
use provium_netsetup::VnetHdr;

use super::defs::MAX_FRAME_BYTES;
use crate::devices::virtio::persist::VirtioPersistError;

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::devices::virtio::persist::{decode_state, encode_state};

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
