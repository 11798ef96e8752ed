//! What a kernel image says about itself, read without booting it: a
//! bzImage's setup header (Linux boot protocol, Documentation/x86/boot.rst)
//! or an ELF vmlinux's `Linux version` banner.
//!
//! Header fields used (offsets from the start of the file):
//! - 0x1f1 `setup_sects`, 0x202 `"HdrS"`, 0x206 `version` (the boot
//!   protocol, e.g. 0x020f = 2.15);
//! - 0x20e `kernel_version`: a pointer to a NUL-terminated string, at
//!   `kernel_version + 0x200` in the file, whose first word is the release
//!   (`uname -r`) the module tree is named after;
//! - 0x234 `relocatable_kernel`, 0x236 `xloadflags` (bit 0: the 64-bit
//!   entry point at 0x200 past the protected-mode code).
//!
//! A bzImage's kernel is compressed (gzip, xz, lz4, zstd...), so its
//! embedded config (IKCONFIG) is not read here; an ELF vmlinux has it in
//! the clear (see `kconfig`). Everything here treats the file as untrusted:
//! bounded reads, no panics (a fuzz target covers [`parse_image`]).

use std::path::{Path, PathBuf};

/// The longest `kernel_version` string read (the kernel's is ~100 bytes).
const MAX_VERSION_BYTES: usize = 512;

/// What kind of image a kernel file is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ImageKind {
    /// A bzImage: its setup header.
    BzImage(BzHeader),
    /// An uncompressed ELF vmlinux (what the VMM boots fastest on kvm_pvm).
    Elf,
}

/// The setup-header fields `kernel check` prints.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BzHeader {
    /// Boot protocol version, major and minor (2.15 is `(2, 15)`).
    pub protocol: (u8, u8),
    /// The `kernel_version` string as written (release, builder, date).
    pub version: String,
    /// `xloadflags` bit 0: a 64-bit entry point.
    pub entry_64: bool,
    /// `relocatable_kernel`.
    pub relocatable: bool,
}

/// A parsed kernel image: its kind and release.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelImageInfo {
    pub kind: ImageKind,
    /// The release (`uname -r`), e.g. `6.1.0-57-amd64`; `None` when an ELF
    /// has no `Linux version` banner.
    pub release: Option<String>,
}

/// Why a file is not a kernel image this VMM can boot.
#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    #[error("cannot read the kernel {}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "{} is not a bzImage (no \"HdrS\" setup header at 0x202) or an ELF vmlinux ({why}); \
         give the kernel's arch/x86/boot/bzImage, its vmlinux, or a distribution's /boot/vmlinuz-*",
        path.display()
    )]
    NotAKernel { path: PathBuf, why: String },
}

/// Reads and parses the kernel at `path`.
pub fn read_image(path: &Path) -> Result<KernelImageInfo, ImageError> {
    let bytes = std::fs::read(path).map_err(|source| ImageError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    parse_image(&bytes).map_err(|why| ImageError::NotAKernel {
        path: path.to_path_buf(),
        why,
    })
}

/// Parses image bytes; the error says what was missing.
pub fn parse_image(bytes: &[u8]) -> Result<KernelImageInfo, String> {
    if bytes.starts_with(b"\x7fELF") {
        if bytes.get(4) != Some(&2) {
            return Err("an ELF, but not 64-bit".into());
        }
        return Ok(KernelImageInfo {
            kind: ImageKind::Elf,
            release: elf_release(bytes),
        });
    }
    let header = parse_bzimage(bytes)?;
    let release = header.version.split_whitespace().next().map(str::to_string);
    Ok(KernelImageInfo {
        kind: ImageKind::BzImage(header),
        release,
    })
}

fn u16_at(b: &[u8], off: usize) -> Option<u16> {
    Some(u16::from_le_bytes(b.get(off..off + 2)?.try_into().ok()?))
}

/// The setup header of a bzImage.
pub fn parse_bzimage(b: &[u8]) -> Result<BzHeader, String> {
    if b.get(0x202..0x206) != Some(b"HdrS") {
        return Err(format!("{} bytes, no header magic", b.len()));
    }
    let version = u16_at(b, 0x206).ok_or("the header is cut short")?;
    let [minor, major] = version.to_le_bytes();
    if major < 2 || (major == 2 && minor < 6) {
        return Err(format!(
            "boot protocol {major}.{minor}; this VMM needs 2.06 or later"
        ));
    }
    let ptr = u16_at(b, 0x20e).ok_or("the header is cut short")?;
    let text = if ptr == 0 {
        String::new()
    } else {
        let start = usize::from(ptr) + 0x200;
        let rest = b.get(start..).ok_or("kernel_version points past the end")?;
        let rest = &rest[..rest.len().min(MAX_VERSION_BYTES)];
        let end = rest.iter().position(|&c| c == 0).unwrap_or(rest.len());
        String::from_utf8_lossy(&rest[..end]).into_owned()
    };
    let relocatable = b.get(0x234).copied().unwrap_or(0) != 0;
    let xloadflags = if (major, minor) >= (2, 12) {
        u16_at(b, 0x236).unwrap_or(0)
    } else {
        0
    };
    Ok(BzHeader {
        protocol: (major, minor),
        version: text,
        entry_64: xloadflags & 1 != 0,
        relocatable,
    })
}

/// The release in an ELF vmlinux's `Linux version <release> (...)` banner.
pub fn elf_release(b: &[u8]) -> Option<String> {
    const BANNER: &[u8] = b"Linux version ";
    let mut from = 0;
    while let Some(i) = find(&b[from..], BANNER) {
        let start = from + i + BANNER.len();
        let word: Vec<u8> = b[start..]
            .iter()
            .take(128)
            .take_while(|c| c.is_ascii_graphic())
            .copied()
            .collect();
        // The banner proper is followed by " (builder@host)"; format
        // strings such as "Linux version %s" are not.
        if !word.is_empty() && !word.contains(&b'%') && word[0].is_ascii_digit() {
            return String::from_utf8(word).ok();
        }
        from = start;
    }
    None
}

/// The first index of `needle` in `hay`.
pub fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    if needle.is_empty() || hay.len() < needle.len() {
        return None;
    }
    hay.windows(needle.len()).position(|w| w == needle)
}

/// A fabricated bzImage setup header (tests and the fuzz seed corpus):
/// protocol `major.minor`, `version` at 0x300, the given flags.
pub fn fake_bzimage(major: u8, minor: u8, version: &str, entry_64: bool, reloc: bool) -> Vec<u8> {
    let mut b = vec![0u8; 0x400 + version.len()];
    b[0x1f1] = 1;
    b[0x202..0x206].copy_from_slice(b"HdrS");
    b[0x206] = minor;
    b[0x207] = major;
    b[0x20e..0x210].copy_from_slice(&0x100u16.to_le_bytes());
    b[0x234] = u8::from(reloc);
    b[0x236] = u8::from(entry_64);
    b[0x300..0x300 + version.len()].copy_from_slice(version.as_bytes());
    b
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bzimage_header_gives_protocol_release_and_flags() {
        let b = fake_bzimage(
            2,
            15,
            "6.1.0-57-amd64 (debian-kernel@lists.debian.org) #1 SMP",
            true,
            true,
        );
        let info = parse_image(&b).unwrap();
        assert_eq!(info.release.as_deref(), Some("6.1.0-57-amd64"));
        let ImageKind::BzImage(h) = info.kind else {
            panic!("a bzImage")
        };
        assert_eq!(h.protocol, (2, 15));
        assert!(h.entry_64 && h.relocatable);
        assert!(h.version.contains("#1 SMP"));
        let old = fake_bzimage(2, 11, "4.0", true, false);
        let ImageKind::BzImage(h) = parse_image(&old).unwrap().kind else {
            panic!("a bzImage")
        };
        assert!(!h.entry_64, "xloadflags is only read from 2.12 on");
        assert!(!h.relocatable);
    }

    #[test]
    fn bad_images_say_what_is_wrong() {
        assert!(parse_image(b"hello")
            .unwrap_err()
            .contains("no header magic"));
        let too_old = fake_bzimage(2, 4, "2.4", false, false);
        assert!(parse_image(&too_old).unwrap_err().contains("2.06"));
        let mut cut = fake_bzimage(2, 15, "x", true, true);
        cut[0x20e..0x210].copy_from_slice(&0xffffu16.to_le_bytes());
        assert!(parse_image(&cut).unwrap_err().contains("past the end"));
        assert!(parse_image(b"\x7fELF\x01").unwrap_err().contains("64-bit"));
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("initrd.cpio");
        std::fs::write(&p, b"070701").unwrap();
        let e = read_image(&p).unwrap_err().to_string();
        assert!(
            e.contains("initrd.cpio") && e.contains("not a bzImage"),
            "{e}"
        );
        let e = read_image(&d.path().join("gone")).unwrap_err().to_string();
        assert!(
            e.contains("cannot read the kernel") && e.contains("gone"),
            "{e}"
        );
    }

    #[test]
    fn an_elf_vmlinux_gives_its_release_from_the_banner() {
        let mut b = b"\x7fELF\x02\x01\x01".to_vec();
        b.extend_from_slice(b"\0Linux version %s (%s)\0junk");
        b.extend_from_slice(b"\0Linux version 6.1.192 (builder@host) (gcc 12) #1\0");
        let info = parse_image(&b).unwrap();
        assert_eq!(info.kind, ImageKind::Elf);
        assert_eq!(info.release.as_deref(), Some("6.1.192"));
        assert_eq!(parse_image(b"\x7fELF\x02\x01\x01\0").unwrap().release, None);
    }
}
