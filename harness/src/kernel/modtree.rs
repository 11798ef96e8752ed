//! A kernel's module tree (`lib/modules/<release>`): where it is, which
//! modules it has, which are built in, and the modules a set of needed ones
//! pulls in, in load order.
//!
//! Where the tree is, first found wins (issue 25; the reference's layout):
//! 1. the profile's `modules` (or `--modules`): a `lib/modules/<release>`
//!    directory, or a root holding `lib/modules/<release>`;
//! 2. the directory the kernel sits in, when it is `lib/modules/<release>`
//!    itself (the reference's layout: `lib/modules/<release>/vmlinuz`);
//! 3. `<dir>/lib/modules/<release>`, `<dir>` being the kernel's directory
//!    or its parent (an unpacked package: `boot/vmlinuz-*` beside `lib/`);
//!    rules 2 and 3 look beside the kernel as named, then beside the file a
//!    link points to (target/probe-kernel-modular/vmlinux);
//! 4. the host's `/lib/modules/<release>`.
//!
//! Modules are found by walking the tree (no `modules.dep` needed: Debian's
//! packages ship none); dependencies come from each module's `.modinfo`.
//! `modules.builtin` names what is built in, which is never loaded. `.ko.gz`,
//! `.ko.xz` and `.ko.zst` are decompressed here on the host, so the guest's
//! `finit_module` gets plain ELF.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Read;
use std::path::{Path, PathBuf};

use super::modinfo::{normalize, parse_modinfo, ModInfo};

/// The largest module accepted, decompressed (the biggest in a distribution
/// kernel are ~20 MiB with debug info stripped).
const MAX_MODULE_BYTES: u64 = 256 << 20;
/// The deepest walk into a module tree.
const MAX_DEPTH: usize = 16;

/// A module tree and what it holds.
#[derive(Debug, Clone, Default)]
pub struct ModuleTree {
    /// `lib/modules/<release>`.
    pub dir: PathBuf,
    /// How it was found (the numbered rule of the module docs).
    pub found_by: String,
    /// Every module file, by normalized name (first found wins).
    files: BTreeMap<String, PathBuf>,
    /// Normalized names in `modules.builtin`.
    builtin: BTreeSet<String>,
}

/// One module to load: its name, its file and its decompressed bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoadableModule {
    pub name: String,
    pub path: PathBuf,
    pub bytes: Vec<u8>,
}

/// A module tree or module that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ModuleError {
    #[error(
        "modules directory {} is not a directory (set `modules` to the kernel's \
         lib/modules/<release>, or a root that holds lib/modules/<release>)",
        dir.display()
    )]
    NotADirectory { dir: PathBuf },
    #[error(
        "modules directory {} is for release {found}, but the kernel is {release} (point \
         `modules` at lib/modules/{release}, the tree built with this kernel)",
        dir.display()
    )]
    WrongRelease {
        dir: PathBuf,
        found: String,
        release: String,
    },
    #[error("cannot read the module tree {}", dir.display())]
    Walk {
        dir: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot read the module {}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "the module {} is not a kernel module ({why}); reinstall the module tree \
         (`make modules_install`, or the distribution's package)",
        path.display()
    )]
    NotAModule { path: PathBuf, why: String },
    #[error(
        "the module {} is compressed in a format Provium cannot read (known: .ko, .ko.gz, \
         .ko.xz, .ko.zst); decompress it on the host, or rebuild with CONFIG_MODULE_COMPRESS_ZSTD",
        path.display()
    )]
    UnknownCompression { path: PathBuf },
    #[error(
        "cannot decompress the module {} (the file is damaged; reinstall the module tree)",
        path.display()
    )]
    Decompress {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "module `{module}` needs `{missing}`, which is neither in {} nor in its \
         modules.builtin (install the complete module tree for this kernel)",
        tree.display()
    )]
    MissingDependency {
        module: String,
        missing: String,
        tree: PathBuf,
    },
    #[error(
        "module `{name}` is not in {} (install the complete module tree for this kernel, or \
         build it in: CONFIG_...=y)",
        tree.display()
    )]
    MissingModule { name: String, tree: PathBuf },
    #[error("module dependencies loop through `{module}`; the module tree is damaged")]
    Cycle { module: String },
}

/// The module name of a file name (`virtio-rng.ko.xz` → `virtio_rng`), if
/// it looks like a module at all.
fn module_name(file: &str) -> Option<String> {
    let stem = file.split_once(".ko")?;
    (stem.1.is_empty() || stem.1.starts_with('.')).then(|| normalize(stem.0))
}

/// Finds the module tree for `release` (module docs); `Ok(None)` when no
/// rule finds one. An explicit directory that is not there, or is of
/// another release, is an error.
pub fn locate(
    explicit: Option<&Path>,
    kernel: &Path,
    release: &str,
    host_root: &Path,
) -> Result<Option<ModuleTree>, ModuleError> {
    if let Some(dir) = explicit {
        if !dir.is_dir() {
            return Err(ModuleError::NotADirectory {
                dir: dir.to_path_buf(),
            });
        }
        let nested = dir.join("lib/modules").join(release);
        let chosen = if nested.is_dir() {
            nested
        } else if dir.join(release).is_dir() {
            dir.join(release)
        } else {
            dir.to_path_buf()
        };
        let tree = ModuleTree::scan(&chosen, "the profile's `modules` (or --modules)")?;
        tree.check_release(release)?;
        return Ok(Some(tree));
    }
    // The kernel as named and, when that is a link, where it points.
    let real = std::fs::canonicalize(kernel).ok();
    let kernels = std::iter::once(kernel).chain(real.as_deref().filter(|r| *r != kernel));
    for k in kernels {
        let kdir = k.parent().unwrap_or(Path::new("."));
        if kdir.file_name().and_then(|n| n.to_str()) == Some(release)
            && kdir.parent().and_then(Path::file_name) == Some("modules".as_ref())
        {
            return ModuleTree::scan(kdir, "the kernel's own directory (lib/modules/<release>)")
                .map(Some);
        }
        for dir in [Some(kdir), kdir.parent()].into_iter().flatten() {
            let p = dir.join("lib/modules").join(release);
            if p.is_dir() {
                return ModuleTree::scan(&p, "lib/modules/<release> beside the kernel").map(Some);
            }
        }
    }
    let host = host_root.join("lib/modules").join(release);
    if host.is_dir() {
        return ModuleTree::scan(&host, "the host's /lib/modules/<release>").map(Some);
    }
    Ok(None)
}

impl ModuleTree {
    /// Indexes the module files under `dir` and reads `modules.builtin`.
    pub fn scan(dir: &Path, found_by: &str) -> Result<ModuleTree, ModuleError> {
        let mut tree = ModuleTree {
            dir: dir.to_path_buf(),
            found_by: found_by.into(),
            ..ModuleTree::default()
        };
        let walk_err = |source| ModuleError::Walk {
            dir: dir.to_path_buf(),
            source,
        };
        let mut stack = vec![(dir.to_path_buf(), 0usize)];
        while let Some((d, depth)) = stack.pop() {
            let mut entries: Vec<_> = std::fs::read_dir(&d)
                .map_err(walk_err)?
                .filter_map(Result::ok)
                .collect();
            entries.sort_by_key(|e| e.file_name());
            for e in entries {
                let Ok(kind) = e.file_type() else { continue };
                let name = e.file_name();
                let Some(name) = name.to_str() else { continue };
                // build/ and source/ link to the kernel's source tree.
                if kind.is_dir() && depth < MAX_DEPTH {
                    stack.push((e.path(), depth + 1));
                } else if kind.is_file() {
                    if let Some(m) = module_name(name) {
                        tree.files.entry(m).or_insert_with(|| e.path());
                    }
                }
            }
        }
        if let Ok(text) = std::fs::read_to_string(dir.join("modules.builtin")) {
            tree.builtin = text
                .lines()
                .filter_map(|l| l.rsplit('/').next())
                .filter_map(module_name)
                .collect();
        }
        Ok(tree)
    }

    /// The file of module `name`, if the tree has it.
    pub fn find(&self, name: &str) -> Option<&Path> {
        self.files.get(&normalize(name)).map(PathBuf::as_path)
    }

    /// Whether `modules.builtin` lists `name`.
    pub fn is_builtin(&self, name: &str) -> bool {
        self.builtin.contains(&normalize(name))
    }

    /// How many module files the tree has.
    pub fn len(&self) -> usize {
        self.files.len()
    }

    pub fn is_empty(&self) -> bool {
        self.files.is_empty()
    }

    /// An explicit tree must be for `release`: its name (when it looks like
    /// a release) and its modules' vermagic say which it is.
    fn check_release(&self, release: &str) -> Result<(), ModuleError> {
        let wrong = |found: &str| ModuleError::WrongRelease {
            dir: self.dir.clone(),
            found: found.into(),
            release: release.into(),
        };
        if let Some((_, path)) = self.files.iter().next() {
            let info = read_module(path)?.1;
            if let Some(found) = info.release() {
                if found != release {
                    return Err(wrong(found));
                }
                return Ok(());
            }
        }
        let name = self.dir.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if name.starts_with(|c: char| c.is_ascii_digit()) && name.contains('.') && name != release {
            return Err(wrong(name));
        }
        Ok(())
    }

    /// `roots` and every module they depend on, dependencies first, each
    /// once; built-in modules are left out. Each file is read and
    /// decompressed.
    pub fn resolve(&self, roots: &[&str]) -> Result<Vec<LoadableModule>, ModuleError> {
        let mut done: Vec<LoadableModule> = Vec::new();
        let mut visiting = BTreeSet::new();
        for r in roots {
            let r = normalize(r);
            if self.is_builtin(&r) {
                continue;
            }
            let path = self.find(&r).ok_or_else(|| ModuleError::MissingModule {
                name: r.clone(),
                tree: self.dir.clone(),
            })?;
            self.visit(&r, path.to_path_buf(), &mut visiting, &mut done)?;
        }
        Ok(done)
    }

    fn visit(
        &self,
        name: &str,
        path: PathBuf,
        visiting: &mut BTreeSet<String>,
        done: &mut Vec<LoadableModule>,
    ) -> Result<(), ModuleError> {
        if done.iter().any(|m| m.name == name) {
            return Ok(());
        }
        if !visiting.insert(name.to_string()) {
            return Err(ModuleError::Cycle {
                module: name.into(),
            });
        }
        let (bytes, info) = read_module(&path)?;
        for dep in &info.depends {
            if self.is_builtin(dep) {
                continue;
            }
            let dep_path = self
                .find(dep)
                .ok_or_else(|| ModuleError::MissingDependency {
                    module: name.into(),
                    missing: dep.clone(),
                    tree: self.dir.clone(),
                })?;
            self.visit(dep, dep_path.to_path_buf(), visiting, done)?;
        }
        visiting.remove(name);
        done.push(LoadableModule {
            name: name.into(),
            path,
            bytes,
        });
        Ok(())
    }
}

/// Reads a module file, decompressing by its extension, and parses its
/// `.modinfo`.
pub fn read_module(path: &Path) -> Result<(Vec<u8>, ModInfo), ModuleError> {
    let raw = std::fs::read(path).map_err(|source| ModuleError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    let bytes = decompress(path, raw)?;
    let info = parse_modinfo(&bytes).map_err(|why| ModuleError::NotAModule {
        path: path.to_path_buf(),
        why,
    })?;
    Ok((bytes, info))
}

/// A module file's bytes as plain ELF, by its extension.
pub fn decompress(path: &Path, raw: Vec<u8>) -> Result<Vec<u8>, ModuleError> {
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
    let ext = name.split_once(".ko").map_or("", |(_, e)| e);
    let err = |source| ModuleError::Decompress {
        path: path.to_path_buf(),
        source,
    };
    let mut out = Vec::new();
    match ext {
        "" => return Ok(raw),
        ".gz" => {
            flate2::read::GzDecoder::new(&raw[..])
                .take(MAX_MODULE_BYTES)
                .read_to_end(&mut out)
                .map_err(err)?;
        }
        ".zst" => {
            zstd::stream::read::Decoder::new(&raw[..])
                .map_err(err)?
                .take(MAX_MODULE_BYTES)
                .read_to_end(&mut out)
                .map_err(err)?;
        }
        ".xz" => {
            let mut limited = Vec::new();
            lzma_rs::xz_decompress(&mut &raw[..], &mut limited)
                .map_err(|e| err(std::io::Error::other(e.to_string())))?;
            out = limited;
        }
        _ => {
            return Err(ModuleError::UnknownCompression {
                path: path.to_path_buf(),
            })
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::super::modinfo::fake_ko;
    use super::*;
    use std::io::Write;

    const REL: &str = "6.1.0-9-amd64";

    fn ko(name: &str, deps: &str) -> Vec<u8> {
        fake_ko(&[
            &format!("depends={deps}"),
            &format!("name={name}"),
            &format!("vermagic={REL} SMP mod_unload"),
        ])
    }

    /// A tree: vsock transport (needs vsock, common), common (needs vsock,
    /// virtio), vsock, virtio gzip-compressed, virtio_ring built in.
    fn tree(root: &Path) -> PathBuf {
        let dir = root.join("lib/modules").join(REL);
        let net = dir.join("kernel/net/vmw_vsock");
        let drv = dir.join("kernel/drivers/virtio");
        std::fs::create_dir_all(&net).unwrap();
        std::fs::create_dir_all(&drv).unwrap();
        std::fs::write(
            net.join("vmw_vsock_virtio_transport.ko"),
            ko(
                "vmw_vsock_virtio_transport",
                "vsock,vmw_vsock_virtio_transport_common",
            ),
        )
        .unwrap();
        std::fs::write(
            net.join("vmw_vsock_virtio_transport_common.ko.zst"),
            zstd::encode_all(
                &ko(
                    "vmw_vsock_virtio_transport_common",
                    "vsock,virtio,virtio_ring",
                )[..],
                1,
            )
            .unwrap(),
        )
        .unwrap();
        std::fs::write(net.join("vsock.ko"), ko("vsock", "")).unwrap();
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        gz.write_all(&ko("virtio", "")).unwrap();
        std::fs::write(drv.join("virtio.ko.gz"), gz.finish().unwrap()).unwrap();
        std::fs::write(
            dir.join("modules.builtin"),
            "kernel/drivers/virtio/virtio_ring.ko\n",
        )
        .unwrap();
        dir
    }

    #[test]
    fn dependencies_come_first_once_and_builtins_are_skipped() {
        let d = tempfile::tempdir().unwrap();
        let dir = tree(d.path());
        let t = ModuleTree::scan(&dir, "test").unwrap();
        assert_eq!(t.len(), 4);
        assert!(t.is_builtin("virtio_ring") && !t.is_builtin("virtio"));
        let mods = t
            .resolve(&["vmw_vsock_virtio_transport", "virtio_ring", "vsock"])
            .unwrap();
        let names: Vec<&str> = mods.iter().map(|m| m.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "vsock",
                "virtio",
                "vmw_vsock_virtio_transport_common",
                "vmw_vsock_virtio_transport"
            ]
        );
        for m in &mods {
            assert!(m.bytes.starts_with(b"\x7fELF"), "{} decompressed", m.name);
        }
    }

    #[test]
    fn the_tree_is_found_in_the_documented_order() {
        let d = tempfile::tempdir().unwrap();
        let dir = tree(d.path());
        let host = d.path().join("host");
        // 3: an unpacked package, boot/vmlinuz beside lib/.
        let boot = d.path().join("boot/vmlinuz");
        let t = locate(None, &boot, REL, &host).unwrap().unwrap();
        assert_eq!(t.dir, dir);
        assert_eq!(t.found_by, "lib/modules/<release> beside the kernel");
        // 2: the kernel inside lib/modules/<release>.
        let t = locate(None, &dir.join("vmlinuz"), REL, &host)
            .unwrap()
            .unwrap();
        assert!(t.found_by.contains("own directory"), "{}", t.found_by);
        // 1: explicit, as the release dir or a root holding it.
        for given in [dir.clone(), d.path().to_path_buf()] {
            let t = locate(Some(&given), Path::new("/x/k"), REL, &host)
                .unwrap()
                .unwrap();
            assert_eq!(t.dir, dir);
        }
        // 4: the host's, only for its own release.
        let elsewhere = Path::new("/nonexistent/vmlinuz");
        assert!(locate(None, elsewhere, REL, &host).unwrap().is_none());
        let t = locate(None, elsewhere, REL, d.path()).unwrap().unwrap();
        assert!(t.found_by.contains("host"), "{}", t.found_by);
    }

    #[test]
    fn bad_trees_and_modules_are_named() {
        let d = tempfile::tempdir().unwrap();
        let dir = tree(d.path());
        let e = locate(Some(&dir), Path::new("/k"), "6.2.0", Path::new("/none"))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("is for release 6.1.0-9-amd64") && e.contains("6.2.0"),
            "{e}"
        );
        let e = locate(Some(&d.path().join("nope")), Path::new("/k"), REL, d.path())
            .unwrap_err()
            .to_string();
        assert!(e.contains("nope") && e.contains("not a directory"), "{e}");
        // A dependency that is nowhere.
        std::fs::remove_file(dir.join("kernel/net/vmw_vsock/vsock.ko")).unwrap();
        let t = ModuleTree::scan(&dir, "t").unwrap();
        let e = t
            .resolve(&["vmw_vsock_virtio_transport"])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("`vmw_vsock_virtio_transport` needs `vsock`"),
            "{e}"
        );
        let e = t.resolve(&["virtio_blk"]).unwrap_err().to_string();
        assert!(e.contains("`virtio_blk` is not in"), "{e}");
        // Not ELF; an unknown compression.
        let bad = dir.join("kernel/bad.ko");
        std::fs::write(&bad, b"#!/bin/sh\n").unwrap();
        let e = read_module(&bad).unwrap_err().to_string();
        assert!(
            e.contains("bad.ko") && e.contains("not a kernel module"),
            "{e}"
        );
        let lz = dir.join("kernel/odd.ko.lz4");
        std::fs::write(&lz, b"\x04\x22\x4d\x18").unwrap();
        let e = read_module(&lz).unwrap_err().to_string();
        assert!(e.contains("odd.ko.lz4") && e.contains(".ko.zst"), "{e}");
        let broken = dir.join("kernel/broken.ko.xz");
        std::fs::write(&broken, b"not xz").unwrap();
        let e = read_module(&broken).unwrap_err().to_string();
        assert!(e.contains("broken.ko.xz") && e.contains("damaged"), "{e}");
    }

    #[test]
    fn xz_modules_are_decompressed() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("m.ko.xz");
        let mut xz = Vec::new();
        lzma_rs::xz_compress(&mut &ko("m", "")[..], &mut xz).unwrap();
        std::fs::write(&p, xz).unwrap();
        let (bytes, info) = read_module(&p).unwrap();
        assert_eq!(bytes, ko("m", ""));
        assert_eq!(info.name.as_deref(), Some("m"));
        assert_eq!(
            module_name("virtio-rng.ko.xz").as_deref(),
            Some("virtio_rng")
        );
        assert_eq!(module_name("modules.order"), None);
        assert_eq!(module_name("x.kobj"), None);
    }
}
