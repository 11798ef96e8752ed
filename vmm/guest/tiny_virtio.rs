//! Helpers the tiny guest's virtio drivers share (`tiny_net.rs`,
//! `tiny_blk.rs`, `tiny_rng.rs`): finding a virtio-mmio window by device ID,
//! bringing a device up with 4-entry split queues at fixed GPAs, reading a
//! console argument byte and printing bytes in hex.
//!
//! Queue layout (one 4 KiB page per queue): descriptor table at +0, avail
//! ring at +0x100, used ring at +0x200. All polled: the guest runs with IF=0.

use crate::asm::{Asm, Cond, Reg};

pub const MMIO0: u32 = 0xd000_0000;
/// virtio-mmio slots the device manager hands out (IRQs 5-23).
const MMIO_SLOTS: u32 = 19;
/// Offsets of the avail and used rings from a queue's descriptor table.
pub const AVAIL: u32 = 0x100;
pub const USED: u32 = 0x200;
/// Entries per queue.
const QUEUE_SIZE: u32 = 4;
const COM1: u32 = 0x3F8;
const COM1_LSR: u32 = COM1 + 5;

/// Emits a call of `virtio_up` for device `id` with driver `features`,
/// `queues` queues from page `queue0`, jumping to `none` when there is no
/// such device.
pub fn up(a: &mut Asm, id: u32, features: u32, queue0: u32, queues: u32, none: &'static str) {
    a.mov_r32_imm(Reg::Rcx, id);
    a.mov_r32_imm(Reg::Rbx, features);
    a.mov_r32_imm(Reg::Rdi, queue0);
    a.mov_r32_imm(Reg::Rdx, queues);
    a.call("virtio_up");
    a.jcc(Cond::Nz, none);
}

/// Emits `virtio_find`, `virtio_up`, `virtio_init`, `virtio_wait_used`,
/// `getc`, `puthexbytes`.
pub fn emit(a: &mut Asm) {
    // virtio_find: ECX = device ID. RSI = its window and ZF=1; ZF=0 when no
    // window has it. Clobbers EAX.
    a.label("virtio_find");
    a.mov_r32_imm(Reg::Rsi, MMIO0);
    a.label("virtio_find_loop");
    a.mov_r32_mem(Reg::Rax, Reg::Rsi, 8);
    a.cmp_r32_r32(Reg::Rax, Reg::Rcx);
    a.jcc(Cond::Z, "virtio_ret");
    a.add_r32_imm(Reg::Rsi, 0x1000);
    a.cmp_r32_imm(Reg::Rsi, MMIO0 + MMIO_SLOTS * 0x1000);
    a.jcc(Cond::B, "virtio_find_loop");
    a.cmp_r32_r32(Reg::Rax, Reg::Rcx); // EAX is not ECX here: ZF=0
    a.label("virtio_ret");
    a.ret();

    // virtio_up: ECX = device ID, EBX = driver features 0-31 (VERSION_1 is
    // always accepted), EDI = queue 0's page (queue i at +i*4 KiB), EDX =
    // queue count. Finds the device (ZF=0 when none), zeroes the queue pages
    // so no ring index survives from an earlier run, then `virtio_init`.
    a.label("virtio_up");
    a.call("virtio_find");
    a.jcc(Cond::Nz, "virtio_ret");
    a.push(Reg::Rdi);
    a.mov_r32_r32(Reg::Rcx, Reg::Rdx);
    a.shl_r32(Reg::Rcx, 12);
    a.mov_al(0);
    a.rep_stosb();
    a.pop(Reg::Rdi);
    // virtio_init: RSI = window, EBX/EDI/EDX as above, pages not touched
    // (the hostile check points a queue outside RAM). Resets the device,
    // negotiates, sets up the queues, sets DRIVER_OK; ZF=1. Clobbers ECX,
    // EDI (left past the last queue).
    a.label("virtio_init");
    a.mov_mem_imm32(Reg::Rsi, 0x70, 0); // reset
    a.mov_mem_imm32(Reg::Rsi, 0x70, 3); // ACKNOWLEDGE | DRIVER
    a.mov_mem_imm32(Reg::Rsi, 0x24, 1);
    a.mov_mem_imm32(Reg::Rsi, 0x20, 1); // VERSION_1 (bit 32)
    a.mov_mem_imm32(Reg::Rsi, 0x24, 0);
    a.mov_mem_r32(Reg::Rsi, 0x20, Reg::Rbx);
    a.mov_mem_imm32(Reg::Rsi, 0x70, 0xB); // FEATURES_OK
    a.mov_r32_imm(Reg::Rcx, 0);
    a.label("virtio_queue_loop");
    a.mov_mem_r32(Reg::Rsi, 0x30, Reg::Rcx);
    a.mov_mem_imm32(Reg::Rsi, 0x38, QUEUE_SIZE);
    a.mov_mem_r32(Reg::Rsi, 0x80, Reg::Rdi);
    a.add_r32_imm(Reg::Rdi, AVAIL);
    a.mov_mem_r32(Reg::Rsi, 0x90, Reg::Rdi);
    a.add_r32_imm(Reg::Rdi, USED - AVAIL);
    a.mov_mem_r32(Reg::Rsi, 0xA0, Reg::Rdi);
    a.add_r32_imm(Reg::Rdi, 0x1000 - USED);
    a.mov_mem_imm32(Reg::Rsi, 0x44, 1);
    a.add_r32_imm(Reg::Rcx, 1);
    a.cmp_r32_r32(Reg::Rcx, Reg::Rdx);
    a.jcc(Cond::Nz, "virtio_queue_loop");
    a.mov_mem_imm32(Reg::Rsi, 0x70, 0xF); // DRIVER_OK (mov keeps ZF=1)
    a.ret();

    // virtio_wait_used: RDI = a queue page; returns once the device has
    // used everything offered (used idx == avail idx). Clobbers EAX.
    a.label("virtio_wait_used");
    a.movzx_r32_mem16(Reg::Rax, Reg::Rdi, AVAIL + 2);
    a.cmp_r16_mem(Reg::Rax, Reg::Rdi, USED + 2);
    a.jcc(Cond::Nz, "virtio_wait_used");
    a.ret();

    // getc: waits for a console byte; AL = it. Clobbers EDX.
    a.label("getc");
    a.mov_r32_imm(Reg::Rdx, COM1_LSR);
    a.in_al_dx();
    a.test_al(0x01);
    a.jcc(Cond::Z, "getc");
    a.mov_r32_imm(Reg::Rdx, COM1);
    a.in_al_dx();
    a.ret();

    // puthexbytes: EDI bytes from RBX, each as 2 hex digits, in memory
    // order. Clobbers EAX, RBX, ECX, EDX, EDI.
    a.label("puthexbytes");
    a.movzx_r32_mem8(Reg::Rax, Reg::Rbx, 0);
    a.call("puthex8");
    a.inc_rbx();
    a.add_r32_imm(Reg::Rdi, 0xFFFF_FFFF); // dec edi
    a.jcc(Cond::Nz, "puthexbytes");
    a.ret();
}
