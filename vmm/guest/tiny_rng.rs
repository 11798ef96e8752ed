//! The tiny guest's virtio-rng driver: one console command.
//!
//! - `G` brings up the first device with DeviceID 4 (`virtio_up`, a fresh
//!   zeroed 4-entry queue), posts one 16-byte device-writable buffer, waits
//!   for the used ring and prints `RNG len=<used length, hex32>
//!   bytes=<the 16 bytes, hex, in memory order>`.
//!
//! No device: `RNG-NONE`.

use crate::asm::{Asm, Cond, Reg};
use crate::tiny_virtio::{self, AVAIL, USED};

/// Console command.
pub const CMD_RNG: u8 = b'G';
/// Command bytes and their handlers, for the main loop's dispatch.
pub const COMMANDS: [(u8, &str); 1] = [(CMD_RNG, "rng_read")];
/// Bytes requested per command.
pub const RNG_BYTES: u32 = 16;

const VIRTIO_ID_RNG: u32 = 4;
const RNGQ: u32 = 0x32_0000;
const RNG_BUF: u32 = RNGQ + 0x1000;
/// Avail/used ring's first dword once idx = 1 and flags = 0.
const IDX_ONE: u32 = 0x0001_0000;

/// Emits `rng_read` (ends with `jmp main_loop`).
pub fn emit(a: &mut Asm) {
    a.label("rng_read");
    tiny_virtio::up(a, VIRTIO_ID_RNG, 0, RNGQ, 1, "rng_none");
    a.mov_r32_imm(Reg::Rdi, RNGQ);
    a.mov_mem_imm32(Reg::Rdi, 0, RNG_BUF);
    a.mov_mem_imm32(Reg::Rdi, 8, RNG_BYTES);
    a.mov_mem_imm32(Reg::Rdi, 12, 2); // WRITE
    a.mov_mem_imm32(Reg::Rdi, AVAIL, IDX_ONE);
    a.mov_mem_imm32(Reg::Rsi, 0x50, 0);
    a.label("rng_wait");
    a.movzx_r32_mem16(Reg::Rax, Reg::Rdi, USED + 2);
    a.cmp_eax(1);
    a.jcc(Cond::Nz, "rng_wait");
    a.lea_rip(Reg::Rbx, "s_rng");
    a.call("puts");
    a.mov_r32_mem(Reg::Rax, Reg::Rdi, USED + 8);
    a.call("puthex32");
    a.lea_rip(Reg::Rbx, "s_rng_bytes");
    a.call("puts");
    a.mov_r32_imm(Reg::Rbx, RNG_BUF);
    a.mov_r32_imm(Reg::Rdi, RNG_BYTES);
    a.call("puthexbytes");
    a.mov_al(b'\n');
    a.call("putc");
    a.jmp("main_loop");

    a.label("rng_none");
    a.lea_rip(Reg::Rbx, "s_rng_none");
    a.call("puts");
    a.jmp("main_loop");

    a.cstr("s_rng", "RNG len=");
    a.cstr("s_rng_bytes", " bytes=");
    a.cstr("s_rng_none", "RNG-NONE\n");
}
