//! virtio-rng snapshot state.
//!
//! Saved: the seeded ChaCha20 stream's position (when `rng_seed` pinned it)
//! and the byte counter. Not saved: the seed itself (the restoring VM's
//! `rng_seed` decides: pinned, the stream continues from the saved
//! position; unpinned, the device is reseeded from the host) and host
//! entropy, which has no state.

use serde::{Deserialize, Serialize};

/// The rng's own state.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RngState {
    /// ChaCha20 word position (a 68-bit count), low and high 64 bits;
    /// `None` for a host-entropy device.
    pub word_pos: Option<(u64, u64)>,
    /// Bytes served so far.
    pub bytes_served: u64,
}

impl RngState {
    /// State for a stream at `word_pos` (if seeded).
    pub fn new(word_pos: Option<u128>, bytes_served: u64) -> RngState {
        RngState {
            // Split on purpose: msgpack has no 128-bit integers.
            #[allow(clippy::cast_possible_truncation)]
            word_pos: word_pos.map(|p| (p as u64, (p >> 64) as u64)),
            bytes_served,
        }
    }

    /// The stream position, if seeded.
    pub fn word_pos(&self) -> Option<u128> {
        self.word_pos
            .map(|(lo, hi)| u128::from(lo) | (u128::from(hi) << 64))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::devices::virtio::persist::{decode_state, encode_state};

    #[test]
    fn state_round_trips() {
        let s = RngState::new(Some((7u128 << 64) | 9), 100);
        let back: RngState = decode_state("virtio-rng", &encode_state(&s)).expect("decodes");
        assert_eq!(back.word_pos(), Some((7u128 << 64) | 9));
        assert_eq!(back.bytes_served, 100);
        assert_eq!(RngState::new(None, 0).word_pos(), None);
    }
}
