//! The open whole-bridge captures a bridge keeps: the layer above makes
//! them (the Lua layer's `bridge:capture()` stream) and registers them
//! ([`LiveCapture`]), and each VM on the bridge counts them as its own open
//! streams, which block its snapshot. A NIC's own capture is
//! `Bridge::capture_nic`.

use std::sync::{Arc, Mutex};

use crate::lock::Locked;

/// An open whole-bridge capture as the layer that made it holds it.
pub trait LiveCapture: Send + Sync {
    /// Still open (a closed one is forgotten).
    fn is_open(&self) -> bool;
    /// How a VM's open streams list it: `kind(detail) at file:line`.
    fn live_label(&self) -> String;
}

/// A bridge's open whole-bridge captures. A lock of its own: a VM reads it
/// while holding its state lock.
#[derive(Default)]
pub struct LiveCaptures(Mutex<Vec<Arc<dyn LiveCapture>>>);

impl LiveCaptures {
    /// Keeps `c` (and forgets the closed ones).
    pub fn add(&self, c: Arc<dyn LiveCapture>) {
        let mut caps = self.0.locked();
        caps.retain(|c| c.is_open());
        caps.push(c);
    }

    /// The labels of the open ones, in the order they were made.
    pub fn labels(&self) -> Vec<String> {
        let mut caps = self.0.locked();
        caps.retain(|c| c.is_open());
        caps.iter().map(|c| c.live_label()).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};

    /// A capture the test opens and closes.
    struct Fake {
        label: &'static str,
        open: AtomicBool,
    }

    impl LiveCapture for Fake {
        fn is_open(&self) -> bool {
            self.open.load(Ordering::SeqCst)
        }
        fn live_label(&self) -> String {
            self.label.to_owned()
        }
    }

    fn fake(label: &'static str) -> Arc<Fake> {
        Arc::new(Fake {
            label,
            open: AtomicBool::new(true),
        })
    }

    #[test]
    fn only_open_captures_are_listed_in_the_order_made() {
        let caps = LiveCaptures::default();
        let (a, b, c) = (fake("a"), fake("b"), fake("c"));
        caps.add(a.clone());
        caps.add(b.clone());
        caps.add(c.clone());
        assert_eq!(caps.labels(), ["a", "b", "c"]);
        b.open.store(false, Ordering::SeqCst);
        assert_eq!(caps.labels(), ["a", "c"]);
        // A closed one is forgotten: reopening it does not bring it back.
        b.open.store(true, Ordering::SeqCst);
        assert_eq!(caps.labels(), ["a", "c"]);
    }
}
