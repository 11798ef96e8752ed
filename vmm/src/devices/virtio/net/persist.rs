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
        };
        let bytes = encode_state(&s);
        assert!(bytes.len() < 60 + 16, "the frame is stored as bytes");
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
    }
}
