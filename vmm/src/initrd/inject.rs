//! Agent injection (DESIGN.md "Backends"; reference: `inject_agent`).
//!
//! The kvm backend boots the profile's initrd with a small newc overlay
//! appended: `/sbin/provium-agent` plus the boot opts' `files`. The kernel
//! unpacks concatenated archives (compressed or not) into one rootfs, later
//! entries winning, so the user's initrd needs no change. `rdinit=/sbin/provium-agent`
//! on the command line makes the agent PID 1; it forks, serves vsock, and the
//! parent execs the initrd's own `/init`.
//!
//! Rules (reference, `[profiles.<name>].inject_agent`):
//! - a command line that already pins another `rdinit=` is an error that says
//!   how to resolve it; one that already says `rdinit=/sbin/provium-agent` is
//!   left as is;
//! - the merged initrd is cached by the SHA-256 of its content (the base
//!   initrd and the overlay), so a second boot of the same pair only hashes;
//!   it is written as `.merge-<pid>-<random>.tmp` and renamed into place, and
//!   a merge that writes deletes the temporaries of processes that are gone
//!   (a run killed mid-write; the cache directory is shared between runs);
//! - with `inject_agent = false` the caller passes no `AgentInjection` and the
//!   boot source is used unchanged.

use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use super::cpio::{CpioError, CpioWriter};
use crate::vmm_config::BootSource;

/// Where the agent lands in the guest.
pub const AGENT_GUEST_PATH: &str = "/sbin/provium-agent";
/// The command-line word injection adds.
pub const RDINIT_AGENT: &str = "rdinit=/sbin/provium-agent";

/// A file the guest should find before init runs (boot opts `files`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BootFile {
    /// Absolute guest path.
    pub path: String,
    /// Contents.
    pub content: Vec<u8>,
    /// Permission bits (0644 for the reference's `files`).
    pub mode: u32,
}

/// What to inject, and where merged initrds are cached.
#[derive(Clone, Debug)]
pub struct AgentInjection {
    /// The static provium-agent binary on the host.
    pub agent: PathBuf,
    /// Extra files (boot opts `files`).
    pub files: Vec<BootFile>,
    /// Cache directory for merged initrds (`<scratch_root>/agent-overlay-cache`).
    pub cache_dir: PathBuf,
}

/// An injection failure.
#[derive(Debug, thiserror::Error)]
pub enum InjectError {
    /// The command line already names another init.
    #[error(
        "kernel command line already sets `{existing}`, which conflicts with the injected agent's \
         `{RDINIT_AGENT}` (remove that rdinit= from the cmdline, or set inject_agent = false on \
         the profile)"
    )]
    RdinitConflict {
        /// The conflicting word.
        existing: String,
    },
    /// A boot file path that cannot go in the overlay.
    #[error("boot file {path:?} cannot be injected (use an absolute path like /etc/hostname)")]
    BadFile {
        /// The path.
        path: String,
        /// Cause.
        #[source]
        source: CpioError,
    },
    /// Reading the agent or the base initrd failed.
    #[error("cannot read {what} {path}")]
    Read {
        /// "agent binary" or "initrd".
        what: &'static str,
        /// The path.
        path: PathBuf,
        /// Cause.
        #[source]
        source: io::Error,
    },
    /// Writing the cache failed.
    #[error(
        "cannot write the merged initrd under {dir} (check the scratch directory is writable)"
    )]
    Cache {
        /// The cache directory.
        dir: PathBuf,
        /// Cause.
        #[source]
        source: io::Error,
    },
}

/// Splits a command line into words the way the kernel's `next_arg` does:
/// whitespace separates, double quotes group (and are kept in the word).
pub fn cmdline_words(cmdline: &str) -> Vec<&str> {
    let mut words = Vec::new();
    let mut start = None;
    let mut in_quote = false;
    for (i, c) in cmdline.char_indices() {
        if c == '"' {
            in_quote = !in_quote;
        }
        if c.is_ascii_whitespace() && !in_quote {
            if let Some(s) = start.take() {
                words.push(&cmdline[s..i]);
            }
        } else if start.is_none() {
            start = Some(i);
        }
    }
    if let Some(s) = start {
        words.push(&cmdline[s..]);
    }
    words
}

/// Adds `rdinit=/sbin/provium-agent` to `cmdline`, before a `--` (words after
/// it go to init, not the kernel). Errors on another `rdinit=` among the kernel's
/// words; returns the line unchanged if it already names the agent.
pub fn inject_cmdline(cmdline: &str) -> Result<String, InjectError> {
    let words = cmdline_words(cmdline);
    let kernel_words = words.iter().take_while(|w| **w != "--");
    let mut already = false;
    for w in kernel_words {
        if let Some(v) = w.strip_prefix("rdinit=") {
            if v.trim_matches('"') == AGENT_GUEST_PATH {
                already = true;
            } else {
                return Err(InjectError::RdinitConflict {
                    existing: (*w).to_string(),
                });
            }
        }
    }
    if already {
        return Ok(cmdline.to_string());
    }
    let mut out: Vec<&str> = Vec::with_capacity(words.len() + 1);
    match words.iter().position(|w| *w == "--") {
        Some(i) => {
            out.extend(&words[..i]);
            out.push(RDINIT_AGENT);
            out.extend(&words[i..]);
        }
        None => {
            out.extend(&words);
            out.push(RDINIT_AGENT);
        }
    }
    Ok(out.join(" "))
}

/// The overlay archive: `/sbin/provium-agent` (0755) and `files`, with their
/// parent directories. Equal inputs give equal bytes.
pub fn overlay_cpio(agent: &[u8], files: &[BootFile]) -> Result<Vec<u8>, InjectError> {
    let mut w = CpioWriter::new();
    let mut dirs = Vec::new();
    w.file_with_parents(AGENT_GUEST_PATH, 0o755, agent, &mut dirs)
        .map_err(|source| InjectError::BadFile {
            path: AGENT_GUEST_PATH.to_string(),
            source,
        })?;
    for f in files {
        if !f.path.starts_with('/') {
            return Err(InjectError::BadFile {
                path: f.path.clone(),
                source: CpioError::BadName(f.path.clone()),
            });
        }
        w.file_with_parents(&f.path, f.mode, &f.content, &mut dirs)
            .map_err(|source| InjectError::BadFile {
                path: f.path.clone(),
                source,
            })?;
    }
    Ok(w.finish())
}

fn read_file(what: &'static str, path: &Path) -> Result<Vec<u8>, InjectError> {
    fs::read(path).map_err(|source| InjectError::Read {
        what,
        path: path.to_path_buf(),
        source,
    })
}

/// Bytes of zero padding that bring `len` to a multiple of 4 (newc headers
/// must start 4-byte aligned; the kernel skips zeros between archives).
fn pad_to_4(len: u64) -> usize {
    usize::try_from((4 - len % 4) % 4).expect("below 4")
}

/// How a merge's temporary file in the cache directory starts, before
/// `<pid>-`: the pid says whether its writer is still alive.
const MERGE_TMP_PREFIX: &str = ".merge-";

/// Deletes the merge temporaries in `cache_dir` whose writing process is
/// gone. A pid reused since only delays that to the next merge after it.
fn remove_dead_merges(cache_dir: &Path) {
    let Ok(entries) = fs::read_dir(cache_dir) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name();
        let pid = name
            .to_str()
            .and_then(|n| n.strip_prefix(MERGE_TMP_PREFIX))
            .and_then(|rest| rest.split('-').next())
            .and_then(|pid| pid.parse::<u32>().ok());
        if pid.is_some_and(|pid| !Path::new("/proc").join(pid.to_string()).exists()) {
            // Best effort: another merge may have removed it first.
            let _ = fs::remove_file(e.path());
        }
    }
}

/// Writes `base` (may be absent) + padding + `overlay` into the cache dir,
/// named by the SHA-256 of the merged bytes, unless it is there already.
/// Returns its path. The write goes to a temporary file renamed into place,
/// so concurrent boots never see half a file.
pub fn merged_initrd(
    base: Option<&Path>,
    overlay: &[u8],
    cache_dir: &Path,
) -> Result<PathBuf, InjectError> {
    let cache_err = |source| InjectError::Cache {
        dir: cache_dir.to_path_buf(),
        source,
    };
    let read_err = |path: &Path, source| InjectError::Read {
        what: "initrd",
        path: path.to_path_buf(),
        source,
    };
    // Hash pass: stream the base, no copy in memory.
    let mut h = Sha256::new();
    let mut base_len = 0u64;
    if let Some(p) = base {
        let mut f = File::open(p).map_err(|e| read_err(p, e))?;
        let mut buf = vec![0u8; 1 << 20];
        loop {
            let n = f.read(&mut buf).map_err(|e| read_err(p, e))?;
            if n == 0 {
                break;
            }
            h.update(&buf[..n]);
            base_len += n as u64;
        }
    }
    let pad = [0u8; 4];
    let pad = &pad[..pad_to_4(base_len)];
    h.update(pad);
    h.update(overlay);
    let digest = h.finalize();
    let name: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    let dest = cache_dir.join(format!("{name}.cpio"));
    if dest.is_file() {
        return Ok(dest);
    }
    fs::create_dir_all(cache_dir).map_err(cache_err)?;
    remove_dead_merges(cache_dir);
    let mut tmp = tempfile::Builder::new()
        .prefix(&format!("{MERGE_TMP_PREFIX}{}-", std::process::id()))
        .suffix(".tmp")
        .tempfile_in(cache_dir)
        .map_err(cache_err)?;
    if let Some(p) = base {
        let mut f = File::open(p).map_err(|e| read_err(p, e))?;
        let copied = io::copy(&mut f, tmp.as_file_mut()).map_err(cache_err)?;
        if copied != base_len {
            return Err(read_err(
                p,
                io::Error::other("the initrd changed while it was being merged; retry"),
            ));
        }
    }
    tmp.write_all(pad).map_err(cache_err)?;
    tmp.write_all(overlay).map_err(cache_err)?;
    tmp.as_file().sync_all().map_err(cache_err)?;
    tmp.persist(&dest).map_err(|e| cache_err(e.error))?;
    Ok(dest)
}

/// The boot source with the agent injected: the merged initrd (cached) and the
/// command line with `rdinit=`. Call only when the profile's `inject_agent` is true.
pub fn inject_agent(boot: &BootSource, inj: &AgentInjection) -> Result<BootSource, InjectError> {
    let cmdline = inject_cmdline(&boot.cmdline)?;
    let agent = read_file("agent binary", &inj.agent)?;
    let overlay = overlay_cpio(&agent, &inj.files)?;
    let initrd = merged_initrd(boot.initrd.as_deref(), &overlay, &inj.cache_dir)?;
    Ok(BootSource {
        kernel: boot.kernel.clone(),
        initrd: Some(initrd),
        cmdline,
    })
}

#[cfg(test)]
mod tests {
    use super::super::cpio::{parse, S_IFDIR, S_IFREG};
    use super::*;
    use crate::vmm_config::KernelImage;

    #[test]
    fn cmdline_gets_rdinit() {
        assert_eq!(
            inject_cmdline("console=ttyS0 quiet").expect("ok"),
            "console=ttyS0 quiet rdinit=/sbin/provium-agent"
        );
        assert_eq!(inject_cmdline("").expect("ok"), RDINIT_AGENT);
        // Words after `--` belong to init: rdinit= goes before them, and an
        // rdinit= there is not the kernel's.
        assert_eq!(
            inject_cmdline("ro -- rdinit=/x single").expect("ok"),
            "ro rdinit=/sbin/provium-agent -- rdinit=/x single"
        );
        // Quotes group words like the kernel's parser.
        assert_eq!(
            inject_cmdline("a=\"x rdinit=/y\" b").expect("ok"),
            "a=\"x rdinit=/y\" b rdinit=/sbin/provium-agent"
        );
        // Already the agent: unchanged (no duplicate).
        let same = "console=ttyS0 rdinit=/sbin/provium-agent";
        assert_eq!(inject_cmdline(same).expect("ok"), same);
    }

    #[test]
    fn another_rdinit_is_a_clear_error() {
        let e = inject_cmdline("console=ttyS0 rdinit=/bin/sh").expect_err("conflict");
        let msg = e.to_string();
        assert!(msg.contains("rdinit=/bin/sh"), "{msg}");
        assert!(msg.contains("inject_agent = false"), "{msg}");
        assert!(
            matches!(e, InjectError::RdinitConflict { existing } if existing == "rdinit=/bin/sh")
        );
    }

    #[test]
    fn overlay_holds_the_agent_and_files() {
        let files = vec![
            BootFile {
                path: "/etc/hostname".into(),
                content: b"v\n".to_vec(),
                mode: 0o644,
            },
            BootFile {
                path: "/sbin/helper".into(),
                content: b"#!/bin/sh\n".to_vec(),
                mode: 0o755,
            },
        ];
        let a = overlay_cpio(b"\x7fELF-agent", &files).expect("overlay");
        assert_eq!(a, overlay_cpio(b"\x7fELF-agent", &files).expect("again"));
        let e = parse(&a).expect("parses");
        let got: Vec<(&str, u32, &[u8])> = e
            .iter()
            .map(|e| (e.name.as_str(), e.mode, e.data.as_slice()))
            .collect();
        assert_eq!(
            got,
            vec![
                ("sbin", S_IFDIR | 0o755, &b""[..]),
                ("sbin/provium-agent", S_IFREG | 0o755, &b"\x7fELF-agent"[..]),
                ("etc", S_IFDIR | 0o755, &b""[..]),
                ("etc/hostname", S_IFREG | 0o644, &b"v\n"[..]),
                ("sbin/helper", S_IFREG | 0o755, &b"#!/bin/sh\n"[..]),
            ]
        );
        for bad in ["relative", "/a/../b", "/"] {
            let f = BootFile {
                path: bad.into(),
                content: vec![],
                mode: 0o644,
            };
            assert!(
                matches!(overlay_cpio(b"x", &[f]), Err(InjectError::BadFile { .. })),
                "{bad}"
            );
        }
    }

    #[test]
    fn a_merge_deletes_the_temporaries_of_dead_writers_only() {
        let dir = tempfile::tempdir().expect("tmp");
        let cache = dir.path().join("cache");
        fs::create_dir_all(&cache).expect("cache");
        // Above any pid_max (2^22): no such process.
        let dead = cache.join(format!("{MERGE_TMP_PREFIX}{}-abc.tmp", u32::MAX));
        let alive = cache.join(format!("{MERGE_TMP_PREFIX}{}-abc.tmp", std::process::id()));
        let other = cache.join(".not-a-merge");
        for f in [&dead, &alive, &other] {
            fs::write(f, b"half an initrd").expect("write");
        }
        let overlay = overlay_cpio(b"agent", &[]).expect("overlay");
        let merged = merged_initrd(None, &overlay, &cache).expect("merge");
        assert!(!dead.exists(), "a dead writer's temporary is deleted");
        assert!(alive.exists(), "a live writer's is kept");
        assert!(other.exists(), "other files are not touched");
        let mut names: Vec<String> = fs::read_dir(&cache)
            .expect("list")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        let merged_name = merged
            .file_name()
            .expect("name")
            .to_string_lossy()
            .into_owned();
        assert_eq!(names.len(), 3, "no temporary of this merge left: {names:?}");
        assert!(names.contains(&merged_name));
    }

    #[test]
    fn merged_initrd_is_base_padding_overlay_and_cached() {
        let dir = tempfile::tempdir().expect("tmp");
        let base_path = dir.path().join("base.cpio");
        let mut base = CpioWriter::new();
        base.file("init", 0o755, b"#!/bin/sh\n").expect("init");
        let mut base = base.finish();
        base.extend_from_slice(b"\0\0\0"); // odd length: needs padding
        fs::write(&base_path, &base).expect("write base");
        let overlay = overlay_cpio(b"agent", &[]).expect("overlay");
        let cache = dir.path().join("cache");
        let m1 = merged_initrd(Some(&base_path), &overlay, &cache).expect("merge");
        let bytes = fs::read(&m1).expect("read merged");
        assert_eq!(&bytes[..base.len()], &base[..]);
        assert_eq!(bytes.len() % 4, 0);
        assert_eq!(&bytes[bytes.len() - overlay.len()..], &overlay[..]);
        let names: Vec<String> = parse(&bytes)
            .expect("the kernel's view parses")
            .into_iter()
            .map(|e| e.name)
            .collect();
        assert_eq!(names, ["init", "sbin", "sbin/provium-agent"]);
        // Named by content hash; a second merge reuses the file.
        let name = m1.file_name().expect("name").to_string_lossy().into_owned();
        let want: String = Sha256::digest(&bytes)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        assert_eq!(name, format!("{want}.cpio"));
        let mtime = fs::metadata(&m1).expect("meta").modified().expect("mtime");
        let m2 = merged_initrd(Some(&base_path), &overlay, &cache).expect("again");
        assert_eq!(m1, m2);
        assert_eq!(
            fs::metadata(&m2).expect("meta").modified().expect("mtime"),
            mtime
        );
        // A different overlay is a different entry; no base is the overlay alone.
        let m3 = merged_initrd(None, &overlay, &cache).expect("agent only");
        assert_ne!(m3, m1);
        assert_eq!(fs::read(&m3).expect("read"), overlay);
        assert_eq!(
            fs::read_dir(&cache).expect("ls").count(),
            2,
            "no temp files left"
        );
    }

    #[test]
    fn inject_agent_rewrites_the_boot_source() {
        let dir = tempfile::tempdir().expect("tmp");
        let agent = dir.path().join("provium-agent");
        fs::write(&agent, b"AGENT").expect("agent");
        let boot = BootSource {
            kernel: KernelImage::Path("/k".into()),
            initrd: None,
            cmdline: "console=ttyS0".into(),
        };
        let inj = AgentInjection {
            agent: agent.clone(),
            files: vec![],
            cache_dir: dir.path().join("cache"),
        };
        let b = inject_agent(&boot, &inj).expect("inject");
        assert_eq!(b.cmdline, "console=ttyS0 rdinit=/sbin/provium-agent");
        let initrd = b.initrd.expect("an initrd");
        let e = parse(&fs::read(initrd).expect("read")).expect("parse");
        assert_eq!(e[1].data, b"AGENT");
        // A conflicting rdinit= fails before anything is written.
        let bad = BootSource {
            cmdline: "rdinit=/init".into(),
            ..boot.clone()
        };
        let inj2 = AgentInjection {
            cache_dir: dir.path().join("cache2"),
            ..inj.clone()
        };
        assert!(matches!(
            inject_agent(&bad, &inj2),
            Err(InjectError::RdinitConflict { .. })
        ));
        assert!(!inj2.cache_dir.exists());
        // A missing agent names the path.
        let missing = AgentInjection {
            agent: dir.path().join("nope"),
            ..inj
        };
        let msg = inject_agent(&boot, &missing)
            .expect_err("missing")
            .to_string();
        assert!(msg.contains("nope"), "{msg}");
    }
}
