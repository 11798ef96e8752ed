//! The fixture cache end to end on the local backend (root, as in CI):
//! vm/lab fixtures, every row of the reference's "What can invalidate the
//! cache" table, concurrent builders, a killed builder, a corrupt entry,
//! LRU eviction at startup, and the `provium fixture` CLI.
//!
//! Fixtures append their name to `$PROVIUM_TEST_BUILD_LOG` on the host when
//! their chunk runs, so each test counts exactly which fixtures were built.
mod common;

use common::{ensure_agent, read_events};

use std::path::PathBuf;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use provium_protocol::Event;

const LOG_LINE: &str = r#"do local f = assert(io.open(os.getenv("PROVIUM_TEST_BUILD_LOG"), "a")); f:write(NAME .. "\n"); f:close() end"#;

fn logged(name: &str) -> String {
    LOG_LINE.replace("NAME", &format!("{name:?}"))
}

struct Project {
    dir: tempfile::TempDir,
}

impl Project {
    fn new() -> Project {
        ensure_agent();
        let p = Project {
            dir: tempfile::tempdir().unwrap(),
        };
        p.write(
            "provium.toml",
            "[provium]\nroots = [\".\"]\ncache_dir = \"cache\"\n\n[profiles.linux]\nkernel = \"k/bzImage\"\ninitrd = \"k/initrd\"\ncmdline = \"q\"\n",
        );
        p.write("k/bzImage", "kernel v1");
        p.write("k/initrd", "initrd v1");
        p.write("data/payload.txt", "payload v1");
        p.write("data/dep.txt", "dep v1");
        p.write("data/untracked.txt", "untracked v1");
        p.write("helpers/h.lua", "return { tag = \"v1\" }\n");
        p.write(
            "fixtures/base.fixture.lua",
            &format!(
                "local h = require(\"helpers.h\")\n{}\nlocal vm = provium:vm(\"base\", \"linux\"):boot()\nvm:write_file(\"/srv/tag\", h.tag)\nvm:push_file(\"../data/payload.txt\", \"/srv/payload\")\nvm:push_file(\"../data/untracked.txt\", \"/srv/untracked\", {{auto_dep = false}})\nreturn vm:snapshot()\n",
                logged("base")
            ),
        );
        p.write(
            "fixtures/derived.fixture.lua",
            &format!(
                "{}\nlocal vm = provium:vm_fixture(\"fixtures/base\")\nvm:write_file(\"/srv/derived\", \"yes\")\nreturn vm:snapshot()\n",
                logged("derived")
            ),
        );
        p.write(
            "fixtures/other.fixture.lua",
            &format!(
                "{}\nprovium:depends_on_file(\"../data/dep.txt\")\nlocal vm = provium:vm(\"other\", \"linux\"):boot()\nvm:write_file(\"/srv/other\", \"o\")\nreturn vm:snapshot()\n",
                logged("other")
            ),
        );
        p.write(
            "fixtures/cluster.fixture.lua",
            &format!(
                "{}\nprovium:vm(\"a\", \"linux\"):boot():write_file(\"/srv/who\", \"a\")\nprovium:lab(\"dc\"):vm(\"b\", \"linux\"):boot():write_file(\"/srv/who\", \"b\")\nreturn provium:snapshot()\n",
                logged("cluster")
            ),
        );
        p.write(
            "uses.test.lua",
            r#"
test("vm fixture", function(t)
  local vm = provium:vm_fixture("fixtures/base")
  t:assert_eq(vm:name(), "base")
  t:assert_eq(vm:state(), "booted")
  t:assert_eq(vm:read_file("/srv/tag"), "v1")
  t:assert_eq(vm:read_file("/srv/payload"), "payload v1")
end)
test("stacked fixture, function form", function(t)
  local vm = provium.vm_fixture("fixtures/derived")
  t:assert_eq(vm:read_file("/srv/derived"), "yes")
  t:assert_eq(vm:read_file("/srv/tag"), "v1")
end)
test("lab fixture", function(t)
  local c = provium:lab_fixture("fixtures/cluster")
  t:assert_eq(c.a:read_file("/srv/who"), "a")
  t:assert_eq(c.dc.b:read_file("/srv/who"), "b")
end)
test("independent fixture", function(t)
  t:assert_eq(provium:vm_fixture("fixtures/other"):read_file("/srv/other"), "o")
end)
"#,
        );
        p
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    fn write(&self, rel: &str, content: &str) {
        let p = self.path(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, content).unwrap();
    }

    /// Rewrite a file with a different mtime (and content).
    fn edit(&self, rel: &str, content: &str) {
        std::thread::sleep(Duration::from_millis(20));
        self.write(rel, content);
    }

    /// Rewrite a file with other bytes of the same length, then set its
    /// mtime back: only its content (and ctime) differ.
    fn rewrite_keeping_mtime(&self, rel: &str, content: &str) {
        let p = self.path(rel);
        let meta = std::fs::metadata(&p).unwrap();
        assert_eq!(meta.len(), content.len() as u64, "same size");
        self.write(rel, content);
        std::fs::File::options()
            .write(true)
            .open(&p)
            .unwrap()
            .set_modified(meta.modified().unwrap())
            .unwrap();
        assert_eq!(
            std::fs::metadata(&p).unwrap().modified().unwrap(),
            meta.modified().unwrap()
        );
    }

    fn log(&self) -> PathBuf {
        self.path("build.log")
    }

    fn command(&self, args: &[&str]) -> Command {
        let mut c = Command::new(env!("CARGO_BIN_EXE_provium"));
        c.args(["--vmm", "local", "--config", "provium.toml"])
            .args(args)
            .current_dir(self.dir.path())
            .env("PROVIUM_TEST_BUILD_LOG", self.log());
        c
    }

    fn run(&self, args: &[&str]) -> Output {
        self.command(args).output().unwrap()
    }

    fn text(o: &Output) -> String {
        format!(
            "{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        )
    }

    /// Run the tests; they must pass. Returns the fixtures built, sorted,
    /// and clears the log.
    fn run_tests(&self, file: &str) -> Vec<String> {
        let o = self.run(&[file]);
        assert!(o.status.success(), "{}", Self::text(&o));
        self.take_builds()
    }

    fn take_builds(&self) -> Vec<String> {
        let text = std::fs::read_to_string(self.log()).unwrap_or_default();
        let _ = std::fs::remove_file(self.log());
        let mut v: Vec<String> = text.lines().map(str::to_string).collect();
        v.sort();
        v
    }
}

const ALL: [&str; 4] = ["base", "cluster", "derived", "other"];

#[test]
fn fixtures_build_once_then_restore_from_the_cache() {
    let p = Project::new();
    let ev = p.path("events.bin");
    let o = p.run(&["--save-events", ev.to_str().unwrap(), "uses.test.lua"]);
    assert!(o.status.success(), "{}", Project::text(&o));
    assert_eq!(p.take_builds(), ALL);
    let events = read_events(&ev);
    let started = events
        .iter()
        .filter(|e| matches!(e.event, Event::FixtureBuildStarted(_)))
        .count();
    let done: Vec<u64> = events
        .iter()
        .filter_map(|e| match &e.event {
            Event::FixtureBuildDone(d) => Some(d.snapshot_bytes),
            _ => None,
        })
        .collect();
    assert_eq!(started, 4);
    assert_eq!(done.len(), 4);
    assert!(done.iter().all(|b| *b > 0), "{done:?}");

    let o = p.run(&["--save-events", ev.to_str().unwrap(), "uses.test.lua"]);
    assert!(o.status.success(), "{}", Project::text(&o));
    assert_eq!(p.take_builds(), Vec::<String>::new());
    let hits: Vec<String> = read_events(&ev)
        .into_iter()
        .filter_map(|e| match e.event {
            Event::FixtureCacheHit(h) => Some(h.path),
            Event::FixtureBuildStarted(_) => panic!("nothing should build on a warm cache"),
            _ => None,
        })
        .collect();
    assert_eq!(
        hits,
        [
            "fixtures/base",
            "fixtures/derived",
            "fixtures/cluster",
            "fixtures/other"
        ]
    );
    // The cache holds the reference's layout.
    let names: Vec<String> = std::fs::read_dir(p.path("cache"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(
        names.iter().filter(|n| n.ends_with(".snap")).count(),
        3,
        "{names:?}"
    );
    assert_eq!(
        names.iter().filter(|n| n.ends_with(".lab")).count(),
        1,
        "{names:?}"
    );
    let lab = names.iter().find(|n| n.ends_with(".lab")).unwrap();
    assert!(p.path("cache").join(lab).join("lab.json").is_file());
}

#[test]
fn every_invalidation_row_of_the_reference_holds() {
    let p = Project::new();
    assert_eq!(p.run_tests("uses.test.lua"), ALL);

    // Edit <fixture>.fixture.lua: that fixture only.
    let src = std::fs::read_to_string(p.path("fixtures/other.fixture.lua")).unwrap();
    p.edit("fixtures/other.fixture.lua", &format!("{src}-- edited\n"));
    assert_eq!(p.run_tests("uses.test.lua"), ["other"]);

    // Edit a helper the fixture requires: it and every fixture referencing it.
    p.edit("helpers/h.lua", "return { tag = \"v1\" } -- edited\n");
    assert_eq!(p.run_tests("uses.test.lua"), ["base", "derived"]);

    // Edit a fixture another fixture references: both.
    let src = std::fs::read_to_string(p.path("fixtures/base.fixture.lua")).unwrap();
    p.edit("fixtures/base.fixture.lua", &format!("{src}-- edited\n"));
    assert_eq!(p.run_tests("uses.test.lua"), ["base", "derived"]);

    // New kernel or initrd image (any profile): every fixture.
    p.edit("k/bzImage", "kernel v2");
    assert_eq!(p.run_tests("uses.test.lua"), ALL);
    p.edit("k/initrd", "initrd v2!");
    assert_eq!(p.run_tests("uses.test.lua"), ALL);

    // Change [profiles.<name>].kernel or .initrd path: every fixture.
    p.write("k/bzImage2", "kernel v2");
    let toml = std::fs::read_to_string(p.path("provium.toml")).unwrap();
    p.edit("provium.toml", &toml.replace("k/bzImage\"", "k/bzImage2\""));
    assert_eq!(p.run_tests("uses.test.lua"), ALL);

    // Adding a profile: every fixture (by design).
    let toml = std::fs::read_to_string(p.path("provium.toml")).unwrap();
    p.edit(
        "provium.toml",
        &format!("{toml}\n[profiles.extra]\nkernel = \"k/other\"\ncmdline = \"q\"\n"),
    );
    assert_eq!(p.run_tests("uses.test.lua"), ALL);

    // Edit a push_file host file: the fixture and every fixture referencing it.
    // Keys identify host files by their bytes (docs/ci.md), where the
    // reference says path, mtime and size: the same bytes under a new mtime
    // are no edit, and restore ...
    p.edit("data/payload.txt", "payload v1"); // same bytes, new mtime
    let ev = p.path("events.bin");
    let o = p.run(&["--save-events", ev.to_str().unwrap(), "uses.test.lua"]);
    assert!(o.status.success(), "{}", Project::text(&o));
    assert_eq!(builds_and_hits(&ev).0, Vec::<String>::new());
    assert_eq!(p.take_builds(), Vec::<String>::new());
    // ... while other bytes of the same size under the same mtime rebuild.
    p.rewrite_keeping_mtime("data/payload.txt", "payload v2");
    p.write(
        "payload.test.lua",
        "test(\"new payload\", function(t)\n  t:assert_eq(provium:vm_fixture(\"fixtures/derived\"):read_file(\"/srv/payload\"), \"payload v2\")\nend)\n",
    );
    assert_eq!(p.run_tests("payload.test.lua"), ["base", "derived"]);
    // Back to the old bytes: the entries built from them are valid again.
    p.rewrite_keeping_mtime("data/payload.txt", "payload v1");
    assert_eq!(p.run_tests("uses.test.lua"), Vec::<String>::new());
    // ... and a depends_on_file one.
    p.edit("data/dep.txt", "dep v2");
    assert_eq!(p.run_tests("uses.test.lua"), ["other"]);
    // auto_dep = false opts out.
    p.edit("data/untracked.txt", "untracked v2");
    assert_eq!(p.run_tests("uses.test.lua"), Vec::<String>::new());

    // Editing the test file that uses fixtures invalidates nothing.
    let src = std::fs::read_to_string(p.path("uses.test.lua")).unwrap();
    p.edit("uses.test.lua", &format!("{src}-- edited\n"));
    assert_eq!(p.run_tests("uses.test.lua"), Vec::<String>::new());

    // `provium fixture rebuild` / `clean`: per command.
    let o = p.run(&["fixture", "rebuild", "fixtures/other"]);
    assert!(o.status.success(), "{}", Project::text(&o));
    assert_eq!(
        String::from_utf8_lossy(&o.stdout),
        "rebuilt: fixtures/other\n"
    );
    assert_eq!(p.take_builds(), ["other"]);
    assert_eq!(p.run_tests("uses.test.lua"), Vec::<String>::new());
    let o = p.run(&["fixture", "clean"]);
    assert!(o.status.success(), "{}", Project::text(&o));
    assert!(!p.path("cache").exists());
    assert_eq!(p.run_tests("uses.test.lua"), ALL);
}

#[test]
fn the_fixture_cli_lists_builds_and_reports_stale_entries() {
    let p = Project::new();
    let o = p.run(&["fixture", "stale"]);
    assert!(o.status.success(), "{}", Project::text(&o));
    assert_eq!(
        String::from_utf8_lossy(&o.stdout),
        "  fixtures/base.fixture.lua\n  fixtures/cluster.fixture.lua\n  fixtures/derived.fixture.lua\n  fixtures/other.fixture.lua\n\n4 stale fixture(s)\n"
    );
    let o = p.run(&["fixture", "build", "fixtures/base"]);
    assert_eq!(
        String::from_utf8_lossy(&o.stdout),
        "built: fixtures/base\n",
        "{}",
        Project::text(&o)
    );
    let o = p.run(&["fixture", "build", "fixtures/base"]);
    assert_eq!(
        String::from_utf8_lossy(&o.stdout),
        "already built: fixtures/base\n"
    );
    let o = p.run(&["fixture", "build", "fixtures/cluster"]);
    assert!(o.status.success(), "{}", Project::text(&o));
    assert_eq!(p.take_builds(), ["base", "cluster"]);
    let o = p.run(&["fixture", "stale"]);
    assert_eq!(
        String::from_utf8_lossy(&o.stdout),
        "  fixtures/derived.fixture.lua\n  fixtures/other.fixture.lua\n\n2 stale fixture(s)\n"
    );
    let o = p.run(&["fixture", "list"]);
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 4, "{out}");
    let kinds: Vec<&str> = lines[..2]
        .iter()
        .map(|l| l.split_whitespace().nth(1).unwrap())
        .collect();
    let mut sorted = kinds.clone();
    sorted.sort();
    assert_eq!(sorted, ["lab", "vm"], "{out}");
    for l in &lines[..2] {
        assert!(l.starts_with(' ') && l.contains("MiB  "), "{out}");
        assert_eq!(l.split_whitespace().nth(2).unwrap().len(), 64, "{out}");
    }
    assert_eq!(lines[2], "");
    assert!(
        lines[3].starts_with("2 entries, ") && lines[3].ends_with("MiB"),
        "{out}"
    );
    let e = p.run(&["fixture", "build", "fixtures/nope"]);
    assert!(!e.status.success());
    assert!(Project::text(&e).contains("fixture `fixtures/nope` not found in any test root"));
}

/// The fixtures a run's saved events announce as cache hits, in order.
fn cache_hits(events: &std::path::Path) -> Vec<String> {
    read_events(events)
        .into_iter()
        .filter_map(|e| match e.event {
            Event::FixtureCacheHit(h) => Some(h.path),
            _ => None,
        })
        .collect()
}

#[test]
fn a_corrupt_entry_is_warned_evicted_and_rebuilt() {
    let p = Project::new();
    assert_eq!(p.run_tests("uses.test.lua"), ALL);
    // Corrupt every single-VM entry in place (same length, flipped bytes).
    for e in std::fs::read_dir(p.path("cache")).unwrap().flatten() {
        let path = e.path();
        if path.extension().is_some_and(|x| x == "snap") {
            let mut b = std::fs::read(&path).unwrap();
            let n = b.len();
            b[n - 1] ^= 0xff;
            b[n / 2] ^= 0xff;
            std::fs::write(&path, b).unwrap();
        }
    }
    let ev = p.path("events.bin");
    let o = p.run(&["--save-events", ev.to_str().unwrap(), "uses.test.lua"]);
    let text = Project::text(&o);
    assert!(o.status.success(), "{text}");
    assert!(
        text.contains("provium: warning: fixture `fixtures/base`: cached entry"),
        "{text}"
    );
    assert!(text.contains("evicting it and rebuilding"), "{text}");
    assert_eq!(p.take_builds(), ["base", "derived", "other"]);
    // No cache hit was announced for the corrupt entries.
    let hits = cache_hits(&ev);
    assert!(
        hits.iter()
            .all(|h| h == "fixtures/cluster" || h == "fixtures/base"),
        "{hits:?}"
    );
}

#[test]
fn a_cut_snapshot_or_a_flipped_byte_in_a_lab_member_is_found_before_the_restore_and_rebuilt() {
    let p = Project::new();
    assert_eq!(p.run_tests("uses.test.lua"), ALL);
    let mut cut = 0;
    let mut flipped = 0;
    for e in std::fs::read_dir(p.path("cache")).unwrap().flatten() {
        let path = e.path();
        if path.extension().is_some_and(|x| x == "snap") {
            // Cut, as a full disk or an interrupted copy leaves it.
            let len = std::fs::metadata(&path).unwrap().len();
            std::fs::OpenOptions::new()
                .write(true)
                .open(&path)
                .unwrap()
                .set_len(len * 2 / 3)
                .unwrap();
            cut += 1;
        } else if path.extension().is_some_and(|x| x == "lab") {
            // One byte of one member's last section.
            let member = std::fs::read_dir(&path)
                .unwrap()
                .flatten()
                .map(|m| m.path())
                .find(|m| m.extension().is_some_and(|x| x == "snap"))
                .expect("a lab entry holds its VMs' snapshots");
            let mut b = std::fs::read(&member).unwrap();
            let n = b.len();
            b[n - 1] ^= 0x01;
            std::fs::write(&member, b).unwrap();
            flipped += 1;
        }
    }
    assert_eq!((cut, flipped), (3, 1), "base, derived, other; cluster");
    let ev = p.path("events.bin");
    let o = p.run(&["--save-events", ev.to_str().unwrap(), "uses.test.lua"]);
    let text = Project::text(&o);
    assert!(
        o.status.success(),
        "the tests pass on the rebuilt entries: {text}"
    );
    for name in ["base", "cluster", "other"] {
        assert!(
            text.contains(&format!(
                "provium: warning: fixture `fixtures/{name}`: cached entry"
            )),
            "{name} reported: {text}"
        );
    }
    assert!(text.contains("fails its check"), "{text}");
    assert!(text.contains("is corrupt"), "{text}");
    assert!(text.contains("evicting it and rebuilding"), "{text}");
    assert_eq!(p.take_builds(), ALL);
    // No cache hit for a corrupt entry: each was found before its restore
    // (`derived`'s rebuild restores `base` from its rebuilt entry).
    let hits = cache_hits(&ev);
    assert!(hits.iter().all(|h| h == "fixtures/base"), "{hits:?}");
    // The next run finds them whole and builds nothing.
    assert!(p.run_tests("uses.test.lua").is_empty());
}

#[test]
fn lru_eviction_at_startup_trims_the_cache() {
    let p = Project::new();
    assert_eq!(p.run_tests("uses.test.lua"), ALL);
    let toml = std::fs::read_to_string(p.path("provium.toml")).unwrap();
    p.write(
        "provium.toml",
        &toml.replace(
            "cache_dir = \"cache\"",
            "cache_dir = \"cache\"\ncache_max_size = \"1\"",
        ),
    );
    p.write("empty.test.lua", "test(\"nothing\", function(t) end)\n");
    let o = p.run(&["empty.test.lua"]);
    let text = Project::text(&o);
    assert!(o.status.success(), "{text}");
    assert_eq!(
        text.matches("provium: evicted fixture cache entry").count(),
        4,
        "{text}"
    );
    let o = p.run(&["fixture", "list"]);
    assert!(String::from_utf8_lossy(&o.stdout).ends_with("0 entries, 0.00MiB\n"));
}

fn slow_project() -> Project {
    let p = Project::new();
    p.write(
        "fixtures/slow.fixture.lua",
        &format!(
            "{}\nlocal vm = provium:vm(\"slow\", \"linux\"):boot()\nvm:run(\"sleep 3\")\nvm:write_file(\"/srv/slow\", \"done\")\nreturn vm:snapshot()\n",
            logged("slow")
        ),
    );
    for f in ["a", "b"] {
        p.write(
            &format!("{f}.test.lua"),
            "test(\"slow fixture\", function(t)\n  t:assert_eq(provium:vm_fixture(\"fixtures/slow\"):read_file(\"/srv/slow\"), \"done\")\nend)\n",
        );
    }
    p
}

fn wait_for_log(p: &Project, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !std::fs::read_to_string(p.log())
        .unwrap_or_default()
        .contains(what)
    {
        assert!(
            Instant::now() < deadline,
            "the build of `{what}` never started"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn two_files_building_one_fixture_concurrently_build_it_once() {
    let p = slow_project();
    let ev_a = p.path("a.bin");
    let ev_b = p.path("b.bin");
    let a = p
        .command(&["--save-events", ev_a.to_str().unwrap(), "a.test.lua"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // b starts once a holds the lock and is building.
    wait_for_log(&p, "slow");
    let b = p.run(&["--save-events", ev_b.to_str().unwrap(), "b.test.lua"]);
    let a = a.wait_with_output().unwrap();
    assert!(a.status.success(), "{}", Project::text(&a));
    assert!(b.status.success(), "{}", Project::text(&b));
    assert_eq!(p.take_builds(), ["slow"]);
    let waiting: Vec<(String, String)> = read_events(&ev_b)
        .into_iter()
        .filter_map(|e| match e.event {
            Event::FixtureBuildWaiting(w) => Some((w.path, w.held_by_file)),
            _ => None,
        })
        .collect();
    assert_eq!(
        waiting,
        [("fixtures/slow".to_string(), "a.test.lua".to_string())]
    );
    let b_hit = read_events(&ev_b)
        .into_iter()
        .any(|e| matches!(e.event, Event::FixtureCacheHit(_)));
    assert!(b_hit, "b restored a's build from the cache");
}

#[test]
fn a_killed_builders_lock_is_recovered() {
    let p = slow_project();
    let mut a = p
        .command(&["a.test.lua"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    wait_for_log(&p, "slow");
    a.kill().unwrap();
    a.wait().unwrap();
    let _ = p.take_builds();
    // The dead holder's flock is gone with it: b builds and passes.
    assert_eq!(p.run_tests("b.test.lua"), ["slow"]);
}

/// The fixtures a run built (from its events) and the ones it restored.
fn builds_and_hits(events: &std::path::Path) -> (Vec<String>, Vec<String>) {
    let (mut built, mut hits) = (Vec::new(), Vec::new());
    for e in read_events(events) {
        match e.event {
            Event::FixtureBuildStarted(b) => built.push(b.path),
            Event::FixtureCacheHit(h) => hits.push(h.path),
            _ => {}
        }
    }
    built.sort();
    hits.sort();
    (built, hits)
}

/// `fixture export`'s manifest, as JSON.
fn manifest(p: &Project, dir: &str) -> serde_json::Value {
    serde_json::from_str(
        &std::fs::read_to_string(p.path(dir).join("provium-fixtures.json")).unwrap(),
    )
    .unwrap()
}

fn entry_of<'a>(m: &'a serde_json::Value, name: &str) -> &'a serde_json::Value {
    m["entries"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["name"] == name)
        .unwrap_or_else(|| panic!("{name} not in {m}"))
}

#[test]
fn build_all_export_then_import_into_an_empty_cache_restores_without_a_build() {
    let p = Project::new();
    let o = p.run(&["fixture", "build", "--all"]);
    assert!(o.status.success(), "{}", Project::text(&o));
    assert_eq!(p.take_builds(), ALL);
    let o = p.run(&["fixture", "export", "exported"]);
    assert!(o.status.success(), "{}", Project::text(&o));
    let m = manifest(&p, "exported");
    assert_eq!(m["entries"].as_array().unwrap().len(), 4, "{m}");
    assert_eq!(entry_of(&m, "fixtures/cluster")["kind"], "lab");
    assert_eq!(p.run(&["fixture", "clean"]).status.code(), Some(0));

    let o = p.run(&["fixture", "import", "exported"]);
    assert!(o.status.success(), "{}", Project::text(&o));
    assert!(
        String::from_utf8_lossy(&o.stdout).ends_with("4 imported, 0 already cached, 0 refused\n"),
        "{}",
        Project::text(&o)
    );
    let ev = p.path("events.bin");
    let o = p.run(&["--save-events", ev.to_str().unwrap(), "uses.test.lua"]);
    assert!(o.status.success(), "{}", Project::text(&o));
    let (built, hits) = builds_and_hits(&ev);
    assert_eq!(
        built,
        Vec::<String>::new(),
        "nothing builds after an import: {}",
        Project::text(&o)
    );
    assert_eq!(
        hits,
        [
            "fixtures/base",
            "fixtures/cluster",
            "fixtures/derived",
            "fixtures/other"
        ]
    );
    assert_eq!(p.take_builds(), Vec::<String>::new());
}

#[test]
fn a_corrupt_or_stale_imported_entry_is_refused_by_name_and_rebuilt() {
    let p = Project::new();
    assert!(p.run(&["fixture", "build", "--all"]).status.success());
    p.take_builds();
    assert!(p.run(&["fixture", "export", "exported"]).status.success());
    let m = manifest(&p, "exported");
    // Corrupt base's snapshot (same size, one byte flipped) ...
    let base = p.path("exported").join(
        entry_of(&m, "fixtures/base")["files"][0]["path"]
            .as_str()
            .unwrap(),
    );
    let mut bytes = std::fs::read(&base).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0xff;
    std::fs::write(&base, bytes).unwrap();
    // ... and make other's export stale: its depends_on_file input changed.
    p.edit("data/dep.txt", "dep v2");
    assert!(p.run(&["fixture", "clean"]).status.success());

    let o = p.run(&["fixture", "import", "exported"]);
    assert!(o.status.success(), "{}", Project::text(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("refused `fixtures/base`: corrupt: ") && err.contains("but the manifest says"),
        "{err}"
    );
    assert!(
        err.contains("refused `fixtures/other`: stale: exported with key "),
        "{err}"
    );
    assert!(
        String::from_utf8_lossy(&o.stdout).ends_with("2 imported, 0 already cached, 2 refused\n")
    );
    let ev = p.path("events.bin");
    let o = p.run(&["--save-events", ev.to_str().unwrap(), "uses.test.lua"]);
    assert!(o.status.success(), "{}", Project::text(&o));
    let (built, _) = builds_and_hits(&ev);
    assert_eq!(built, ["fixtures/base", "fixtures/other"]);
    assert_eq!(p.take_builds(), ["base", "other"]);
}

#[test]
fn fixture_rebuild_evicts_both_the_snap_and_the_lab_entry() {
    let p = Project::new();
    assert!(p
        .run(&["fixture", "build", "fixtures/other"])
        .status
        .success());
    p.take_builds();
    assert!(
        p.run(&["fixture", "export", "keys"]).status.code() == Some(1),
        "others are not built"
    );
    let key = entry_of(&manifest(&p, "keys"), "fixtures/other")["key"]
        .as_str()
        .unwrap()
        .to_string();
    // A lab layout of the same key, as a fixture that changed kind leaves.
    let lab = p.path("cache").join(format!("{key}.lab"));
    std::fs::create_dir_all(&lab).unwrap();
    std::fs::write(lab.join("lab.json"), "{}").unwrap();
    let o = p.run(&["fixture", "rebuild", "fixtures/other"]);
    assert!(o.status.success(), "{}", Project::text(&o));
    assert!(!lab.exists(), "the .lab entry is evicted");
    assert!(p.path("cache").join(format!("{key}.snap")).is_file());
    assert_eq!(p.take_builds(), ["other"]);
}
