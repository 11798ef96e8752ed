//! The parsers `provium kernel check` and every kvm boot run on a user's
//! kernel and module files: a bzImage setup header (and an ELF vmlinux's
//! banner) and a module's `.modinfo`. Any bytes: an error or a result, never
//! a panic, and no read outside the input.
#![no_main]

use libfuzzer_sys::fuzz_target;
use provium::kernel::{image, modinfo};

fuzz_target!(|data: &[u8]| {
    let _ = image::parse_image(data);
    if let Ok(info) = modinfo::parse_modinfo(data) {
        let _ = info.release();
    }
    let _ = modinfo::elf_section(data, ".modinfo");
});
