//! Cold-boot setup on the VMM, the measuring half of the `vmm_setup`
//! profile in docs/benchmarking.md. Not a test: timings are measured here,
//! never asserted.
//!
//! ```text
//! cargo bench -p provium-vmm --bench boot_setup -- N [MEM_MIB]
//! ```
//!
//! N times: `Vm::new` and `boot` of the tiny guest on MEM_MIB (default 32)
//! of RAM, until vCPU 0's first `KVM_RUN`, then shut down. Prints one JSON
//! line: per sample `build_ms` (`build_start` → `setup_done`: RAM, KVM VM,
//! kernel load, tables, devices, vCPUs) and `start_ms` (`setup_done` →
//! `first_kvm_run`: the vCPU thread's spawn and first entry). Run it under
//! `perf record -g` or `valgrind --tool=callgrind` to see where `build_ms`
//! goes.

use std::time::{Duration, Instant};

use provium_vmm::{tiny_guest, BootMark, BootSource, BootTimer, KernelImage, Vm, VmConfig};

fn main() {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    let n: usize = args.first().and_then(|a| a.parse().ok()).unwrap_or(30);
    let mem_mib: u64 = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(32);
    let (mut build, mut start) = (Vec::new(), Vec::new());
    for _ in 0..n {
        let timer = BootTimer::new();
        let mut cfg = VmConfig::new(BootSource {
            kernel: KernelImage::Bytes(tiny_guest::BZIMAGE.into()),
            initrd: None,
            cmdline: "console=ttyS0".into(),
        });
        cfg.machine.mem_size_mib = mem_mib;
        cfg.boot_timer = Some(timer.clone());
        let vm = Vm::new(cfg).expect("create");
        vm.boot().expect("boot");
        let t0 = Instant::now();
        let m = loop {
            let m = timer.marks();
            if m.get(BootMark::FirstKvmRun).is_some() {
                break m;
            }
            assert!(t0.elapsed() < Duration::from_secs(10), "no first KVM_RUN");
            std::thread::yield_now();
        };
        let ms = |a: BootMark, b: BootMark| {
            let (a, b) = (m.get(a).expect("mark"), m.get(b).expect("mark"));
            b.duration_since(a).as_secs_f64() * 1e3
        };
        build.push(ms(BootMark::BuildStart, BootMark::SetupDone));
        start.push(ms(BootMark::SetupDone, BootMark::FirstKvmRun));
        vm.shutdown().expect("shutdown");
    }
    let list = |v: &[f64]| {
        let s: Vec<String> = v.iter().map(|x| format!("{x:.3}")).collect();
        format!("[{}]", s.join(","))
    };
    println!(
        "{{\"mem_mib\":{mem_mib},\"build_ms\":{},\"start_ms\":{}}}",
        list(&build),
        list(&start)
    );
}
