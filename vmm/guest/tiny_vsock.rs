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
//! - `S` sends OP_RW with `TX_PAYLOAD` again on `V`'s connection (guest
//!   port `GUEST_PORT` to host port `HOST_PORT`), without a reset.
//! - `F<mode>` floods the host with `FLOOD_CONNECTIONS` OP_REQUESTs, as
//!   fast as the device takes them, from guest ports counting up from
//!   `FLOOD_GUEST_PORT0` (where the last flood stopped, so floods never
//!   reuse a port): to `HOST_PORT` (mode `FLOOD_HOLD`: kept open), to
//!   `HOST_PORT` with an OP_RST right after each request (`FLOOD_CHURN`),
//!   or to `FLOOD_UNLISTENED_PORT` (`FLOOD_UNLISTENED`). RX buffers are
//!   drained between requests (`vs_drain`: the device owes one reply per
//!   request); once all the replies are in it prints `VSOCK-FLOOD
//!   resp=<OP_RESPONSEs, hex32> rst=<OP_RSTs, hex32>`. Nothing else is
//!   printed, so the flood runs at the device's pace, not the console's.
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
pub const CMD_VSOCK_SEND_AGAIN: u8 = b'S';
pub const CMD_VSOCK_FLOOD: u8 = b'F';
/// Command bytes and their handlers, for the main loop's dispatch.
pub const COMMANDS: [(u8, &str); 5] = [
    (CMD_VSOCK_CONNECT, "vs_connect"),
    (CMD_VSOCK_RECV, "vs_recv"),
    (CMD_VSOCK_ACCEPT, "vs_accept"),
    (CMD_VSOCK_SEND_AGAIN, "vs_send_again"),
    (CMD_VSOCK_FLOOD, "vs_flood"),
];
/// `F`'s mode bytes.
pub const FLOOD_HOLD: u8 = b'h';
pub const FLOOD_CHURN: u8 = b'c';
pub const FLOOD_UNLISTENED: u8 = b'u';
// Any mode byte but these two holds: the guest compares only with them.
const _: () = assert!(FLOOD_HOLD != FLOOD_CHURN && FLOOD_HOLD != FLOOD_UNLISTENED);
/// Requests per flood, the first flood's first guest port, and the host
/// port `FLOOD_UNLISTENED` floods.
pub const FLOOD_CONNECTIONS: u32 = 4096;
pub const FLOOD_GUEST_PORT0: u32 = 0x1_0000;
pub const FLOOD_UNLISTENED_PORT: u32 = HOST_PORT + 1;
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
const OP_RST: u32 = 3;
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

/// Emits the take of the next packet the device put in RX (RDI = the RX
/// queue page): jumps to `none` when there is none, else counts it taken
/// and leaves its buffer's address in EAX.
fn take_rx(a: &mut Asm, none: &'static str) {
    a.movzx_r32_mem16(Reg::Rax, Reg::Rdi, USED + 2);
    a.cmp_r16_mem(Reg::Rax, Reg::Rdi, RX_TAKEN);
    a.jcc(Cond::Z, none);
    a.movzx_r32_mem16(Reg::Rax, Reg::Rdi, RX_TAKEN);
    a.inc_word_mem(Reg::Rdi, RX_TAKEN);
    // Heads 0-3 are used in turn: the buffer is the taken count mod 4.
    a.and_r32_imm(Reg::Rax, 3);
    a.shl_r32(Reg::Rax, 8);
    a.add_r32_imm(Reg::Rax, RXBUF);
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
    take_rx(a, "vs_next_wait");
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

    a.label("vs_send_again");
    a.call("vs_find");
    a.jcc(Cond::Nz, "vs_none");
    a.mov_r32_imm(Reg::Rax, GUEST_PORT);
    a.mov_r32_imm(Reg::Rdx, HOST_PORT);
    set_ports(a, Reg::Rax, Reg::Rdx);
    a.jmp("vs_send_payload");

    flood(a);

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
    a.align(8, 0);
    for l in [
        "vs_flood_resp",
        "vs_flood_rst",
        "vs_flood_seen",
        "vs_flood_left",
        "vs_flood_dst",
    ] {
        a.label(l);
        a.bytes(&[0; 8]);
    }
    a.label("vs_flood_port");
    a.bytes(&u64::from(FLOOD_GUEST_PORT0).to_le_bytes());
    a.label("vs_flood_mode");
    a.bytes(&[0; 8]);
}

/// `vs_flood` (console `F<mode>`) and `vs_drain`.
fn flood(a: &mut Asm) {
    a.label("vs_flood");
    a.call("getc");
    a.mov_rip_al("vs_flood_mode");
    a.mov_r32_imm(Reg::Rcx, HOST_PORT);
    a.cmp_al(FLOOD_UNLISTENED);
    a.jcc(Cond::Nz, "vs_flood_dst_set");
    a.mov_r32_imm(Reg::Rcx, FLOOD_UNLISTENED_PORT);
    a.label("vs_flood_dst_set");
    a.mov_rip_r32("vs_flood_dst", Reg::Rcx);
    a.call("vs_find");
    a.jcc(Cond::Nz, "vs_none");
    a.mov_r32_imm(Reg::Rax, 0);
    for l in ["vs_flood_resp", "vs_flood_rst", "vs_flood_seen"] {
        a.mov_rip_r32(l, Reg::Rax);
    }
    a.mov_r32_imm(Reg::Rax, FLOOD_CONNECTIONS);
    a.mov_rip_r32("vs_flood_left", Reg::Rax);

    a.label("vs_flood_loop");
    a.mov_r32_rip("vs_flood_port", Reg::Rax);
    a.mov_r32_rip("vs_flood_dst", Reg::Rdx);
    set_ports(a, Reg::Rax, Reg::Rdx);
    send(a, OP_REQUEST, 0);
    a.mov_al_rip("vs_flood_mode");
    a.cmp_al(FLOOD_CHURN);
    a.jcc(Cond::Nz, "vs_flood_next");
    send(a, OP_RST, 0);
    a.label("vs_flood_next");
    a.call("vs_drain");
    a.mov_r32_rip("vs_flood_port", Reg::Rax);
    a.add_r32_imm(Reg::Rax, 1);
    a.mov_rip_r32("vs_flood_port", Reg::Rax);
    a.mov_r32_rip("vs_flood_left", Reg::Rcx);
    a.dec_ecx();
    a.mov_rip_r32("vs_flood_left", Reg::Rcx);
    a.jcc(Cond::Nz, "vs_flood_loop");

    // The replies to the last requests may still be on their way.
    a.label("vs_flood_wait");
    a.call("vs_drain");
    a.mov_r32_rip("vs_flood_seen", Reg::Rax);
    a.cmp_eax(FLOOD_CONNECTIONS);
    a.jcc(Cond::Nz, "vs_flood_wait");
    for (label, count) in [
        ("s_vs_flood", "vs_flood_resp"),
        ("s_vs_flood_rst", "vs_flood_rst"),
    ] {
        a.lea_rip(Reg::Rbx, label);
        a.call("puts");
        a.mov_r32_rip(count, Reg::Rax);
        a.call("puthex32");
    }
    a.mov_al(b'\n');
    a.call("putc");
    a.jmp("main_loop");

    // vs_drain: counts every packet the device has put in RX since the
    // last call by its op (nothing is printed), then re-offers their
    // buffers, as `vs_next` does, notifying only when there were any.
    // RSI = window. Clobbers EAX, EDI.
    a.label("vs_drain");
    a.mov_r32_imm(Reg::Rdi, RXQ);
    a.label("vs_drain_loop");
    take_rx(a, "vs_drain_offer");
    a.movzx_r32_mem8(Reg::Rax, Reg::Rax, OP);
    a.inc_qword_rip("vs_flood_seen");
    a.cmp_al(OP_RESPONSE as u8);
    a.jcc(Cond::Nz, "vs_drain_not_resp");
    a.inc_qword_rip("vs_flood_resp");
    a.label("vs_drain_not_resp");
    a.cmp_al(OP_RST as u8);
    a.jcc(Cond::Nz, "vs_drain_loop");
    a.inc_qword_rip("vs_flood_rst");
    a.jmp("vs_drain_loop");
    a.label("vs_drain_offer");
    a.movzx_r32_mem16(Reg::Rax, Reg::Rdi, RX_TAKEN);
    a.add_r32_imm(Reg::Rax, 4);
    a.cmp_r16_mem(Reg::Rax, Reg::Rdi, AVAIL + 2);
    a.jcc(Cond::Z, "vs_drain_done");
    a.mov_mem_ax(Reg::Rdi, AVAIL + 2);
    a.mov_mem_imm32(Reg::Rsi, 0x50, 0);
    a.label("vs_drain_done");
    a.ret();

    a.cstr("s_vs_flood", "VSOCK-FLOOD resp=");
    a.cstr("s_vs_flood_rst", " rst=");
}
