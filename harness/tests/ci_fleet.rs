//! A suite spread over a CI fleet, through the real binary on the local
//! backend (docs/ci.md): `--partition` shards, `provium report merge`, and
//! fixture caches carried between machines with `fixture export|import`.
mod common;

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Output;

use common::{exit_code, read_events, stderr, stdout, LocalProject};
use provium_protocol::Event;

/// Eleven files over three directories, each with a passing test.
fn eleven_files() -> Vec<(String, String)> {
    (0..11)
        .map(|i| {
            (
                format!("d{}/f{i:02}.test.lua", i % 3),
                format!("test(\"t{i}\", function(t) t:assert(true) end)\n"),
            )
        })
        .collect()
}

/// The file lines of `provium list` (tests are indented under them).
fn listed_files(o: &Output) -> Vec<String> {
    assert_eq!(exit_code(o), 0, "{o:?}");
    stdout(o)
        .lines()
        .filter(|l| !l.starts_with(' '))
        .map(str::to_string)
        .collect()
}

#[test]
fn shards_of_both_kinds_are_disjoint_and_cover_the_suite() {
    let files = eleven_files();
    let refs: Vec<(&str, &str)> = files
        .iter()
        .map(|(a, b)| (a.as_str(), b.as_str()))
        .collect();
    let p = LocalProject::new(&refs);
    let all = listed_files(&p.run(&["list"]));
    assert_eq!(all.len(), 11);
    for kind in ["count", "hash"] {
        for n in 1..=5 {
            let mut seen: Vec<String> = Vec::new();
            for i in 1..=n {
                let shard =
                    listed_files(&p.run(&["list", "--partition", &format!("{kind}:{i}/{n}")]));
                seen.extend(shard);
            }
            let unique: BTreeSet<&String> = seen.iter().collect();
            assert_eq!(
                unique.len(),
                seen.len(),
                "{kind} N={n}: a file in two shards: {seen:?}"
            );
            assert_eq!(
                unique.into_iter().cloned().collect::<BTreeSet<_>>(),
                all.iter().cloned().collect::<BTreeSet<_>>(),
                "{kind} N={n}"
            );
        }
    }
    // count deals round-robin in discovery order.
    let second = listed_files(&p.run(&["list", "--partition", "count:2/4"]));
    let want: Vec<String> = all.iter().skip(1).step_by(4).cloned().collect();
    assert_eq!(second, want);
    // A shard runs exactly its listed files, and says which shard it is.
    let events = p.path().join("shard.events");
    let o = p.run(&[
        "--partition",
        "hash:2/3",
        "--json",
        "--save-events",
        events.to_str().unwrap(),
    ]);
    assert_eq!(exit_code(&o), 0, "{o:?}");
    let ran: BTreeSet<String> = stdout(&o)
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            assert_eq!(v["run"]["partition"], "hash:2/3", "{v}");
            assert_eq!(v["run"]["suite_files"], 11, "{v}");
            v["path"].as_str().unwrap().to_string()
        })
        .collect();
    let listed: BTreeSet<String> = listed_files(&p.run(&["list", "--partition", "hash:2/3"]))
        .into_iter()
        .collect();
    assert_eq!(ran, listed);
    let frames = read_events(&events);
    let Event::RunStarted(r) = &frames[0].event else {
        panic!("first event: {:?}", frames[0].event)
    };
    assert_eq!(r.partition.as_deref(), Some("hash:2/3"));
    assert_eq!(r.suite_files, 11);
    let discovered = frames
        .iter()
        .filter(|f| matches!(f.event, Event::FileDiscovered(_)))
        .count();
    assert_eq!(discovered, listed.len());
}

#[test]
fn a_bad_partition_exits_2_naming_the_problem_and_the_form() {
    let p = LocalProject::new(&[("a.test.lua", "test('a', function() end)\n")]);
    for (spec, problem) in [
        ("0/3", "`0/3` has no kind"),
        (
            "count:0/3",
            "shard 0 in `count:0/3`: shards are numbered from 1",
        ),
        (
            "count:4/3",
            "shard 4 of 3 in `count:4/3`: I must be at most N",
        ),
        ("count:x/y", "`x/y` is not I/N with whole numbers"),
        ("slice:1/2", "unknown partition kind `slice`"),
    ] {
        for args in [vec!["--partition", spec], vec!["list", "--partition", spec]] {
            let o = p.run(&args);
            assert_eq!(exit_code(&o), 2, "{spec}: {o:?}");
            let e = stderr(&o);
            assert!(e.contains(problem), "{spec}: {e}");
            assert!(
                e.contains("count:I/N") || e.contains("count:1/3"),
                "{spec}: {e}"
            );
        }
    }
}

/// Five files: passes, failures, skips, logs and a chunk that fails to load.
fn mixed_suite() -> LocalProject {
    LocalProject::new(&[
        ("a.test.lua", "test('one', function(t) t:log('hello') end)\ntest('two', function(t) t:assert_eq(1, 1) end)\n"),
        ("b.test.lua", "test('ok', function() end)\ntest('bad', function(t) t:assert_eq(1, 2) end)\ntest('later', {skip = 'not yet'}, function() end)\n"),
        ("net/c.test.lua", "test('c1', function(t) t:log('from c') end)\n"),
        ("net/d.test.lua", "test('d1', function(t) t:fail('d is broken') end)\ntest('d2', function() end)\n"),
        ("e.test.lua", "test('e1', function() end)\n"),
    ])
}

/// The summary line without its run time.
fn summary(out: &str) -> String {
    let line = out
        .lines()
        .rev()
        .find(|l| l.contains(" file(s); "))
        .unwrap_or("");
    line.rsplit_once("; ").map_or(line, |(a, _)| a).to_string()
}

/// JUnit with `time="…"` removed, as a sorted list of `<testsuite>` blocks.
fn junit_without_times(path: &Path) -> Vec<String> {
    let x = std::fs::read_to_string(path).unwrap();
    let re = regex::Regex::new(r#" time="[0-9.]+""#).unwrap();
    let x = re.replace_all(&x, "");
    let mut suites: Vec<String> = x
        .split("  <testsuite ")
        .skip(1)
        .map(|s| s.split("  </testsuite>").next().unwrap().to_string())
        .collect();
    suites.sort();
    suites
}

/// Each `<testcase …>` with its status child, without logs (events do not
/// carry `t:log` lines).
fn testcases(suites: &[String]) -> Vec<String> {
    let re = regex::Regex::new(r"<system-out>[^<]*</system-out>").unwrap();
    suites
        .iter()
        .flat_map(|s| s.lines().filter(|l| l.contains("<testcase")))
        .map(|l| re.replace_all(l, "").into_owned())
        .collect()
}

#[test]
fn a_merge_of_three_shards_equals_one_unsharded_run() {
    let p = mixed_suite();
    let whole_junit = p.path().join("whole.xml");
    let whole = p.run(&["--junit", whole_junit.to_str().unwrap()]);
    assert_eq!(exit_code(&whole), 1);
    let mut events = Vec::new();
    let mut jsons = Vec::new();
    for i in 1..=3 {
        let ev = p.path().join(format!("shard{i}.events"));
        let o = p.run(&[
            "--partition",
            &format!("count:{i}/3"),
            "--save-events",
            ev.to_str().unwrap(),
        ]);
        assert!(exit_code(&o) <= 1, "{o:?}");
        events.push(ev.to_str().unwrap().to_string());
        let js = p.path().join(format!("shard{i}.json"));
        let o = p.run(&["--partition", &format!("count:{i}/3"), "--json"]);
        std::fs::write(&js, &o.stdout).unwrap();
        jsons.push(js.to_str().unwrap().to_string());
    }
    let want_suites = junit_without_times(&whole_junit);
    for (inputs, exact) in [(&jsons, true), (&events, false)] {
        let merged_junit = p.path().join("merged.xml");
        let mut args = vec!["report", "merge", "--junit", merged_junit.to_str().unwrap()];
        args.extend(inputs.iter().map(String::as_str));
        let m = p.run(&args);
        assert_eq!(exit_code(&m), 1, "{m:?}");
        assert_eq!(summary(&stdout(&m)), summary(&stdout(&whole)));
        assert_eq!(
            summary(&stdout(&m)),
            "5 file(s); 6 passed, 2 failed, 1 skipped"
        );
        let got = junit_without_times(&merged_junit);
        if exact {
            assert_eq!(got, want_suites);
        } else {
            assert_eq!(testcases(&got), testcases(&want_suites));
            assert_eq!(testcases(&got).len(), 9);
        }
    }
    // A missing shard is named; a shard of another suite is refused.
    let m = p.run(&["report", "merge", &events[0], &events[2]]);
    assert_eq!(exit_code(&m), 2, "{m:?}");
    assert!(
        stderr(&m).contains("shard count:2/3 of suite"),
        "{}",
        stderr(&m)
    );
    p.write("tests/extra.test.lua", "test('x', function() end)\n");
    let other = p.path().join("other.events");
    p.run(&[
        "--partition",
        "count:2/3",
        "--save-events",
        other.to_str().unwrap(),
    ]);
    let m = p.run(&[
        "report",
        "merge",
        &events[0],
        other.to_str().unwrap(),
        &events[2],
    ]);
    assert_eq!(exit_code(&m), 2, "{m:?}");
    assert!(stderr(&m).contains("is from suite"), "{}", stderr(&m));
    // A clean suite merges to exit 0.
    let clean = LocalProject::new(&[
        ("a.test.lua", "test('a', function() end)\n"),
        ("b.test.lua", "test('b', function() end)\n"),
    ]);
    let mut inputs = Vec::new();
    for i in 1..=2 {
        let ev = clean.path().join(format!("s{i}.events"));
        assert_eq!(
            exit_code(&clean.run(&[
                "--partition",
                &format!("hash:{i}/2"),
                "--save-events",
                ev.to_str().unwrap()
            ])),
            0
        );
        inputs.push(ev);
    }
    let m = clean.run(&[
        "report",
        "merge",
        inputs[0].to_str().unwrap(),
        inputs[1].to_str().unwrap(),
    ]);
    assert_eq!(exit_code(&m), 0, "{m:?}");
    assert_eq!(
        summary(&stdout(&m)),
        "2 file(s); 2 passed, 0 failed, 0 skipped"
    );
}

/// A project whose fixtures depend on every kind of host file a key
/// identifies: the profile's kernel and initrd, a `push_file` (from a
/// helper) and a `depends_on_file`; its cache inside it.
fn fixture_project() -> LocalProject {
    common::ensure_agent();
    let p = LocalProject::new(&[
        ("k/bzImage", "kernel"),
        ("k/initrd", "initrd"),
        ("data/payload.txt", "payload"),
        ("data/dep.txt", "dep"),
        ("lib/push.lua", "return function(vm) vm:push_file(\"../data/payload.txt\", \"/srv/payload\") end\n"),
        (
            "fixtures/base.fixture.lua",
            "local push = require(\"lib.push\")\nlocal vm = provium:vm(\"base\", \"linux\"):boot()\npush(vm)\nreturn vm:snapshot()\n",
        ),
        (
            "fixtures/other.fixture.lua",
            "provium:depends_on_file(\"../data/dep.txt\")\nlocal vm = provium:vm_fixture(\"fixtures/base\")\nvm:write_file(\"/srv/other\", \"o\")\nreturn vm:snapshot()\n",
        ),
        (
            "uses.test.lua",
            "test('base', function(t) t:assert_eq(provium:vm_fixture('fixtures/base'):read_file('/srv/payload'), 'payload') end)\ntest('other', function(t) t:assert_eq(provium:vm_fixture('fixtures/other'):read_file('/srv/other'), 'o') end)\n",
        ),
    ]);
    p.write(
        "provium.toml",
        "[provium]\nroots = [\"tests\"]\ncache_dir = \"cache\"\n\n[profiles.linux]\nkernel = \"tests/k/bzImage\"\ninitrd = \"tests/k/initrd\"\ncmdline = \"quiet\"\nguest_os = \"linux\"\n",
    );
    p
}

/// Copy the files under `from` to `to`, except `skip` (top-level names),
/// each stamped with `mtime`: what a fresh checkout on another runner
/// (another path, another clock) holds.
fn copy_as_fresh_checkout(from: &Path, to: &Path, skip: &[&str], mtime: std::time::SystemTime) {
    for e in std::fs::read_dir(from).unwrap().flatten() {
        let name = e.file_name();
        if skip.iter().any(|s| name == *s) {
            continue;
        }
        let (src, dst) = (e.path(), to.join(&name));
        if e.file_type().unwrap().is_dir() {
            std::fs::create_dir_all(&dst).unwrap();
            copy_as_fresh_checkout(&src, &dst, &[], mtime);
        } else {
            std::fs::copy(&src, &dst).unwrap();
            std::fs::File::options()
                .write(true)
                .open(&dst)
                .unwrap()
                .set_modified(mtime)
                .unwrap();
        }
    }
}

#[test]
fn an_export_imported_into_a_fresh_checkout_elsewhere_restores_without_a_build() {
    let job = fixture_project();
    let o = job.run(&["fixture", "build", "--all"]);
    assert_eq!(exit_code(&o), 0, "{o:?}");
    let o = job.run(&["fixture", "export", "fixture-cache"]);
    assert_eq!(exit_code(&o), 0, "{o:?}");

    // The shard's checkout: another directory, every file (the carried
    // cache too) with a new mtime, and an empty fixture cache.
    let shard = tempfile::tempdir().unwrap();
    let later = std::time::SystemTime::now() + std::time::Duration::from_secs(3600);
    copy_as_fresh_checkout(job.path(), shard.path(), &["cache", "rerun.json"], later);
    assert!(!shard.path().join("cache").exists());
    for f in [
        "tests/k/bzImage",
        "tests/k/initrd",
        "tests/data/payload.txt",
    ] {
        let mtime = |dir: &Path| std::fs::metadata(dir.join(f)).unwrap().modified().unwrap();
        assert_ne!(mtime(job.path()), mtime(shard.path()), "{f}");
    }

    let o = common::provium_local(shard.path(), &["fixture", "import", "fixture-cache"]);
    assert_eq!(exit_code(&o), 0, "{o:?}");
    assert!(
        stdout(&o).ends_with("2 imported, 0 already cached, 0 refused\n"),
        "{o:?}"
    );
    let events = shard.path().join("shard.events");
    let o = common::provium_local(shard.path(), &["--save-events", events.to_str().unwrap()]);
    assert_eq!(exit_code(&o), 0, "{o:?}");
    let mut hits = Vec::new();
    for f in read_events(&events) {
        match f.event {
            Event::FixtureBuildStarted(b) => {
                panic!("`{}` was built after a clean import: {o:?}", b.path)
            }
            Event::FixtureCacheHit(h) => hits.push(h.path),
            _ => {}
        }
    }
    hits.sort();
    hits.dedup();
    assert_eq!(hits, ["fixtures/base", "fixtures/other"]);
}
