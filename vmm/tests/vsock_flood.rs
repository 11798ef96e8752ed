//! Tier 4: a hostile guest floods the host side of its vsock device with
//! connections (issue 16, "thousands of connections opened to the host
//! side").
//!
//! The tiny guest (`vmm/guest/tiny_vsock.rs`, console `F<mode>`) sends
//! `VSOCK_FLOOD_CONNECTIONS` OP_REQUESTs per flood as fast as the device
//! takes them: to a port nobody listens on, to a listened port resetting each
//! connection at once, and to a listened port keeping them open, with the host
//! accepting or not. The test checks that every request is answered (RST when
//! refused), that the VMM's connections, descriptors and memory stay within
//! the device's bounds (`MAX_CONNECTIONS`, `LISTEN_BACKLOG`), far below the
//! 16 384 requests, and that the connection made before the flood still
//! carries data both ways afterwards.
//!
//! Its own test binary, so `VmHWM` and `/proc/self/fd` are this VM's alone.
//! Needs /dev/kvm; with `PROVIUM_SKIP_KVM=1` on a machine without it, the
//! test prints why it skipped and passes.

mod common;

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use provium_vmm::devices::virtio::vsock::defs::{LISTEN_BACKLOG, MAX_CONNECTIONS};
use provium_vmm::tiny_guest::{
    self, CMD_VSOCK_CONNECT, CMD_VSOCK_FLOOD, CMD_VSOCK_RECV, CMD_VSOCK_SEND_AGAIN, READY,
    VSOCK_FLOOD_CHURN, VSOCK_FLOOD_CONNECTIONS, VSOCK_FLOOD_HOLD, VSOCK_FLOOD_LINE,
    VSOCK_FLOOD_UNLISTENED, VSOCK_HOST_PORT, VSOCK_TX_PAYLOAD,
};
use provium_vmm::vmm_config::VsockHost;
use provium_vmm::{BootSource, KernelImage, Vm, VmConfig, VmError, VmState};

/// Generous: the guest's code is emulated on kvm_pvm.
const WAIT: Duration = Duration::from_secs(120);
/// Descriptors the test process may open besides the ones the flood's
/// bounds allow (the sampler's own `read_dir`, a stray pipe).
const FD_SLACK: usize = 16;
/// Peak memory the floods may add to the process (VmHWM): the muxer's
/// per-connection state is a few hundred bytes, so even `MAX_CONNECTIONS` of
/// them is well under this, and one buffer per request would be far over it.
const HWM_GROWTH_BOUND_KIB: u64 = 16 << 10;

fn vm_with_vsock(host: &VsockHost) -> Option<Vm> {
    let mut cfg = VmConfig::new(BootSource {
        kernel: KernelImage::Bytes(tiny_guest::BZIMAGE.into()),
        initrd: None,
        cmdline: "console=ttyS0".to_string(),
    });
    cfg.machine.mem_size_mib = 32;
    cfg.vsock = Some(host.clone());
    match Vm::new(cfg) {
        Ok(vm) => Some(vm),
        Err(e @ VmError::Kvm(_))
            if std::env::var_os("PROVIUM_SKIP_KVM").is_some_and(|v| v == "1") =>
        {
            eprintln!("SKIP vsock flood: {e} (PROVIUM_SKIP_KVM=1)");
            None
        }
        Err(e) => panic!(
            "vsock flood: {e} — this test needs /dev/kvm; set PROVIUM_SKIP_KVM=1 on a machine without it"
        ),
    }
}

fn wait_console(vm: &Vm, needle: &str, count: usize) {
    common::wait_console_within(vm, needle, count, WAIT);
}

/// Open descriptors of this process.
fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd")
        .expect("/proc/self/fd")
        .count()
}

/// `VmHWM` of this process, in KiB.
fn vm_hwm_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmHWM in /proc/self/status")
}

/// `peak` is at most `before + allowed` descriptors (and `FD_SLACK`).
fn assert_fds_within(peak: usize, before: usize, allowed: usize, what: &str) {
    assert!(
        peak <= before + allowed + FD_SLACK,
        "{what}: peak {peak} descriptors, {before} before, {allowed} allowed"
    );
}

/// Polls the descriptor count until stopped; the highest count seen.
struct FdSampler {
    peak: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl FdSampler {
    fn start() -> FdSampler {
        let peak = Arc::new(AtomicUsize::new(open_fds()));
        let stop = Arc::new(AtomicBool::new(false));
        let (p, s) = (peak.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                p.fetch_max(open_fds(), Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(5));
            }
        });
        FdSampler {
            peak,
            stop,
            thread: Some(thread),
        }
    }

    /// The peak since the last call, which starts a new one.
    fn take_peak(&self) -> usize {
        self.peak.swap(open_fds(), Ordering::Relaxed)
    }
}

impl Drop for FdSampler {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Runs flood `n` (1-based) in `mode`; the guest's (OP_RESPONSEs, OP_RSTs).
fn flood(vm: &Vm, mode: u8, n: usize) -> (usize, usize) {
    let started = Instant::now();
    vm.console()
        .write_input(&[CMD_VSOCK_FLOOD, mode])
        .expect("queued");
    wait_console(vm, VSOCK_FLOOD_LINE, n);
    // The prefix can arrive before the rest of its line: wait for the end.
    let deadline = Instant::now() + WAIT;
    let line = loop {
        let log = vm.console().log_string();
        let complete = log.split_inclusive('\n').filter(|l| l.ends_with('\n'));
        if let Some(l) = complete
            .filter_map(|l| l.strip_prefix(VSOCK_FLOOD_LINE))
            .nth(n - 1)
        {
            break l.trim_end().to_string();
        }
        assert!(
            Instant::now() < deadline,
            "flood {n}'s line never ended; log:\n{log}"
        );
        std::thread::sleep(Duration::from_millis(5));
    };
    let field = |name: &str| {
        let v = line
            .split_whitespace()
            .find_map(|f| f.strip_prefix(name))
            .unwrap_or_else(|| panic!("no {name} in {line:?}"));
        usize::from_str_radix(v, 16).unwrap_or_else(|_| panic!("bad {name} in {line:?}"))
    };
    let (resp, rst) = (field("resp="), field("rst="));
    eprintln!(
        "flood {n} ({}): {resp} accepted, {rst} refused, in {:?}",
        char::from(mode),
        started.elapsed()
    );
    (resp, rst)
}

/// Runs flood `n` in `mode` against a listener that does not accept:
/// `LISTEN_BACKLOG` requests are answered OP_RESPONSE, the rest OP_RST, and
/// the descriptors peak within `fds_per_waiting` per backlog slot. Returns
/// the peak.
fn backlog_flood(
    vm: &Vm,
    mode: u8,
    n: usize,
    sampler: &FdSampler,
    fds_before: usize,
    fds_per_waiting: usize,
) -> usize {
    let requests = usize::try_from(VSOCK_FLOOD_CONNECTIONS).expect("small");
    assert_eq!(
        flood(vm, mode, n),
        (LISTEN_BACKLOG, requests - LISTEN_BACKLOG),
        "the backlog's worth accepted, the rest refused"
    );
    let peak = sampler.take_peak();
    assert_fds_within(
        peak,
        fds_before,
        fds_per_waiting * LISTEN_BACKLOG,
        "the backlog bounds the descriptors",
    );
    peak
}

/// Accepts what waits in `listener` now; each stream is returned.
fn accept_waiting(
    listener: &provium_vmm::devices::virtio::vsock::VsockListener,
) -> Vec<UnixStream> {
    std::iter::from_fn(|| listener.accept_timeout(Duration::from_millis(200))).collect()
}

#[test]
fn a_guest_connection_flood_is_refused_within_bounds_and_the_device_keeps_working() {
    let host = VsockHost::new(3).expect("vsock host");
    let Some(vm) = vm_with_vsock(&host) else {
        return;
    };
    let listener = host.listen(VSOCK_HOST_PORT).expect("listen");
    vm.boot().expect("boot");
    wait_console(&vm, READY, 1);
    let flood_requests = usize::try_from(VSOCK_FLOOD_CONNECTIONS).expect("small");

    // The connection that must survive: guest port 0x500 to the listener.
    vm.console()
        .write_input(&[CMD_VSOCK_CONNECT])
        .expect("queued");
    wait_console(&vm, "VSOCK-RX op=02 port=00000500 \n", 1);
    let mut first = listener.accept_timeout(WAIT).expect("the first connection");
    first.set_read_timeout(Some(WAIT)).expect("timeout");
    let mut payload = vec![0u8; VSOCK_TX_PAYLOAD.len()];
    first.read_exact(&mut payload).expect("the guest's bytes");
    assert_eq!(payload, VSOCK_TX_PAYLOAD.as_bytes());

    let fds_before = open_fds();
    let hwm_before = vm_hwm_kib();
    let sampler = FdSampler::start();
    sampler.take_peak();

    // 1. Nobody listens: every request is answered RST, nothing is kept.
    let (resp, rst) = flood(&vm, VSOCK_FLOOD_UNLISTENED, 1);
    assert_eq!((resp, rst), (0, flood_requests), "all refused");
    let peak_unlistened = sampler.take_peak();
    assert_fds_within(
        peak_unlistened,
        fds_before,
        0,
        "refused connects hold no descriptors",
    );

    // 2. Connect and reset at once, the host not accepting: the listener's
    //    backlog fills with dead connections, then the rest are refused.
    //    Before the backlog had a bound, each of the 4096 left a socketpair
    //    end waiting in the listener.
    let peak_churn = backlog_flood(&vm, VSOCK_FLOOD_CHURN, 2, &sampler, fds_before, 1);
    let dead = accept_waiting(&listener);
    assert_eq!(
        dead.len(),
        LISTEN_BACKLOG,
        "the backlog held the reset ones"
    );
    for mut s in dead {
        let mut rest = Vec::new();
        s.set_read_timeout(Some(WAIT)).expect("timeout");
        s.read_to_end(&mut rest).expect("EOF: the guest reset it");
        assert!(rest.is_empty());
    }

    // 3. Connections kept open, the host not accepting: the backlog again.
    let peak_hold = backlog_flood(&vm, VSOCK_FLOOD_HOLD, 3, &sampler, fds_before, 2);

    // 4. Kept open, the host accepting all the while: the device's
    //    connection limit refuses the rest.
    let held = Arc::new(std::sync::Mutex::new(accept_waiting(&listener)));
    let stop = Arc::new(AtomicBool::new(false));
    let acceptor = {
        let (held, stop) = (held.clone(), stop.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                if let Some(s) = listener.accept_timeout(Duration::from_millis(20)) {
                    held.lock().expect("no panic while held").push(s);
                }
            }
            listener
        })
    };
    let (resp4, rst4) = flood(&vm, VSOCK_FLOOD_HOLD, 4);
    stop.store(true, Ordering::Relaxed);
    let listener = acceptor.join().expect("acceptor");
    held.lock().expect("held").extend(accept_waiting(&listener));
    let accepted = LISTEN_BACKLOG + resp4;
    assert_eq!(resp4 + rst4, flood_requests, "every request answered");
    assert!(resp4 > 0, "an accepting host gets connections");
    assert!(
        accepted < MAX_CONNECTIONS,
        "at most {MAX_CONNECTIONS} connections, the first one included: {accepted} accepted besides it"
    );
    assert_eq!(
        held.lock().expect("held").len(),
        accepted,
        "every answered connection reached the host"
    );
    let peak_full = sampler.take_peak();
    assert_fds_within(
        peak_full,
        fds_before,
        2 * MAX_CONNECTIONS,
        "two ends per connection, at most MAX_CONNECTIONS of them",
    );
    drop(sampler);
    let hwm_after = vm_hwm_kib();
    eprintln!(
        "{} requests; fds before {fds_before}, peaks {peak_unlistened}/{peak_churn}/{peak_hold}/{peak_full}; \
         VmHWM {hwm_before} KiB -> {hwm_after} KiB; {} connections open",
        4 * flood_requests,
        1 + accepted
    );
    assert!(
        hwm_after - hwm_before <= HWM_GROWTH_BOUND_KIB,
        "VmHWM grew {} KiB (bound {HWM_GROWTH_BOUND_KIB} KiB)",
        hwm_after - hwm_before
    );

    // The first connection still carries data both ways.
    first.write_all(b"HOST-AFTER-FLOOD").expect("host writes");
    vm.console().write_input(&[CMD_VSOCK_RECV]).expect("queued");
    wait_console(&vm, "VSOCK-RX op=05 port=00000500 HOST-AFTER-FLOOD\n", 1);
    vm.console()
        .write_input(&[CMD_VSOCK_SEND_AGAIN])
        .expect("queued");
    first
        .read_exact(&mut payload)
        .expect("the guest's bytes again");
    assert_eq!(payload, VSOCK_TX_PAYLOAD.as_bytes());
    assert_eq!(vm.state(), VmState::Booted, "the VM runs on");
    vm.shutdown().expect("shutdown");
}
