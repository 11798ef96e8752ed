//! virtio-rng snapshot state.
//!
//! Saved: the seeded ChaCha20 stream's position (when `rng_seed` pinned it)
//! and the byte counter. Not saved: the seed itself (the restoring VM's
//! `rng_seed` decides: pinned, the stream continues from the saved
//! position; unpinned, the device is reseeded from the host) and host
//! entropy, which has no state.

use provium_snapshot::Persist;
use serde::{Deserialize, Serialize};

use super::active::{Active, Entropy, RngServer};
use crate::devices::virtio::persist::{check_queue_count, ActiveArgs, VirtioPersistError};

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

/// What an rng device's server is rebuilt from besides its state.
pub struct RngConstructorArgs {
    /// The restoring VM's source (its `rng_seed`): seeded, the saved stream
    /// position is taken over; host entropy has none.
    pub entropy: Entropy,
    /// The activation, when the device was activated at snapshot time.
    pub active: Option<ActiveArgs>,
}

/// Implemented by the device's [`RngServer`] (`active.rs`): the byte source
/// and counter, and the queue when activated. The features the driver
/// accepted are the device's, restored by the transport.
impl Persist for RngServer {
    type State = RngState;
    type ConstructorArgs = RngConstructorArgs;
    type Error = VirtioPersistError;

    fn save(&self) -> RngState {
        let word_pos = match &self.entropy {
            Entropy::Seeded(r) => Some(r.get_word_pos()),
            Entropy::Host => None,
        };
        RngState::new(word_pos, self.bytes_served)
    }

    fn restore(args: RngConstructorArgs, state: &RngState) -> Result<Self, Self::Error> {
        let mut entropy = args.entropy;
        // Reseeded unless this VM's rng_seed pins the stream: then it goes
        // on from where the snapshot left it, so a restored guest reads the
        // bytes the original would have read next.
        if let (Entropy::Seeded(r), Some(pos)) = (&mut entropy, state.word_pos()) {
            r.set_word_pos(pos);
        }
        let active = match args.active {
            Some(mut a) => {
                check_queue_count("virtio-rng", &a.queues, 1)?;
                Some(Active {
                    mem: a.mem,
                    queue: a.queues.remove(0),
                    interrupt: a.interrupt,
                })
            }
            None => None,
        };
        Ok(RngServer {
            entropy,
            bytes_served: state.bytes_served,
            active,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::devices::virtio::persist::{decode_state, encode_state};
    use crate::devices::virtio::rng::RngConfig;

    #[test]
    fn a_device_round_trips_through_save_encode_decode_restore() {
        let cfg = RngConfig { seed: Some(5) };
        let args = || RngConstructorArgs {
            entropy: Entropy::new(cfg),
            active: None,
        };
        let mut original = RngServer::new(Entropy::new(cfg));
        let mut first = [0u8; 64];
        original.entropy.fill(&mut first).expect("seeded");
        original.bytes_served = 64;
        let bytes = encode_state(&original.save());
        let decoded: RngState = decode_state("virtio-rng", &bytes).expect("decodes");
        let mut restored = RngServer::restore(args(), &decoded).expect("restores");
        assert_eq!(restored.save(), original.save());
        assert!(restored.active.is_none());
        // The restored stream goes on where the original's would.
        let (mut a, mut b) = ([0u8; 32], [0u8; 32]);
        original.entropy.fill(&mut a).expect("seeded");
        restored.entropy.fill(&mut b).expect("seeded");
        assert_eq!(a, b);
        assert_ne!(a[..], first[..32]);
    }

    #[test]
    fn state_round_trips() {
        let s = RngState::new(Some((7u128 << 64) | 9), 100);
        let back: RngState = decode_state("virtio-rng", &encode_state(&s)).expect("decodes");
        assert_eq!(back.word_pos(), Some((7u128 << 64) | 9));
        assert_eq!(back.bytes_served, 100);
        assert_eq!(RngState::new(None, 0).word_pos(), None);
    }
}
