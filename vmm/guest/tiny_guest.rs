//! The tiny test guest: a bzImage whose 64-bit entry talks to COM1.
//!
//! Built by `build.rs` (no assembler on the machine: `asm.rs` emits the bytes).
//! It is packaged exactly like a Linux bzImage (Documentation/arch/x86/boot.rst):
//! a one-sector boot block + one setup sector holding the setup header (`HdrS`,
//! protocol 2.15, LOADED_HIGH, XLF_KERNEL_64), then the protected-mode kernel,
//! whose 64-bit entry (`startup_64`) sits at offset 0x200, as Linux's does. So it
//! takes the same linux-loader path as a real kernel.
//!
//! Behaviour, entered in long mode with RSI = boot_params (zero page):
//! 1. prints `PROVIUM-TINY-GUEST v1`, then `cmdline=<the command line read
//!    through boot_params.hdr.cmd_line_ptr>`, then `e820=<entries, hex>
//!    initrd=<ramdisk_image hex>+<ramdisk_size hex> mmio0=<magic>/<device id>`
//!    (the first virtio-mmio window, read through the VMM's 4 GiB identity
//!    map), then `READY`, on COM1, then writes 123 to the boot-timer port
//!    0x440 (the VMM stamps "guest ready");
//! 2. loops forever: increments a u64 counter (at `COUNTER_OFFSET` from the
//!    kernel's load address), polls COM1's LSR, and for each received byte:
//!    `R` writes 0xFE to the i8042 command port (reset), `P` writes SLP_EN to
//!    the PM1a control port 0x604 (power off), `N`/`M`/`L` drive the
//!    virtio-net device (`tiny_net.rs`), `B`/`I`/`H` the virtio-blk device
//!    (`tiny_blk.rs`), `G` the virtio-rng device (`tiny_rng.rs`), `V`/`X`/`A`
//!    the virtio-vsock device (`tiny_vsock.rs`), `C` re-enables kvmclock (KVM
//!    rewrites the pvclock struct), `K` runs the keyboard check below, `W`
//!    runs it and then powers off (a guest that honours the power button),
//!    anything else is echoed.
//!
//! kvmclock (before `READY`): prints `kvm=<CPUID 0x40000000 signature>
//! features=<CPUID 0x40000001 EAX, hex>` and, when the signature is KVM's,
//! writes MSR_KVM_SYSTEM_TIME_NEW with the GPA of a 32-byte pvclock struct in
//! the image (`PVCLOCK_OFFSET`), so the host can watch KVM fill it.
//!
//! Keyboard (`K`): prints `KBD-ARMED`, waits until the PIC's IRR shows IRQ 1
//! (read with OCW3; interrupts stay off), then reads the i8042 output buffer
//! while its status says a byte waits and prints `kbd=<bytes, hex>`: what a
//! keyboard driver would get after IRQ 1 (the power button's Ctrl+Alt+Del).
//!
//! It stays tiny because its CPL0 code is emulated (~2-3 M instructions/s) on
//! kvm_pvm, and uses no instruction that emulator lacks.

use crate::asm::{Asm, Cond, Reg};

const COM1: u32 = 0x3F8;
const COM1_LSR: u32 = COM1 + 5;
const I8042_COMMAND: u32 = 0x64;
const PM1A_CNT: u32 = 0x604;
const I8042_DATA: u32 = 0x60;
/// The master 8259's command port: OCW3 0x0A selects IRR for reads.
const PIC_MASTER_CMD: u32 = 0x20;
const PIC_OCW3_READ_IRR: u8 = 0x0A;
/// KVM's paravirt CPUID base, its signature's first four bytes ("KVMK") and
/// the kvmclock MSR (Documentation/virt/kvm/x86/msr.rst).
const KVM_CPUID_SIGNATURE: u32 = 0x4000_0000;
const KVM_CPUID_FEATURES: u32 = 0x4000_0001;
const KVM_SIGNATURE_EBX: u32 = u32::from_le_bytes(*b"KVMK");
const MSR_KVM_SYSTEM_TIME_NEW: u32 = 0x4b56_4d01;
/// The VMM's boot-timer port and the "ready" value (`boot_timer.rs`).
const BOOT_TIMER_PORT: u32 = 0x440;
const BOOT_TIMER_READY: u8 = 123;
/// The first virtio-mmio window (the VMM's `device_manager::mmio::MMIO_BASE`).
const MMIO0: u32 = 0xd000_0000;
/// SLP_EN (bit 13) with SLP_TYP 0: what QEMU's PIIX4/ICH9 PM treats as S5.
const PM1_SLP_EN: u16 = 1 << 13;

/// boot_params offsets (arch/x86/include/uapi/asm/bootparam.h).
const BP_E820_ENTRIES: u32 = 0x1E8;
const BP_RAMDISK_IMAGE: u32 = 0x218;
const BP_RAMDISK_SIZE: u32 = 0x21C;
const BP_CMD_LINE_PTR: u32 = 0x228;

/// Where linux-loader puts the protected-mode kernel (`code32_start`).
pub const LOAD_ADDR: u32 = 0x10_0000;
/// Offset of `startup_64` in the protected-mode kernel (Linux's convention).
pub const STARTUP_64_OFFSET: usize = 0x200;

pub struct TinyGuest {
    pub bzimage: Vec<u8>,
    /// Offset of the u64 loop counter from `LOAD_ADDR`.
    pub counter_offset: usize,
    /// Offset of the pvclock struct (`struct pvclock_vcpu_time_info`) from `LOAD_ADDR`.
    pub pvclock_offset: usize,
}

fn program() -> (Vec<u8>, usize, usize) {
    let mut a = Asm::default();
    // startup_32: the 32-bit entry is not supported; park the CPU.
    a.label("startup_32");
    a.hlt();
    a.jmp("startup_32");
    a.pad_to(STARTUP_64_OFFSET, 0xF4);

    a.label("startup_64");
    a.cli();
    a.lea_rip(Reg::Rbx, "s_banner");
    a.call("puts");
    a.lea_rip(Reg::Rbx, "s_cmdline");
    a.call("puts");
    // cmd_line_ptr is a 32-bit GPA; the VMM identity-maps the first GiB.
    a.mov_r32_mem(Reg::Rbx, Reg::Rsi, BP_CMD_LINE_PTR);
    a.call("puts");
    a.lea_rip(Reg::Rbx, "s_e820");
    a.call("puts");
    a.movzx_r32_mem8(Reg::Rax, Reg::Rsi, BP_E820_ENTRIES);
    a.call("puthex8");
    a.lea_rip(Reg::Rbx, "s_initrd");
    a.call("puts");
    a.mov_r32_mem(Reg::Rax, Reg::Rsi, BP_RAMDISK_IMAGE);
    a.call("puthex32");
    a.mov_al(b'+');
    a.call("putc");
    a.mov_r32_mem(Reg::Rax, Reg::Rsi, BP_RAMDISK_SIZE);
    a.call("puthex32");
    // virtio-mmio discovery: the first window's MagicValue and DeviceID
    // (all ones when no device is there).
    a.lea_rip(Reg::Rbx, "s_mmio");
    a.call("puts");
    a.mov_r32_imm(Reg::Rsi, MMIO0);
    a.mov_r32_mem(Reg::Rax, Reg::Rsi, 0);
    a.call("puthex32");
    a.mov_al(b'/');
    a.call("putc");
    a.mov_r32_mem(Reg::Rax, Reg::Rsi, 8);
    a.call("puthex32");
    a.call("kvm_report");
    a.lea_rip(Reg::Rbx, "s_ready");
    a.call("puts");
    // Tell the VMM's boot timer (vmm/src/boot_timer.rs) the guest is ready.
    a.mov_r32_imm(Reg::Rdx, BOOT_TIMER_PORT);
    a.mov_al(BOOT_TIMER_READY);
    a.out_dx_al();

    a.label("main_loop");
    a.inc_qword_rip("counter");
    a.mov_r32_imm(Reg::Rdx, COM1_LSR);
    a.in_al_dx();
    a.test_al(0x01); // LSR.DR: a byte is waiting
    a.jcc(Cond::Z, "main_loop");
    a.mov_r32_imm(Reg::Rdx, COM1);
    a.in_al_dx();
    a.cmp_al(b'R');
    a.jcc(Cond::Z, "do_reset");
    a.cmp_al(b'P');
    a.jcc(Cond::Z, "do_poweroff");
    // virtio-net checks (tiny_net.rs).
    a.cmp_al(crate::tiny_net::CMD_NET_UP);
    a.jcc(Cond::Z, "net_up");
    a.cmp_al(crate::tiny_net::CMD_NET_RX);
    a.jcc(Cond::Z, "net_rx");
    a.cmp_al(crate::tiny_net::CMD_NET_LINK);
    a.jcc(Cond::Z, "net_link");
    // virtio-blk, virtio-rng and virtio-vsock checks (tiny_blk.rs,
    // tiny_rng.rs, tiny_vsock.rs).
    for (cmd, l) in crate::tiny_blk::COMMANDS
        .into_iter()
        .chain(crate::tiny_rng::COMMANDS)
        .chain(crate::tiny_vsock::COMMANDS)
    {
        a.cmp_al(cmd);
        a.jcc(Cond::Z, l);
    }
    a.cmp_al(b'C');
    a.jcc(Cond::Z, "do_kvmclock");
    a.cmp_al(b'K');
    a.jcc(Cond::Z, "do_kbd");
    a.cmp_al(b'W');
    a.jcc(Cond::Z, "do_kbd_then_off");
    a.out_dx_al(); // echo
    a.jmp("main_loop");

    a.label("do_reset");
    a.mov_r32_imm(Reg::Rdx, I8042_COMMAND);
    a.mov_al(0xFE);
    a.out_dx_al();
    a.jmp("main_loop");

    a.label("do_poweroff");
    a.mov_r32_imm(Reg::Rdx, PM1A_CNT);
    a.mov_ax(PM1_SLP_EN);
    a.out_dx_ax();
    a.jmp("main_loop");

    kvmclock_block(&mut a);
    keyboard_block(&mut a);

    // puts: RBX = NUL-terminated string. Clobbers AL, EDX, RBX.
    a.label("puts");
    a.mov_al_at_rbx();
    a.test_al_al();
    a.jcc(Cond::Z, "puts_done");
    a.call("putc");
    a.inc_rbx();
    a.jmp("puts");
    a.label("puts_done");
    a.ret();

    // putc: AL = byte. Clobbers EDX.
    a.label("putc");
    a.mov_r32_imm(Reg::Rdx, COM1);
    a.out_dx_al();
    a.ret();

    // puthex8: AL (zero-extended in EAX) as 2 hex digits.
    a.label("puthex8");
    a.shl_eax(24);
    a.mov_r32_imm(Reg::Rcx, 2);
    a.jmp("hex_loop");
    // puthex32: EAX as 8 hex digits. Clobbers EAX, ECX, EDX.
    a.label("puthex32");
    a.mov_r32_imm(Reg::Rcx, 8);
    a.label("hex_loop");
    a.rol_eax(4);
    a.push_rax();
    a.and_al(0x0F);
    a.cmp_al(10);
    a.jcc(Cond::B, "hex_digit");
    a.add_al(b'a' - b'0' - 10);
    a.label("hex_digit");
    a.add_al(b'0');
    a.call("putc");
    a.pop_rax();
    a.dec_ecx();
    a.jcc(Cond::Nz, "hex_loop");
    a.ret();

    crate::tiny_net::emit(&mut a);
    crate::tiny_virtio::emit(&mut a);
    crate::tiny_blk::emit(&mut a);
    crate::tiny_rng::emit(&mut a);
    crate::tiny_vsock::emit(&mut a);

    a.cstr("s_banner", "PROVIUM-TINY-GUEST v1\n");
    a.cstr("s_cmdline", "cmdline=");
    a.cstr("s_e820", "\ne820=");
    a.cstr("s_initrd", " initrd=");
    a.cstr("s_mmio", " mmio0=");
    a.cstr("s_ready", "\nREADY\n");
    a.align(8, 0);
    a.label("counter");
    a.bytes(&[0; 8]);
    let counter = a.offset_of("counter");
    kvmclock_data(&mut a);
    keyboard_data(&mut a);
    let pvclock = a.offset_of("pvclock");
    (a.finish(), counter, pvclock)
}

/// `kvm_report` (called once before READY) and `do_kvmclock` (console `C`).
fn kvmclock_block(a: &mut Asm) {
    a.label("kvm_report");
    a.lea_rip(Reg::Rbx, "s_kvm");
    a.call("puts");
    a.mov_r32_imm(Reg::Rax, KVM_CPUID_SIGNATURE);
    a.cpuid();
    a.mov_rip_r32("kvm_sig0", Reg::Rbx);
    a.mov_rip_r32("kvm_sig1", Reg::Rcx);
    a.mov_rip_r32("kvm_sig2", Reg::Rdx);
    a.lea_rip(Reg::Rbx, "kvm_sig0");
    a.call("puts");
    a.lea_rip(Reg::Rbx, "s_kvm_features");
    a.call("puts");
    a.mov_r32_imm(Reg::Rax, KVM_CPUID_FEATURES);
    a.cpuid();
    a.call("puthex32");
    // Only KVM has the kvmclock MSR: anywhere else the write would #GP
    // (and, with no IDT, triple-fault every tiny-guest test).
    a.mov_r32_rip("kvm_sig0", Reg::Rax);
    a.cmp_eax(KVM_SIGNATURE_EBX);
    a.jcc(Cond::Nz, "kvm_report_done");
    a.call("kvmclock_on");
    a.label("kvm_report_done");
    a.ret();

    // kvmclock_on: MSR_KVM_SYSTEM_TIME_NEW = pvclock GPA | enable.
    // Clobbers EAX, ECX, EDX.
    a.label("kvmclock_on");
    a.lea_rip(Reg::Rax, "pvclock");
    a.or_al(1);
    a.mov_r32_imm(Reg::Rcx, MSR_KVM_SYSTEM_TIME_NEW);
    a.mov_r32_imm(Reg::Rdx, 0);
    a.wrmsr();
    a.ret();

    a.label("do_kvmclock");
    a.call("kvmclock_on");
    a.jmp("main_loop");
}

fn kvmclock_data(a: &mut Asm) {
    a.cstr("s_kvm", "\nkvm=");
    a.cstr("s_kvm_features", " features=");
    a.label("kvm_sig0");
    a.bytes(&[0; 4]);
    a.label("kvm_sig1");
    a.bytes(&[0; 4]);
    a.label("kvm_sig2");
    a.bytes(&[0; 4]);
    a.bytes(&[0]); // NUL after the 12 signature bytes
                   // struct pvclock_vcpu_time_info: 32 bytes, must not cross a page.
    a.align(32, 0);
    a.label("pvclock");
    a.bytes(&[0; 32]);
}

/// `do_kbd` (console `K`): wait for IRQ 1 in the PIC's IRR, then drain the
/// i8042 output buffer and print it.
fn keyboard_block(a: &mut Asm) {
    a.label("do_kbd_then_off");
    a.mov_al(1);
    a.mov_rip_al("kbd_then_off");
    a.label("do_kbd");
    a.lea_rip(Reg::Rbx, "s_kbd_armed");
    a.call("puts");
    a.mov_r32_imm(Reg::Rdx, PIC_MASTER_CMD);
    a.mov_al(PIC_OCW3_READ_IRR);
    a.out_dx_al();
    a.label("kbd_wait_irq");
    a.mov_r32_imm(Reg::Rdx, PIC_MASTER_CMD);
    a.in_al_dx();
    a.test_al(1 << 1); // IRR bit 1: IRQ 1 raised
    a.jcc(Cond::Z, "kbd_wait_irq");
    a.lea_rip(Reg::Rbx, "s_kbd");
    a.call("puts");
    a.label("kbd_drain");
    a.mov_r32_imm(Reg::Rdx, I8042_COMMAND);
    a.in_al_dx();
    a.test_al(0x01); // status: output buffer full
    a.jcc(Cond::Z, "kbd_done");
    a.mov_r32_imm(Reg::Rdx, I8042_DATA);
    a.in_al_dx();
    a.movzx_eax_al();
    a.call("puthex8");
    a.jmp("kbd_drain");
    a.label("kbd_done");
    a.mov_al(b'\n');
    a.call("putc");
    a.mov_al_rip("kbd_then_off");
    a.test_al_al();
    a.jcc(Cond::Nz, "do_poweroff");
    a.jmp("main_loop");
}

fn keyboard_data(a: &mut Asm) {
    a.cstr("s_kbd_armed", "KBD-ARMED\n");
    a.cstr("s_kbd", "kbd=");
    a.label("kbd_then_off");
    a.bytes(&[0]);
}

/// What the 16-bit entry prints: loaders that start a bzImage in real mode
/// (QEMU's `-kernel`, for the benches' side-by-side boot) reach this.
pub const REAL_MODE_BANNER: &str = "PROVIUM-TINY-GUEST v1 16-bit\n";

/// The real-mode setup entry (setup + 0x200 jumps here): prints
/// `REAL_MODE_BANNER` on COM1 and halts. The 64-bit program needs the
/// 64-bit boot protocol; this is only so another VMM booting the same image
/// the 16-bit way shows its first serial bytes.
fn real_mode_stub() -> Vec<u8> {
    let mut c = vec![0xBA, 0xF8, 0x03]; // mov dx, 0x3f8
    for b in REAL_MODE_BANNER.bytes() {
        c.extend_from_slice(&[0xB0, b, 0xEE]); // mov al, b; out dx, al
    }
    c.extend_from_slice(&[0xFA, 0xF4, 0xEB, 0xFD]); // cli; hlt; jmp hlt
    c
}

/// Packages the program as a bzImage.
pub fn build() -> TinyGuest {
    let (kernel, counter_offset, pvclock_offset) = program();
    const SETUP_SECTS: u8 = 1;
    let setup_len = (usize::from(SETUP_SECTS) + 1) * 512;
    let mut img = vec![0u8; setup_len];
    let put = |img: &mut Vec<u8>, off: usize, bytes: &[u8]| {
        img[off..off + bytes.len()].copy_from_slice(bytes);
    };
    let syssize = u32::try_from(kernel.len().div_ceil(16)).expect("small kernel");
    let init_size = u32::try_from(kernel.len().next_multiple_of(4096)).expect("small kernel");
    put(&mut img, 0x1F1, &[SETUP_SECTS]); // setup_sects
    put(&mut img, 0x1F4, &syssize.to_le_bytes()); // syssize (16-byte units)
    put(&mut img, 0x1FE, &0xAA55u16.to_le_bytes()); // boot_flag
    put(&mut img, 0x200, &[0xEB, 0x66]); // jump over the header (real mode; unused)
    put(&mut img, 0x202, b"HdrS"); // header
    put(&mut img, 0x206, &0x020Fu16.to_le_bytes()); // version 2.15
    put(&mut img, 0x211, &[0x01]); // loadflags: LOADED_HIGH
    put(&mut img, 0x214, &LOAD_ADDR.to_le_bytes()); // code32_start
    put(&mut img, 0x22C, &0x37FF_FFFFu32.to_le_bytes()); // initrd_addr_max
    put(&mut img, 0x230, &0x20_0000u32.to_le_bytes()); // kernel_alignment
    put(&mut img, 0x236, &0x0001u16.to_le_bytes()); // xloadflags: XLF_KERNEL_64
    put(&mut img, 0x238, &2047u32.to_le_bytes()); // cmdline_size
    put(&mut img, 0x258, &u64::from(LOAD_ADDR).to_le_bytes()); // pref_address
    put(&mut img, 0x260, &init_size.to_le_bytes()); // init_size
    put(&mut img, 0x268, &real_mode_stub()); // where the jump at 0x200 lands
    img.extend_from_slice(&kernel);
    TinyGuest {
        bzimage: img,
        counter_offset,
        pvclock_offset,
    }
}
