//! Kernel modules the harness packed into the agent overlay (issue 25,
//! docs/kernels.md): when the guest kernel has vsock, its virtio transport
//! or our devices (blk, net, rng) as modules, the harness puts the `.ko`
//! files, decompressed and in dependency order, under [`MODULES_DIR`] with a
//! manifest ([`MANIFEST`]): one `<file> <name>` line per module, in load
//! order. As PID 1, before it forks to serve, the agent loads them with
//! `finit_module(2)`; `EEXIST` (already loaded, or built in) is fine. A
//! module that fails is named with its errno on the console (stderr), in a
//! line the harness quotes when no Hello comes ([`FAILED_PREFIX`]); the rest
//! are still tried, so one bad module costs only what depends on it.
//!
//! Parameters: the kernel applies `module.param=value` words of its command
//! line only to built-in code; for a loadable module `modprobe` collects them
//! from /proc/cmdline, and so does the agent ([`params_for`]): a modular
//! virtio_mmio gets its `virtio_mmio.device=` words that way.
//!
//! No manifest (a kernel with everything built in): nothing to do.

use std::ffi::CString;
use std::os::fd::AsRawFd;
use std::path::Path;

/// Where the harness puts the modules (vmm/src/initrd/inject.rs's overlay).
pub const MODULES_DIR: &str = "/lib/provium/modules";
/// The load-order manifest's name in [`MODULES_DIR`].
pub const MANIFEST: &str = "order";
/// How a failed load's console line starts (the harness looks for it).
pub const FAILED_PREFIX: &str = "provium-agent: cannot load module";

/// One manifest entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// The file name inside [`MODULES_DIR`].
    pub file: String,
    /// The module's name.
    pub name: String,
}

/// The manifest's entries; lines that are not `<file> <name>` with a plain
/// file name are skipped.
pub fn parse_manifest(text: &str) -> Vec<Entry> {
    text.lines()
        .filter_map(|l| {
            let mut w = l.split_whitespace();
            let (file, name) = (w.next()?, w.next()?);
            let plain = !file.contains('/') && file != "." && file != "..";
            plain.then(|| Entry {
                file: file.into(),
                name: name.into(),
            })
        })
        .collect()
}

/// The symbolic name of an errno the module loader returns.
pub fn errno_name(errno: i32) -> &'static str {
    match errno {
        libc::EEXIST => "EEXIST",
        libc::ENOENT => "ENOENT",
        libc::ENOEXEC => "ENOEXEC",
        libc::EINVAL => "EINVAL",
        libc::EKEYREJECTED => "EKEYREJECTED",
        libc::ENOKEY => "ENOKEY",
        libc::EPERM => "EPERM",
        libc::ENOMEM => "ENOMEM",
        libc::EBUSY => "EBUSY",
        libc::ENOSYS => "ENOSYS",
        libc::ENODEV => "ENODEV",
        libc::EFAULT => "EFAULT",
        libc::EBADMSG => "EBADMSG",
        _ => "errno",
    }
}

/// The parameters for module `name` in a kernel command line, as modprobe
/// takes them from /proc/cmdline: every `name.param[=value]` word before
/// `--` (`-` and `_` alike in the module name), `param[=value]` joined by
/// spaces.
pub fn params_for(name: &str, cmdline: &str) -> String {
    let norm = |s: &str| s.replace('-', "_");
    let want = norm(name);
    cmdline
        .split_whitespace()
        .take_while(|w| *w != "--")
        .filter_map(|w| {
            let (module, param) = w.split_once('.')?;
            let key_end = param.find('=').unwrap_or(param.len());
            (norm(module) == want && key_end > 0 && !module.contains('=')).then_some(param)
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// Loads one module file with `params`; `Ok(true)` loaded, `Ok(false)`
/// already there.
fn load(path: &Path, params: &str) -> Result<bool, std::io::Error> {
    let file = std::fs::File::open(path)?;
    let params = CString::new(params).unwrap_or_default();
    // SAFETY: finit_module reads the open fd and a NUL-terminated (empty)
    // parameter string that lives across the call; flags 0.
    let rc = unsafe { libc::syscall(libc::SYS_finit_module, file.as_raw_fd(), params.as_ptr(), 0) };
    if rc == 0 {
        return Ok(true);
    }
    let e = std::io::Error::last_os_error();
    if e.raw_os_error() == Some(libc::EEXIST) {
        return Ok(false);
    }
    Err(e)
}

/// Loads every module of the manifest under `dir`, in order; returns the
/// failure lines (also printed on stderr, the console).
pub fn load_listed(dir: &Path) -> Vec<String> {
    let Ok(text) = std::fs::read_to_string(dir.join(MANIFEST)) else {
        return Vec::new();
    };
    let cmdline = std::fs::read_to_string("/proc/cmdline").unwrap_or_default();
    let mut failures = Vec::new();
    let mut loaded = 0usize;
    for e in parse_manifest(&text) {
        match load(&dir.join(&e.file), &params_for(&e.name, &cmdline)) {
            Ok(true) => loaded += 1,
            Ok(false) => {}
            Err(err) => {
                let code = err.raw_os_error().unwrap_or(0);
                let line = format!(
                    "{FAILED_PREFIX} {} ({}/{}): {} ({err})",
                    e.name,
                    dir.display(),
                    e.file,
                    errno_name(code)
                );
                eprintln!("{line}");
                failures.push(line);
            }
        }
    }
    eprintln!(
        "provium-agent: loaded {loaded} kernel module(s) from {}",
        dir.display()
    );
    failures
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_manifest_is_file_and_name_per_line() {
        let m = parse_manifest("00-virtio.ko virtio\n\n01-vsock.ko vsock\n../x.ko x\nlonely\n");
        assert_eq!(
            m,
            [
                Entry {
                    file: "00-virtio.ko".into(),
                    name: "virtio".into()
                },
                Entry {
                    file: "01-vsock.ko".into(),
                    name: "vsock".into()
                },
            ]
        );
    }

    #[test]
    fn parameters_come_from_the_command_line_like_modprobe() {
        let line =
            "console=ttyS0 virtio_mmio.device=4K@0xd0000000:5 virtio-mmio.device=4K@0xd0001000:6 \
                    vsock.x virtio_mmio_x.y=1 -- virtio_mmio.device=init";
        assert_eq!(
            params_for("virtio_mmio", line),
            "device=4K@0xd0000000:5 device=4K@0xd0001000:6"
        );
        assert_eq!(params_for("vsock", line), "x");
        assert_eq!(params_for("virtio_blk", line), "");
    }

    /// Not a module: the loader refuses it (as non-root: EPERM; as root:
    /// ENOEXEC) and the failure names the module and the errno.
    #[test]
    fn a_failed_load_is_named_with_its_errno() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("00-bad.ko"), b"not a module").unwrap();
        std::fs::write(d.path().join("order"), "00-bad.ko bad\n01-gone.ko gone\n").unwrap();
        let f = load_listed(d.path());
        assert_eq!(f.len(), 2, "{f:?}");
        assert!(
            f[0].starts_with(&format!("{FAILED_PREFIX} bad (")),
            "{}",
            f[0]
        );
        assert!(
            ["EPERM", "ENOEXEC", "ENOSYS", "EINVAL"]
                .iter()
                .any(|n| f[0].contains(&format!(": {n} ("))),
            "{}",
            f[0]
        );
        assert!(f[1].contains("gone") && f[1].contains("ENOENT"), "{}", f[1]);
        assert!(load_listed(&d.path().join("none")).is_empty());
    }
}
