//! Prepared KVM VMs: guest RAM and a KVM VM with that RAM registered, its
//! irqchip and PIT made, built ahead of the boot that will use them.
//!
//! Why: registering guest RAM as a memory slot ends in an expedited SRCU
//! grace period of the new VM, which the VMM sleeps through until a kernel
//! worker has run (docs/benchmarking.md, "Where vmm_setup goes"). That
//! wait is most of a cold boot's VMM setup: about 1 ms of our own work
//! against 5-10 ms of waiting on a loaded host, and it is not ours to
//! shorten. A caller that boots VMs one after another (a test run, `bench
//! boot`) gives each [`VmConfig`](crate::VmConfig) the same
//! [`PreparedVms`]; a boot then takes a VM prepared while the previous
//! guest ran, and the next one is prepared on a thread of the pool's
//! while this guest boots. The first boot of a size, and a boot that comes
//! before its VM is ready, build their own as before: the pool never makes
//! a boot wait for it.
//!
//! What a prepared VM holds is exactly what a boot would build first, and
//! nothing of any guest: fresh zero RAM (an untouched memfd, no resident
//! pages) and a VM without vCPUs or devices beyond the irqchip and PIT. A
//! pool keeps at most one per RAM size, so an idle pool costs a VM's
//! kernel objects per size, not guest memory. A restore does not use it:
//! its RAM is the snapshot's image, mapped where the VM is made.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use super::kvm::{KvmContext, KvmError};
use super::memory::{create_guest_ram, GuestRam, MemoryError};
use super::vm::{KvmVm, KvmVmError};

/// Why a pool stopped preparing VMs (each boot then builds its own).
#[derive(Debug, thiserror::Error)]
pub enum PrepareError {
    /// `/dev/kvm` could not be opened for the pool.
    #[error("cannot open /dev/kvm for prepared VMs")]
    Kvm(#[source] KvmError),
    /// The guest RAM could not be made.
    #[error("cannot make guest RAM for a prepared VM")]
    Memory(#[source] MemoryError),
    /// The KVM VM could not be made.
    #[error("cannot make a prepared KVM VM")]
    Vm(#[source] KvmVmError),
    /// The refill thread could not start.
    #[error("cannot start the thread that prepares VMs")]
    Thread(#[source] std::io::Error),
}

/// How many RAM sizes a pool keeps a prepared VM for: a run boots a few
/// machine sizes, and each kept VM holds kernel objects while idle.
const SIZES_KEPT: usize = 4;

/// Guest RAM with its KVM VM, registered and ready for a boot.
pub(crate) struct PreparedVm {
    /// Declared before `ram`: the VM, whose memory slots point into `ram`,
    /// goes first.
    pub(crate) vm: KvmVm,
    pub(crate) ram: GuestRam,
}

/// A pool of [`PreparedVm`]s, one per RAM size, refilled in the
/// background after each take (module docs). Clones share the pool.
#[derive(Clone, Default)]
pub struct PreparedVms {
    shared: Arc<Mutex<Pool>>,
}

#[derive(Default)]
struct Pool {
    /// Opened by the first refill, on its thread: `KvmContext::open` asks
    /// the kernel for the supported CPUID, which is slow under an
    /// emulating KVM.
    kvm: Option<Arc<KvmContext>>,
    ready: HashMap<u64, PreparedVm>,
    /// Sizes a refill thread is preparing now.
    preparing: Vec<u64>,
    /// Why the last refill failed, if it did: the pool then stops
    /// refilling (each boot builds its own, as without a pool).
    failed: Option<Arc<PrepareError>>,
    /// Takes that found a VM ready, and those that did not.
    hits: u64,
    misses: u64,
}

impl std::fmt::Debug for PreparedVms {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let pool = self.lock();
        f.debug_struct("PreparedVms")
            .field("ready_sizes", &pool.ready.keys().collect::<Vec<_>>())
            .field("failed", &pool.failed)
            .finish()
    }
}

impl PreparedVms {
    /// An empty pool; it fills as boots take from it.
    pub fn new() -> PreparedVms {
        PreparedVms::default()
    }

    fn lock(&self) -> MutexGuard<'_, Pool> {
        self.shared.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The prepared VM with `mem_bytes` of RAM, if one is ready; either way
    /// the next one of that size starts being prepared.
    pub(crate) fn take(&self, mem_bytes: u64) -> Option<PreparedVm> {
        let taken = {
            let mut pool = self.lock();
            let taken = pool.ready.remove(&mem_bytes);
            match taken {
                Some(_) => pool.hits += 1,
                None => pool.misses += 1,
            }
            taken
        };
        self.refill(mem_bytes);
        taken
    }

    /// Whether a VM with `mem_bytes` of RAM is ready now (for tests and
    /// benches that wait for the pool before timing a boot).
    pub fn is_ready(&self, mem_bytes: u64) -> bool {
        self.lock().ready.contains_key(&mem_bytes)
    }

    /// How many boots took a prepared VM, and how many built their own.
    pub fn hits_and_misses(&self) -> (u64, u64) {
        let pool = self.lock();
        (pool.hits, pool.misses)
    }

    /// Why the pool stopped preparing VMs, if it did.
    pub fn failure(&self) -> Option<Arc<PrepareError>> {
        self.lock().failed.clone()
    }

    /// Starts preparing a VM of `mem_bytes` on a thread of its own, unless
    /// one is ready or being prepared, the pool failed before, or it keeps
    /// [`SIZES_KEPT`] other sizes already.
    fn refill(&self, mem_bytes: u64) {
        {
            let mut pool = self.lock();
            let sizes = pool.ready.len() + pool.preparing.len();
            if pool.failed.is_some()
                || pool.ready.contains_key(&mem_bytes)
                || pool.preparing.contains(&mem_bytes)
                || sizes >= SIZES_KEPT
            {
                return;
            }
            pool.preparing.push(mem_bytes);
        }
        let pool = self.clone();
        let spawned = std::thread::Builder::new()
            .name("vm-prepare".into())
            .spawn(move || pool.prepare(mem_bytes));
        if let Err(e) = spawned {
            let mut pool = self.lock();
            pool.preparing.retain(|s| *s != mem_bytes);
            pool.failed = Some(Arc::new(PrepareError::Thread(e)));
        }
    }

    /// Builds one VM of `mem_bytes` (on the refill thread) and puts it in
    /// the pool.
    fn prepare(&self, mem_bytes: u64) {
        let built = self.kvm().and_then(|kvm| {
            let ram = create_guest_ram(mem_bytes).map_err(PrepareError::Memory)?;
            let vm = KvmVm::with_memory(&kvm, &ram.memory).map_err(PrepareError::Vm)?;
            Ok(PreparedVm { vm, ram })
        });
        let mut pool = self.lock();
        pool.preparing.retain(|s| *s != mem_bytes);
        match built {
            Ok(vm) => {
                pool.ready.insert(mem_bytes, vm);
            }
            Err(why) => pool.failed = Some(Arc::new(why)),
        }
    }

    /// The pool's `/dev/kvm` handle, opened on first use.
    fn kvm(&self) -> Result<Arc<KvmContext>, PrepareError> {
        if let Some(kvm) = &self.lock().kvm {
            return Ok(kvm.clone());
        }
        let opened = Arc::new(KvmContext::open().map_err(PrepareError::Kvm)?);
        Ok(self.lock().kvm.get_or_insert(opened).clone())
    }
}
