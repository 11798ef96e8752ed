//! Local-backend snapshots: a sandbox's *files*, captured and restored.
//!
//! A sandbox has no guest memory of its own: its state worth keeping is
//! what the test wrote to its filesystems. A snapshot holds:
//!
//! - `fs-upper`: the root overlay's upper layer (the difference from the
//!   host's `/`): directories (with overlayfs's opaque marker), regular
//!   files with their bytes, symlinks, fifos, device nodes, hard links
//!   within the layer, whiteouts (deletions of host files), with mode,
//!   owner, mtime and `user.*` extended attributes. Entries under the
//!   sandbox's own mount points (`/proc`, `/dev`, `/tmp`, the runtime
//!   directory) are hidden inside and are skipped.
//! - `fs-tmp`, `fs-shm`: the whole of the sandbox's `/tmp` and `/dev/shm`
//!   tmpfs mounts, captured the same way.
//!
//! The host reaches the upper layer, which is on a tmpfs mounted only inside
//! the sandbox's mount namespace, through the descriptor the sandbox's init
//! keeps open (`/proc/<init>/fd/<n>`, see `init::UPPER_FD_OFFSET`), and the
//! sandbox's tree through `/proc/<init>/root`.
//!
//! - `net-config` (only for a sandbox with interfaces besides `lo`): their
//!   addresses, link states and routes (`netconfig.rs`), put back once the
//!   restored sandbox's NICs are on its bridges again.
//!
//! Capture refuses, naming what is in the way, when anything but the init
//! and the agent runs inside (process memory cannot be captured), and for
//! Unix sockets, POSIX ACLs, and overlayfs redirect or
//! metacopy entries. Not captured, by design: the agent's own in-memory
//! state (a restored sandbox has a fresh agent), `/dev` beyond `/dev/shm`,
//! and atimes.
//!
//! Restore applies the captured trees to a *fresh* sandbox through its
//! merged view (`openat2(RESOLVE_IN_ROOT | RESOLVE_NO_SYMLINKS)` relative to
//! `/proc/<init>/root`), so overlayfs itself records the whiteouts and
//! copy-ups: nothing writes to an overlay layer behind its back, and no path
//! in the snapshot can reach outside the sandbox.

use std::collections::HashMap;
use std::ffi::{CStr, CString, OsStr};
use std::fs;
use std::io::{self, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

use provium_snapshot::{Expect, Shape, Snapshot, SnapshotBuilder};
use serde::{Deserialize, Serialize};

use super::{sys, LocalSandbox};

/// The overlay upper layer's section.
pub const SECTION_UPPER: &str = "fs-upper";
/// The whole-tree tmpfs mounts captured besides the upper layer: (section,
/// path inside the sandbox).
pub const TMPFS_TREES: [(&str, &str); 2] = [("fs-tmp", "tmp"), ("fs-shm", "dev/shm")];
/// The backend name in a local snapshot's shape.
pub const BACKEND: &str = "local";
/// The interface configuration's section (absent: no interfaces but `lo`).
pub const SECTION_NET: &str = "net-config";

/// What a sandbox snapshot can fail with.
#[derive(Debug, thiserror::Error)]
pub enum SandboxSnapshotError {
    #[error("sandbox `{name}` cannot be snapshotted while processes other than its agent run inside (a local snapshot holds files, not process memory): {processes}; wait for them to exit or kill them first")]
    Busy { name: String, processes: String },
    #[error("sandbox `{name}`: cannot capture the configuration of its network interfaces ({interfaces})")]
    Network {
        name: String,
        interfaces: String,
        #[source]
        source: super::netconfig::NetConfigError,
    },
    #[error("sandbox `{name}`: cannot capture `/{path}`: {what}")]
    Unsupported {
        name: String,
        path: String,
        what: String,
    },
    #[error("sandbox `{name}` is not running")]
    NotRunning { name: String },
    #[error("sandbox `{name}`: cannot {action} `/{path}`")]
    Io {
        name: String,
        action: &'static str,
        path: String,
        #[source]
        source: io::Error,
    },
    #[error("the sandbox state in snapshot {file} is invalid: {detail}")]
    Invalid { file: String, detail: String },
    #[error("the sandbox state in snapshot {file} is invalid: section `{section}`")]
    InvalidTree {
        file: String,
        section: String,
        #[source]
        source: TreeError,
    },
    #[error("snapshot unusable")]
    Format(#[from] provium_snapshot::SnapshotError),
}

type Result<T, E = SandboxSnapshotError> = std::result::Result<T, E>;

/// One filesystem object.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Node {
    Dir {
        /// overlayfs's opaque marker: the lower directory's contents are hidden.
        opaque: bool,
    },
    File {
        #[serde(with = "serde_bytes")]
        data: Vec<u8>,
    },
    Symlink {
        #[serde(with = "serde_bytes")]
        target: Vec<u8>,
    },
    /// A deletion of the lower (host) entry at this path.
    Whiteout,
    Fifo,
    CharDev {
        rdev: u64,
    },
    BlockDev {
        rdev: u64,
    },
    /// Another name for the earlier regular-file entry at `to`.
    HardLink {
        #[serde(with = "serde_bytes")]
        to: Vec<u8>,
    },
}

/// An object and its metadata; `path` is relative to the tree's root,
/// `/`-separated.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FsEntry {
    #[serde(with = "serde_bytes")]
    pub path: Vec<u8>,
    pub node: Node,
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub mtime_s: i64,
    pub mtime_ns: i64,
    /// `user.*` extended attributes.
    pub xattrs: Vec<(String, serde_bytes::ByteBuf)>,
}

/// A captured tree, parents before children.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FsTree {
    pub entries: Vec<FsEntry>,
}

impl FsTree {
    /// Bytes of file contents held.
    pub fn data_bytes(&self) -> u64 {
        self.entries
            .iter()
            .map(|e| match &e.node {
                Node::File { data } => data.len() as u64,
                _ => 0,
            })
            .sum()
    }
}

/// Everything a local snapshot holds.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SandboxFs {
    pub upper: FsTree,
    /// In [`TMPFS_TREES`] order.
    pub tmpfs: Vec<FsTree>,
    /// The interfaces besides `lo` (empty: none).
    pub net: super::netconfig::SandboxNet,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum WalkMode {
    /// An overlay upper layer: whiteouts and opaque markers have meaning.
    Upper,
    /// A plain filesystem.
    Plain,
}

struct Walker<'a> {
    sandbox: &'a str,
    base: PathBuf,
    mode: WalkMode,
    /// Paths (relative) hidden by mounts inside the sandbox.
    skip: &'a [Vec<u8>],
    entries: Vec<FsEntry>,
    links: HashMap<(u64, u64), Vec<u8>>,
}

fn join_rel(a: &[u8], b: &[u8]) -> Vec<u8> {
    if a.is_empty() {
        b.to_vec()
    } else {
        let mut v = a.to_vec();
        v.push(b'/');
        v.extend_from_slice(b);
        v
    }
}

fn shown(rel: &[u8]) -> String {
    String::from_utf8_lossy(rel).into_owned()
}

/// Extended attribute names of `path` (not following a symlink).
fn list_xattrs(path: &Path) -> io::Result<Vec<Vec<u8>>> {
    let list = sys::llistxattr(&sys::cpath(path)?)?;
    Ok(list
        .split(|b| *b == 0)
        .filter(|s| !s.is_empty())
        .map(<[u8]>::to_vec)
        .collect())
}

fn get_xattr(path: &Path, name: &[u8]) -> io::Result<Vec<u8>> {
    let n = CString::new(name).map_err(|_| io::Error::other("xattr name holds a NUL byte"))?;
    sys::lgetxattr(&sys::cpath(path)?, &n)
}

impl Walker<'_> {
    fn io(
        &self,
        action: &'static str,
        rel: &[u8],
    ) -> impl FnOnce(io::Error) -> SandboxSnapshotError {
        let name = self.sandbox.to_string();
        let path = shown(rel);
        move |source| SandboxSnapshotError::Io {
            name,
            action,
            path,
            source,
        }
    }

    fn unsupported(&self, rel: &[u8], what: &str) -> SandboxSnapshotError {
        SandboxSnapshotError::Unsupported {
            name: self.sandbox.into(),
            path: shown(rel),
            what: what.into(),
        }
    }

    fn abs(&self, rel: &[u8]) -> PathBuf {
        if rel.is_empty() {
            self.base.clone()
        } else {
            self.base.join(OsStr::from_bytes(rel))
        }
    }

    fn walk(&mut self, rel: &[u8]) -> Result<()> {
        let dir = self.abs(rel);
        let mut names: Vec<Vec<u8>> = fs::read_dir(&dir)
            .map_err(self.io("read directory", rel))?
            .map(|e| e.map(|e| e.file_name().as_bytes().to_vec()))
            .collect::<io::Result<_>>()
            .map_err(self.io("read directory", rel))?;
        names.sort();
        for name in names {
            let child = join_rel(rel, &name);
            let hidden = self.skip.iter().any(|m| {
                child == *m || (child.starts_with(m) && child.get(m.len()) == Some(&b'/'))
            });
            if hidden {
                continue;
            }
            if self.entry(&child)? {
                self.walk(&child)?;
            }
        }
        Ok(())
    }

    /// Record one entry; true if it is a directory to descend into.
    fn entry(&mut self, rel: &[u8]) -> Result<bool> {
        let path = self.abs(rel);
        let meta = fs::symlink_metadata(&path).map_err(self.io("inspect", rel))?;
        let ft = meta.file_type();
        let mut opaque = false;
        let mut xattrs = Vec::new();
        for name in list_xattrs(&path).map_err(self.io("list extended attributes of", rel))? {
            let text = String::from_utf8_lossy(&name).into_owned();
            if self.mode == WalkMode::Upper && text.starts_with("trusted.overlay.") {
                match text.as_str() {
                    "trusted.overlay.opaque" => {
                        opaque = get_xattr(&path, &name)
                            .map_err(self.io("read the opaque marker of", rel))?
                            == b"y";
                    }
                    "trusted.overlay.redirect" => {
                        return Err(self.unsupported(
                            rel,
                            "a renamed directory (an overlayfs redirect) cannot be replayed; copy the directory instead of renaming it",
                        ))
                    }
                    "trusted.overlay.metacopy" => {
                        return Err(self.unsupported(
                            rel,
                            "an overlayfs metadata-only copy-up cannot be captured",
                        ))
                    }
                    // origin, impure, nlink, ...: bookkeeping overlayfs redoes itself.
                    _ => {}
                }
            } else if text.starts_with("security.") {
                // Labels the host's policy assigns again on creation.
            } else if text.starts_with("user.") {
                let v = get_xattr(&path, &name)
                    .map_err(self.io("read an extended attribute of", rel))?;
                xattrs.push((text, serde_bytes::ByteBuf::from(v)));
            } else {
                return Err(self.unsupported(
                    rel,
                    &format!("extended attribute `{text}` (ACLs and trusted attributes) cannot be captured"),
                ));
            }
        }
        let node = if ft.is_dir() {
            Node::Dir { opaque }
        } else if ft.is_file() {
            let key = (meta.dev(), meta.ino());
            match self.links.get(&key) {
                Some(first) if meta.nlink() > 1 => Node::HardLink { to: first.clone() },
                _ => {
                    if meta.nlink() > 1 {
                        self.links.insert(key, rel.to_vec());
                    }
                    Node::File {
                        data: fs::read(&path).map_err(self.io("read", rel))?,
                    }
                }
            }
        } else if ft.is_symlink() {
            Node::Symlink {
                target: fs::read_link(&path)
                    .map_err(self.io("read the symlink", rel))?
                    .into_os_string()
                    .into_vec(),
            }
        } else if ft.is_char_device() {
            if self.mode == WalkMode::Upper && meta.rdev() == 0 {
                Node::Whiteout
            } else {
                Node::CharDev { rdev: meta.rdev() }
            }
        } else if ft.is_block_device() {
            Node::BlockDev { rdev: meta.rdev() }
        } else if ft.is_fifo() {
            Node::Fifo
        } else if ft.is_socket() {
            return Err(self.unsupported(
                rel,
                "a Unix socket belongs to a running process and cannot be captured; remove the socket file before snapshotting",
            ));
        } else {
            return Err(self.unsupported(rel, "unknown file type"));
        };
        let is_dir = matches!(node, Node::Dir { .. });
        self.entries.push(FsEntry {
            path: rel.to_vec(),
            node,
            mode: meta.mode() & 0o7777,
            uid: meta.uid(),
            gid: meta.gid(),
            mtime_s: meta.mtime(),
            mtime_ns: meta.mtime_nsec(),
            xattrs,
        });
        Ok(is_dir)
    }
}

use std::os::unix::ffi::OsStringExt;

/// Mount points inside the sandbox other than `/`, relative, without the
/// leading slash.
fn mount_points(init_pid: i32) -> io::Result<Vec<Vec<u8>>> {
    let text = fs::read(format!("/proc/{init_pid}/mountinfo"))?;
    let mut out = Vec::new();
    for line in text.split(|b| *b == b'\n') {
        let Some(mp) = line.split(|b| *b == b' ').nth(4) else {
            continue;
        };
        let mp = unescape_mountinfo(mp);
        let rel = mp.strip_prefix(b"/").unwrap_or(&mp).to_vec();
        if !rel.is_empty() {
            out.push(rel);
        }
    }
    Ok(out)
}

/// mountinfo escapes space, tab, newline and backslash as `\ooo`.
fn unescape_mountinfo(s: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(s.len());
    let mut i = 0;
    while i < s.len() {
        if s[i] == b'\\'
            && i + 3 < s.len()
            && s[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            let v = (s[i + 1] - b'0') * 64 + (s[i + 2] - b'0') * 8 + (s[i + 3] - b'0');
            out.push(v);
            i += 4;
        } else {
            out.push(s[i]);
            i += 1;
        }
    }
    out
}

/// A `/proc/<pid>/status` field.
fn status_field(status: &str, key: &str) -> Option<String> {
    status
        .lines()
        .find_map(|l| l.strip_prefix(key).map(|v| v.trim().to_string()))
}

/// How long a snapshot waits for processes that were already killed to be
/// gone: a SIGKILLed group's members die as each is next scheduled, so on a
/// loaded host one can outlive its leader (whose exit `proc:wait` reports)
/// by a few milliseconds.
const KILLED_EXIT_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// Whether a `/proc/<pid>/status` shows SIGKILL pending, for the thread or
/// its whole process: it runs no more user code and is on its way out.
fn killed(status: &str) -> bool {
    const SIGKILL_BIT: u64 = 1 << (libc::SIGKILL - 1);
    ["SigPnd:", "ShdPnd:"].iter().any(|key| {
        status_field(status, key)
            .and_then(|mask| u64::from_str_radix(&mask, 16).ok())
            .is_some_and(|mask| mask & SIGKILL_BIT != 0)
    })
}

/// A process found inside a sandbox that is neither its init nor its agent.
pub struct UserProcess {
    /// `pid N (inside) \`cmdline\``.
    pub described: String,
    /// SIGKILL is pending: it will be gone without running again.
    pub killed: bool,
}

impl LocalSandbox {
    /// The user processes inside, waiting (up to [`KILLED_EXIT_WAIT`]) for
    /// those already killed to finish exiting: what stays is what a
    /// snapshot must refuse for.
    fn live_user_processes(&self) -> Vec<String> {
        let deadline = std::time::Instant::now() + KILLED_EXIT_WAIT;
        loop {
            let procs = self.user_processes();
            let all_dying = procs.iter().all(|p| p.killed);
            if procs.is_empty() || !all_dying || std::time::Instant::now() >= deadline {
                return procs.into_iter().map(|p| p.described).collect();
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
    }

    /// Processes inside other than the init and the agent (zombies aside).
    pub fn user_processes(&self) -> Vec<UserProcess> {
        let mut out = Vec::new();
        for pid in self.host_pids() {
            if pid == self.init_pid {
                continue;
            }
            let Ok(status) = fs::read_to_string(format!("/proc/{pid}/status")) else {
                continue; // gone meanwhile
            };
            if status_field(&status, "State:").is_some_and(|s| s.starts_with('Z')) {
                continue;
            }
            let inner = status_field(&status, "NSpid:")
                .and_then(|v| v.split_whitespace().last().map(str::to_string))
                .unwrap_or_else(|| "?".into());
            let ppid = status_field(&status, "PPid:").and_then(|p| p.parse::<i32>().ok());
            if inner == "2" && ppid == Some(self.init_pid) {
                continue; // the agent: the init's first child
            }
            let cmd = fs::read(format!("/proc/{pid}/cmdline"))
                .map(|c| {
                    String::from_utf8_lossy(&c)
                        .split('\0')
                        .filter(|s| !s.is_empty())
                        .collect::<Vec<_>>()
                        .join(" ")
                })
                .unwrap_or_default();
            let cmd = if cmd.is_empty() {
                status_field(&status, "Name:").unwrap_or_default()
            } else {
                cmd
            };
            out.push(UserProcess {
                described: format!("pid {inner} `{cmd}`"),
                killed: killed(&status),
            });
        }
        out
    }

    /// Network interfaces inside besides `lo`.
    fn extra_interfaces(&self) -> Vec<String> {
        let text =
            fs::read_to_string(format!("/proc/{}/net/dev", self.init_pid)).unwrap_or_default();
        text.lines()
            .skip(2)
            .filter_map(|l| l.split(':').next().map(|n| n.trim().to_string()))
            .filter(|n| {
                !n.is_empty() && n != "lo" && !provium_netsetup::kernel_path::is_wire_end(n)
            })
            .collect()
    }

    /// Capture the sandbox's files (see the module docs for what and when).
    pub fn capture_fs(&self) -> Result<SandboxFs> {
        if self.down || !self.is_running() {
            return Err(SandboxSnapshotError::NotRunning {
                name: self.name.clone(),
            });
        }
        let procs = self.live_user_processes();
        if !procs.is_empty() {
            return Err(SandboxSnapshotError::Busy {
                name: self.name.clone(),
                processes: procs.join(", "),
            });
        }
        let ifaces = self.extra_interfaces();
        let net = if ifaces.is_empty() {
            super::netconfig::SandboxNet::default()
        } else {
            super::netconfig::capture(self.init_pid).map_err(|source| {
                SandboxSnapshotError::Network {
                    name: self.name.clone(),
                    interfaces: ifaces.join(", "),
                    source,
                }
            })?
        };
        let mounts = mount_points(self.init_pid).map_err(|source| SandboxSnapshotError::Io {
            name: self.name.clone(),
            action: "read the mount table of",
            path: String::new(),
            source,
        })?;
        let mut upper = Walker {
            sandbox: &self.name,
            base: PathBuf::from(format!("/proc/{}/fd/{}", self.init_pid, self.upper_fd)),
            mode: WalkMode::Upper,
            skip: &mounts,
            entries: Vec::new(),
            links: HashMap::new(),
        };
        upper.walk(b"")?;
        let mut tmpfs = Vec::new();
        for (_, inside) in TMPFS_TREES {
            let mut w = Walker {
                sandbox: &self.name,
                base: PathBuf::from(format!("/proc/{}/root/{inside}", self.init_pid)),
                mode: WalkMode::Plain,
                skip: &[],
                entries: Vec::new(),
                links: HashMap::new(),
            };
            w.walk(b"")?;
            // Paths are relative to the mount; keep them so.
            tmpfs.push(FsTree { entries: w.entries });
        }
        Ok(SandboxFs {
            upper: FsTree {
                entries: upper.entries,
            },
            tmpfs,
            net,
        })
    }

    /// Apply `state` to this (fresh) sandbox through its merged view.
    pub fn restore_fs(&self, state: &SandboxFs) -> Result<()> {
        if self.down || !self.is_running() {
            return Err(SandboxSnapshotError::NotRunning {
                name: self.name.clone(),
            });
        }
        let name = self.name.clone();
        let io = |action: &'static str, path: &[u8]| {
            let name = name.clone();
            let path = shown(path);
            move |source| SandboxSnapshotError::Io {
                name,
                action,
                path,
                source,
            }
        };
        let root_path = PathBuf::from(format!("/proc/{}/root", self.init_pid));
        let root = sys::open_dir_path(&root_path).map_err(io("open the root of", b""))?;
        apply_tree(&root, &state.upper, b"").map_err(|(action, path, source)| {
            SandboxSnapshotError::Io {
                name: name.clone(),
                action,
                path: shown(&path),
                source,
            }
        })?;
        for ((_, inside), tree) in TMPFS_TREES.iter().zip(&state.tmpfs) {
            let base = sys::open_beneath(root.as_fd(), inside.as_bytes(), true)
                .map_err(io("open", inside.as_bytes()))?;
            apply_tree(&base, tree, inside.as_bytes()).map_err(|(action, path, source)| {
                SandboxSnapshotError::Io {
                    name: name.clone(),
                    action,
                    path: shown(&path),
                    source,
                }
            })?;
        }
        Ok(())
    }
}

fn is_dir(st: &libc::stat) -> bool {
    st.st_mode & libc::S_IFMT == libc::S_IFDIR
}

/// Remove `leaf` in `dir`, recursively if it is a directory.
fn remove_at(dir: BorrowedFd<'_>, leaf: &CStr) -> io::Result<()> {
    let e = match sys::unlinkat(dir, leaf, 0) {
        Ok(()) => return Ok(()),
        Err(e) => e,
    };
    match e.raw_os_error() {
        Some(libc::ENOENT) => Ok(()),
        Some(libc::EISDIR) | Some(libc::EPERM) => {
            clear_dir(dir, leaf)?;
            sys::unlinkat(dir, leaf, libc::AT_REMOVEDIR)
        }
        _ => Err(e),
    }
}

/// Remove everything inside directory `leaf` of `dir`.
fn clear_dir(dir: BorrowedFd<'_>, leaf: &CStr) -> io::Result<()> {
    // O_NOFOLLOW: never a symlink's target.
    let fd = sys::openat(
        dir,
        leaf,
        libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW,
        0,
    )?;
    let names: Vec<CString> = fs::read_dir(format!("/proc/self/fd/{}", fd.as_raw_fd()))?
        .map(|e| e.map(|e| CString::new(e.file_name().as_bytes()).expect("no NUL in a name")))
        .collect::<io::Result<_>>()?;
    for n in names {
        remove_at(fd.as_fd(), &n)?;
    }
    Ok(())
}

type ApplyError = (&'static str, Vec<u8>, io::Error);

fn check_rel(p: &[u8]) -> bool {
    !p.is_empty()
        && !p.contains(&0)
        && p.split(|b| *b == b'/')
            .all(|c| !c.is_empty() && c != b"." && c != b"..")
}

/// Why a tree read from a snapshot file is refused (the file is untrusted:
/// nothing is restored from it). Paths are shown as [`shown`] prints them.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TreeError {
    #[error("entry path `{path}` is not a plain relative path")]
    NotRelative { path: String },
    #[error("hard link `{path}` points at `{to}`, which no earlier entry is")]
    DanglingHardLink { path: String, to: String },
    #[error("extended attribute `{name}` on `{path}` is not a user attribute")]
    NotUserXattr { name: String, path: String },
}

/// Check a tree read from a file before touching anything.
pub fn validate(tree: &FsTree) -> std::result::Result<(), TreeError> {
    let mut seen = std::collections::HashSet::new();
    for e in &tree.entries {
        if !check_rel(&e.path) {
            return Err(TreeError::NotRelative {
                path: shown(&e.path),
            });
        }
        if let Node::HardLink { to } = &e.node {
            if !seen.contains(to.as_slice()) {
                return Err(TreeError::DanglingHardLink {
                    path: shown(&e.path),
                    to: shown(to),
                });
            }
        }
        for (name, _) in &e.xattrs {
            if !name.starts_with("user.") {
                return Err(TreeError::NotUserXattr {
                    name: name.clone(),
                    path: shown(&e.path),
                });
            }
        }
        seen.insert(e.path.as_slice());
    }
    Ok(())
}

fn split_parent(p: &[u8]) -> (&[u8], &[u8]) {
    match p.iter().rposition(|b| *b == b'/') {
        Some(i) => (&p[..i], &p[i + 1..]),
        None => (b"", p),
    }
}

fn set_meta(dir: BorrowedFd<'_>, leaf: &CStr, e: &FsEntry, symlink: bool) -> io::Result<()> {
    sys::lchownat(dir, leaf, e.uid, e.gid)?;
    if !symlink {
        // After chown, which clears set-id bits.
        sys::fchmodat(dir, leaf, e.mode & 0o7777)?;
    }
    sys::set_mtime_nofollow(
        dir,
        leaf,
        e.mtime_s as libc::time_t,
        e.mtime_ns as libc::c_long,
    )
}

/// Write `tree` beneath `base` (shown as `shown_prefix` in errors).
fn apply_tree(
    base: &OwnedFd,
    tree: &FsTree,
    shown_prefix: &[u8],
) -> std::result::Result<(), ApplyError> {
    let at = |e: &FsEntry| join_rel(shown_prefix, &e.path);
    let mut dirs = Vec::new();
    for e in &tree.entries {
        let (parent, leaf) = split_parent(&e.path);
        let fail = |action: &'static str| move |err: io::Error| (action, at(e), err);
        let pfd =
            sys::open_beneath(base.as_fd(), parent, true).map_err(fail("open the parent of"))?;
        let p = pfd.as_fd();
        let leaf = CString::new(leaf).map_err(|_| fail("name")(io::Error::other("NUL in name")))?;
        let existing = sys::fstatat_nofollow(p, &leaf).map_err(fail("inspect"))?;
        match &e.node {
            Node::Whiteout => {
                if existing.is_some() {
                    remove_at(p, &leaf).map_err(fail("delete"))?;
                }
                continue;
            }
            Node::Dir { opaque } => {
                match existing {
                    Some(st) if !is_dir(&st) => remove_at(p, &leaf).map_err(fail("replace"))?,
                    Some(_) if *opaque => {
                        clear_dir(p, &leaf).map_err(fail("empty the directory"))?
                    }
                    _ => {}
                }
                if !sys::fstatat_nofollow(p, &leaf)
                    .map_err(fail("inspect"))?
                    .is_some_and(|s| is_dir(&s))
                {
                    sys::mkdirat(p, &leaf, 0o700).map_err(fail("create the directory"))?;
                }
                dirs.push(e);
            }
            node => {
                if existing.is_some() {
                    remove_at(p, &leaf).map_err(fail("replace"))?;
                }
                match node {
                    Node::File { data } => {
                        // O_EXCL|O_NOFOLLOW: a new file only.
                        let fd = sys::openat(
                            p,
                            &leaf,
                            libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW,
                            0o600,
                        )
                        .map_err(fail("create"))?;
                        let mut f = fs::File::from(fd);
                        f.write_all(data).map_err(fail("write"))?;
                    }
                    Node::Symlink { target } => {
                        let t = CString::new(target.as_slice())
                            .map_err(|_| fail("link")(io::Error::other("NUL in symlink target")))?;
                        sys::symlinkat(&t, p, &leaf).map_err(fail("create the symlink"))?;
                    }
                    Node::Fifo | Node::CharDev { .. } | Node::BlockDev { .. } => {
                        let (kind, rdev) = match node {
                            Node::Fifo => (libc::S_IFIFO, 0),
                            Node::CharDev { rdev } => (libc::S_IFCHR, *rdev),
                            Node::BlockDev { rdev } => (libc::S_IFBLK, *rdev),
                            _ => unreachable!("matched above"),
                        };
                        sys::mknodat(p, &leaf, kind | 0o600, rdev as libc::dev_t)
                            .map_err(fail("create the node"))?;
                    }
                    Node::HardLink { to } => {
                        let (tp, tl) = split_parent(to);
                        let tfd = sys::open_beneath(base.as_fd(), tp, true)
                            .map_err(fail("open the link target of"))?;
                        let tl =
                            CString::new(tl).map_err(|_| fail("link")(io::Error::other("NUL")))?;
                        sys::linkat(tfd.as_fd(), &tl, p, &leaf).map_err(fail("hard-link"))?;
                        continue; // shares the first name's metadata
                    }
                    Node::Whiteout | Node::Dir { .. } => unreachable!("handled above"),
                }
                set_meta(p, &leaf, e, matches!(node, Node::Symlink { .. }))
                    .map_err(fail("set the attributes of"))?;
                set_xattrs(p, &leaf, e).map_err(fail("set extended attributes of"))?;
            }
        }
    }
    // Directory attributes last (children changed their mtimes), deepest first.
    for e in dirs.iter().rev() {
        let (parent, leaf) = split_parent(&e.path);
        let fail = |action: &'static str| move |err: io::Error| (action, at(e), err);
        let pfd =
            sys::open_beneath(base.as_fd(), parent, true).map_err(fail("open the parent of"))?;
        let leaf = CString::new(leaf).map_err(|_| fail("name")(io::Error::other("NUL in name")))?;
        set_meta(pfd.as_fd(), &leaf, e, false).map_err(fail("set the attributes of"))?;
        set_xattrs(pfd.as_fd(), &leaf, e).map_err(fail("set extended attributes of"))?;
    }
    Ok(())
}

fn set_xattrs(dir: BorrowedFd<'_>, leaf: &CStr, e: &FsEntry) -> io::Result<()> {
    if e.xattrs.is_empty() {
        return Ok(());
    }
    // O_NOFOLLOW: the entry itself.
    let fd = sys::openat(
        dir,
        leaf,
        libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_NONBLOCK,
        0,
    )?;
    for (name, value) in &e.xattrs {
        let n = CString::new(name.as_str()).map_err(|_| io::Error::other("NUL in xattr name"))?;
        sys::fsetxattr(fd.as_fd(), &n, value)?;
    }
    Ok(())
}

/// Capture `sandbox` into a snapshot file at `path` (written atomically).
/// Returns the file's size in bytes.
pub fn write_snapshot(
    sandbox: &LocalSandbox,
    path: &Path,
    shape: Shape,
    protocol_version: u32,
    extra: &[(&str, Vec<u8>)],
) -> Result<u64> {
    let state = sandbox.capture_fs()?;
    let mut b = SnapshotBuilder::new(protocol_version, shape);
    let enc = |t: &FsTree| rmp_serde::to_vec_named(t).expect("a tree always serializes");
    b.add_section(SECTION_UPPER, &enc(&state.upper))?;
    for ((section, _), tree) in TMPFS_TREES.iter().zip(&state.tmpfs) {
        b.add_section(section, &enc(tree))?;
    }
    if !state.net.is_empty() {
        let net = serde_json::to_vec(&state.net).expect("a net config always serializes");
        b.add_section(SECTION_NET, &net)?;
    }
    for (name, data) in extra {
        b.add_section(name, data)?;
    }
    Ok(b.write_file(path)?)
}

/// Read and validate the sandbox state in the snapshot at `path`.
pub fn read_snapshot(path: &Path, shape: Shape, protocol_version: u32) -> Result<SandboxFs> {
    let snap = Snapshot::open(path, &Expect::protocol(protocol_version).with_shape(shape))?;
    let file = path.display().to_string();
    let dec = |section: &str| -> Result<FsTree> {
        let bytes = snap.section(section)?;
        let tree: FsTree =
            rmp_serde::from_slice(&bytes).map_err(|e| SandboxSnapshotError::Invalid {
                file: file.clone(),
                detail: format!("section `{section}` does not decode: {e}"),
            })?;
        validate(&tree).map_err(|source| SandboxSnapshotError::InvalidTree {
            file: file.clone(),
            section: section.into(),
            source,
        })?;
        Ok(tree)
    };
    let upper = dec(SECTION_UPPER)?;
    let mut tmpfs = Vec::new();
    for (section, _) in TMPFS_TREES {
        tmpfs.push(dec(section)?);
    }
    let net = if snap.has_section(SECTION_NET) {
        serde_json::from_slice(&snap.section(SECTION_NET)?).map_err(|e| {
            SandboxSnapshotError::Invalid {
                file: file.clone(),
                detail: format!("section `{SECTION_NET}` does not decode: {e}"),
            }
        })?
    } else {
        super::netconfig::SandboxNet::default()
    };
    Ok(SandboxFs { upper, tmpfs, net })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_process_with_sigkill_pending_is_known_to_be_dying() {
        let status = |sig: &str, shd: &str| {
            format!("Name:\tsleep\nState:\tS (sleeping)\nSigPnd:\t{sig}\nShdPnd:\t{shd}\n")
        };
        assert!(!killed(&status("0000000000000000", "0000000000000000")));
        // SIGKILL is signal 9: bit 8 of either mask.
        assert!(killed(&status("0000000000000000", "0000000000000100")));
        assert!(killed(&status("0000000000000100", "0000000000000000")));
        // SIGTERM (15, bit 14) pending can still be caught: not dying.
        assert!(!killed(&status("0000000000004000", "0000000000004000")));
        assert!(
            !killed("Name:\tx\n"),
            "no mask lines: not known to be dying"
        );
    }

    fn entry(path: &str, node: Node) -> FsEntry {
        FsEntry {
            path: path.as_bytes().to_vec(),
            node,
            mode: 0o644,
            uid: 0,
            gid: 0,
            mtime_s: 1_600_000_000,
            mtime_ns: 5,
            xattrs: vec![],
        }
    }

    #[test]
    fn hostile_paths_are_refused() {
        for bad in ["", "/etc/passwd", "a/../b", "./a", "a//b", "a/"] {
            let t = FsTree {
                entries: vec![entry(bad, Node::Whiteout)],
            };
            assert!(validate(&t).is_err(), "{bad:?} accepted");
        }
        let t = FsTree {
            entries: vec![entry("a", Node::HardLink { to: b"b".to_vec() })],
        };
        assert!(validate(&t)
            .unwrap_err()
            .to_string()
            .contains("no earlier entry"));
    }

    #[test]
    fn a_refused_tree_names_the_file_and_section_then_the_entry() {
        let mut e = entry("a", Node::Whiteout);
        e.xattrs = vec![("trusted.x".into(), serde_bytes::ByteBuf::new())];
        let source = validate(&FsTree { entries: vec![e] }).unwrap_err();
        assert_eq!(
            source,
            TreeError::NotUserXattr {
                name: "trusted.x".into(),
                path: "a".into()
            }
        );
        let err = SandboxSnapshotError::InvalidTree {
            file: "/c/x.snap".into(),
            section: SECTION_UPPER.into(),
            source,
        };
        assert_eq!(
            crate::error_chain::flatten(&err),
            format!(
                "the sandbox state in snapshot /c/x.snap is invalid: section `{SECTION_UPPER}`: \
                 extended attribute `trusted.x` on `a` is not a user attribute"
            )
        );
    }

    #[test]
    fn mountinfo_escapes_are_decoded() {
        assert_eq!(unescape_mountinfo(b"/a\\040b"), b"/a b");
        assert_eq!(unescape_mountinfo(b"/x\\"), b"/x\\");
    }

    /// Capture a plain directory and apply it to another: the tree survives
    /// (no sandbox needed: the walker and applier work on any directory).
    #[test]
    fn capture_and_apply_round_trip_on_plain_directories() {
        let src = tempfile::tempdir().unwrap();
        let s = src.path();
        fs::create_dir_all(s.join("d/e")).unwrap();
        fs::write(s.join("d/f"), b"hello").unwrap();
        fs::hard_link(s.join("d/f"), s.join("d/f2")).unwrap();
        std::os::unix::fs::symlink("/etc/passwd", s.join("d/abs")).unwrap();
        std::os::unix::fs::symlink("../d/f", s.join("d/e/rel")).unwrap();
        {
            use std::os::unix::fs::PermissionsExt;
            fs::set_permissions(s.join("d/f"), fs::Permissions::from_mode(0o751)).unwrap();
        }
        let mut w = Walker {
            sandbox: "t",
            base: s.to_path_buf(),
            mode: WalkMode::Plain,
            skip: &[],
            entries: vec![],
            links: HashMap::new(),
        };
        w.walk(b"").unwrap();
        let tree = FsTree { entries: w.entries };
        validate(&tree).unwrap();
        let bytes = rmp_serde::to_vec_named(&tree).unwrap();
        let back: FsTree = rmp_serde::from_slice(&bytes).unwrap();
        assert_eq!(back, tree);

        let dst = tempfile::tempdir().unwrap();
        // Something in the way that the tree replaces.
        fs::write(dst.path().join("d"), b"a file where a directory goes").unwrap();
        let base = sys::open_dir_path(dst.path()).unwrap();
        apply_tree(&base, &tree, b"").unwrap();
        let d = dst.path();
        assert_eq!(fs::read(d.join("d/f")).unwrap(), b"hello");
        assert_eq!(
            fs::metadata(d.join("d/f")).unwrap().ino(),
            fs::metadata(d.join("d/f2")).unwrap().ino()
        );
        assert_eq!(fs::metadata(d.join("d/f")).unwrap().mode() & 0o7777, 0o751);
        assert_eq!(
            fs::read_link(d.join("d/abs")).unwrap(),
            PathBuf::from("/etc/passwd")
        );
        assert_eq!(
            fs::read_link(d.join("d/e/rel")).unwrap(),
            PathBuf::from("../d/f")
        );
        let m_src = fs::metadata(s.join("d/f")).unwrap();
        let m_dst = fs::metadata(d.join("d/f")).unwrap();
        assert_eq!(
            (m_src.mtime(), m_src.mtime_nsec()),
            (m_dst.mtime(), m_dst.mtime_nsec())
        );

        // A whiteout removes what is there, directories recursively.
        let wt = FsTree {
            entries: vec![entry("d", Node::Whiteout)],
        };
        apply_tree(&base, &wt, b"").unwrap();
        assert!(!d.join("d").exists());
    }

    #[test]
    fn apply_never_writes_outside_the_base() {
        let outer = tempfile::tempdir().unwrap();
        let base_dir = outer.path().join("base");
        fs::create_dir(&base_dir).unwrap();
        // A symlink inside pointing out: a path through it must not resolve.
        std::os::unix::fs::symlink(outer.path(), base_dir.join("escape")).unwrap();
        let base = sys::open_dir_path(&base_dir).unwrap();
        let t = FsTree {
            entries: vec![entry(
                "escape/pwned",
                Node::File {
                    data: b"x".to_vec(),
                },
            )],
        };
        let e = apply_tree(&base, &t, b"").unwrap_err();
        assert_eq!(e.0, "open the parent of");
        assert!(!outer.path().join("pwned").exists());
    }
}
