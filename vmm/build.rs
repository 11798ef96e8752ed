//! Builds the tiny test guest (DESIGN.md test tier 4) into OUT_DIR.
//!
//! No assembler is needed: `guest/asm.rs` encodes the few instructions the
//! guest uses, and `guest/tiny_guest.rs` packages them as a bzImage.

#[path = "guest/asm.rs"]
mod asm;
#[path = "guest/tiny_blk.rs"]
mod tiny_blk;
#[path = "guest/tiny_guest.rs"]
mod tiny_guest;
#[path = "guest/tiny_net.rs"]
mod tiny_net;
#[path = "guest/tiny_rng.rs"]
mod tiny_rng;
#[path = "guest/tiny_virtio.rs"]
mod tiny_virtio;
#[path = "guest/tiny_vsock.rs"]
mod tiny_vsock;

use std::path::PathBuf;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=guest");
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let guest = tiny_guest::build();
    std::fs::write(out.join("tiny_guest.bzImage"), &guest.bzimage).expect("write tiny guest");
    let consts = format!(
        "/// GPA where linux-loader places the tiny guest's protected-mode kernel.\n\
         pub const LOAD_ADDR: u64 = {:#x};\n\
         /// Offset of `startup_64` in the protected-mode kernel.\n\
         pub const STARTUP_64_OFFSET: u64 = {:#x};\n\
         /// Offset of the guest's u64 loop counter from `LOAD_ADDR`.\n\
         pub const COUNTER_OFFSET: u64 = {:#x};\n\
         /// Offset of the guest's kvmclock pvclock struct from `LOAD_ADDR`.\n\
         pub const PVCLOCK_OFFSET: u64 = {:#x};\n",
        tiny_guest::LOAD_ADDR,
        tiny_guest::STARTUP_64_OFFSET,
        guest.counter_offset,
        guest.pvclock_offset,
    );
    std::fs::write(out.join("tiny_guest_layout.rs"), consts).expect("write tiny guest layout");
}
