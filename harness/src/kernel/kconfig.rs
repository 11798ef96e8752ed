//! A kernel's build configuration (`CONFIG_X=y|m|...`), found where a
//! kernel keeps it:
//! 1. embedded (IKCONFIG): in an ELF vmlinux, the gzip blob between the
//!    `IKCFG_ST` and `IKCFG_ED` markers. A bzImage's kernel is compressed,
//!    so its embedded config is not read (the files below are);
//! 2. `config-<release>` beside the kernel (a distribution's /boot), then
//!    `config` or `.config` beside it (a build tree's vmlinux, the probe
//!    kernel's cache directory) or `boot/config-<release>` below it (an
//!    unpacked package's vmlinux), then `config` in the module tree (Fedora's
//!    /lib/modules/<release>/config), then `.config` three directories up
//!    (a build tree's arch/x86/boot/bzImage).

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};

use super::image::find;

/// The largest embedded config accepted, decompressed (a full distribution
/// config is ~250 KiB).
const MAX_CONFIG_BYTES: u64 = 8 << 20;

/// One option's value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tristate {
    /// `=y`
    Yes,
    /// `=m`
    Module,
    /// unset, `# ... is not set`, or `=n`
    No,
}

/// A parsed kernel config, and where it came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelConfig {
    /// "embedded (IKCONFIG)" or the file's path.
    pub source: String,
    values: BTreeMap<String, String>,
}

impl KernelConfig {
    /// Parses `.config` text (`CONFIG_X=value` lines; the rest is ignored).
    pub fn parse(text: &str, source: impl Into<String>) -> KernelConfig {
        let values = text
            .lines()
            .filter_map(|l| l.trim().strip_prefix("CONFIG_"))
            .filter_map(|l| l.split_once('='))
            .map(|(k, v)| (k.to_string(), v.trim_matches('"').to_string()))
            .collect();
        KernelConfig {
            source: source.into(),
            values,
        }
    }

    /// `CONFIG_<name>` (without the prefix) as a tristate.
    pub fn get(&self, name: &str) -> Tristate {
        match self.values.get(name).map(String::as_str) {
            Some("y") => Tristate::Yes,
            Some("m") => Tristate::Module,
            _ => Tristate::No,
        }
    }
}

/// The config could not be read.
#[derive(Debug, thiserror::Error)]
pub enum KconfigError {
    #[error(
        "no config for the kernel {} (release {release}): it embeds none that can be read \
         ({embedded}) and none of {} exists; put the kernel's config beside it as \
         config-{release}, or build it with CONFIG_IKCONFIG=y",
        kernel.display(),
        tried.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", ")
    )]
    NotFound {
        kernel: PathBuf,
        release: String,
        embedded: String,
        tried: Vec<PathBuf>,
    },
    #[error("cannot read the kernel config {} (check its permissions)", path.display())]
    Unreadable {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "the embedded config (IKCONFIG) of {} is not valid gzip (the kernel file is damaged; \
         rebuild it, or put its config beside it as config-<release>)",
        kernel.display()
    )]
    BadEmbedded {
        kernel: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// The IKCONFIG text of an uncompressed kernel, if it embeds one.
pub fn embedded_config(image: &[u8]) -> Option<Result<String, std::io::Error>> {
    let start = find(image, b"IKCFG_ST")? + 8;
    let len = find(&image[start..], b"IKCFG_ED")?;
    let mut text = String::new();
    let r = flate2::read::GzDecoder::new(&image[start..start + len])
        .take(MAX_CONFIG_BYTES)
        .read_to_string(&mut text);
    Some(r.map(|_| text))
}

/// The files tried for a kernel's config, in order (module docs).
pub fn config_candidates(kernel: &Path, release: &str, modules: Option<&Path>) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let real = std::fs::canonicalize(kernel).unwrap_or_else(|_| kernel.to_path_buf());
    let mut dirs = vec![kernel.parent().map(Path::to_path_buf)];
    dirs.push(real.parent().map(Path::to_path_buf));
    for dir in dirs.into_iter().flatten() {
        for name in [
            format!("config-{release}"),
            "config".into(),
            ".config".into(),
            format!("boot/config-{release}"),
        ] {
            let p = dir.join(name);
            if !out.contains(&p) {
                out.push(p);
            }
        }
    }
    if let Some(m) = modules {
        out.push(m.join("config"));
    }
    if let Some(top) = real.ancestors().nth(4) {
        out.push(top.join(".config"));
    }
    out
}

/// Reads the config of the kernel at `kernel` (bytes in `image` when it is an
/// ELF whose IKCONFIG can be read, else `None`), in the module docs' order.
pub fn read_config(
    kernel: &Path,
    image: Option<&[u8]>,
    release: &str,
    modules: Option<&Path>,
) -> Result<KernelConfig, KconfigError> {
    let embedded = match image.map(embedded_config) {
        Some(Some(Ok(text))) => return Ok(KernelConfig::parse(&text, "embedded (IKCONFIG)")),
        Some(Some(Err(source))) => {
            return Err(KconfigError::BadEmbedded {
                kernel: kernel.to_path_buf(),
                source,
            })
        }
        Some(None) => "no IKCONFIG in this vmlinux",
        None => "a bzImage's kernel is compressed, so its IKCONFIG is not read",
    };
    let tried = config_candidates(kernel, release, modules);
    for p in &tried {
        if p.is_file() {
            let text = std::fs::read_to_string(p).map_err(|source| KconfigError::Unreadable {
                path: p.clone(),
                source,
            })?;
            return Ok(KernelConfig::parse(&text, p.display().to_string()));
        }
    }
    Err(KconfigError::NotFound {
        kernel: kernel.to_path_buf(),
        release: release.into(),
        embedded: embedded.into(),
        tried,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn config_lines_become_tristates() {
        let c = KernelConfig::parse(
            "# comment\nCONFIG_VIRTIO=m\nCONFIG_ACPI=y\n# CONFIG_PCI is not set\nCONFIG_X=\"s\"\n",
            "t",
        );
        assert_eq!(c.get("VIRTIO"), Tristate::Module);
        assert_eq!(c.get("ACPI"), Tristate::Yes);
        assert_eq!(c.get("PCI"), Tristate::No);
        assert_eq!(c.get("NOPE"), Tristate::No);
    }

    #[test]
    fn an_elf_with_ikconfig_is_read_from_itself() {
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        gz.write_all(b"CONFIG_VSOCKETS=y\n").unwrap();
        let mut image = b"\x7fELF\x02junkIKCFG_ST".to_vec();
        image.extend(gz.finish().unwrap());
        image.extend_from_slice(b"IKCFG_EDmore");
        let d = tempfile::tempdir().unwrap();
        let k = d.path().join("vmlinux");
        let c = read_config(&k, Some(&image), "6.1", None).unwrap();
        assert_eq!(c.source, "embedded (IKCONFIG)");
        assert_eq!(c.get("VSOCKETS"), Tristate::Yes);
        let broken = b"IKCFG_STnot gzipIKCFG_ED".to_vec();
        let e = read_config(&k, Some(&broken), "6.1", None).unwrap_err();
        assert!(matches!(e, KconfigError::BadEmbedded { .. }), "{e}");
    }

    #[test]
    fn a_config_beside_the_kernel_is_found_else_the_error_lists_the_tries() {
        let d = tempfile::tempdir().unwrap();
        let k = d.path().join("vmlinuz-6.1.0-1-amd64");
        let e = read_config(&k, None, "6.1.0-1-amd64", None)
            .unwrap_err()
            .to_string();
        for want in ["config-6.1.0-1-amd64", "CONFIG_IKCONFIG=y", "compressed"] {
            assert!(e.contains(want), "missing {want:?} in {e}");
        }
        std::fs::write(d.path().join("config"), "CONFIG_PCI=y\n").unwrap();
        let c = read_config(&k, None, "6.1.0-1-amd64", None).unwrap();
        assert_eq!(c.get("PCI"), Tristate::Yes);
        std::fs::write(d.path().join("config-6.1.0-1-amd64"), "CONFIG_PCI=m\n").unwrap();
        let c = read_config(&k, None, "6.1.0-1-amd64", None).unwrap();
        assert_eq!(c.get("PCI"), Tristate::Module, "config-<release> first");
        assert!(c.source.ends_with("config-6.1.0-1-amd64"));
    }
}
