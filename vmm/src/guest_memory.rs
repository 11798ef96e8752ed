//! The guest-memory type every layer of the VMM names.
//!
//! Devices read and write guest RAM through it and `vstate/` creates it;
//! it lives here, below both, so that the device models never import
//! `vstate/` to name the memory they are handed.

/// Guest memory as the rest of the VMM sees it.
pub type GuestMemoryMmap = vm_memory::GuestMemoryMmap<()>;
