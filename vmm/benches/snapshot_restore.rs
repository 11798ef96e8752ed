//! Snapshot and restore on the VMM, the measuring half of
//! `benches/snapshot_restore.sh` (which runs QEMU side by side and prints
//! ratios). Not a test: timings are measured here, never asserted.
//!
//! ```text
//! cargo bench -p provium-vmm --bench snapshot_restore -- latency MEM_MIB PCT REPS DIR
//! cargo bench -p provium-vmm --bench snapshot_restore -- memory  MEM_MIB PCT COUNT DIR
//! ```
//!
//! `latency`: REPS times, boot the tiny guest on MEM_MIB of RAM, pause it,
//! write pseudo-random data into PCT % of its pages (spread evenly: the
//! worst case for the sparse image), snapshot to DIR (which writes its
//! restore image too); restore it (`first_restore_ms`), remove the image
//! and restore again (`build_restore_ms`: that restore builds the image
//! from the memory section, what every first restore did before), then
//! once more (`restore_ms`). A restore
//! is timed from `Vm::new` to `Vm::restore` returning with the vCPUs
//! started and to the guest's counter
//! moving in restored RAM (`running_ms`). One JSON line.
//!
//! `memory`: one such snapshot, then COUNT restores alive at once against
//! COUNT cold boots that touch the same pages, each set measured from
//! /proc/self/smaps over the VMs' RAM mappings (Rss, and Pss, which splits
//! page-cache pages the restores share); the restores are measured again
//! after the host read the touched pages through each (as a guest using its
//! memory would fault them in). One JSON line.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use provium_vmm::tiny_guest::{self, COUNTER_GPA, READY};
use provium_vmm::{BootSource, KernelImage, Vm, VmConfig};

const PAGE: u64 = 4096;

fn config(mem_mib: u64) -> VmConfig {
    let mut c = VmConfig::new(BootSource {
        kernel: KernelImage::Bytes(tiny_guest::BZIMAGE.into()),
        initrd: None,
        cmdline: "console=ttyS0".into(),
    });
    c.machine.mem_size_mib = mem_mib;
    c
}

fn must<T, E: std::fmt::Display>(r: Result<T, E>, what: &str) -> T {
    r.unwrap_or_else(|e| {
        eprintln!("snapshot_restore: {what}: {e}");
        std::process::exit(2)
    })
}

/// Boots the tiny guest to READY, pauses it and dirties `pct` % of its RAM
/// above 16 MiB (clear of the guest's code and stack).
fn prepared_vm(mem_mib: u64, pct: u64) -> Vm {
    let vm = must(Vm::new(config(mem_mib)), "create");
    must(vm.boot(), "boot");
    assert!(
        vm.console()
            .wait_for(READY.as_bytes(), 1, Duration::from_secs(120)),
        "the tiny guest did not print READY"
    );
    must(vm.pause(), "pause");
    touch(&vm, mem_mib, pct);
    vm
}

/// The guest addresses `touch` writes: every (100/pct)-th page above 16 MiB
/// (clear of the guest's image) and below the MMIO gap.
fn touched_pages(mem_mib: u64, pct: u64) -> impl Iterator<Item = u64> {
    let pages = (mem_mib << 20) / PAGE;
    let stride = (100 / pct.clamp(1, 100)).max(1);
    (0..pages)
        .step_by(usize::try_from(stride).unwrap_or(1))
        .map(|p| p * PAGE)
        .filter(|gpa| (16 << 20..0xc000_0000).contains(gpa))
}

fn touch(vm: &Vm, mem_mib: u64, pct: u64) {
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut buf = vec![0u8; PAGE as usize];
    for gpa in touched_pages(mem_mib, pct) {
        for w in buf.chunks_mut(8) {
            // xorshift64: incompressible enough, cheap.
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            w.copy_from_slice(&x.to_le_bytes());
        }
        must(vm.write_guest_memory(gpa, &buf), "touch");
    }
}

/// `Vm::new` + restore until the counter moves; (`Vm::new` to `restore`
/// returned with vCPUs started, to the guest running).
fn timed_restore(mem_mib: u64, snap: &Path) -> (Vm, Duration, Duration) {
    let t0 = Instant::now();
    let vm = must(Vm::new(config(mem_mib)), "create");
    must(vm.restore(snap), "restore");
    let call = t0.elapsed();
    let c0 = must(vm.read_guest_u64(COUNTER_GPA), "counter");
    while must(vm.read_guest_u64(COUNTER_GPA), "counter") == c0 {
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "restored guest does not run"
        );
        std::hint::spin_loop();
    }
    (vm, call, t0.elapsed())
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn list(v: &[f64]) -> String {
    let s: Vec<String> = v.iter().map(|x| format!("{x:.3}")).collect();
    format!("[{}]", s.join(","))
}

fn latency(mem_mib: u64, pct: u64, reps: usize, dir: &Path) {
    let (mut snap_ms, mut first_ms, mut build_ms, mut running_ms, mut restore_ms) =
        (vec![], vec![], vec![], vec![], vec![]);
    let mut file_bytes = 0;
    for i in 0..reps {
        let vm = prepared_vm(mem_mib, pct);
        let path = dir.join(format!("ours-{mem_mib}-{pct}-{i}.snap"));
        let t = Instant::now();
        let st = must(vm.snapshot(&path), "snapshot");
        snap_ms.push(ms(t.elapsed()));
        file_bytes = st.file_bytes;
        drop(vm);
        let (vm, call, _) = timed_restore(mem_mib, &path);
        first_ms.push(ms(call));
        drop(vm);
        // The restore image removed: this restore builds it from the memory
        // section, as every first restore did before snapshots wrote it.
        let _ = std::fs::remove_file(provium_vmm::snapshot::image_path(&path));
        let (vm, call, _) = timed_restore(mem_mib, &path);
        build_ms.push(ms(call));
        drop(vm);
        let (vm, call, total) = timed_restore(mem_mib, &path);
        restore_ms.push(ms(call));
        running_ms.push(ms(total));
        drop(vm);
        let _ = std::fs::remove_file(provium_vmm::snapshot::image_path(&path));
        let _ = std::fs::remove_file(&path);
    }
    println!(
        "{{\"who\":\"ours\",\"mem_mib\":{mem_mib},\"touch_pct\":{pct},\"file_bytes\":{file_bytes},\
         \"snapshot_ms\":{},\"first_restore_ms\":{},\"build_restore_ms\":{},\"restore_ms\":{},\"running_ms\":{}}}",
        list(&snap_ms),
        list(&first_ms),
        list(&build_ms),
        list(&restore_ms),
        list(&running_ms)
    );
}

/// (Rss, Pss) bytes of this process's mappings starting inside `ranges`.
fn mapped(ranges: &[(u64, u64)]) -> (u64, u64) {
    let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap_or_default();
    let (mut rss, mut pss, mut inside) = (0, 0, false);
    for line in smaps.lines() {
        let head = line.split_whitespace().next().unwrap_or("");
        if let Some(start) = head
            .split_once('-')
            .and_then(|(a, _)| u64::from_str_radix(a, 16).ok())
        {
            inside = ranges.iter().any(|&(s, l)| start >= s && start < s + l);
            continue;
        }
        let kib = |k: &str| {
            line.strip_prefix(k)
                .and_then(|v| v.split_whitespace().next())
                .and_then(|v| v.parse::<u64>().ok())
                .map_or(0, |v| v * 1024)
        };
        if inside {
            rss += kib("Rss:");
            pss += kib("Pss:");
        }
    }
    (rss, pss)
}

fn sum_mapped(vms: &[Vm]) -> (u64, u64) {
    let ranges: Vec<(u64, u64)> = vms.iter().flat_map(|v| v.ram_host_ranges()).collect();
    mapped(&ranges)
}

fn memory(mem_mib: u64, pct: u64, count: usize, dir: &Path) {
    let vm = prepared_vm(mem_mib, pct);
    let path = dir.join(format!("ours-mem-{mem_mib}-{pct}.snap"));
    must(vm.snapshot(&path), "snapshot");
    drop(vm);
    drop(timed_restore(mem_mib, &path)); // builds the restore image
    let restored: Vec<Vm> = (0..count)
        .map(|_| timed_restore(mem_mib, &path).0)
        .collect();
    let (r_rss, r_pss) = sum_mapped(&restored);
    // Then as if each guest read the pages it had written: read faults map
    // the restore image's page-cache pages, shared by every restore.
    let mut buf = vec![0u8; PAGE as usize];
    for vm in &restored {
        for gpa in touched_pages(mem_mib, pct) {
            must(vm.read_guest_memory(gpa, &mut buf), "read");
        }
    }
    let (read_rss, read_pss) = sum_mapped(&restored);
    drop(restored);
    let cold: Vec<Vm> = (0..count)
        .map(|_| {
            let vm = prepared_vm(mem_mib, pct);
            must(vm.resume(), "resume");
            vm
        })
        .collect();
    let (c_rss, c_pss) = sum_mapped(&cold);
    drop(cold);
    let _ = std::fs::remove_file(provium_vmm::snapshot::image_path(&path));
    let _ = std::fs::remove_file(&path);
    println!(
        "{{\"who\":\"ours\",\"mem_mib\":{mem_mib},\"touch_pct\":{pct},\"count\":{count},\
         \"restored_rss\":{r_rss},\"restored_pss\":{r_pss},\"read_rss\":{read_rss},\"read_pss\":{read_pss},\"cold_rss\":{c_rss},\"cold_pss\":{c_pss}}}"
    );
}

fn main() {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .collect();
    let num = |i: usize| -> u64 {
        args.get(i).and_then(|a| a.parse().ok()).unwrap_or_else(|| {
            eprintln!("usage: snapshot_restore latency|memory MEM_MIB PCT N DIR");
            std::process::exit(2)
        })
    };
    let Some(mode) = args.first() else {
        eprintln!("usage: snapshot_restore latency|memory MEM_MIB PCT N DIR");
        std::process::exit(2)
    };
    let dir = PathBuf::from(args.get(4).map_or("/tmp", String::as_str));
    let n = usize::try_from(num(3)).unwrap_or(1);
    match mode.as_str() {
        "latency" => latency(num(1), num(2), n, &dir),
        "memory" => memory(num(1), num(2), n, &dir),
        m => {
            eprintln!("snapshot_restore: unknown mode {m}");
            std::process::exit(2)
        }
    }
}
