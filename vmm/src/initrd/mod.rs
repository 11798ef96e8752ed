//! Initrds the VMM makes or changes: the newc cpio format (`cpio`) and the
//! agent overlay appended to a profile's initrd (`inject`).

pub mod cpio;
pub mod inject;

pub use cpio::{CpioEntry, CpioError, CpioWriter};
pub use inject::{inject_agent, AgentInjection, BootFile, InjectError};
