//! The tiny guest's virtio-vsock driver: console commands, polled, on the
//! first device with DeviceID 19 (queues: RX 0, TX 1, event 2).
//!
//! - `V` brings the device up afresh (`virtio_up`), offers four 256-byte RX
//!   buffers, sends OP_REQUEST from guest port `GUEST_PORT` to host (CID 2)
//!   port `HOST_PORT`, prints the answer as below (`op=02`: RESPONSE), then
//!   sends OP_RW with `TX_PAYLOAD`.
//! - `X` waits for the next packet on RX and prints `VSOCK-RX op=<op, 2 hex
//!   digits> port=<its dst port, hex32> <its payload>`.
//! - `A` takes the next packet (the host's OP_REQUEST), prints it as `X`
//!   does, answers OP_RESPONSE on that connection and sends OP_RW with
//!   `TX_PAYLOAD` on it.
//!
//! Every TX packet advertises buf_alloc 4 KiB and fwd_cnt 0: enough credit
//! for the few bytes the tests send. RX buffers are re-offered once the
//! packet in them was printed (`vs_next`). No device: `VSOCK-NONE`.

use crate::asm::{Asm, Cond, Reg};
use crate::tiny_virtio::{self, AVAIL, USED};

/// Console commands.
pub const CMD_VSOCK_CONNECT: u8 = b'V';
pub const CMD_VSOCK_RECV: u8 = b'X';
pub const CMD_VSOCK_ACCEPT: u8 = b'A';
/// Command bytes and their handlers, for the main loop's dispatch.
pub const COMMANDS: [(u8, &str); 3] = [
    (CMD_VSOCK_CONNECT, "vs_connect"),
    (CMD_VSOCK_RECV, "vs_recv"),
    (CMD_VSOCK_ACCEPT, "vs_accept"),
];
/// The host port `V` connects to, from guest port `GUEST_PORT`.
pub const HOST_PORT: u32 = 1024;
pub const GUEST_PORT: u32 = 0x500;
/// What the guest sends on each connection.
pub const TX_PAYLOAD: &str = "PROVIUM-TINY-VSOCK-TX";

const VIRTIO_ID_VSOCK: u32 = 19;
/// RX, TX and event queue pages, then the RX buffers.
const RXQ: u32 = 0x33_0000;
const TXQ: u32 = RXQ + 0x1000;
const RXBUF: u32 = RXQ + 0x3000;
const RXBUF_BYTES: u32 = 0x100;
/// Packets taken from RX so far (u16, in the zeroed RX queue page).
const RX_TAKEN: u32 = 0x800;
/// virtio_vsock_hdr (virtio 1.2, 5.10.6) field offsets.
const HDR_BYTES: u32 = 44;
const SRC_CID: u32 = 0;
const SRC_PORT: u32 = 16;
const DST_PORT: u32 = 20;
const LEN: u32 = 24;
const OP: u32 = 30;
const OP_REQUEST: u32 = 1;
const OP_RESPONSE: u32 = 2;
const OP_RW: u32 = 5;
const PAYLOAD_LEN: u32 = TX_PAYLOAD.len() as u32;

fn set_ports(a: &mut Asm, src: Reg, dst: Reg) {
    a.lea_rip(Reg::Rbx, "vs_pkt");
    a.mov_mem_r32(Reg::Rbx, SRC_PORT, src);
    a.mov_mem_r32(Reg::Rbx, DST_PORT, dst);
}

/// `vs_send` with op `op` and `len` payload bytes.
fn send(a: &mut Asm, op: u32, len: u32) {
    a.mov_r32_imm(Reg::Rax, op);
    a.mov_r32_imm(Reg::Rdx, len);
    a.call("vs_send");
}

/// Emits the handlers (each ends with `jmp main_loop`).
pub fn emit(a: &mut Asm) {
    // vs_send: EAX = op, EDX = payload length; sends `vs_pkt` on TX and
    // waits until the device took it. RSI = window.
    a.label("vs_send");
    a.lea_rip(Reg::Rbx, "vs_pkt");
    a.mov_mem_r32(Reg::Rbx, OP, Reg::Rax); // op, flags 0
    a.mov_mem_r32(Reg::Rbx, LEN, Reg::Rdx);
    a.mov_r32_imm(Reg::Rdi, TXQ);
    a.mov_mem_r64(Reg::Rdi, 0, Reg::Rbx);
    a.add_r32_imm(Reg::Rdx, HDR_BYTES);
    a.mov_mem_r32(Reg::Rdi, 8, Reg::Rdx);
    a.inc_word_mem(Reg::Rdi, AVAIL + 2);
    a.mov_mem_imm32(Reg::Rsi, 0x50, 1);
    a.jmp("virtio_wait_used");

    // vs_next: re-offers the RX buffers of every packet taken so far (the
    // avail ring holds heads 0-3 in slots 0-3, so the index is all that
    // moves), waits for the next packet and prints it. RBX = its buffer.
    a.label("vs_next");
    a.mov_r32_imm(Reg::Rdi, RXQ);
    a.movzx_r32_mem16(Reg::Rax, Reg::Rdi, RX_TAKEN);
    a.add_r32_imm(Reg::Rax, 4);
    a.mov_mem_ax(Reg::Rdi, AVAIL + 2);
    a.mov_mem_imm32(Reg::Rsi, 0x50, 0);
    a.label("vs_next_wait");
    a.movzx_r32_mem16(Reg::Rax, Reg::Rdi, USED + 2);
    a.cmp_r16_mem(Reg::Rax, Reg::Rdi, RX_TAKEN);
    a.jcc(Cond::Z, "vs_next_wait");
    a.movzx_r32_mem16(Reg::Rax, Reg::Rdi, RX_TAKEN);
    a.inc_word_mem(Reg::Rdi, RX_TAKEN);
    a.and_r32_imm(Reg::Rax, 3);
    a.shl_r32(Reg::Rax, 8);
    a.add_r32_imm(Reg::Rax, RXBUF);
    a.push(Reg::Rax);
    // `<label><field of the header, hex>`; RBX = the buffer again after.
    for (label, field, wide) in [("s_vs_rx", OP, false), ("s_vs_port", DST_PORT, true)] {
        a.lea_rip(Reg::Rbx, label);
        a.call("puts");
        a.pop(Reg::Rbx);
        a.push(Reg::Rbx);
        if wide {
            a.mov_r32_mem(Reg::Rax, Reg::Rbx, field);
            a.call("puthex32");
        } else {
            a.movzx_r32_mem8(Reg::Rax, Reg::Rbx, field);
            a.call("puthex8");
        }
    }
    a.mov_al(b' ');
    a.call("putc");
    a.pop(Reg::Rbx);
    a.push(Reg::Rbx);
    // The payload as a string: NUL after its `len` bytes (the device never
    // puts more than the buffer holds, and buffers are 256 bytes).
    a.mov_r32_mem(Reg::Rax, Reg::Rbx, LEN);
    a.add_r32_r32(Reg::Rax, Reg::Rbx);
    a.mov_mem_imm8(Reg::Rax, HDR_BYTES, 0);
    a.add_r32_imm(Reg::Rbx, HDR_BYTES);
    a.call("puts");
    a.mov_al(b'\n');
    a.call("putc");
    a.pop(Reg::Rbx);
    a.ret();

    a.label("vs_none");
    a.lea_rip(Reg::Rbx, "s_vs_none");
    a.call("puts");
    a.jmp("main_loop");

    // vs_find: RSI = the device's window; ZF=0 when there is none.
    a.label("vs_find");
    a.mov_r32_imm(Reg::Rcx, VIRTIO_ID_VSOCK);
    a.jmp("virtio_find");

    a.label("vs_connect");
    tiny_virtio::up(a, VIRTIO_ID_VSOCK, 0, RXQ, 3, "vs_none");
    // RX descriptors 0-3: one 256-byte device-writable buffer each, heads
    // 0-3 in avail slots 0-3 (offered by vs_next).
    a.mov_r32_imm(Reg::Rdi, RXQ);
    for i in 0..4 {
        a.mov_mem_imm32(Reg::Rdi, i * 16, RXBUF + i * RXBUF_BYTES);
        a.mov_mem_imm32(Reg::Rdi, i * 16 + 8, RXBUF_BYTES);
        a.mov_mem_imm32(Reg::Rdi, i * 16 + 12, 2); // WRITE
    }
    a.mov_mem_imm32(Reg::Rdi, AVAIL + 4, 0x0001_0000);
    a.mov_mem_imm32(Reg::Rdi, AVAIL + 8, 0x0003_0002);
    // Our CID from config space is every packet's source.
    a.lea_rip(Reg::Rbx, "vs_pkt");
    a.mov_r32_mem(Reg::Rax, Reg::Rsi, 0x100);
    a.mov_mem_r32(Reg::Rbx, SRC_CID, Reg::Rax);
    a.mov_r32_imm(Reg::Rax, GUEST_PORT);
    a.mov_r32_imm(Reg::Rdx, HOST_PORT);
    set_ports(a, Reg::Rax, Reg::Rdx);
    send(a, OP_REQUEST, 0);
    a.call("vs_next");
    a.jmp("vs_send_payload");

    a.label("vs_recv");
    a.call("vs_find");
    a.jcc(Cond::Nz, "vs_none");
    a.call("vs_next");
    a.jmp("main_loop");

    a.label("vs_accept");
    a.call("vs_find");
    a.jcc(Cond::Nz, "vs_none");
    a.call("vs_next");
    // Answer on the request's connection: its ports swapped.
    a.mov_r32_mem(Reg::Rax, Reg::Rbx, DST_PORT);
    a.mov_r32_mem(Reg::Rdx, Reg::Rbx, SRC_PORT);
    set_ports(a, Reg::Rax, Reg::Rdx);
    send(a, OP_RESPONSE, 0);
    a.label("vs_send_payload");
    send(a, OP_RW, PAYLOAD_LEN);
    a.jmp("main_loop");

    a.cstr("s_vs_rx", "VSOCK-RX op=");
    a.cstr("s_vs_port", " port=");
    a.cstr("s_vs_none", "VSOCK-NONE\n");
    // The TX packet: header (dst CID 2 = host, type STREAM, buf_alloc
    // 4 KiB; the rest is filled in before each send), then the payload.
    a.align(8, 0);
    a.label("vs_pkt");
    a.bytes(&[0; 8]); // src_cid
    a.bytes(&2u64.to_le_bytes()); // dst_cid
    a.bytes(&[0; 12]); // src_port, dst_port, len
    a.bytes(&1u16.to_le_bytes()); // type: STREAM
    a.bytes(&[0; 6]); // op, flags
    a.bytes(&0x1000u32.to_le_bytes()); // buf_alloc
    a.bytes(&[0; 4]); // fwd_cnt
    a.bytes(TX_PAYLOAD.as_bytes());
}
