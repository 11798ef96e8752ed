//! Guest vsock CIDs for one run. 0-2 are reserved; each VM a backend makes
//! gets the next one. The allocator lives in the run's backend value (no
//! process-wide counter): two runs in one process (tests) count on their own.
//! Our vsock is userspace (one device per VM), so CIDs never collide across
//! processes; within a run they tell VMs apart in events.

use std::sync::atomic::{AtomicU32, Ordering};

/// Hands out guest CIDs, from [`CidAllocator::FIRST`] up.
#[derive(Debug)]
pub struct CidAllocator {
    next: AtomicU32,
}

impl CidAllocator {
    /// The first CID a guest may have (0-2 are the hypervisor's, reserved
    /// and the host's).
    pub const FIRST: u32 = 3;

    pub fn new() -> CidAllocator {
        CidAllocator {
            next: AtomicU32::new(CidAllocator::FIRST),
        }
    }

    /// The next unused CID.
    pub fn allocate(&self) -> u32 {
        self.next.fetch_add(1, Ordering::Relaxed)
    }
}

impl Default for CidAllocator {
    fn default() -> Self {
        CidAllocator::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cids_start_at_three_and_each_allocator_counts_alone() {
        let a = CidAllocator::new();
        assert_eq!((a.allocate(), a.allocate()), (3, 4));
        let b = CidAllocator::default();
        assert_eq!(b.allocate(), 3, "another run starts over");
        assert_eq!(a.allocate(), 5);
    }
}
