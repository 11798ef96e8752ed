//! The "newc" cpio format (`070701`), as the Linux initramfs unpacker reads it
//! (Documentation/driver-api/early-userspace/buffer-format.rst).
//!
//! Each entry is a 110-byte ASCII header (magic + 13 eight-digit hex fields),
//! the NUL-terminated name padded to a multiple of 4 bytes (counting from the
//! header's start), then the data padded to a multiple of 4. The archive ends
//! with an entry named `TRAILER!!!`. Headers must start 4-byte aligned, which
//! is why an archive appended to an initrd is preceded by zero padding.
//!
//! `CpioWriter` makes archives (the agent overlay, the probe tier's initrd);
//! `parse` reads one back, for tests and checks. `parse` takes untrusted bytes:
//! every length is checked against the input, so it never panics or allocates
//! more than the input's size.

use std::fmt::Write as _;

/// The newc magic.
pub const NEWC_MAGIC: &[u8; 6] = b"070701";
/// Header length in bytes.
pub const HEADER_BYTES: usize = 110;
/// Name of the last entry.
pub const TRAILER: &str = "TRAILER!!!";

/// File type bits of `mode`.
pub const S_IFMT: u32 = 0o170_000;
/// A directory.
pub const S_IFDIR: u32 = 0o040_000;
/// A regular file.
pub const S_IFREG: u32 = 0o100_000;
/// A character device.
pub const S_IFCHR: u32 = 0o020_000;

/// An error writing or reading an archive.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum CpioError {
    /// A name the format cannot carry.
    #[error("cpio entry name {0:?} is invalid (use a relative path without NUL bytes, `..` or empty components)")]
    BadName(String),
    /// A file over the format's 32-bit size field.
    #[error("cpio entry {name:?} is {len_bytes} bytes, over the format's 4 GiB limit")]
    TooLarge {
        /// Entry name.
        name: String,
        /// Its length.
        len_bytes: u64,
    },
    /// Input that is not a newc archive.
    #[error("not a newc cpio archive at byte {offset} ({what})")]
    Malformed {
        /// Where in the input.
        offset: usize,
        /// What was wrong.
        what: &'static str,
    },
}

/// One entry of an archive.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CpioEntry {
    /// Path without a leading `/` (`sbin/provium-agent`).
    pub name: String,
    /// Type and permission bits (`S_IFREG | 0o755`).
    pub mode: u32,
    /// Device major/minor for device nodes (`rdevmajor`, `rdevminor`).
    pub rdev: (u32, u32),
    /// File contents (empty for directories and devices).
    pub data: Vec<u8>,
}

/// Builds a newc archive in memory. Entries get inode numbers 1, 2, ...;
/// owner root, mtime 0 and nlink 1 (2 for directories), so the same entries
/// always give the same bytes (the merged initrd is cached by content hash).
#[derive(Debug, Default)]
pub struct CpioWriter {
    out: Vec<u8>,
    next_ino: u32,
}

fn pad4(out: &mut Vec<u8>) {
    while out.len() % 4 != 0 {
        out.push(0);
    }
}

fn check_name(name: &str) -> Result<(), CpioError> {
    let bad = name.is_empty()
        || name.starts_with('/')
        || name.contains('\0')
        || name
            .split('/')
            .any(|c| c.is_empty() || c == "." || c == "..");
    if bad && name != TRAILER {
        return Err(CpioError::BadName(name.to_string()));
    }
    Ok(())
}

impl CpioWriter {
    /// An empty archive.
    pub fn new() -> CpioWriter {
        CpioWriter::default()
    }

    fn header(&mut self, name: &str, mode: u32, rdev: (u32, u32), len: u32) {
        let ino = if name == TRAILER {
            0
        } else {
            self.next_ino += 1;
            self.next_ino
        };
        let nlink = if mode & S_IFMT == S_IFDIR { 2 } else { 1 };
        let namesize = u32::try_from(name.len() + 1).expect("names are checked shorter than 4 GiB");
        let mut h = String::with_capacity(HEADER_BYTES);
        h.push_str("070701");
        for v in [
            ino, mode, 0, 0, nlink, 0, len, 0, 0, rdev.0, rdev.1, namesize, 0,
        ] {
            write!(h, "{v:08x}").expect("writing to a String cannot fail");
        }
        debug_assert_eq!(h.len(), HEADER_BYTES);
        self.out.extend_from_slice(h.as_bytes());
        self.out.extend_from_slice(name.as_bytes());
        self.out.push(0);
        pad4(&mut self.out);
    }

    /// Adds a directory (`mode` is its permission bits).
    pub fn dir(&mut self, name: &str, perm: u32) -> Result<&mut Self, CpioError> {
        check_name(name)?;
        self.header(name, S_IFDIR | (perm & 0o7777), (0, 0), 0);
        Ok(self)
    }

    /// Adds a regular file.
    pub fn file(&mut self, name: &str, perm: u32, data: &[u8]) -> Result<&mut Self, CpioError> {
        check_name(name)?;
        let len = u32::try_from(data.len()).map_err(|_| CpioError::TooLarge {
            name: name.to_string(),
            len_bytes: data.len() as u64,
        })?;
        self.header(name, S_IFREG | (perm & 0o7777), (0, 0), len);
        self.out.extend_from_slice(data);
        pad4(&mut self.out);
        Ok(self)
    }

    /// Adds a character device node.
    pub fn char_dev(
        &mut self,
        name: &str,
        perm: u32,
        major: u32,
        minor: u32,
    ) -> Result<&mut Self, CpioError> {
        check_name(name)?;
        self.header(name, S_IFCHR | (perm & 0o7777), (major, minor), 0);
        Ok(self)
    }

    /// Adds a file at `path` (leading `/` allowed) and every parent directory
    /// not added yet, each 0755.
    pub fn file_with_parents(
        &mut self,
        path: &str,
        perm: u32,
        data: &[u8],
        dirs_added: &mut Vec<String>,
    ) -> Result<&mut Self, CpioError> {
        let rel = path.trim_start_matches('/');
        check_name(rel)?;
        let mut prefix = String::new();
        let comps: Vec<&str> = rel.split('/').collect();
        for c in &comps[..comps.len() - 1] {
            if !prefix.is_empty() {
                prefix.push('/');
            }
            prefix.push_str(c);
            if !dirs_added.iter().any(|d| d == &prefix) {
                self.dir(&prefix, 0o755)?;
                dirs_added.push(prefix.clone());
            }
        }
        self.file(rel, perm, data)
    }

    /// Writes the trailer and returns the archive.
    pub fn finish(mut self) -> Vec<u8> {
        self.header(TRAILER, 0, (0, 0), 0);
        self.out
    }
}

fn hex_field(bytes: &[u8], offset: usize) -> Result<u32, CpioError> {
    let malformed = |what| CpioError::Malformed { offset, what };
    let s = std::str::from_utf8(bytes).map_err(|_| malformed("header field is not ASCII"))?;
    u32::from_str_radix(s, 16).map_err(|_| malformed("header field is not hex"))
}

fn align4(n: usize) -> Option<usize> {
    n.checked_add(3).map(|v| v & !3)
}

/// Parses every newc archive in `bytes` (concatenated archives and zero
/// padding between them, as the kernel accepts), returning the entries in
/// order without trailers. Compressed segments are refused.
pub fn parse(bytes: &[u8]) -> Result<Vec<CpioEntry>, CpioError> {
    let mut entries = Vec::new();
    let mut at = 0usize;
    while at < bytes.len() {
        if bytes[at] == 0 {
            at += 1;
            continue;
        }
        let malformed = |what| CpioError::Malformed { offset: at, what };
        if at % 4 != 0 {
            return Err(malformed("header not 4-byte aligned"));
        }
        let h = bytes
            .get(at..at + HEADER_BYTES)
            .ok_or_else(|| malformed("truncated header"))?;
        if &h[..6] != NEWC_MAGIC {
            return Err(malformed("bad magic (only uncompressed newc is read)"));
        }
        let field = |i: usize| hex_field(&h[6 + 8 * i..14 + 8 * i], at + 6 + 8 * i);
        let mode = field(1)?;
        let filesize = usize::try_from(field(6)?).map_err(|_| malformed("size"))?;
        let rdev = (field(9)?, field(10)?);
        let namesize = usize::try_from(field(11)?).map_err(|_| malformed("name size"))?;
        if namesize == 0 {
            return Err(malformed("empty name"));
        }
        let name_start = at + HEADER_BYTES;
        let name_end = name_start
            .checked_add(namesize)
            .filter(|&e| e <= bytes.len())
            .ok_or_else(|| malformed("truncated name"))?;
        let raw_name = &bytes[name_start..name_end];
        if raw_name.last() != Some(&0) {
            return Err(malformed("name not NUL-terminated"));
        }
        let name = String::from_utf8_lossy(&raw_name[..namesize - 1]).into_owned();
        let data_start = align4(name_end).ok_or_else(|| malformed("offset overflow"))?;
        let data_end = data_start
            .checked_add(filesize)
            .filter(|&e| e <= bytes.len())
            .ok_or_else(|| malformed("truncated data"))?;
        at = align4(data_end)
            .ok_or_else(|| malformed("offset overflow"))?
            .min(bytes.len());
        if name == TRAILER {
            continue;
        }
        entries.push(CpioEntry {
            name,
            mode,
            rdev,
            data: bytes[data_start..data_end].to_vec(),
        });
    }
    Ok(entries)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_bytes_are_exact() {
        let mut w = CpioWriter::new();
        w.file("init", 0o755, b"hi").expect("file");
        let a = w.finish();
        // magic, ino 1, mode 0100755, uid, gid, nlink 1, mtime, filesize 2,
        // devmajor, devminor, rdevmajor, rdevminor, namesize 5, check.
        let expected_header = [
            "070701", "00000001", "000081ed", "00000000", "00000000", "00000001", "00000000",
            "00000002", "00000000", "00000000", "00000000", "00000000", "00000005", "00000000",
        ]
        .concat();
        assert_eq!(&a[..HEADER_BYTES], expected_header.as_bytes());
        // name "init\0" ends at 115, padded to 116; data "hi" padded to 120.
        assert_eq!(&a[110..116], b"init\0\0");
        assert_eq!(&a[116..120], b"hi\0\0");
        assert_eq!(&a[120..126], b"070701");
        assert_eq!(a.len() % 4, 0);
        assert!(
            a.ends_with(b"TRAILER!!!\0\0\0\0"),
            "{:?}",
            &a[a.len() - 16..]
        );
    }

    #[test]
    fn round_trip() {
        let mut w = CpioWriter::new();
        let mut dirs = Vec::new();
        w.file_with_parents("/sbin/provium-agent", 0o755, &[7; 1001], &mut dirs)
            .expect("agent");
        w.file_with_parents("/etc/hostname", 0o644, b"v\n", &mut dirs)
            .expect("hostname");
        w.char_dev("dev-console", 0o600, 5, 1).expect("dev");
        let a = w.finish();
        let e = parse(&a).expect("parse");
        let names: Vec<&str> = e.iter().map(|e| e.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "sbin",
                "sbin/provium-agent",
                "etc",
                "etc/hostname",
                "dev-console"
            ]
        );
        assert_eq!(e[0].mode, S_IFDIR | 0o755);
        assert_eq!(e[1].mode, S_IFREG | 0o755);
        assert_eq!(e[1].data, vec![7; 1001]);
        assert_eq!(e[3].data, b"v\n");
        assert_eq!(e[4].mode, S_IFCHR | 0o600);
        assert_eq!(e[4].rdev, (5, 1));
    }

    #[test]
    fn concatenated_archives_with_padding_parse() {
        let mut a = CpioWriter::new();
        a.file("a", 0o644, b"1").expect("a");
        let mut bytes = a.finish();
        bytes.extend_from_slice(&[0; 512]);
        let mut b = CpioWriter::new();
        b.file("b", 0o644, b"22").expect("b");
        bytes.extend(b.finish());
        let names: Vec<String> = parse(&bytes)
            .expect("parse")
            .into_iter()
            .map(|e| e.name)
            .collect();
        assert_eq!(names, ["a", "b"]);
    }

    #[test]
    fn bad_names_are_refused() {
        let mut w = CpioWriter::new();
        for n in ["", "/abs", "a//b", "../x", "a/./b", "nul\0"] {
            assert!(
                matches!(w.file(n, 0o644, b""), Err(CpioError::BadName(_))),
                "{n:?}"
            );
        }
    }

    #[test]
    fn hostile_input_is_an_error_not_a_panic() {
        let mut w = CpioWriter::new();
        w.file("x", 0o644, b"abc").expect("x");
        let good = w.finish();
        // Every truncation, and every single-byte corruption of the header.
        for len in 0..good.len() {
            let _ = parse(&good[..len]);
        }
        for i in 0..HEADER_BYTES {
            let mut bad = good.clone();
            bad[i] = b'f';
            let _ = parse(&bad);
            bad[i] = b'z';
            let _ = parse(&bad);
        }
        // A huge declared size does not allocate: it is checked against the input.
        let mut huge = good.clone();
        huge[54..62].copy_from_slice(b"ffffffff");
        assert!(matches!(parse(&huge), Err(CpioError::Malformed { .. })));
        assert!(parse(b"\x1f\x8b\x08\0").is_err(), "gzip is refused");
    }
}
