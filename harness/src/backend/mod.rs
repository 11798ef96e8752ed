//! Backends: the ways a test VM is created. `local` runs the agent in fresh
//! namespaces on the host; `kvm` (the product) boots a guest on our VMM.

pub mod kvm;
pub mod local;
