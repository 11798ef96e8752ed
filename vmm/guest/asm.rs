//! A tiny x86-64 machine-code emitter for the tiny test guest.
//!
//! It knows exactly the instructions `tiny_guest.rs` uses, each written out as
//! its encoding (Intel SDM vol. 2), plus labels with 32-bit relative fixups.
//! No external assembler is needed at build time. Every instruction here is
//! one the kvm_pvm emulator implements (no int3, xrstor, cmpxchg16b, clac/stac,
//! vmcall): see DESIGN.md "This machine's KVM".

use std::collections::BTreeMap;

/// 64-bit general-purpose registers, numbered as in ModRM.reg (only the low eight).
#[derive(Clone, Copy)]
pub enum Reg {
    Rax = 0,
    Rcx = 1,
    Rdx = 2,
    Rbx = 3,
    Rsi = 6,
    Rdi = 7,
}

/// Condition codes for `jcc` (the low nibble of 0F 8x).
#[derive(Clone, Copy)]
pub enum Cond {
    B = 0x2,
    Z = 0x4,
    Nz = 0x5,
}

/// Emits code into a buffer; labels are resolved in `finish`.
#[derive(Default)]
pub struct Asm {
    code: Vec<u8>,
    labels: BTreeMap<&'static str, usize>,
    fixups: Vec<(usize, &'static str)>,
}

impl Asm {
    pub fn bytes(&mut self, b: &[u8]) {
        self.code.extend_from_slice(b);
    }

    /// Pads with `fill` up to offset `to` (which must not be behind us).
    pub fn pad_to(&mut self, to: usize, fill: u8) {
        assert!(self.code.len() <= to, "code overran offset {to:#x}");
        self.code.resize(to, fill);
    }

    pub fn align(&mut self, n: usize, fill: u8) {
        while self.code.len() % n != 0 {
            self.code.push(fill);
        }
    }

    /// Bytes emitted so far.
    pub fn offset(&self) -> usize {
        self.code.len()
    }

    pub fn label(&mut self, name: &'static str) {
        let prev = self.labels.insert(name, self.code.len());
        assert!(prev.is_none(), "label {name} defined twice");
    }

    pub fn offset_of(&self, name: &str) -> usize {
        *self
            .labels
            .get(name)
            .unwrap_or_else(|| panic!("no label {name}"))
    }

    fn rel32(&mut self, name: &'static str) {
        self.fixups.push((self.code.len(), name));
        self.code.extend_from_slice(&[0; 4]);
    }

    /// `jmp rel32`
    pub fn jmp(&mut self, l: &'static str) {
        self.bytes(&[0xE9]);
        self.rel32(l);
    }

    /// `jcc rel32`
    pub fn jcc(&mut self, c: Cond, l: &'static str) {
        self.bytes(&[0x0F, 0x80 | c as u8]);
        self.rel32(l);
    }

    /// `call rel32`
    pub fn call(&mut self, l: &'static str) {
        self.bytes(&[0xE8]);
        self.rel32(l);
    }

    pub fn ret(&mut self) {
        self.bytes(&[0xC3]);
    }

    pub fn cli(&mut self) {
        self.bytes(&[0xFA]);
    }

    pub fn hlt(&mut self) {
        self.bytes(&[0xF4]);
    }

    /// `lea r64, [rip + l]`
    pub fn lea_rip(&mut self, r: Reg, l: &'static str) {
        self.bytes(&[0x48, 0x8D, ((r as u8) << 3) | 0b101]);
        self.rel32(l);
    }

    /// `inc qword [rip + l]`
    pub fn inc_qword_rip(&mut self, l: &'static str) {
        self.bytes(&[0x48, 0xFF, 0x05]);
        self.rel32(l);
    }

    /// `mov r32, imm32` (zero-extends into the 64-bit register)
    pub fn mov_r32_imm(&mut self, r: Reg, imm: u32) {
        self.bytes(&[0xB8 + r as u8]);
        self.bytes(&imm.to_le_bytes());
    }

    /// `mov r32, [base + disp32]`
    pub fn mov_r32_mem(&mut self, r: Reg, base: Reg, disp: u32) {
        self.bytes(&[0x8B, 0x80 | ((r as u8) << 3) | base as u8]);
        self.bytes(&disp.to_le_bytes());
    }

    /// `movzx r32, byte [base + disp32]`
    pub fn movzx_r32_mem8(&mut self, r: Reg, base: Reg, disp: u32) {
        self.bytes(&[0x0F, 0xB6, 0x80 | ((r as u8) << 3) | base as u8]);
        self.bytes(&disp.to_le_bytes());
    }

    /// `mov al, [rbx]`
    pub fn mov_al_at_rbx(&mut self) {
        self.bytes(&[0x8A, 0x03]);
    }

    /// `inc rbx`
    pub fn inc_rbx(&mut self) {
        self.bytes(&[0x48, 0xFF, 0xC3]);
    }

    /// `dec ecx`
    pub fn dec_ecx(&mut self) {
        self.bytes(&[0xFF, 0xC9]);
    }

    /// `mov al, imm8`
    pub fn mov_al(&mut self, imm: u8) {
        self.bytes(&[0xB0, imm]);
    }

    /// `mov ax, imm16`
    pub fn mov_ax(&mut self, imm: u16) {
        self.bytes(&[0x66, 0xB8]);
        self.bytes(&imm.to_le_bytes());
    }

    /// `test al, al`
    pub fn test_al_al(&mut self) {
        self.bytes(&[0x84, 0xC0]);
    }

    /// `test al, imm8`
    pub fn test_al(&mut self, imm: u8) {
        self.bytes(&[0xA8, imm]);
    }

    /// `cmp al, imm8`
    pub fn cmp_al(&mut self, imm: u8) {
        self.bytes(&[0x3C, imm]);
    }

    /// `and al, imm8`
    pub fn and_al(&mut self, imm: u8) {
        self.bytes(&[0x24, imm]);
    }

    /// `add al, imm8`
    pub fn add_al(&mut self, imm: u8) {
        self.bytes(&[0x04, imm]);
    }

    /// `rol eax, imm8`
    pub fn rol_eax(&mut self, imm: u8) {
        self.bytes(&[0xC1, 0xC0, imm]);
    }

    /// `shl eax, imm8`
    pub fn shl_eax(&mut self, imm: u8) {
        self.bytes(&[0xC1, 0xE0, imm]);
    }

    pub fn push_rax(&mut self) {
        self.bytes(&[0x50]);
    }

    pub fn pop_rax(&mut self) {
        self.bytes(&[0x58]);
    }

    /// `in al, dx`
    pub fn in_al_dx(&mut self) {
        self.bytes(&[0xEC]);
    }

    /// `out dx, al`
    pub fn out_dx_al(&mut self) {
        self.bytes(&[0xEE]);
    }

    /// `out dx, ax`
    pub fn out_dx_ax(&mut self) {
        self.bytes(&[0x66, 0xEF]);
    }

    // ---- used by the virtio-net driver (tiny_net.rs) ----

    /// `mov dword [base + disp32], imm32`
    pub fn mov_mem_imm32(&mut self, base: Reg, disp: u32, imm: u32) {
        self.bytes(&[0xC7, 0x80 | base as u8]);
        self.bytes(&disp.to_le_bytes());
        self.bytes(&imm.to_le_bytes());
    }

    /// `mov [base + disp32], r32`
    pub fn mov_mem_r32(&mut self, base: Reg, disp: u32, r: Reg) {
        self.bytes(&[0x89, 0x80 | ((r as u8) << 3) | base as u8]);
        self.bytes(&disp.to_le_bytes());
    }

    /// `mov [base + disp32], r64`
    pub fn mov_mem_r64(&mut self, base: Reg, disp: u32, r: Reg) {
        self.bytes(&[0x48, 0x89, 0x80 | ((r as u8) << 3) | base as u8]);
        self.bytes(&disp.to_le_bytes());
    }

    /// `mov [base + disp32], ax`
    pub fn mov_mem_ax(&mut self, base: Reg, disp: u32) {
        self.bytes(&[0x66, 0x89, 0x80 | base as u8]);
        self.bytes(&disp.to_le_bytes());
    }

    /// `movzx r32, word [base + disp32]`
    pub fn movzx_r32_mem16(&mut self, r: Reg, base: Reg, disp: u32) {
        self.bytes(&[0x0F, 0xB7, 0x80 | ((r as u8) << 3) | base as u8]);
        self.bytes(&disp.to_le_bytes());
    }

    /// `cmp eax, imm32`
    pub fn cmp_eax(&mut self, imm: u32) {
        self.bytes(&[0x3D]);
        self.bytes(&imm.to_le_bytes());
    }

    /// `add r32, imm32`
    pub fn add_r32_imm(&mut self, r: Reg, imm: u32) {
        self.bytes(&[0x81, 0xC0 | r as u8]);
        self.bytes(&imm.to_le_bytes());
    }

    /// `cmp r32, imm32`
    pub fn cmp_r32_imm(&mut self, r: Reg, imm: u32) {
        self.bytes(&[0x81, 0xF8 | r as u8]);
        self.bytes(&imm.to_le_bytes());
    }

    // ---- used by the shared virtio helpers and the blk/rng drivers ----

    /// `push r64`
    pub fn push(&mut self, r: Reg) {
        self.bytes(&[0x50 + r as u8]);
    }

    /// `pop r64`
    pub fn pop(&mut self, r: Reg) {
        self.bytes(&[0x58 + r as u8]);
    }

    /// `stosb` (store AL at [RDI], RDI += 1)
    pub fn stosb(&mut self) {
        self.bytes(&[0xAA]);
    }

    /// `rep stosb` (RCX bytes of AL from RDI)
    pub fn rep_stosb(&mut self) {
        self.bytes(&[0xF3, 0xAA]);
    }

    /// `inc al`
    pub fn inc_al(&mut self) {
        self.bytes(&[0xFE, 0xC0]);
    }

    /// `mov dst32, src32`
    pub fn mov_r32_r32(&mut self, dst: Reg, src: Reg) {
        self.bytes(&[0x89, 0xC0 | ((src as u8) << 3) | dst as u8]);
    }

    /// `shl r32, imm8`
    pub fn shl_r32(&mut self, r: Reg, imm: u8) {
        self.bytes(&[0xC1, 0xE0 | r as u8, imm]);
    }

    /// `cmp a32, b32`
    pub fn cmp_r32_r32(&mut self, a: Reg, b: Reg) {
        self.bytes(&[0x39, 0xC0 | ((b as u8) << 3) | a as u8]);
    }

    /// `cmp r16, word [base + disp32]`
    pub fn cmp_r16_mem(&mut self, r: Reg, base: Reg, disp: u32) {
        self.bytes(&[0x66, 0x3B, 0x80 | ((r as u8) << 3) | base as u8]);
        self.bytes(&disp.to_le_bytes());
    }

    /// `cmp al, byte [base + disp32]`
    pub fn cmp_al_mem(&mut self, base: Reg, disp: u32) {
        self.bytes(&[0x3A, 0x80 | base as u8]);
        self.bytes(&disp.to_le_bytes());
    }

    /// `inc word [base + disp32]`
    pub fn inc_word_mem(&mut self, base: Reg, disp: u32) {
        self.bytes(&[0x66, 0xFF, 0x80 | base as u8]);
        self.bytes(&disp.to_le_bytes());
    }

    /// `add dst32, src32`
    pub fn add_r32_r32(&mut self, dst: Reg, src: Reg) {
        self.bytes(&[0x01, 0xC0 | ((src as u8) << 3) | dst as u8]);
    }

    /// `and r32, imm32`
    pub fn and_r32_imm(&mut self, r: Reg, imm: u32) {
        self.bytes(&[0x81, 0xE0 | r as u8]);
        self.bytes(&imm.to_le_bytes());
    }

    /// `mov byte [base + disp32], imm8`
    pub fn mov_mem_imm8(&mut self, base: Reg, disp: u32, imm: u8) {
        self.bytes(&[0xC6, 0x80 | base as u8]);
        self.bytes(&disp.to_le_bytes());
        self.bytes(&[imm]);
    }

    /// A NUL-terminated string at a label.
    pub fn cstr(&mut self, l: &'static str, s: &str) {
        self.label(l);
        self.bytes(s.as_bytes());
        self.bytes(&[0]);
    }

    // ---- used by the kvmclock and keyboard checks (tiny_guest.rs) ----

    /// `cpuid` (EAX = leaf; clobbers EAX, EBX, ECX, EDX)
    pub fn cpuid(&mut self) {
        self.bytes(&[0x0F, 0xA2]);
    }

    /// `wrmsr` (ECX = MSR, EDX:EAX = value)
    pub fn wrmsr(&mut self) {
        self.bytes(&[0x0F, 0x30]);
    }

    /// `mov [rip + l], r32`
    pub fn mov_rip_r32(&mut self, l: &'static str, r: Reg) {
        self.bytes(&[0x89, ((r as u8) << 3) | 0b101]);
        self.rel32(l);
    }

    /// `mov r32, [rip + l]`
    pub fn mov_r32_rip(&mut self, l: &'static str, r: Reg) {
        self.bytes(&[0x8B, ((r as u8) << 3) | 0b101]);
        self.rel32(l);
    }

    /// `mov [rip + l], al`
    pub fn mov_rip_al(&mut self, l: &'static str) {
        self.bytes(&[0x88, 0x05]);
        self.rel32(l);
    }

    /// `mov al, [rip + l]`
    pub fn mov_al_rip(&mut self, l: &'static str) {
        self.bytes(&[0x8A, 0x05]);
        self.rel32(l);
    }

    /// `or al, imm8`
    pub fn or_al(&mut self, imm: u8) {
        self.bytes(&[0x0C, imm]);
    }

    /// `movzx eax, al`
    pub fn movzx_eax_al(&mut self) {
        self.bytes(&[0x0F, 0xB6, 0xC0]);
    }

    /// Resolves every fixup and returns the code.
    pub fn finish(mut self) -> Vec<u8> {
        for (at, name) in std::mem::take(&mut self.fixups) {
            let target = i64::try_from(self.offset_of(name)).expect("small image");
            let next = i64::try_from(at + 4).expect("small image");
            let rel = i32::try_from(target - next).expect("rel32 in range");
            self.code[at..at + 4].copy_from_slice(&rel.to_le_bytes());
        }
        self.code
    }
}
