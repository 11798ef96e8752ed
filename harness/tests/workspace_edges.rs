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
//!
//! Inside harness/src the test also holds the backend boundary (no code
//! outside `backend/` names a concrete backend, none outside `backend/kvm/`
//! a VMM type), the module import graph (no circles) and
//! the one event path (only the dispatcher writes the event stream and calls
//! the reporters).

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

/// A self-test's source tree: (path relative to src/, source) pairs, as
/// [`rust_files`] returns them.
fn files(list: &[(&str, &str)]) -> Vec<(String, String)> {
    list.iter()
        .map(|(r, s)| (r.to_string(), s.to_string()))
        .collect()
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

// ---- the VMM's types stay behind the kvm backend ----
//
// The harness speaks its own device vocabulary at the backend boundary
// (`backend::{NicSpec, DiskSpec}`); only `backend/kvm/` turns it into the
// VMM's configs. So outside the exceptions below no code names a
// `provium_vmm` item. Comments, literals and test code (`#[cfg(test)]`
// items and the files they declare) do not count: a unit test may boot the
// VMM's tiny guest image.

/// Where `provium_vmm` may be named (a folder ends in `/`), and why.
const VMM_NAMERS: &[(&str, &str)] = &[
    (
        "backend/kvm/",
        "the kvm backend: the one place the spec becomes the VMM's VmConfig",
    ),
    (
        "backend/vmm_models.rs",
        "names, once, the VMM's plain models the boundary shares by Arc (the console \
         log, a disk's fault set, the boot timer's marks, a boot's source): state \
         and rules with no KVM object, re-exported as backend::{Console, DiskFaults, …}",
    ),
    (
        "cli/bench/",
        "`provium bench` measures the VMM itself: it boots the tiny guest straight on \
         provium_vmm::Vm and reads the VMM's boot marks, beside the boots it makes \
         through the backend",
    ),
];

/// Files (relative to harness/src) whose non-test code names `provium_vmm`
/// outside [`VMM_NAMERS`].
/// `files` without those declared by `#[cfg(test)] mod x;`, which are test
/// code (paths relative to one source root, with or without a prefix).
fn non_test_files(files: &[(String, String)]) -> Vec<&(String, String)> {
    let mut test_files = std::collections::BTreeSet::new();
    for (rel, src) in files {
        let dir = match rel.rsplit_once('/') {
            Some((d, f)) if f == "mod.rs" || f == "lib.rs" || f == "main.rs" => format!("{d}/"),
            Some(_) => format!("{}/", rel.trim_end_matches(".rs")),
            None if rel == "lib.rs" || rel == "main.rs" => String::new(),
            None => format!("{}/", rel.trim_end_matches(".rs")),
        };
        for m in code_without_tests(src).1 {
            test_files.insert(format!("{dir}{m}.rs"));
            test_files.insert(format!("{dir}{m}/mod.rs"));
        }
    }
    files
        .iter()
        .filter(|(rel, _)| !test_files.contains(rel))
        .collect()
}

fn vmm_namers(files: &[(String, String)]) -> Vec<String> {
    non_test_files(files)
        .into_iter()
        .filter(|(rel, _)| {
            !VMM_NAMERS.iter().any(|(place, _)| {
                if place.ends_with('/') {
                    rel.starts_with(place)
                } else {
                    rel == place
                }
            })
        })
        .filter(|(_, src)| code_without_tests(src).0.contains("provium_vmm"))
        .map(|(rel, _)| rel.clone())
        .collect()
}

#[test]
fn no_code_outside_the_kvm_backend_names_a_vmm_type() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let files = rust_files(&src);
    assert!(
        files.iter().any(|(rel, _)| rel == "backend/spec.rs"),
        "the walk found harness/src"
    );
    let found = vmm_namers(&files);
    assert!(
        found.is_empty(),
        "code outside backend/kvm/ names a provium_vmm item (speak the boundary's \
         vocabulary: backend::{{NicSpec, DiskSpec, Console, DiskFaults}}, and turn it \
         into the VMM's in backend/kvm/):\n  {}",
        found.join("\n  ")
    );
    // Every exception is still needed: each names the VMM.
    for (place, why) in VMM_NAMERS {
        assert!(
            files
                .iter()
                .filter(|(rel, _)| rel.starts_with(place))
                .any(|(_, src)| code_without_tests(src).0.contains("provium_vmm")),
            "{place} no longer names provium_vmm; drop its exception ({why})"
        );
    }
}

#[test]
fn the_vmm_type_check_catches_code_and_spares_comments_and_tests() {
    for src in [
        "use provium_vmm::vmm_config::NetConfig;",
        "pub nics: Vec<provium_vmm::vmm_config::NetConfig>,",
        "use provium_vmm as vmm;",
        "fn f() -> Option<std::sync::Arc<provium_vmm::Console>> { None }",
    ] {
        assert_eq!(
            vmm_namers(&files(&[("backend/spec.rs", src)])),
            ["backend/spec.rs"],
            "{src}"
        );
    }
    let spared = files(&[
        (
            "lua/disk.rs",
            "//! the VMM's `provium_vmm::BlockFaults`\nfn f() {}",
        ),
        ("lua/a.rs", "const S: &str = \"provium_vmm\";"),
        (
            "lua/vm/lifecycle.rs",
            "fn f() {}\n#[cfg(test)]\nmod tests { fn t() { provium_vmm::tiny_guest::BZIMAGE; } }",
        ),
        ("lua/vm/mod.rs", "#[cfg(test)]\nmod test_utils;"),
        ("lua/vm/test_utils.rs", "use provium_vmm::tiny_guest;"),
        ("backend/kvm/config.rs", "use provium_vmm::VmConfig;"),
        ("backend/vmm_models.rs", "pub use provium_vmm::Console;"),
        ("cli/bench/boot.rs", "use provium_vmm::Vm;"),
    ]);
    assert_eq!(vmm_namers(&spared), Vec::<String>::new());
}

// ---- the network model is Lua-free (issue 27) ----

/// What Lua code is named by: mlua itself, the Lua layer, and the typed
/// carrier of a Lua error.
const LUA_NAMES: &[&str] = &["mlua", "crate::lua", "script_error"];

/// Files (relative to harness/src) under network/ whose non-test code
/// names Lua ([`LUA_NAMES`]).
fn network_lua_users(files: &[(String, String)]) -> Vec<String> {
    non_test_files(files)
        .into_iter()
        .filter(|(rel, _)| rel.starts_with("network/"))
        .filter(|(_, src)| {
            let code = code_without_tests(src).0;
            LUA_NAMES.iter().any(|n| code.contains(n))
        })
        .map(|(rel, _)| rel.clone())
        .collect()
}

#[test]
fn the_network_model_names_no_lua() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let files = rust_files(&src);
    assert!(
        files.iter().any(|(rel, _)| rel == "network/bridge.rs"),
        "the walk found harness/src/network"
    );
    let found = network_lua_users(&files);
    assert!(
        found.is_empty(),
        "network/ is the Lua-free bridge model: parse Lua arguments and raise Lua \
         errors in lua/ (lua/network.rs, lua/bridge.rs, lua/nic.rs), and let the model \
         speak NetworkError:\n  {}",
        found.join("\n  ")
    );
}

#[test]
fn the_network_lua_check_catches_code_and_spares_comments_and_tests() {
    for src in [
        "use mlua::Lua;",
        "fn f(e: NetworkError) -> mlua::Error { todo!() }",
        "use crate::lua::vm_ctx::VmCtx;",
        "Refused(crate::script_error::ScriptError),",
    ] {
        assert_eq!(
            network_lua_users(&files(&[("network/bridge.rs", src)])),
            ["network/bridge.rs"],
            "{src}"
        );
    }
    let spared = files(&[
        (
            "network/mod.rs",
            "//! the `lua::network` glue, over mlua\n#[cfg(test)]\npub(crate) mod test_env;",
        ),
        ("network/test_env.rs", "use crate::lua::vm::Vm;"),
        ("network/naming.rs", "const S: &str = \"mlua\";"),
        (
            "network/membership.rs",
            "fn f() {}\n#[cfg(test)]\nmod tests { use crate::lua::phase::Phase; }",
        ),
        (
            "lua/network.rs",
            "impl From<NetworkError> for mlua::Error {}",
        ),
    ]);
    assert_eq!(network_lua_users(&spared), Vec::<String>::new());
}

// ---- no process-wide mutable state (STYLE.md §5) ----

/// The only mutable statics, each with why: both serve a signal handler,
/// which can reach nothing but a static.
const PROCESS_WIDE: &[(&str, &str)] = &[
    (
        "harness/src/runner/interrupt.rs",
        "the run's SIGINT/SIGTERM flag (signal setup is process-wide, in one place)",
    ),
    (
        "vmm/src/vstate/vcpu.rs",
        "a thread_local! (one per vCPU thread, not process-wide): the kick \
         signal handler's pointer to its thread's kvm_run.immediate_exit",
    ),
];

/// `(crate-relative file, line)` of each mutable static in `files` (an
/// atomic, lock or cell, or `static mut`) in non-test code.
fn mutable_statics(files: &[(String, String)]) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for (rel, src) in files {
        for line in code_without_tests(src).0.lines() {
            let t = line.trim_start();
            let t = t
                .strip_prefix("pub(crate) ")
                .or_else(|| t.strip_prefix("pub "))
                .unwrap_or(t);
            let Some(rest) = t.strip_prefix("static ") else {
                continue;
            };
            let mutable = rest.starts_with("mut ")
                || ["Atomic", "Mutex", "RwLock", "Cell<", "Cell "]
                    .iter()
                    .any(|k| rest.contains(k));
            if mutable {
                out.push((rel.clone(), line.trim().to_string()));
            }
        }
    }
    out
}

/// A rule's finder: `(file, line)` of each offence in `(file, source)`s.
type Finder = fn(&[(String, String)]) -> Vec<(String, String)>;

/// `offenders`' findings, one `file: line` a line, for a failure message.
fn listed(found: &[(String, String)]) -> String {
    found
        .iter()
        .map(|(f, l)| format!("{f}: {l}"))
        .collect::<Vec<_>>()
        .join("\n  ")
}

/// What `check` finds in every crate's source (`(crate/src/file, line)`),
/// except in the files `allowed` lists (each with why).
fn offenders(check: Finder, allowed: &[(&str, &str)]) -> Vec<(String, String)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut found = Vec::new();
    for krate in [
        "harness", "netsetup", "snapshot", "protocol", "vmm", "agent",
    ] {
        let files: Vec<(String, String)> = rust_files(&root.join(krate).join("src"))
            .into_iter()
            .map(|(rel, src)| (format!("{krate}/src/{rel}"), src))
            .collect();
        assert!(!files.is_empty(), "{krate}/src has Rust files");
        found.extend(
            check(&files)
                .into_iter()
                .filter(|(f, _)| !allowed.iter().any(|(p, _)| p == f)),
        );
    }
    found
}

#[test]
fn no_crate_keeps_a_process_wide_counter() {
    let found = offenders(mutable_statics, PROCESS_WIDE);
    assert!(
        found.is_empty(),
        "process-wide mutable state (pass a per-run or per-VM context instead, as \
         netsetup's WireNumbers does):\n  {}",
        listed(&found)
    );
}

#[test]
fn the_static_check_sees_counters_and_spares_constants_and_tests() {
    let files = |src: &str| vec![("a.rs".to_string(), src.to_string())];
    for src in [
        "static NEXT_WIRE: AtomicU32 = AtomicU32::new(0);",
        "pub static SEEN: std::sync::Mutex<Vec<u8>> = Mutex::new(Vec::new());",
        "static mut COUNT: u32 = 0;",
    ] {
        assert_eq!(mutable_statics(&files(src)).len(), 1, "{src}");
    }
    for src in [
        "static RE: OnceLock<Regex> = OnceLock::new();",
        "const N: AtomicU32 = AtomicU32::new(0);",
        "#[cfg(test)]\nmod tests { static HITS: AtomicU32 = AtomicU32::new(0); }",
    ] {
        assert_eq!(mutable_statics(&files(src)), [], "{src}");
    }
}

// ---- where each crate reads its environment ----

/// The only places that read the process environment at run time, each
/// with why. Everything else takes what it needs from its caller: the
/// harness's `Settings` (read once, in settings.rs) hands PATH, cache
/// directories and knobs down to netsetup, snapshot and the VMM, so a test
/// or a caller can give any of them another value.
const ENV_READERS: &[(&str, &str)] = &[
    (
        "harness/src/settings.rs",
        "Settings::from_env: every variable the harness reads, once a run",
    ),
    (
        "agent/src/main.rs",
        "the agent's own process entry: as PID 1 it may start with no PATH, \
         and sets the one its children get",
    ),
];

/// Run-time environment reads in non-test code: `(file, line)`.
fn env_reads(files: &[(String, String)]) -> Vec<(String, String)> {
    const READS: [&str; 5] = [
        "env::var(",
        "env::var_os(",
        "env::vars(",
        "env::vars_os(",
        "env::current_exe(",
    ];
    let mut out = Vec::new();
    for (rel, src) in non_test_files(files) {
        for line in code_without_tests(src).0.lines() {
            let compact: String = line.chars().filter(|c| !c.is_whitespace()).collect();
            if READS.iter().any(|r| compact.contains(r)) {
                out.push((rel.clone(), line.trim().to_string()));
            }
        }
    }
    out
}

#[test]
fn only_the_settings_and_the_agents_entry_read_the_environment() {
    let found = offenders(env_reads, ENV_READERS);
    assert!(
        found.is_empty(),
        "environment read outside harness/src/settings.rs (add the variable to Settings and \
         pass the value down):\n  {}",
        listed(&found)
    );
}

#[test]
fn the_env_check_sees_each_read_and_spares_comments_and_tests() {
    let files = |src: &str| vec![("a.rs".to_string(), src.to_string())];
    for src in [
        "fn f() { std::env::var_os(\"PATH\"); }",
        "use std::env;\nfn f() { env::var (\"X\").ok(); }",
        "fn f() { for (k, v) in std::env::vars() {} }",
        "fn f() { std::env::current_exe().unwrap(); }",
    ] {
        assert_eq!(env_reads(&files(src)).len(), 1, "{src}");
    }
    for src in [
        "// std::env::var(\"X\") is read in Settings\nfn f() {}",
        "fn f() { let s = \"env::var(\"; }",
        "#[cfg(test)]\nmod tests { fn t() { std::env::var(\"X\").ok(); } }",
    ] {
        assert_eq!(env_reads(&files(src)), [], "{src}");
    }
    // A file that `#[cfg(test)] mod tests;` declares is test code.
    let with_test_file = vec![
        (
            "k/src/a/mod.rs".to_string(),
            "#[cfg(test)]\nmod tests;".to_string(),
        ),
        (
            "k/src/a/tests.rs".to_string(),
            "fn t() { std::env::var_os(\"X\"); }".to_string(),
        ),
    ];
    assert_eq!(env_reads(&with_test_file), []);
}

// ---- one event path: only the dispatcher feeds the stream and reporters ----
//
// STYLE.md §3 (after cargo-nextest's runner) and issue 27: everything below
// the dispatcher (the executor, the Lua VM lifecycle, claims, the fixture
// builder) sends typed lifecycle events through its file's `EventSender`
// into the dispatcher's inbox; the dispatcher alone writes the msgpack
// stream and calls the reporters.

/// The only harness files that may write the event stream, call a
/// reporter, or point an `EventSender` anywhere, each with why.
const EVENT_PATH_ENDS: &[(&str, &str)] = &[
    (
        "harness/src/scheduler/dispatcher.rs",
        "the dispatcher: the one consumer of lifecycle events, the only writer of the \
         stream and caller of the reporters, and the maker of every file's EventSender",
    ),
    (
        "harness/src/events.rs",
        "defines the stream's writer handle (StreamSender) and the bus thread that drains it",
    ),
    (
        "harness/src/report/event_stream.rs",
        "the stream's encoder (EventStreamWriter), run by the bus thread",
    ),
    (
        "harness/src/report/mod.rs",
        "Reporters: fans the dispatcher's one call out to each reporter",
    ),
];

/// What writes the stream, calls a reporter or routes lifecycle events:
/// the stream's writer handles, a frame built by hand, `EventSender::to`,
/// and a `.report(…)` call with an argument (a `FileOutcome`'s
/// `.report()`, which only builds the report, is not one).
fn event_path_uses(files: &[(String, String)]) -> Vec<(String, String)> {
    const MARKS: [&str; 7] = [
        "StreamSender",
        "EventStreamWriter",
        ".emit(",
        ".emit_at(",
        "EventFrame{",
        "EventSender::to(",
        ".report(",
    ];
    let mut out = Vec::new();
    for (rel, src) in non_test_files(files) {
        for line in code_without_tests(src).0.lines() {
            let compact: String = line.chars().filter(|c| !c.is_whitespace()).collect();
            let hit = MARKS.iter().any(|m| {
                compact
                    .match_indices(m)
                    .any(|(i, _)| *m != ".report(" || !compact[i + m.len()..].starts_with(')'))
            });
            if hit {
                out.push((rel.clone(), line.trim().to_string()));
            }
        }
    }
    out
}

/// harness/src's files, as `(harness/src/file, source)`.
fn harness_files() -> Vec<(String, String)> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    rust_files(&src)
        .into_iter()
        .map(|(rel, s)| (format!("harness/src/{rel}"), s))
        .collect()
}

#[test]
fn only_the_dispatcher_feeds_the_event_stream_and_the_reporters() {
    let files = harness_files();
    assert!(
        files
            .iter()
            .any(|(f, _)| f == "harness/src/lua/vm/lifecycle.rs"),
        "the walk found harness/src"
    );
    let found: Vec<(String, String)> = event_path_uses(&files)
        .into_iter()
        .filter(|(f, _)| !EVENT_PATH_ENDS.iter().any(|(p, _)| p == f))
        .collect();
    assert!(
        found.is_empty(),
        "the event stream or a reporter is fed from outside the dispatcher (send a \
         crate::events::Lifecycle through the file's EventSender; the dispatcher \
         writes the stream and calls the reporters):\n  {}",
        listed(&found)
    );
    // Every exception is still needed.
    let used = event_path_uses(&files);
    for (place, why) in EVENT_PATH_ENDS {
        assert!(
            used.iter().any(|(f, _)| f == place),
            "{place} no longer touches the stream or a reporter; drop its exception ({why})"
        );
    }
    // The producers below the dispatcher do send lifecycle events (the
    // check above is not passing for want of any).
    for producer in [
        "harness/src/scheduler/executor.rs",
        "harness/src/lua/vm/lifecycle.rs",
        "harness/src/fixture/mod.rs",
    ] {
        let (_, src) = files.iter().find(|(f, _)| f == producer).unwrap();
        assert!(
            code_without_tests(src).0.contains("Lifecycle::"),
            "{producer} sends no lifecycle event"
        );
    }
}

#[test]
fn the_event_path_check_sees_each_writer_and_spares_comments_and_tests() {
    let files = |src: &str| vec![("harness/src/a.rs".to_string(), src.to_string())];
    for src in [
        "fn f(s: &StreamSender) {}",
        "fn f(env: &FileEnv) { env.events.emit(Event::PoolState(p)); }",
        "fn f(b: &EventBus) { b.sender().emit_at(0, e); }",
        "fn f() { let w = EventStreamWriter::new(vec![], c); }",
        "fn f() { let fr = EventFrame { ts: 0, event: e }; }",
        "fn f(tx: Tx) { EventSender::to(move |s| tx.send(s)); }",
        "fn f(r: &mut dyn Reporter) { r.report(&RunEvent::RunStarted { file_count: 0 }); }",
    ] {
        assert_eq!(event_path_uses(&files(src)).len(), 1, "{src}");
    }
    for src in [
        "// the dispatcher calls .report(&e) and StreamSender::emit\nfn f() {}",
        "fn f() { let s = \".emit(\"; }",
        "fn f(o: &FileOutcome) { let r = o.report(); }",
        "fn f(env: &FileEnv) { env.events.send(Lifecycle::FileStarted { path }); }",
        "#[cfg(test)]\nmod tests { fn t(r: &mut R) { r.report(&e); } }",
    ] {
        assert_eq!(event_path_uses(&files(src)), [], "{src}");
    }
}

// ---- module import graph: no circles ----
//
// Inside harness/ and agent/, a module may use another only if that one does
// not (directly or through others) use it back: the graph of `crate::a::b`
// and `super::x` references between modules is a DAG. A reference counts by
// its longest prefix that is a module; a module's parent or child is not a
// separate node for it (`lua::vm` declaring `lua::vm::opts` is no cycle).
// Comments, string and char literals, and `#[cfg(test)]` items (test modules
// and the files they declare) are not code here, as in /work/cycles.py.

/// Strongly connected groups of modules that are still circles, each with
/// why it is one. This list only shrinks: every entry must match a cycle
/// that exists (a stale one fails), and every cycle must be listed.
/// harness/ and agent/ have none: lua/'s circles (every userdata held a
/// `Vm`) went with the per-VM context (`lua::vm_ctx`), and the others with
/// earlier work. The other crates have none either (checked since issue
/// 27): netsetup's switch had `delay`, `forward` and `topology` in a
/// circle, broken by giving one port's delay queue its own leaf module
/// (`switch::port_delay`, which the port table holds and `delay` drives)
/// and the clock conversion its home in `clock`; the vmm virtio devices'
/// `device.rs` and `persist.rs` no longer form circles (issue 24): each
/// device's worker-side half is its own file (`active.rs`, vsock's
/// `muxer.rs`), which both use and which uses neither.
const KNOWN_CYCLES: &[(&str, &[&str])] = &[];

/// Source with comments, string/char literal contents and `#[cfg(test)]`
/// items removed; and the names of the file modules those items declared
/// (`#[cfg(test)] mod test_utils;`), which are test code too.
fn code_without_tests(src: &str) -> (String, Vec<String>) {
    let plain = strip_comments_and_literals(src);
    let chars: Vec<char> = plain.chars().collect();
    let mut out = String::new();
    let mut test_mods = Vec::new();
    let marker: Vec<char> = "#[cfg(test)]".chars().collect();
    let mut i = 0;
    while i < chars.len() {
        if chars[i..].starts_with(&marker) {
            i += marker.len();
            // Skip the item: up to its `;` or its balanced `{ ... }`.
            let start = i;
            while i < chars.len() && chars[i] != ';' && chars[i] != '{' {
                i += 1;
            }
            let head: String = chars[start..i.min(chars.len())].iter().collect();
            if i < chars.len() && chars[i] == ';' {
                let words: Vec<&str> = head.split_whitespace().collect();
                if let Some(p) = words.iter().position(|w| *w == "mod") {
                    if let Some(name) = words.get(p + 1) {
                        test_mods.push(name.to_string());
                    }
                }
                i += 1;
            } else {
                let mut depth = 0usize;
                while i < chars.len() {
                    match chars[i] {
                        '{' => depth += 1,
                        '}' => {
                            depth -= 1;
                            if depth == 0 {
                                i += 1;
                                break;
                            }
                        }
                        _ => {}
                    }
                    i += 1;
                }
            }
            continue;
        }
        out.push(chars[i]);
        i += 1;
    }
    (out, test_mods)
}

/// `src` with `//` and `/* */` comments gone and every string, raw string
/// and char literal emptied (their text may hold braces or `crate::`).
fn strip_comments_and_literals(src: &str) -> String {
    let c: Vec<char> = src.chars().collect();
    let mut out = String::with_capacity(src.len());
    let mut i = 0;
    let at = |i: usize| c.get(i).copied().unwrap_or('\0');
    while i < c.len() {
        let ch = c[i];
        if ch == '/' && at(i + 1) == '/' {
            while i < c.len() && c[i] != '\n' {
                i += 1;
            }
        } else if ch == '/' && at(i + 1) == '*' {
            i += 2;
            while i < c.len() && !(c[i] == '*' && at(i + 1) == '/') {
                i += 1;
            }
            i += 2;
        } else if ch == 'r'
            && (at(i + 1) == '"' || (at(i + 1) == '#' && matches!(at(i + 2), '"' | '#')))
            && !at(i.wrapping_sub(1)).is_alphanumeric()
        {
            // r"..." or r#"..."#: ends at a quote followed by as many #.
            let mut j = i + 1;
            let mut hashes = 0;
            while at(j) == '#' {
                hashes += 1;
                j += 1;
            }
            j += 1;
            while j < c.len() && !(c[j] == '"' && (1..=hashes).all(|k| at(j + k) == '#')) {
                j += 1;
            }
            out.push_str("\"\"");
            i = j + 1 + hashes;
        } else if ch == '"' {
            i += 1;
            while i < c.len() && c[i] != '"' {
                i += if c[i] == '\\' { 2 } else { 1 };
            }
            out.push_str("\"\"");
            i += 1;
        } else if ch == '\'' && (at(i + 1) == '\\' || at(i + 2) == '\'') {
            // A char literal ('x', '\n', '\u{..}'); a lifetime has no closing quote.
            i += 1;
            while i < c.len() && c[i] != '\'' {
                i += if c[i] == '\\' { 2 } else { 1 };
            }
            out.push_str("' '");
            i += 1;
        } else {
            out.push(ch);
            i += 1;
        }
    }
    out
}

/// The module a file under a crate's src/ is (`lua/vm/mod.rs` is
/// `lua::vm`; `main.rs` and `lib.rs` are the root, "").
fn module_of(rel: &str) -> String {
    let path = rel.trim_end_matches(".rs");
    let mut parts: Vec<&str> = path.split('/').collect();
    if matches!(parts.last(), Some(&"mod")) {
        parts.pop();
    }
    if parts.len() == 1 && matches!(parts[0], "main" | "lib") {
        return String::new();
    }
    parts.join("::")
}

/// Every full path a use tree at `s[*i..]` names, below `prefix`
/// (`{a, b::{c, self}}` names `a`, `b::c` and `b`).
fn use_tree(s: &[char], i: &mut usize, prefix: Vec<String>, out: &mut Vec<Vec<String>>) {
    let mut path = prefix;
    loop {
        while *i < s.len() && s[*i].is_whitespace() {
            *i += 1;
        }
        if *i < s.len() && s[*i] == '{' {
            *i += 1;
            loop {
                while *i < s.len() && (s[*i].is_whitespace() || s[*i] == ',') {
                    *i += 1;
                }
                if *i >= s.len() || s[*i] == '}' {
                    *i += 1;
                    return;
                }
                let before = *i;
                use_tree(s, i, path.clone(), out);
                // Skip what a tree item may end with (`as name`).
                while *i < s.len() && !matches!(s[*i], ',' | '}') {
                    *i += 1;
                }
                if *i == before {
                    *i += 1;
                }
            }
        }
        let start = *i;
        while *i < s.len() && (s[*i].is_alphanumeric() || s[*i] == '_') {
            *i += 1;
        }
        let ident: String = s[start..*i].iter().collect();
        if ident.is_empty() || ident == "self" {
            out.push(path);
            return;
        }
        path.push(ident);
        if s.get(*i) == Some(&':') && s.get(*i + 1) == Some(&':') {
            *i += 2;
        } else {
            out.push(path);
            return;
        }
    }
}

/// The module-level import edges of one crate's files (`(rel path, src)`):
/// each `(from, to)` with neither the other's ancestor.
fn import_edges(files: &[(String, String)]) -> BTreeSet<(String, String)> {
    let mut code = BTreeMap::new();
    let mut test_only: Vec<String> = Vec::new();
    for (rel, src) in files {
        let m = module_of(rel);
        let (c, test_mods) = code_without_tests(src);
        for t in test_mods {
            test_only.push(if m.is_empty() { t } else { format!("{m}::{t}") });
        }
        code.insert(m, c);
    }
    let is_test = |m: &str| {
        test_only
            .iter()
            .any(|t| m == t || m.starts_with(&format!("{t}::")))
    };
    code.retain(|m, _| !is_test(m));
    let modules: BTreeSet<String> = code.keys().cloned().collect();
    let related = |a: &str, b: &str| {
        a == b
            || a.is_empty()
            || b.is_empty()
            || a.starts_with(&format!("{b}::"))
            || b.starts_with(&format!("{a}::"))
    };
    let mut edges = BTreeSet::new();
    for (m, c) in &code {
        let s: Vec<char> = c.chars().collect();
        let mut paths = Vec::new();
        let mut i = 0;
        while i < s.len() {
            let boundary =
                i == 0 || !(s[i - 1].is_alphanumeric() || s[i - 1] == '_' || s[i - 1] == ':');
            let rest = |w: &str| s[i..].starts_with(&w.chars().collect::<Vec<_>>());
            if boundary && rest("crate::") {
                i += "crate::".len();
                use_tree(&s, &mut i, Vec::new(), &mut paths);
            } else if boundary && rest("super::") {
                let mut base: Vec<String> = if m.is_empty() {
                    Vec::new()
                } else {
                    m.split("::").map(String::from).collect()
                };
                while s[i..].starts_with(&"super::".chars().collect::<Vec<_>>()) {
                    base.pop();
                    i += "super::".len();
                }
                use_tree(&s, &mut i, base, &mut paths);
            } else {
                i += 1;
            }
        }
        for p in paths {
            let target = (1..=p.len())
                .rev()
                .map(|k| p[..k].join("::"))
                .find(|cand| modules.contains(cand));
            if let Some(t) = target {
                if !related(m, &t) {
                    edges.insert((m.clone(), t));
                }
            }
        }
    }
    edges
}

/// The strongly connected groups of more than one module, each sorted, with
/// one circle through it (`a -> b -> a`).
fn cycles(edges: &BTreeSet<(String, String)>) -> Vec<(Vec<String>, String)> {
    let mut succ: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for (a, b) in edges {
        succ.entry(a).or_default().push(b);
        succ.entry(b).or_default();
    }
    let reach = |from: &str| {
        let mut seen = BTreeSet::from([from.to_string()]);
        let mut stack = vec![from];
        while let Some(n) = stack.pop() {
            for s in &succ[n] {
                if seen.insert(s.to_string()) {
                    stack.push(s);
                }
            }
        }
        seen
    };
    let reachable: BTreeMap<&str, BTreeSet<String>> = succ.keys().map(|n| (*n, reach(n))).collect();
    let mut done = BTreeSet::new();
    let mut out = Vec::new();
    for n in succ.keys() {
        if done.contains(*n) {
            continue;
        }
        let group: Vec<String> = reachable[n]
            .iter()
            .filter(|m| reachable[m.as_str()].contains(*n))
            .cloned()
            .collect();
        done.extend(group.iter().cloned());
        if group.len() < 2 {
            continue;
        }
        // A circle: shortest path from n back to n inside the group.
        let mut prev: BTreeMap<&str, &str> = BTreeMap::new();
        let mut queue = std::collections::VecDeque::from([*n]);
        let mut back = None;
        while let Some(x) = queue.pop_front() {
            for y in &succ[x] {
                if !group.iter().any(|g| g == y) {
                    continue;
                }
                if y == n {
                    back = Some(x);
                    break;
                }
                if !prev.contains_key(y) {
                    prev.insert(y, x);
                    queue.push_back(y);
                }
            }
            if back.is_some() {
                break;
            }
        }
        let mut path = vec![n.to_string()];
        let mut x = back.expect("a group of two or more has a circle through each member");
        while x != *n {
            path.push(x.to_string());
            x = prev[x];
        }
        path.push(n.to_string());
        path.reverse();
        out.push((group, path.join(" -> ")));
    }
    out
}

/// The circles of `krate`'s src/ that `known` (as [`KNOWN_CYCLES`]) does
/// not list, and the listed ones that no longer exist.
fn unexpected_cycles(
    krate: &str,
    files: &[(String, String)],
    known: &[(&str, &[&str])],
) -> Vec<String> {
    let found = cycles(&import_edges(files));
    let known: Vec<BTreeSet<&str>> = known
        .iter()
        .filter(|(k, _)| *k == krate)
        .map(|(_, g)| g.iter().copied().collect())
        .collect();
    let mut problems = Vec::new();
    for (group, circle) in &found {
        let g: BTreeSet<&str> = group.iter().map(String::as_str).collect();
        if known.contains(&g) {
            eprintln!("{krate}: known import circle (KNOWN_CYCLES): {circle}");
        } else {
            problems.push(format!(
                "{krate}: import circle {circle} (group: {})",
                group.join(", ")
            ));
        }
    }
    for k in &known {
        if !found
            .iter()
            .any(|(g, _)| g.iter().map(String::as_str).collect::<BTreeSet<_>>() == *k)
        {
            problems.push(format!(
                "{krate}: KNOWN_CYCLES lists {k:?}, which is no longer a circle: remove it"
            ));
        }
    }
    problems
}

/// Every workspace crate's src/, by its folder name (`root`: harness/).
fn every_crate_src(root: &Path) -> Vec<(&'static str, std::path::PathBuf)> {
    [
        "harness", "agent", "protocol", "snapshot", "netsetup", "vmm",
    ]
    .into_iter()
    .map(|k| (k, root.join("..").join(k).join("src")))
    .collect()
}

#[test]
fn every_crates_modules_import_no_circle() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut problems = Vec::new();
    for (krate, src) in every_crate_src(root) {
        let files = rust_files(&src);
        assert!(files.len() > 5, "the walk found {}", src.display());
        problems.extend(unexpected_cycles(krate, &files, KNOWN_CYCLES));
    }
    assert!(
        problems.is_empty(),
        "modules import each other (move what both need into a module both use):\n  {}",
        problems.join("\n  ")
    );
}

/// `edges` with every module collapsed to its first `depth` path segments
/// (`lua::vm::opts` is `lua` at depth 1), edges inside one collapsed module
/// dropped.
fn collapsed(edges: &BTreeSet<(String, String)>, depth: usize) -> BTreeSet<(String, String)> {
    let top = |m: &str| m.split("::").take(depth).collect::<Vec<_>>().join("::");
    edges
        .iter()
        .map(|(a, b)| (top(a), top(b)))
        .filter(|(a, b)| a != b)
        .collect()
}

#[test]
fn every_crates_top_level_modules_import_no_circle() {
    // A child may not hide a circle between two top-level modules: runner
    // importing fixture::x while fixture imports runner is a circle of
    // fixture and runner, though no single file of either is in one. In
    // vmm, `vstate/` and `devices/` both stand on the ground floor (`bus`,
    // `guest_memory`, `msi`) and import nothing of each other.
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    for (krate, src) in every_crate_src(root) {
        let edges = import_edges(&rust_files(&src));
        assert!(!edges.is_empty(), "the walk sees {krate}'s imports");
        let found = cycles(&collapsed(&edges, 1));
        assert!(
            found.is_empty(),
            "{krate}: top-level modules import each other (move what both need into a module both use): {found:?}"
        );
    }
}

#[test]
fn vmm_state_and_device_models_import_nothing_of_each_other() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../vmm/src");
    let edges = collapsed(&import_edges(&rust_files(&src)), 1);
    assert!(
        edges.contains(&("vstate".to_string(), "bus".to_string())),
        "the walk sees vmm's imports: {edges:?}"
    );
    let between: Vec<_> = edges
        .iter()
        .filter(|(a, b)| (a == "vstate" && b == "devices") || (a == "devices" && b == "vstate"))
        .collect();
    assert!(
        between.is_empty(),
        "vmm's vstate/ and devices/ import each other: {between:?} (put what both name in a ground-floor module: bus, guest_memory, msi)"
    );
}

#[test]
fn the_lua_layer_imports_no_circle_at_any_depth() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let files: Vec<(String, String)> = rust_files(&src)
        .into_iter()
        .filter(|(rel, _)| rel.starts_with("lua/"))
        .collect();
    let edges = import_edges(&files);
    assert!(
        edges.contains(&("lua::vm".to_string(), "lua::vm_ctx".to_string())),
        "the walk sees lua/'s imports: {edges:?}"
    );
    // Collapsed to lua/'s direct children too (lua::vm::opts is lua::vm):
    // a child module may not hide a circle through its parent's siblings.
    let collapsed = collapsed(&edges, 2);
    for e in [&edges, &collapsed] {
        let found = cycles(e);
        assert!(found.is_empty(), "lua/ has import circles: {found:?}");
    }
}

#[test]
fn the_circle_check_sees_each_way_of_importing() {
    let groups = |f: &[(String, String)]| -> Vec<Vec<String>> {
        cycles(&import_edges(f))
            .into_iter()
            .map(|(g, _)| g)
            .collect()
    };
    // A circle of three, through a grouped `use`, a `super::` path and an
    // inline path; printed as a path.
    let three = files(&[
        ("lib.rs", "mod a; mod b; mod c;"),
        ("a.rs", "use crate::{b::B, x};"),
        ("b.rs", "fn f() { super::c::g(); }"),
        ("c/mod.rs", "use crate::a::A;"),
    ]);
    let found = cycles(&import_edges(&three));
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(found[0].0, ["a", "b", "c"]);
    assert_eq!(found[0].1, "a -> b -> c -> a");
    // A parent using its child (and back) is no circle; nor are comments,
    // strings, or test modules.
    let fine = files(&[
        ("lua/mod.rs", "pub mod vm; use self::vm::Vm; // crate::x uses crate::lua"),
        ("lua/vm/mod.rs", "use super::err; use crate::lua::Lab;"),
        ("x.rs", "const S: &str = \"crate::lua::vm {\"; fn f() -> char { '{' }"),
        (
            "y.rs",
            "use crate::x::S;\n#[cfg(test)]\nmod tests { use crate::lua::vm::Vm; fn f() { let _ = \"}\"; } }",
        ),
        ("lua/vm/probe.rs", "use crate::y::Y;"),
        ("lua/vm/helper.rs", "use crate::lua::vm::probe::P;"),
        ("x2.rs", "/* use crate::y; */ use crate::lua::vm::probe;"),
    ]);
    assert_eq!(groups(&fine), Vec::<Vec<String>>::new());
    // A file module declared under #[cfg(test)] is test code: its imports
    // are not edges.
    let test_utils = files(&[
        (
            "a.rs",
            "#[cfg(test)]\npub(crate) mod test_utils;\nfn f() {}",
        ),
        ("a/test_utils.rs", "use crate::b::B;"),
        ("b.rs", "use crate::a::A;"),
    ]);
    assert_eq!(
        import_edges(&test_utils),
        BTreeSet::from([("b".to_string(), "a".to_string())])
    );
    // ... while the same module declared for every build is a node, and a
    // circle through it is found at its own level.
    let real = files(&[
        ("a.rs", "pub(crate) mod helpers;\nfn f() {}"),
        ("a/helpers.rs", "use crate::b::B;"),
        ("b.rs", "use crate::a::helpers::T;"),
    ]);
    assert_eq!(groups(&real), [["a::helpers", "b"]]);
    // `super::super::` climbs two levels (from p::q::r to p).
    let climb = files(&[
        ("p/q/r.rs", "use super::super::s::S;"),
        ("p/s.rs", "use crate::p::q::r::R;"),
    ]);
    assert_eq!(groups(&climb), [["p::q::r", "p::s"]]);
}

#[test]
fn a_known_circle_is_printed_and_a_gone_one_must_leave_the_list() {
    let two = [
        ("a.rs".to_string(), "use crate::b::B;".to_string()),
        ("b.rs".to_string(), "use crate::a::A;".to_string()),
    ];
    let listed: &[(&str, &[&str])] = &[("harness", &["a", "b"])];
    assert_eq!(
        unexpected_cycles("harness", &two, listed),
        Vec::<String>::new()
    );
    let problems = unexpected_cycles("harness", &two, &[]);
    assert_eq!(
        problems,
        ["harness: import circle a -> b -> a (group: a, b)"],
        "an unlisted circle is reported with its path"
    );
    let problems = unexpected_cycles("harness", &two[..1], listed);
    assert!(
        problems
            .iter()
            .any(|p| p.contains("no longer a circle: remove it")),
        "{problems:?}"
    );
    // Only the named crate's entries apply.
    assert_eq!(unexpected_cycles("agent", &two, listed).len(), 1);
}
