//! A kernel module's own `.modinfo` section: `name=`, `depends=` and
//! `vermagic=` (NUL-separated `key=value` strings, what `modinfo` prints).
//!
//! Dependencies come from here rather than `modules.dep` because a module
//! tree may have no depmod output (Debian's packages ship none). The file is
//! untrusted: every offset and size is checked against the bytes, and a
//! fuzz target covers [`parse_modinfo`].

/// The fields of `.modinfo` the harness uses.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ModInfo {
    /// `name=`: the module's name (underscores, as the kernel knows it).
    pub name: Option<String>,
    /// `depends=`: the modules it needs loaded first (may be empty).
    pub depends: Vec<String>,
    /// `vermagic=`: its first word is the release it was built for.
    pub vermagic: Option<String>,
}

impl ModInfo {
    /// The release in `vermagic` (its first word).
    pub fn release(&self) -> Option<&str> {
        self.vermagic.as_deref()?.split_whitespace().next()
    }
}

/// A module name as the kernel compares them: `-` and `_` are the same.
pub fn normalize(name: &str) -> String {
    name.replace('-', "_")
}

fn u16_at(b: &[u8], off: usize) -> Option<u16> {
    Some(u16::from_le_bytes(
        b.get(off..off.checked_add(2)?)?.try_into().ok()?,
    ))
}
fn u32_at(b: &[u8], off: usize) -> Option<u32> {
    Some(u32::from_le_bytes(
        b.get(off..off.checked_add(4)?)?.try_into().ok()?,
    ))
}
fn u64_at(b: &[u8], off: usize) -> Option<usize> {
    let v = u64::from_le_bytes(b.get(off..off.checked_add(8)?)?.try_into().ok()?);
    usize::try_from(v).ok()
}

/// The bytes of the section called `want` in a 64-bit little-endian ELF,
/// or why there is none.
pub fn elf_section<'a>(b: &'a [u8], want: &str) -> Result<Option<&'a [u8]>, String> {
    if !b.starts_with(b"\x7fELF") {
        return Err("no ELF magic".into());
    }
    if b.get(4) != Some(&2) || b.get(5) != Some(&1) {
        return Err("not a 64-bit little-endian ELF".into());
    }
    let bad = || "its section headers run past the end".to_string();
    let shoff = u64_at(b, 0x28).ok_or_else(bad)?;
    let shentsize = usize::from(u16_at(b, 0x3a).ok_or_else(bad)?);
    let shnum = usize::from(u16_at(b, 0x3c).ok_or_else(bad)?);
    let shstrndx = usize::from(u16_at(b, 0x3e).ok_or_else(bad)?);
    if shnum == 0 {
        return Ok(None);
    }
    if shentsize < 64 {
        return Err(format!("section header size {shentsize} is below 64"));
    }
    let section = |i: usize| -> Option<(u32, &'a [u8])> {
        let h = shoff.checked_add(i.checked_mul(shentsize)?)?;
        let name = u32_at(b, h)?;
        let kind = u32_at(b, h + 4)?;
        let off = u64_at(b, h + 0x18)?;
        let size = u64_at(b, h + 0x20)?;
        // SHT_NOBITS has no bytes in the file.
        let data = if kind == 8 {
            &[][..]
        } else {
            b.get(off..off.checked_add(size)?)?
        };
        Some((name, data))
    };
    let (_, strtab) = section(shstrndx).ok_or_else(bad)?;
    for i in 0..shnum {
        let (name_off, data) = section(i).ok_or_else(bad)?;
        let Some(name) = usize::try_from(name_off).ok().and_then(|o| strtab.get(o..)) else {
            continue;
        };
        let end = name.iter().position(|&c| c == 0).unwrap_or(name.len());
        if &name[..end] == want.as_bytes() {
            return Ok(Some(data));
        }
    }
    Ok(None)
}

/// Parses a module's `.modinfo`; an error says why the bytes are not a
/// module (not ELF, broken headers, no `.modinfo`).
pub fn parse_modinfo(ko: &[u8]) -> Result<ModInfo, String> {
    let data = elf_section(ko, ".modinfo")?.ok_or("an ELF without a .modinfo section")?;
    let mut info = ModInfo::default();
    for entry in data.split(|&c| c == 0) {
        let Ok(text) = std::str::from_utf8(entry) else {
            continue;
        };
        let Some((key, value)) = text.split_once('=') else {
            continue;
        };
        match key {
            "name" => info.name = Some(value.to_string()),
            "vermagic" => info.vermagic = Some(value.to_string()),
            "depends" => {
                info.depends = value
                    .split(',')
                    .filter(|d| !d.is_empty())
                    .map(normalize)
                    .collect();
            }
            _ => {}
        }
    }
    Ok(info)
}

/// A minimal relocatable ELF whose only sections are a `.modinfo` holding
/// `entries` and the section-name table (tests and the fuzz corpus).
pub fn fake_ko(entries: &[&str]) -> Vec<u8> {
    let mut modinfo = Vec::new();
    for e in entries {
        modinfo.extend_from_slice(e.as_bytes());
        modinfo.push(0);
    }
    let shstrtab = b"\0.modinfo\0.shstrtab\0";
    let mut b = vec![0u8; 64];
    b[..7].copy_from_slice(b"\x7fELF\x02\x01\x01");
    b[0x10] = 1; // ET_REL
    let modinfo_off = b.len();
    b.extend_from_slice(&modinfo);
    let strtab_off = b.len();
    b.extend_from_slice(shstrtab);
    while b.len() % 8 != 0 {
        b.push(0);
    }
    let shoff = b.len();
    let header = |name: u32, kind: u32, off: usize, size: usize| {
        let mut h = vec![0u8; 64];
        h[..4].copy_from_slice(&name.to_le_bytes());
        h[4..8].copy_from_slice(&kind.to_le_bytes());
        h[0x18..0x20].copy_from_slice(&(off as u64).to_le_bytes());
        h[0x20..0x28].copy_from_slice(&(size as u64).to_le_bytes());
        h
    };
    b.extend(header(0, 0, 0, 0));
    b.extend(header(1, 1, modinfo_off, modinfo.len()));
    b.extend(header(10, 3, strtab_off, shstrtab.len()));
    b[0x28..0x30].copy_from_slice(&(shoff as u64).to_le_bytes());
    b[0x3a..0x3c].copy_from_slice(&64u16.to_le_bytes());
    b[0x3c..0x3e].copy_from_slice(&3u16.to_le_bytes());
    b[0x3e..0x40].copy_from_slice(&2u16.to_le_bytes());
    b
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modinfo_gives_name_depends_and_vermagic() {
        let ko = fake_ko(&[
            "license=GPL",
            "depends=vsock,vmw_vsock_virtio_transport_common",
            "name=vmw_vsock_virtio_transport",
            "vermagic=6.1.0-57-amd64 SMP preempt mod_unload modversions ",
        ]);
        let m = parse_modinfo(&ko).unwrap();
        assert_eq!(m.name.as_deref(), Some("vmw_vsock_virtio_transport"));
        assert_eq!(m.depends, ["vsock", "vmw_vsock_virtio_transport_common"]);
        assert_eq!(m.release(), Some("6.1.0-57-amd64"));
        let none = parse_modinfo(&fake_ko(&["depends=", "name=virtio"])).unwrap();
        assert!(none.depends.is_empty());
        assert_eq!(normalize("virtio-rng"), "virtio_rng");
    }

    #[test]
    fn broken_modules_are_errors_not_panics() {
        assert_eq!(parse_modinfo(b"not elf").unwrap_err(), "no ELF magic");
        let ko = fake_ko(&["name=x"]);
        for cut in [0x20, 0x41, ko.len() - 30] {
            assert!(parse_modinfo(&ko[..cut]).is_err(), "cut at {cut}");
        }
        let mut bad = ko.clone();
        bad[0x28..0x30].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(parse_modinfo(&bad).unwrap_err().contains("past the end"));
        let mut no_sections = ko;
        no_sections[0x3c] = 0;
        assert!(parse_modinfo(&no_sections)
            .unwrap_err()
            .contains("without a .modinfo"));
    }
}
