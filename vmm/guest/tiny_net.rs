//! The tiny guest's virtio-net driver: three console commands, each a short
//! polled sequence (no interrupts: the guest runs with IF=0).
//!
//! - `N` finds the first virtio-mmio window whose DeviceID is 1 (net), resets
//!   it, negotiates VERSION_1 | MAC | STATUS, sets up a 4-entry RX queue and TX
//!   queue at fixed GPAs, sets DRIVER_OK, posts one 2 KiB RX buffer, copies the
//!   MAC from config space into the source of a broadcast frame (ethertype
//!   0x88b5, payload `TX_PAYLOAD`) and transmits it, waits for the TX used
//!   ring, then prints `NET-UP status=<config status, 2 hex digits>`.
//! - `M` waits for the RX used ring, then prints `NET-RX <payload>`: the
//!   received frame's bytes after the Ethernet header, as a NUL-terminated
//!   string.
//! - `L` prints `NET-LINK cfg-irq=<InterruptStatus & 2> status=<status>` and
//!   acknowledges the interrupt, so a link change between two `L`s shows as
//!   `cfg-irq=02`.
//!
//! No device found: `NET-NONE`. Kept small: this code is emulated.

use crate::asm::{Asm, Cond, Reg};
use crate::tiny_virtio::{self, AVAIL, USED};

/// Console commands.
pub const CMD_NET_UP: u8 = b'N';
pub const CMD_NET_RX: u8 = b'M';
pub const CMD_NET_LINK: u8 = b'L';
/// The payload of the frame the guest sends.
pub const TX_PAYLOAD: &str = "PROVIUM-TINY-NET-TX";

const VIRTIO_ID_NET: u32 = 1;
/// Queue pages (`tiny_virtio.rs` layout: TX must follow RX).
const RXQ: u32 = 0x30_0000;
const TXQ: u32 = RXQ + 0x1000;
pub const RX_BUF: u32 = 0x30_2000;
const RX_BUF_BYTES: u32 = 2048;
/// virtio-net header (VERSION_1) + Ethernet header.
const HDR: u32 = 12;
const ETH: u32 = 14;
const TX_FRAME_BYTES: u32 = HDR + 60;
/// Used (or avail) ring's first dword once idx = 1 and flags = 0.
const IDX_ONE: u32 = 0x0001_0000;

/// Emits the three command handlers (each ends with `jmp main_loop`) and
/// their data. The main loop jumps to `net_up`, `net_rx`, `net_link`.
pub fn emit(a: &mut Asm) {
    a.label("net_none");
    a.lea_rip(Reg::Rbx, "s_net_none");
    a.call("puts");
    a.jmp("main_loop");

    a.label("net_up");
    // RX is queue 0 at RXQ, TX queue 1 at TXQ (the next page).
    const MAC_STATUS: u32 = (1 << 5) | (1 << 16);
    tiny_virtio::up(a, VIRTIO_ID_NET, MAC_STATUS, RXQ, 2, "net_none");
    // RX: descriptor 0 = the 2 KiB buffer, device-writable; avail idx 1.
    a.mov_r32_imm(Reg::Rdi, RXQ);
    a.mov_mem_imm32(Reg::Rdi, 0, RX_BUF);
    a.mov_mem_imm32(Reg::Rdi, 8, RX_BUF_BYTES);
    a.mov_mem_imm32(Reg::Rdi, 12, 2); // flags WRITE, next 0
    a.mov_mem_imm32(Reg::Rdi, AVAIL, IDX_ONE);
    a.mov_mem_imm32(Reg::Rsi, 0x50, 0);
    // TX: our MAC (config space) as the frame's source.
    a.lea_rip(Reg::Rbx, "net_frame");
    a.mov_r32_mem(Reg::Rax, Reg::Rsi, 0x100);
    a.mov_mem_r32(Reg::Rbx, HDR + 6, Reg::Rax);
    a.movzx_r32_mem16(Reg::Rax, Reg::Rsi, 0x104);
    a.mov_mem_ax(Reg::Rbx, HDR + 10);
    a.mov_r32_imm(Reg::Rdi, TXQ);
    a.mov_mem_r64(Reg::Rdi, 0, Reg::Rbx);
    a.mov_mem_imm32(Reg::Rdi, 8, TX_FRAME_BYTES);
    a.mov_mem_imm32(Reg::Rdi, AVAIL, IDX_ONE);
    a.mov_mem_imm32(Reg::Rsi, 0x50, 1);
    a.label("net_tx_wait");
    a.mov_r32_mem(Reg::Rax, Reg::Rdi, USED);
    a.cmp_eax(IDX_ONE);
    a.jcc(Cond::Nz, "net_tx_wait");
    a.lea_rip(Reg::Rbx, "s_net_up");
    a.call("puts");
    a.jmp("net_print_status");

    a.label("net_rx");
    a.mov_r32_imm(Reg::Rdi, RXQ);
    a.label("net_rx_wait");
    a.mov_r32_mem(Reg::Rax, Reg::Rdi, USED);
    a.cmp_eax(IDX_ONE);
    a.jcc(Cond::Nz, "net_rx_wait");
    a.lea_rip(Reg::Rbx, "s_net_rx");
    a.call("puts");
    a.mov_r32_imm(Reg::Rbx, RX_BUF + HDR + ETH);
    a.call("puts");
    a.mov_al(b'\n');
    a.call("putc");
    a.jmp("main_loop");

    a.label("net_link");
    a.mov_r32_imm(Reg::Rcx, VIRTIO_ID_NET);
    a.call("virtio_find");
    a.jcc(Cond::Nz, "net_none");
    a.lea_rip(Reg::Rbx, "s_net_link");
    a.call("puts");
    a.mov_r32_mem(Reg::Rax, Reg::Rsi, 0x60);
    a.and_al(2); // configuration change
    a.call("puthex8");
    a.mov_mem_imm32(Reg::Rsi, 0x64, 3);
    a.lea_rip(Reg::Rbx, "s_net_status");
    a.call("puts");
    // Shared tail: `<status>\n`, then back to the loop.
    a.label("net_print_status");
    a.movzx_r32_mem16(Reg::Rax, Reg::Rsi, 0x106);
    a.call("puthex8");
    a.mov_al(b'\n');
    a.call("putc");
    a.jmp("main_loop");

    a.cstr("s_net_none", "NET-NONE\n");
    a.cstr("s_net_up", "NET-UP status=");
    a.cstr("s_net_rx", "NET-RX ");
    a.cstr("s_net_link", "NET-LINK cfg-irq=");
    a.cstr("s_net_status", " status=");
    // The TX buffer: header (zeros: no offloads), broadcast destination,
    // source filled in from config space, ethertype 0x88b5, payload.
    a.label("net_frame");
    let start = a.offset();
    a.bytes(&[0; HDR as usize]);
    a.bytes(&[0xFF; 6]);
    a.bytes(&[0; 6]);
    a.bytes(&[0x88, 0xB5]);
    a.bytes(TX_PAYLOAD.as_bytes());
    while a.offset() < start + TX_FRAME_BYTES as usize {
        a.bytes(&[0]);
    }
}
