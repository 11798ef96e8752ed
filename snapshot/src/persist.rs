//! The save/restore contract every stateful component follows (style guide
//! §1, "The `persist` pattern"): plain serde `State`, live `ConstructorArgs`,
//! an infallible `save` and a `restore` that treats the state as untrusted.
//!
//! Implemented by provium-vmm's virtio devices, each in its `persist.rs`:
//! the active half of each device, in its own file (`ActiveBlock`,
//! `ActiveNet`, `ActiveConsole`, the vsock `Muxer`, the rng's `RngServer`). Their
//! `VirtioDevice::save`/`restore` (which the whole-VM snapshot in
//! `vmm/src/persist.rs` calls through the transport) encode and decode the
//! `State` and go through this trait.

/// Save/restore for one component (a device, the vCPUs, a sandbox's files).
pub trait Persist: Sized {
    /// Plain data only: no file descriptors, pointers or `Arc`s.
    type State;
    /// Live resources `restore` needs that cannot be serialized (guest
    /// memory, eventfds, backends).
    type ConstructorArgs;
    /// What `restore` refuses with.
    type Error;

    /// Capture the component's state. Cannot fail: everything it needs is
    /// in memory.
    fn save(&self) -> Self::State;

    /// Rebuild the component from `state`, which came from a file: validate
    /// every field (sizes, addresses, indices) before trusting it.
    fn restore(args: Self::ConstructorArgs, state: &Self::State) -> Result<Self, Self::Error>;
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A counter that refuses states above its bound: the shape every
    /// device's persist.rs follows.
    struct Counter {
        value: u32,
        max: u32,
    }

    impl Persist for Counter {
        type State = u32;
        type ConstructorArgs = u32;
        type Error = String;

        fn save(&self) -> u32 {
            self.value
        }

        fn restore(max: u32, state: &u32) -> Result<Self, String> {
            if *state > max {
                return Err(format!("counter {state} above its bound {max}"));
            }
            Ok(Counter { value: *state, max })
        }
    }

    #[test]
    fn save_then_restore_round_trips_and_validates() {
        let c = Counter { value: 7, max: 10 };
        let back = Counter::restore(c.max, &c.save()).unwrap();
        assert_eq!((back.value, back.max), (7, 10));
        assert_eq!(
            Counter::restore(5, &7).err().unwrap(),
            "counter 7 above its bound 5"
        );
    }
}
