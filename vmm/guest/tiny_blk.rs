//! The tiny guest's virtio-blk driver: console commands, each a short polled
//! sequence on the first device with DeviceID 2, brought up afresh (reset,
//! zeroed 4-entry queue) by `virtio_up` (`tiny_virtio.rs`). Requests are
//! header + data + status descriptors 0-2 on sector 1; the status byte is
//! preset to 0xff so a request the device never completed shows as `ff`.
//!
//! - `B<seed>` writes sector 1 with bytes seed, seed+1, ... (512), reads it
//!   back into a zeroed buffer and prints `BLK-RW w=<status> r=<status>
//!   data=<first 4 bytes read, hex> ok|bad` (`ok`: the 512 bytes read equal
//!   the ones written). With `eio_write` the write's status is 01 and the
//!   read returns the older data; with `eio_read` nothing is copied.
//! - `I` sends GET_ID and prints `BLK-ID s=<status> <id>`.
//! - `H` posts hostile chains and prints `BLK-HOSTILE oob=<status>/<used
//!   len> loop=<status>/<used len> good=<status> bad-ring=<device status>`:
//!   a header outside guest memory (1 TiB), a descriptor chained to itself,
//!   then a good read (the device still serves the queue), then a reset with
//!   the queue placed outside RAM, which the device must refuse with
//!   DEVICE_NEEDS_RESET (0x40) instead of going live.
//!
//! No device: `BLK-NONE`.

use crate::asm::{Asm, Cond, Reg};
use crate::tiny_virtio::{AVAIL, USED};

/// Console commands.
pub const CMD_BLK_RW: u8 = b'B';
pub const CMD_BLK_ID: u8 = b'I';
pub const CMD_BLK_HOSTILE: u8 = b'H';

/// Command bytes and their handlers, for the main loop's dispatch.
pub const COMMANDS: [(u8, &str); 3] = [
    (CMD_BLK_RW, "blk_rw"),
    (CMD_BLK_ID, "blk_id"),
    (CMD_BLK_HOSTILE, "blk_hostile"),
];

const VIRTIO_ID_BLOCK: u32 = 2;
/// The queue page, then a data page: header at +0, status at +0x10, the
/// write buffer at +0x200 and the read buffer right after it at +0x400.
const BLKQ: u32 = 0x31_0000;
const HDR: u32 = 0x1000;
const STATUS: u32 = 0x1010;
const WBUF: u32 = BLKQ + 0x1200;
const RBUF: u32 = BLKQ + 0x1400;
const SECTOR: u32 = 1;
const T_IN: u32 = 0;
const T_OUT: u32 = 1;
const T_GET_ID: u32 = 8;
/// Descriptor flags | next << 16, as the descriptor's last dword.
const NEXT: u32 = 1;
const WRITE: u32 = 2;
const DATA_TO_DEVICE: u32 = NEXT | (2 << 16);
const DATA_FROM_DEVICE: u32 = NEXT | WRITE | (2 << 16);
/// A GPA far outside the tiny guest's RAM (the descriptor address's high dword).
const OOB_HIGH_DWORD: u32 = 0x100; // 1 TiB
/// Queue page outside RAM (which is 32 MiB in the tests) for the NEEDS_RESET check.
const OOB_QUEUE: u32 = 0xF000_0000;

/// `EAX` = type, `EBX` = data GPA, `ECX` = data length, `EDX` = data
/// descriptor's flags | next << 16, for `blk_req`/`blk_desc`.
fn request(a: &mut Asm, kind: u32, buf: u32, len: u32, flags: u32) {
    a.mov_r32_imm(Reg::Rax, kind);
    a.mov_r32_imm(Reg::Rbx, buf);
    a.mov_r32_imm(Reg::Rcx, len);
    a.mov_r32_imm(Reg::Rdx, flags);
}

fn puts(a: &mut Asm, l: &'static str) {
    a.lea_rip(Reg::Rbx, l);
    a.call("puts");
}

/// Prints `<status>/<used len of used-ring entry i>` (EAX = status, RDI = BLKQ).
fn status_and_len(a: &mut Asm, i: u32) {
    a.call("puthex8");
    a.mov_al(b'/');
    a.call("putc");
    a.mov_r32_mem(Reg::Rax, Reg::Rdi, USED + 4 + 8 * i + 4);
    a.call("puthex32");
}

/// Prints `label`, posts a read whose descriptor table dword at `disp`
/// (from BLKQ) is then overwritten with `v`, and prints what came back as
/// used-ring entry `i`.
fn hostile_read(a: &mut Asm, label: &'static str, disp: u32, v: u32, i: u32) {
    puts(a, label);
    request(a, T_IN, RBUF, 512, DATA_FROM_DEVICE);
    a.call("blk_desc");
    a.mov_mem_imm32(Reg::Rdi, disp, v);
    a.call("blk_go");
    status_and_len(a, i);
}

/// Emits the handlers (each ends with `jmp main_loop`): `blk_rw`, `blk_id`,
/// `blk_hostile`.
pub fn emit(a: &mut Asm) {
    // blk_up: zeroes the read buffer (and the byte after it, so GET_ID's
    // 20 bytes print as a string), then brings the device up. RSI = window,
    // ZF=0 when there is none.
    a.label("blk_up");
    a.mov_r32_imm(Reg::Rdi, RBUF);
    a.mov_r32_imm(Reg::Rcx, 0x204);
    a.mov_al(0);
    a.rep_stosb();
    a.mov_r32_imm(Reg::Rcx, VIRTIO_ID_BLOCK);
    a.mov_r32_imm(Reg::Rbx, 0);
    a.mov_r32_imm(Reg::Rdi, BLKQ);
    a.mov_r32_imm(Reg::Rdx, 1);
    a.jmp("virtio_up");

    // blk_desc: writes descriptors 0-2 (see `request`); RDI = BLKQ.
    a.label("blk_desc");
    a.mov_r32_imm(Reg::Rdi, BLKQ);
    a.mov_mem_r32(Reg::Rdi, HDR, Reg::Rax);
    a.mov_mem_imm32(Reg::Rdi, HDR + 8, SECTOR);
    a.mov_mem_imm32(Reg::Rdi, HDR + 12, 0);
    a.mov_mem_imm32(Reg::Rdi, 0, BLKQ + HDR);
    a.mov_mem_imm32(Reg::Rdi, 4, 0);
    a.mov_mem_imm32(Reg::Rdi, 8, 16);
    a.mov_mem_imm32(Reg::Rdi, 12, NEXT | (1 << 16));
    a.mov_mem_r32(Reg::Rdi, 16, Reg::Rbx);
    a.mov_mem_r32(Reg::Rdi, 24, Reg::Rcx);
    a.mov_mem_r32(Reg::Rdi, 28, Reg::Rdx);
    a.mov_mem_imm32(Reg::Rdi, 32, BLKQ + STATUS);
    a.mov_mem_imm32(Reg::Rdi, 40, 1);
    a.mov_mem_imm32(Reg::Rdi, 44, WRITE);
    a.ret();

    // blk_req: blk_desc, then blk_go.
    a.label("blk_req");
    a.call("blk_desc");
    // blk_go: presets the status byte, offers chain 0 (every avail slot
    // holds head 0: the page was zeroed), notifies, waits until the used
    // index catches up. EAX = status byte. RDI = BLKQ, RSI = window.
    a.label("blk_go");
    a.mov_mem_imm32(Reg::Rdi, STATUS, 0xFF);
    a.inc_word_mem(Reg::Rdi, AVAIL + 2);
    a.mov_mem_imm32(Reg::Rsi, 0x50, 0);
    a.call("virtio_wait_used");
    a.movzx_r32_mem8(Reg::Rax, Reg::Rdi, STATUS);
    a.ret();

    a.label("blk_none");
    puts(a, "s_blk_none");
    a.jmp("main_loop");

    a.label("blk_rw");
    a.call("getc");
    a.mov_r32_imm(Reg::Rdi, WBUF);
    a.mov_r32_imm(Reg::Rcx, 512);
    a.label("blk_fill");
    a.stosb();
    a.inc_al();
    a.add_r32_imm(Reg::Rcx, 0xFFFF_FFFF); // dec ecx
    a.jcc(Cond::Nz, "blk_fill");
    a.call("blk_up");
    a.jcc(Cond::Nz, "blk_none");
    puts(a, "s_blk_rw");
    request(a, T_OUT, WBUF, 512, DATA_TO_DEVICE);
    a.call("blk_req");
    a.call("puthex8");
    puts(a, "s_blk_r");
    request(a, T_IN, RBUF, 512, DATA_FROM_DEVICE);
    a.call("blk_req");
    a.call("puthex8");
    puts(a, "s_blk_data");
    a.mov_r32_imm(Reg::Rbx, RBUF);
    a.mov_r32_imm(Reg::Rdi, 4);
    a.call("puthexbytes");
    // Compare all 512 bytes read with the ones written.
    a.mov_r32_imm(Reg::Rbx, WBUF);
    a.mov_r32_imm(Reg::Rcx, 512);
    a.label("blk_cmp");
    a.mov_al_at_rbx();
    a.cmp_al_mem(Reg::Rbx, RBUF - WBUF);
    a.jcc(Cond::Nz, "blk_bad");
    a.inc_rbx();
    a.add_r32_imm(Reg::Rcx, 0xFFFF_FFFF); // dec ecx
    a.jcc(Cond::Nz, "blk_cmp");
    puts(a, "s_blk_ok");
    a.jmp("main_loop");
    a.label("blk_bad");
    puts(a, "s_blk_bad");
    a.jmp("main_loop");

    a.label("blk_id");
    a.call("blk_up");
    a.jcc(Cond::Nz, "blk_none");
    puts(a, "s_blk_id");
    request(a, T_GET_ID, RBUF, 20, DATA_FROM_DEVICE);
    a.call("blk_req");
    a.call("puthex8");
    a.mov_al(b' ');
    a.call("putc");
    a.mov_r32_imm(Reg::Rbx, RBUF);
    a.call("puts");
    a.jmp("blk_newline");

    a.label("blk_hostile");
    a.call("blk_up");
    a.jcc(Cond::Nz, "blk_none");
    // A header address >= 1 TiB, then descriptor 0 chained to itself.
    hostile_read(a, "s_blk_oob", 4, OOB_HIGH_DWORD, 0);
    hostile_read(a, "s_blk_loop", 12, NEXT, 1);
    puts(a, "s_blk_good");
    request(a, T_IN, RBUF, 512, DATA_FROM_DEVICE);
    a.call("blk_req");
    a.call("puthex8");
    puts(a, "s_blk_badring");
    a.mov_r32_imm(Reg::Rbx, 0);
    a.mov_r32_imm(Reg::Rdi, OOB_QUEUE);
    a.mov_r32_imm(Reg::Rdx, 1);
    a.call("virtio_init");
    a.mov_r32_mem(Reg::Rax, Reg::Rsi, 0x70);
    a.call("puthex8");
    a.label("blk_newline");
    a.mov_al(b'\n');
    a.call("putc");
    a.jmp("main_loop");

    a.cstr("s_blk_none", "BLK-NONE\n");
    a.cstr("s_blk_rw", "BLK-RW w=");
    a.cstr("s_blk_r", " r=");
    a.cstr("s_blk_data", " data=");
    a.cstr("s_blk_ok", " ok\n");
    a.cstr("s_blk_bad", " bad\n");
    a.cstr("s_blk_id", "BLK-ID s=");
    a.cstr("s_blk_oob", "BLK-HOSTILE oob=");
    a.cstr("s_blk_loop", " loop=");
    a.cstr("s_blk_good", " good=");
    a.cstr("s_blk_badring", " bad-ring=");
}
