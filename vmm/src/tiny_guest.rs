//! The tiny test guest built by `build.rs` (see `vmm/guest/tiny_guest.rs` for
//! what it does). Exposed so tests, benches and `provium` can boot it.

include!(concat!(env!("OUT_DIR"), "/tiny_guest_layout.rs"));

/// The bzImage.
pub static BZIMAGE: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/tiny_guest.bzImage"));

/// The first line the guest prints on every boot.
pub const BANNER: &str = "PROVIUM-TINY-GUEST v1";
/// Printed once the guest has reported its boot params and entered its loop.
pub const READY: &str = "READY";
/// GPA of the u64 the guest's main loop increments.
pub const COUNTER_GPA: u64 = LOAD_ADDR + COUNTER_OFFSET;
/// Console input byte: reset through the i8042.
pub const CMD_RESET: u8 = b'R';
/// Console input byte: power off through PM1a_CNT.
pub const CMD_POWER_OFF: u8 = b'P';
/// Console input byte: bring the first virtio-net device up, send one
/// broadcast frame (source: the MAC in config space, ethertype 0x88b5,
/// payload [`NET_TX_PAYLOAD`]), post one RX buffer; prints
/// `NET-UP status=<link status, 2 hex digits>` (`vmm/guest/tiny_net.rs`).
pub const CMD_NET_UP: u8 = b'N';
/// Console input byte: wait for a received frame, print `NET-RX <its bytes
/// after the Ethernet header, up to the first NUL>`.
pub const CMD_NET_RX: u8 = b'M';
/// Console input byte: print `NET-LINK cfg-irq=<02 if the config changed
/// since the last one, else 00> status=<link status>`.
pub const CMD_NET_LINK: u8 = b'L';
/// The payload of the frame `CMD_NET_UP` sends.
pub const NET_TX_PAYLOAD: &str = "PROVIUM-TINY-NET-TX";
/// Console input byte, followed by a seed byte: the first virtio-blk device
/// (brought up afresh) writes sector 1 with seed, seed+1, ... (512 bytes),
/// reads it back and prints `BLK-RW w=<write status> r=<read status>
/// data=<first 4 bytes read, hex> ok|bad` (`ok`: all 512 bytes read equal
/// the ones written; statuses are 2 hex digits, `ff` if the device never
/// wrote one) (`vmm/guest/tiny_blk.rs`).
pub const CMD_BLK_RW: u8 = b'B';
/// Console input byte: GET_ID; prints `BLK-ID s=<status> <id>`.
pub const CMD_BLK_ID: u8 = b'I';
/// Console input byte: hostile chains on the virtio-blk queue; prints
/// `BLK-HOSTILE oob=<status>/<used len> loop=<status>/<used len>
/// good=<status> bad-ring=<device status>` (a header outside RAM, a
/// descriptor chained to itself, a good read, then the queue placed outside
/// RAM on a fresh init).
pub const CMD_BLK_HOSTILE: u8 = b'H';
/// Console input byte: read 16 bytes from the first virtio-rng device; prints
/// `RNG len=<used length, 8 hex digits> bytes=<the bytes, hex>`
/// (`vmm/guest/tiny_rng.rs`).
pub const CMD_RNG: u8 = b'G';
/// Console input byte: bring the first virtio-vsock device up afresh, connect
/// from guest port [`VSOCK_GUEST_PORT`] to host port [`VSOCK_HOST_PORT`],
/// print the answer as [`CMD_VSOCK_RECV`] does (`op=02`: OP_RESPONSE), then
/// send [`VSOCK_TX_PAYLOAD`] on the connection (`vmm/guest/tiny_vsock.rs`).
pub const CMD_VSOCK_CONNECT: u8 = b'V';
/// Console input byte: wait for the next vsock packet and print `VSOCK-RX
/// op=<op, 2 hex digits> port=<dst port, 8 hex digits> <payload>`.
pub const CMD_VSOCK_RECV: u8 = b'X';
/// Console input byte: take the next vsock packet (a host connect's
/// OP_REQUEST), print it as [`CMD_VSOCK_RECV`] does, accept the connection
/// and send [`VSOCK_TX_PAYLOAD`] on it.
pub const CMD_VSOCK_ACCEPT: u8 = b'A';
/// Console input byte: send [`VSOCK_TX_PAYLOAD`] again on
/// [`CMD_VSOCK_CONNECT`]'s connection (no device reset).
pub const CMD_VSOCK_SEND_AGAIN: u8 = b'S';
/// Console input byte, followed by a mode byte ([`VSOCK_FLOOD_HOLD`],
/// [`VSOCK_FLOOD_CHURN`], [`VSOCK_FLOOD_UNLISTENED`]): send
/// [`VSOCK_FLOOD_CONNECTIONS`] OP_REQUESTs as fast as the device takes them,
/// each from a guest port no earlier flood used, draining RX between them;
/// then print `VSOCK-FLOOD resp=<OP_RESPONSEs, 8 hex digits> rst=<OP_RSTs>`
/// (`vmm/guest/tiny_vsock.rs`).
pub const CMD_VSOCK_FLOOD: u8 = b'F';
/// Flood mode: requests to [`VSOCK_HOST_PORT`], kept open.
pub const VSOCK_FLOOD_HOLD: u8 = b'h';
/// Flood mode: requests to [`VSOCK_HOST_PORT`], each followed by OP_RST.
pub const VSOCK_FLOOD_CHURN: u8 = b'c';
/// Flood mode: requests to [`VSOCK_FLOOD_UNLISTENED_PORT`].
pub const VSOCK_FLOOD_UNLISTENED: u8 = b'u';
/// Requests per flood.
pub const VSOCK_FLOOD_CONNECTIONS: u32 = 4096;
/// The host port [`VSOCK_FLOOD_UNLISTENED`] floods.
pub const VSOCK_FLOOD_UNLISTENED_PORT: u32 = VSOCK_HOST_PORT + 1;
/// Prefix of the line a flood ends with.
pub const VSOCK_FLOOD_LINE: &str = "VSOCK-FLOOD ";
/// The host port [`CMD_VSOCK_CONNECT`] connects to.
pub const VSOCK_HOST_PORT: u32 = 1024;
/// The guest port it connects from.
pub const VSOCK_GUEST_PORT: u32 = 0x500;
/// What the guest sends on each vsock connection.
pub const VSOCK_TX_PAYLOAD: &str = "PROVIUM-TINY-VSOCK-TX";
/// Console input byte: write MSR_KVM_SYSTEM_TIME_NEW again (KVM refreshes the struct).
pub const CMD_KVMCLOCK: u8 = b'C';
/// GPA of the guest's `struct pvclock_vcpu_time_info` (kvmclock).
pub const PVCLOCK_GPA: u64 = LOAD_ADDR + PVCLOCK_OFFSET;
/// Printed before the guest reports its paravirt CPUID leaves: `kvm=<signature> features=<hex>`.
pub const KVM_LINE: &str = "kvm=";
/// Console input byte: wait for IRQ 1, then print the i8042 output buffer.
pub const CMD_KEYBOARD: u8 = b'K';
/// Console input byte: like `CMD_KEYBOARD`, then power off (a guest whose
/// init honours the power button).
pub const CMD_KEYBOARD_THEN_POWER_OFF: u8 = b'W';
/// Printed once the guest waits for IRQ 1.
pub const KBD_ARMED: &str = "KBD-ARMED";
/// Prefix of the line with the bytes read from the i8042 after IRQ 1.
pub const KBD_LINE: &str = "kbd=";

#[cfg(test)]
mod tests {
    use super::*;
    use crate::builder::probe_kernel;
    use crate::vmm_config::KernelImage;
    use vm_memory::{Bytes, GuestAddress};

    fn u16_at(off: usize) -> u16 {
        u16::from_le_bytes([BZIMAGE[off], BZIMAGE[off + 1]])
    }

    #[test]
    fn setup_header_is_a_64_bit_bzimage() {
        assert_eq!(&BZIMAGE[0x202..0x206], b"HdrS");
        assert_eq!(u16_at(0x1fe), 0xaa55);
        assert!(u16_at(0x206) >= 0x0206, "protocol >= 2.06");
        assert_eq!(BZIMAGE[0x211] & 1, 1, "LOADED_HIGH");
        assert_eq!(u16_at(0x236) & 1, 1, "XLF_KERNEL_64");
        // The emulator's cost is the instructions the guest executes, not
        // its size; the bound keeps the drivers minimal (4.5 KiB with net,
        // blk, rng and vsock).
        assert!(
            BZIMAGE.len() < 8192,
            "keep it tiny: {} bytes",
            BZIMAGE.len()
        );
    }

    #[test]
    fn linux_loader_takes_the_bzimage_path() {
        let img = KernelImage::Bytes(BZIMAGE.into());
        let (info, ram) = probe_kernel(&img, 16 << 20).expect("tiny guest loads");
        assert_eq!(info.kernel_load_gpa, LOAD_ADDR);
        assert_eq!(info.entry_gpa, LOAD_ADDR + STARTUP_64_OFFSET);
        let first: u8 = ram
            .memory
            .read_obj(GuestAddress(info.entry_gpa))
            .expect("loaded");
        assert_eq!(first, 0xfa, "startup_64 begins with cli");
        let counter: u64 = ram
            .memory
            .read_obj(GuestAddress(COUNTER_GPA))
            .expect("loaded");
        assert_eq!(counter, 0);
        assert!(COUNTER_GPA + 8 <= info.kernel_end_gpa);
    }

    #[test]
    fn strings_are_in_the_image() {
        let hay = String::from_utf8_lossy(BZIMAGE);
        assert!(hay.contains(BANNER));
        assert!(hay.contains(READY));
        assert!(hay.contains(NET_TX_PAYLOAD), "the net check's frame");
        assert!(hay.contains(VSOCK_TX_PAYLOAD), "the vsock check's payload");
        assert!(hay.contains(VSOCK_FLOOD_LINE), "the vsock flood's answer");
        for answer in ["BLK-RW w=", "BLK-ID s=", "BLK-HOSTILE oob=", "RNG len="] {
            assert!(hay.contains(answer), "{answer}");
        }
    }
}
