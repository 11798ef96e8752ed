//! The workspace's crate graph is fixed by DESIGN.md: this test asserts it as an
//! exact equality over `cargo metadata`, not as a list of forbidden edges.
//!
//! Members must be exactly
//! `{provium-protocol, provium-agent, provium-vmm, provium-snapshot, provium-netsetup, provium}`
//! and the internal dependency edges exactly
//! `provium -> {protocol, vmm, snapshot, netsetup}`, `provium-vmm -> {snapshot, netsetup}`,
//! `provium-agent -> provium-protocol`.
//!
//! Why equality: a "no forbidden edge" check passes trivially for a crate that
//! lost all its edges (or a new crate nobody listed), so it cannot fail where it
//! matters. Here a missing edge, an extra edge, a missing member and an extra
//! member each fail, and the message lists every difference.
//!
//! Which dependencies count: every kind (normal, build *and* dev), including
//! optional and target-specific ones, because the design allows no other edge at
//! all. A dev-dependency from, say, `provium-protocol` on `provium-snapshot` would
//! still couple the crates' builds and versions. A dependency counts as internal
//! when its package name (not its `rename`) is a workspace member's name.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use cargo_metadata::{DependencyKind, Metadata, MetadataCommand};

/// A directed edge `from -> to` between two package names.
type Edge = (String, String);

/// The part of `cargo metadata` this test reasons about.
#[derive(Debug, Clone, Default)]
struct Graph {
    /// Package names of the workspace members.
    members: BTreeSet<String>,
    /// Internal edges, each with the dependency kinds that produce it
    /// (`normal`, `build`, `dev`), kept for the failure message.
    edges: BTreeMap<Edge, BTreeSet<String>>,
}

impl Graph {
    /// A graph from plain lists, for the expected graph and for tests.
    fn from_lists(members: &[&str], edges: &[(&str, &str)]) -> Self {
        Graph {
            members: members.iter().map(|m| m.to_string()).collect(),
            edges: edges
                .iter()
                .map(|(f, t)| {
                    (
                        (f.to_string(), t.to_string()),
                        BTreeSet::from(["normal".to_string()]),
                    )
                })
                .collect(),
        }
    }

    fn add_edge(&mut self, from: &str, to: &str, kind: &str) {
        self.edges
            .entry((from.to_string(), to.to_string()))
            .or_default()
            .insert(kind.to_string());
    }

    fn remove_edges_from(&mut self, from: &str) {
        self.edges.retain(|(f, _), _| f != from);
    }
}

const EXPECTED_MEMBERS: &[&str] = &[
    "provium-protocol",
    "provium-agent",
    "provium-vmm",
    "provium-snapshot",
    "provium-netsetup",
    "provium",
];

const EXPECTED_EDGES: &[(&str, &str)] = &[
    ("provium", "provium-protocol"),
    ("provium", "provium-vmm"),
    ("provium", "provium-snapshot"),
    ("provium", "provium-netsetup"),
    ("provium-vmm", "provium-snapshot"),
    ("provium-vmm", "provium-netsetup"),
    ("provium-agent", "provium-protocol"),
];

fn kind_name(kind: DependencyKind) -> &'static str {
    match kind {
        DependencyKind::Normal => "normal",
        DependencyKind::Development => "dev",
        DependencyKind::Build => "build",
        // A kind this cargo_metadata does not know yet still counts as an edge.
        _ => "unknown",
    }
}

/// Members and internal edges (all dependency kinds) of a workspace.
fn graph_from_metadata(metadata: &Metadata) -> Graph {
    let packages = metadata.workspace_packages();
    let members: BTreeSet<String> = packages.iter().map(|p| p.name.to_string()).collect();
    let mut graph = Graph {
        members: members.clone(),
        edges: BTreeMap::new(),
    };
    for package in packages {
        for dep in &package.dependencies {
            if members.contains(&dep.name) {
                graph.add_edge(&package.name, &dep.name, kind_name(dep.kind));
            }
        }
    }
    graph
}

fn load_metadata(manifest_path: &Path) -> Metadata {
    // `no_deps`: only workspace members are listed (each still with its full
    // dependency list), so no registry access or lock file is needed.
    MetadataCommand::new()
        .manifest_path(manifest_path)
        .no_deps()
        .exec()
        .unwrap_or_else(|e| panic!("cargo metadata on {}: {e}", manifest_path.display()))
}

fn workspace_graph() -> Graph {
    // `cargo test` also sets CARGO_MANIFEST_DIR at run time; prefer it, so a
    // test binary built in a checkout that has since moved reads the right one.
    let harness_dir = std::env::var_os("CARGO_MANIFEST_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| env!("CARGO_MANIFEST_DIR").into());
    let manifest = harness_dir.join("../Cargo.toml");
    graph_from_metadata(&load_metadata(&manifest))
}

fn format_edge(edge: &Edge, kinds: Option<&BTreeSet<String>>) -> String {
    match kinds {
        Some(k) if !k.is_empty() => format!(
            "{} -> {} ({})",
            edge.0,
            edge.1,
            k.iter().cloned().collect::<Vec<_>>().join(", ")
        ),
        _ => format!("{} -> {}", edge.0, edge.1),
    }
}

/// `Ok` when `actual` equals `expected` exactly (members and edges); otherwise
/// an error listing every missing and extra member and edge.
fn check_graph(actual: &Graph, expected: &Graph) -> Result<(), String> {
    let mut problems = Vec::new();
    for m in expected.members.difference(&actual.members) {
        problems.push(format!("missing member: {m}"));
    }
    for m in actual.members.difference(&expected.members) {
        problems.push(format!("extra member: {m}"));
    }
    for (edge, _) in expected.edges.iter() {
        if !actual.edges.contains_key(edge) {
            problems.push(format!("missing edge: {}", format_edge(edge, None)));
        }
    }
    for (edge, kinds) in actual.edges.iter() {
        if !expected.edges.contains_key(edge) {
            problems.push(format!("extra edge: {}", format_edge(edge, Some(kinds))));
        }
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "workspace crate graph differs from DESIGN.md (\"Dependency direction\"):\n  {}",
            problems.join("\n  ")
        ))
    }
}

fn check_against_design(actual: &Graph) -> Result<(), String> {
    check_graph(actual, &Graph::from_lists(EXPECTED_MEMBERS, EXPECTED_EDGES))
}

#[test]
fn workspace_graph_is_exactly_the_designed_one() {
    let graph = workspace_graph();
    if let Err(msg) = check_against_design(&graph) {
        panic!("{msg}");
    }
    // Guard against the extractor silently finding nothing: the real graph
    // must carry every designed edge, so it cannot be empty.
    assert_eq!(graph.edges.len(), EXPECTED_EDGES.len());
    assert_eq!(graph.members.len(), EXPECTED_MEMBERS.len());
}

#[test]
fn checker_fails_when_a_crate_loses_its_edges() {
    let mut graph = workspace_graph();
    graph.remove_edges_from("provium-vmm");
    let err = check_against_design(&graph).expect_err("vmm without edges must fail");
    assert!(
        err.contains("missing edge: provium-vmm -> provium-snapshot"),
        "{err}"
    );
    assert!(
        err.contains("missing edge: provium-vmm -> provium-netsetup"),
        "{err}"
    );
    assert!(!err.contains("extra"), "{err}");
}

#[test]
fn checker_fails_on_an_extra_member_with_no_edges() {
    let mut graph = workspace_graph();
    graph.members.insert("provium-stub".to_string());
    let err = check_against_design(&graph).expect_err("an unlisted member must fail");
    assert!(err.contains("extra member: provium-stub"), "{err}");
}

#[test]
fn checker_fails_on_a_missing_member() {
    let mut graph = workspace_graph();
    graph.members.remove("provium-netsetup");
    let err = check_against_design(&graph).expect_err("a missing member must fail");
    assert!(err.contains("missing member: provium-netsetup"), "{err}");
}

#[test]
fn checker_fails_on_an_extra_edge_of_any_kind() {
    for kind in ["normal", "build", "dev"] {
        let mut graph = workspace_graph();
        graph.add_edge("provium-protocol", "provium-snapshot", kind);
        let err = check_against_design(&graph).expect_err("an extra edge must fail");
        assert!(
            err.contains(&format!(
                "extra edge: provium-protocol -> provium-snapshot ({kind})"
            )),
            "{err}"
        );
        assert!(!err.contains("missing"), "{err}");
    }
}

#[test]
fn checker_fails_on_an_empty_graph() {
    let err = check_against_design(&Graph::default()).expect_err("empty graph must fail");
    for m in EXPECTED_MEMBERS {
        let line = format!("missing member: {m}");
        assert!(err.lines().any(|l| l.trim() == line), "{err}");
    }
    for (f, t) in EXPECTED_EDGES {
        assert!(err.contains(&format!("missing edge: {f} -> {t}")), "{err}");
    }
}

#[test]
fn checker_accepts_the_expected_lists() {
    let expected = Graph::from_lists(EXPECTED_MEMBERS, EXPECTED_EDGES);
    assert_eq!(check_against_design(&expected), Ok(()));
}

/// The extractor counts normal, build and dev dependencies, target-specific
/// ones, and uses the package name of a renamed dependency. Proven on a
/// throwaway fixture workspace of path-only crates.
#[test]
fn extractor_counts_every_dependency_kind() {
    let root = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("workspace_edges_fixture_{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    let write = |rel: &str, text: &str| {
        let path = root.join(rel);
        std::fs::create_dir_all(path.parent().expect("fixture paths have a parent"))
            .expect("create fixture dir");
        std::fs::write(&path, text).expect("write fixture file");
    };
    write(
        "Cargo.toml",
        "[workspace]\nresolver = \"2\"\nmembers = [\"a\", \"b\", \"c\", \"d\", \"e\", \"lonely\"]\n",
    );
    let krate = |name: &str, deps: &str| {
        write(
            &format!("{name}/Cargo.toml"),
            &format!(
                "[package]\nname = \"{name}\"\nversion = \"0.1.0\"\nedition = \"2021\"\n\n{deps}"
            ),
        );
        write(&format!("{name}/src/lib.rs"), "");
    };
    krate("a", "[dependencies]\nb = { path = \"../b\" }\n");
    krate("b", "[build-dependencies]\nc = { path = \"../c\" }\n");
    krate("c", "[dev-dependencies]\nd = { path = \"../d\" }\n");
    krate(
        "d",
        "[target.'cfg(unix)'.dependencies]\nrenamed = { package = \"e\", path = \"../e\" }\n",
    );
    krate("e", "");
    krate("lonely", "");

    let graph = graph_from_metadata(&load_metadata(&root.join("Cargo.toml")));
    let _ = std::fs::remove_dir_all(&root);

    let expected = Graph::from_lists(
        &["a", "b", "c", "d", "e", "lonely"],
        &[("a", "b"), ("b", "c"), ("c", "d"), ("d", "e")],
    );
    assert_eq!(check_graph(&graph, &expected), Ok(()));
    let kinds = |f: &str, t: &str| {
        graph.edges[&(f.to_string(), t.to_string())]
            .iter()
            .cloned()
            .collect::<Vec<_>>()
    };
    assert_eq!(kinds("a", "b"), ["normal"]);
    assert_eq!(kinds("b", "c"), ["build"]);
    assert_eq!(kinds("c", "d"), ["dev"]);
    assert_eq!(kinds("d", "e"), ["normal"]);
    // A member with no edges is still a member, and must be listed.
    assert!(graph.members.contains("lonely"));
}

/// Names of the concrete backends: only `harness/src/backend/` may use them.
/// Everything else goes through `backend::{Backend, Guest, Capabilities}`,
/// and picks a backend only with `backend::for_kind(BackendKind)`.
const CONCRETE_BACKEND_NAMES: &[&str] = &[
    "backend::local",
    "backend::kvm",
    "LocalSandbox",
    "LocalBackend",
    "LocalGuest",
    "KvmMachine",
    "KvmBackend",
    "KvmBootOpts",
];

/// Files outside `backend/` that still name a concrete backend, each with
/// the only text it may use and why. This list only shrinks: it is empty
/// now that bench boots through `Backend` too.
const NOT_YET_ON_THE_BOUNDARY: &[(&str, &str)] = &[];

/// `src` without `//` comments (a doc comment may name a backend's module).
fn code_of(src: &str) -> String {
    src.lines()
        .map(|l| l.find("//").map_or(l, |i| &l[..i]))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Each `(file, name)` where `code` (by path relative to harness/src) names
/// a concrete backend outside `backend/`, less [`NOT_YET_ON_THE_BOUNDARY`].
fn concrete_backend_uses(files: &[(String, String)]) -> Vec<(String, &'static str)> {
    concrete_backend_uses_except(files, NOT_YET_ON_THE_BOUNDARY)
}

/// [`concrete_backend_uses`] less the given `exceptions` (file or folder
/// ending in `/`, and the text it may use, or `*` for any).
fn concrete_backend_uses_except(
    files: &[(String, String)],
    exceptions: &[(&str, &str)],
) -> Vec<(String, &'static str)> {
    let mut found = Vec::new();
    for (rel, src) in files {
        if rel.starts_with("backend/") {
            continue;
        }
        let mut code = code_of(src);
        let mut allowed_all = false;
        for (file, allowed) in exceptions {
            let matches = if file.ends_with('/') {
                rel.starts_with(file)
            } else {
                rel == file
            };
            if matches {
                if *allowed == "*" {
                    allowed_all = true;
                } else {
                    code = code.replace(allowed, "");
                }
            }
        }
        if allowed_all {
            continue;
        }
        for name in CONCRETE_BACKEND_NAMES {
            if code.contains(name) {
                found.push((rel.clone(), *name));
            }
        }
        // `use crate::backend::{kvm, local}` names them too.
        for line in code.lines().filter(|l| l.contains("backend::{")) {
            let group = &line[line.find("backend::{").unwrap_or(0)..];
            for module in ["kvm", "local"] {
                if group
                    .split(|c: char| !c.is_alphanumeric() && c != '_')
                    .any(|w| w == module)
                {
                    found.push((
                        rel.clone(),
                        if module == "kvm" {
                            "backend::kvm"
                        } else {
                            "backend::local"
                        },
                    ));
                }
            }
        }
    }
    found
}

/// Every `.rs` file under `dir`, as (path relative to `dir`, contents).
fn rust_files(dir: &Path) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap_or_else(|e| panic!("{}: {e}", d.display())) {
            let path = entry.expect("a readable directory entry").path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let rel = path
                    .strip_prefix(dir)
                    .expect("walked from dir")
                    .to_string_lossy()
                    .replace('\\', "/");
                let src = std::fs::read_to_string(&path)
                    .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
                out.push((rel, src));
            }
        }
    }
    out.sort();
    out
}

#[test]
fn no_code_outside_backend_names_a_concrete_backend() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let files = rust_files(&src);
    assert!(
        files.iter().any(|(rel, _)| rel == "backend/mod.rs")
            && files.iter().any(|(rel, _)| rel.starts_with("lua/")),
        "the walk found harness/src"
    );
    let found = concrete_backend_uses(&files);
    assert!(
        found.is_empty(),
        "code outside harness/src/backend/ names a concrete backend (ask \
         `Capabilities`, or go through `backend::for_kind`):\n  {}",
        found
            .iter()
            .map(|(f, n)| format!("{f}: {n}"))
            .collect::<Vec<_>>()
            .join("\n  ")
    );
}

#[test]
fn the_backend_name_check_catches_each_way_of_naming_one() {
    let files = |rel: &str, src: &str| vec![(rel.to_string(), src.to_string())];
    for (src, name) in [
        ("use crate::backend::kvm::KvmMachine;", "backend::kvm"),
        ("fn f(s: &LocalSandbox) {}", "LocalSandbox"),
        ("use crate::backend::{local, Guest};", "backend::local"),
        ("use crate::backend::{Guest, kvm::config};", "backend::kvm"),
    ] {
        let found = concrete_backend_uses(&files("lua/vm.rs", src));
        assert!(found.iter().any(|(_, n)| *n == name), "{src}: {found:?}");
    }
    // Inside backend/, in a comment, or through the boundary: fine.
    for (rel, src) in [
        (
            "backend/mod.rs",
            "use kvm::KvmMachine; use crate::backend::kvm;",
        ),
        ("lua/bridge.rs", "//! TAPs (`backend::local::net`)"),
        (
            "lua/vm.rs",
            "use crate::backend::{Backend, Guest, MachineSpec};",
        ),
        ("cli/run.rs", "crate::backend::host_is_kvm_pvm(settings)"),
    ] {
        assert_eq!(concrete_backend_uses(&files(rel, src)), [], "{rel}: {src}");
    }
    // A folder's exception covers its files; bench has none any more.
    let bench = files("cli/bench/boot.rs", "crate::backend::kvm::KvmMachine");
    assert_eq!(
        concrete_backend_uses_except(&bench, &[("cli/bench/", "*")]),
        []
    );
    let found = concrete_backend_uses(&bench);
    assert!(
        found.iter().any(|(_, n)| *n == "KvmMachine"),
        "bench is on the boundary: {found:?}"
    );
    let run = files(
        "cli/run.rs",
        "crate::backend::kvm::KvmMachine; LocalSandbox",
    );
    assert_eq!(
        concrete_backend_uses_except(&run, &[("cli/run.rs", "crate::backend::kvm::KvmMachine")]),
        [("cli/run.rs".to_string(), "LocalSandbox")],
        "a file's exception removes only its text"
    );
    // An exception covers only its own text.
    let found = concrete_backend_uses(&files("cli/run.rs", "crate::backend::kvm::KvmMachine"));
    assert_eq!(
        found,
        [
            ("cli/run.rs".to_string(), "backend::kvm"),
            ("cli/run.rs".to_string(), "KvmMachine")
        ]
    );
}
