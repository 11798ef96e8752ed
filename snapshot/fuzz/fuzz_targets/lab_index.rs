//! `lab.json`, the index of a lab snapshot, from a hostile file: it parses
//! to an index whose every file name is a plain name inside the directory,
//! listed once per VM, and that exists; or it is refused with a typed
//! error. Nothing panics, and a valid index writes back to JSON that reads
//! as the same index.
//!
//! Input: the bytes of `lab.json`. Files named `a.snap`, `b.snap` and
//! `dc1.a.snap` exist in the simulated directory.

#![no_main]

use libfuzzer_sys::fuzz_target;
use provium_snapshot::lab_index::is_plain_file_name;
use provium_snapshot::LabIndex;

fn exists(name: &str) -> bool {
    matches!(name, "a.snap" | "b.snap" | "dc1.a.snap")
}

fuzz_target!(|data: &[u8]| {
    let Ok(index) = LabIndex::parse("lab.json", data, &exists) else {
        return;
    };
    let mut seen = std::collections::BTreeSet::new();
    for vm in &index.vms {
        assert!(is_plain_file_name(&vm.file), "{:?}", vm.file);
        assert!(exists(&vm.file));
        assert!(seen.insert((vm.lab_path.clone(), vm.name.clone())));
    }
    let json = serde_json::to_vec(&index).expect("an index serializes");
    let again = LabIndex::parse("lab.json", &json, &exists).expect("a written index reads back");
    assert_eq!(again, index);
    // A fresh file name never collides with one the index holds.
    let f = index.file_name_for(&["x".into()], "a");
    assert!(index.vms.iter().all(|v| v.file != f));
    assert!(is_plain_file_name(&f), "{f:?}");
});
