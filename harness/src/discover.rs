//! Finding test files and what they declare statically (fixture references,
//! file-scope claims), and the selection flags that work on whole files.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use provium_protocol::event::ResourceAmount;
use regex::Regex;

use crate::config::parse_size;

/// Why the test files could not be found: the path that failed; the I/O
/// error is the source.
#[derive(Debug, thiserror::Error)]
pub enum DiscoverError {
    /// A path given (or a file found) cannot be read or resolved.
    #[error("`{}`", path.display())]
    Path {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A directory could not be walked to the end.
    #[error("walking `{}`", path.display())]
    Walk {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// The error for `path`, which could not be read or resolved.
fn at_path(path: &Path) -> impl FnOnce(std::io::Error) -> DiscoverError + '_ {
    move |source| DiscoverError::Path {
        path: path.to_path_buf(),
        source,
    }
}

#[derive(Debug, Clone)]
pub struct TestFile {
    pub abs: PathBuf,
    /// Relative to the root (or CLI path) it was found under.
    pub rel: String,
    pub fixture_refs: Vec<String>,
    pub declared_claim: Option<ResourceAmount>,
    /// How many VMs the file's source creates at most at once, as far as a
    /// static scan can tell ([`vm_estimate`]); what the dispatcher's
    /// emulated-VM slots count (`SchedulerOptions::emulated_vm_slots`).
    pub vm_estimate: u32,
}

/// Walk `paths` (files or directories) for `*.test.lua`, sorted, deduplicated.
/// Names are relative to the test root that holds the file (`roots`), else
/// to the path it was found under.
pub fn discover(paths: &[PathBuf], roots: &[PathBuf]) -> Result<Vec<TestFile>, DiscoverError> {
    let roots: Vec<PathBuf> = roots
        .iter()
        .filter_map(|r| std::fs::canonicalize(r).ok())
        .collect();
    let mut out: Vec<TestFile> = Vec::new();
    for p in paths {
        let meta = std::fs::metadata(p).map_err(at_path(p))?;
        if meta.is_file() {
            let base = p.parent().unwrap_or(Path::new("."));
            out.push(describe(p, base, &roots)?);
        } else {
            let mut found = Vec::new();
            walk(p, &mut found).map_err(|source| DiscoverError::Walk {
                path: p.clone(),
                source,
            })?;
            found.sort();
            for f in found {
                out.push(describe(&f, p, &roots)?);
            }
        }
    }
    let mut seen = std::collections::BTreeSet::new();
    out.retain(|f| seen.insert(f.abs.clone()));
    Ok(out)
}

fn walk(dir: &Path, out: &mut Vec<PathBuf>) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let ty = entry.file_type()?;
        let path = entry.path();
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if ty.is_dir() {
            // Hidden directories (.git, .provium-meta) and build output are not test trees.
            if !name.starts_with('.') && name != "target" {
                walk(&path, out)?;
            }
        } else if name.ends_with(".test.lua") {
            out.push(path);
        }
    }
    Ok(())
}

fn describe(path: &Path, base: &Path, roots: &[PathBuf]) -> Result<TestFile, DiscoverError> {
    let abs = std::fs::canonicalize(path).map_err(at_path(path))?;
    let base_abs = match roots
        .iter()
        .filter(|r| abs.starts_with(r))
        .max_by_key(|r| r.as_os_str().len())
    {
        Some(root) => root.clone(),
        None => std::fs::canonicalize(base).unwrap_or_else(|_| base.to_path_buf()),
    };
    let rel = abs
        .strip_prefix(&base_abs)
        .unwrap_or(&abs)
        .to_string_lossy()
        .into_owned();
    let source = std::fs::read_to_string(&abs).unwrap_or_default();
    let fixture_roots = if roots.is_empty() {
        std::slice::from_ref(&base_abs)
    } else {
        roots
    };
    Ok(TestFile {
        fixture_refs: fixture_refs(&source),
        declared_claim: declared_claim(&source),
        vm_estimate: vm_estimate(&source)
            .saturating_add(lab_fixture_extra_vms(&source, fixture_roots)),
        abs,
        rel,
    })
}

fn fixture_re() -> &'static Regex {
    static RE: OnceLock<Regex> = OnceLock::new();
    RE.get_or_init(|| Regex::new(r#"(?:vm|lab)_fixture\s*\(\s*["']([^"']+)["']"#).unwrap())
}

/// `vm_fixture("x")` / `lab_fixture("x")` literals in the source.
pub fn fixture_refs(source: &str) -> Vec<String> {
    let mut v: Vec<String> = fixture_re()
        .captures_iter(source)
        .map(|c| c[1].to_string())
        .collect();
    v.sort();
    v.dedup();
    v
}

/// The VMs a file creates, counted from its source: every
/// `provium:vm(` / `provium.vm(` and `vm_fixture(` call site, and a lab
/// fixture as one VM ([`lab_fixture_extra_vms`] adds the rest). Comment
/// lines do not count. A file that creates VMs in a loop is undercounted,
/// one whose call sites run one after another is overcounted; either way
/// the dispatcher only uses the count to keep emulated VMs (kvm_pvm) from
/// sharing a host core, and a file with more VMs than slots still runs,
/// alone.
pub fn vm_estimate(source: &str) -> u32 {
    static RE: OnceLock<Regex> = OnceLock::new();
    let re = RE.get_or_init(|| {
        Regex::new(r#"provium\s*[:.]\s*vm\s*\(|\b(?:vm|lab)_fixture\s*\("#).unwrap()
    });
    let n = source
        .lines()
        .filter(|l| !l.trim_start().starts_with("--"))
        .map(|l| re.find_iter(l).count())
        .sum::<usize>();
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// The VMs a file's lab fixtures add beyond the one [`vm_estimate`] counts
/// per `lab_fixture(` call site: each fixture's own estimate, less one,
/// from its source in `roots` (a fixture that cannot be found adds
/// nothing; the run reports it). A fixture's own lab fixtures count one
/// each: the estimate reads one level deep.
pub fn lab_fixture_extra_vms(source: &str, roots: &[PathBuf]) -> u32 {
    static RE: OnceLock<Regex> = OnceLock::new();
    let re = RE.get_or_init(|| Regex::new(r#"\blab_fixture\s*\(\s*["']([^"']+)["']"#).unwrap());
    source
        .lines()
        .filter(|l| !l.trim_start().starts_with("--"))
        .flat_map(|l| {
            re.captures_iter(l)
                .map(|c| c[1].to_string())
                .collect::<Vec<_>>()
        })
        .filter_map(|name| crate::fixture::key::resolve_fixture(roots, &name).ok())
        .filter_map(|path| std::fs::read_to_string(path).ok())
        .map(|fixture| vm_estimate(&fixture).saturating_sub(1))
        .fold(0u32, u32::saturating_add)
}

/// A file-scope `provium:claim({memory = ..., cpus = ...})` with literal values.
pub fn declared_claim(source: &str) -> Option<ResourceAmount> {
    static RE: OnceLock<Regex> = OnceLock::new();
    let re = RE.get_or_init(|| Regex::new(r#"(?m)^provium:claim\s*\(\s*\{([^}]*)\}"#).unwrap());
    let body = re.captures(source)?.get(1)?.as_str().to_string();
    static MEM: OnceLock<Regex> = OnceLock::new();
    static CPU: OnceLock<Regex> = OnceLock::new();
    let mem =
        MEM.get_or_init(|| Regex::new(r#"memory\s*=\s*(?:"([^"]+)"|'([^']+)'|(\d+))"#).unwrap());
    let cpu = CPU.get_or_init(|| Regex::new(r#"cpus\s*=\s*(\d+)"#).unwrap());
    let memory_bytes = mem
        .captures(&body)
        .and_then(|c| {
            c.get(1)
                .or(c.get(2))
                .or(c.get(3))
                .map(|m| m.as_str().to_string())
        })
        .and_then(|s| parse_size(&s).ok())
        .unwrap_or(0);
    let cpus = cpu
        .captures(&body)
        .and_then(|c| c[1].parse().ok())
        .unwrap_or(0);
    Some(ResourceAmount { memory_bytes, cpus })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_path_names_itself_with_the_io_error_as_source() {
        let d = tempfile::tempdir().unwrap();
        let missing = d.path().join("nope");
        let e = discover(std::slice::from_ref(&missing), &[]).unwrap_err();
        assert!(matches!(&e, DiscoverError::Path { path, .. } if *path == missing));
        assert_eq!(
            crate::error_chain::flatten(&e),
            format!(
                "`{}`: No such file or directory (os error 2)",
                missing.display()
            )
        );
    }

    #[test]
    fn vm_estimate_counts_vm_and_fixture_call_sites_not_comments() {
        let src = "local a = provium:vm(\"a\", \"linux\")\nlocal b = provium.vm('b')\n\
                   -- provium:vm(\"commented\")\nlocal c = provium:vm_fixture(\"base\")\n\
                   local lab = provium:lab_fixture(\"pair\")\nlocal vms = 'vm(' -- not a call site\n";
        assert_eq!(vm_estimate(src), 4);
        assert_eq!(vm_estimate("test('x', function(t) t:assert(true) end)"), 0);
    }

    #[test]
    fn a_lab_fixture_counts_the_vms_its_builder_creates() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(
            d.path().join("pair.fixture.lua"),
            "local a = provium:vm(\"a\", \"linux\")\nlocal b = provium:vm(\"b\", \"linux\")\nreturn provium:snapshot()\n",
        )
        .unwrap();
        std::fs::write(
            d.path().join("uses.test.lua"),
            "local pair = provium:lab_fixture(\"pair\")\n-- provium:lab_fixture(\"pair\")\nlocal gone = provium:lab_fixture(\"missing\")\n",
        )
        .unwrap();
        let roots = [std::fs::canonicalize(d.path()).unwrap()];
        let files = discover(&[d.path().to_path_buf()], &roots).unwrap();
        // Two call sites (one per lab fixture), plus the pair's second VM;
        // the commented call and the missing fixture add nothing more.
        assert_eq!(files[0].vm_estimate, 3);
    }

    #[test]
    fn static_scans() {
        let src = "provium:claim({memory = \"2G\", cpus = 3})\nlocal v = provium:vm_fixture(\"base\")\nprovium.lab_fixture('pair')\n";
        assert_eq!(
            fixture_refs(src),
            vec!["base".to_string(), "pair".to_string()]
        );
        assert_eq!(
            declared_claim(src),
            Some(ResourceAmount {
                memory_bytes: 2 << 30,
                cpus: 3
            })
        );
        assert_eq!(declared_claim("test('x', function() end)"), None);
    }

    #[test]
    fn discovery_is_sorted_and_relative() {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(d.path().join("b/.hidden")).unwrap();
        for f in [
            "b/z.test.lua",
            "a.test.lua",
            "b/.hidden/x.test.lua",
            "helper.lua",
            "f.fixture.lua",
        ] {
            std::fs::write(d.path().join(f), "").unwrap();
        }
        let files = discover(&[d.path().to_path_buf()], &[]).unwrap();
        let under_root = discover(&[d.path().join("b")], &[d.path().to_path_buf()]).unwrap();
        assert_eq!(under_root[0].rel, "b/z.test.lua");
        let rels: Vec<&str> = files.iter().map(|f| f.rel.as_str()).collect();
        assert_eq!(rels, vec!["a.test.lua", "b/z.test.lua"]);
    }
}
