//! Agent op latency on the local backend, with a plain Unix-socket echo
//! round trip measured in the same run as the floor to compare against.
//!
//!   cargo bench -p provium --bench agent_ops      (root: it starts sandboxes)
//!
//! Ops: sandbox start (start + handshake + ping), the echo round trip (an
//! echo server thread in this process), `ping` (a no-op round trip),
//! `run("true")`, `read_file` of 4 KiB, and `write_file` + `read_file` of
//! 1 MiB. Each prints one line, `agent_ops: op=NAME n=N p50_us=X p99_us=Y`,
//! then the ping/echo ratio and the 1 MiB throughput. The agent is the
//! release build: `$PROVIUM_AGENT` if set, else `target/release/provium-agent`
//! (built here if missing). `AGENT_OPS_SCALE` (default 1) multiplies the
//! iteration counts.

mod common;

use std::io::{Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use provium::backend::local::{LocalOptions, LocalSandbox};
use provium::client::AgentOps;

/// Bytes per echo round trip: about a ping request frame's size.
const ECHO_BYTES: usize = 32;

fn fail(msg: &str) -> ! {
    eprintln!("agent_ops: {msg}");
    std::process::exit(2);
}

/// Time `n` calls of `f` after `warmup` untimed ones.
fn measure(n: usize, warmup: usize, mut f: impl FnMut()) -> Vec<Duration> {
    for _ in 0..warmup {
        f();
    }
    (0..n)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed()
        })
        .collect()
}

/// (p50, p99) in microseconds, nearest rank.
fn percentiles(v: Vec<Duration>) -> (f64, f64) {
    let mut us: Vec<f64> = v.iter().map(|d| d.as_secs_f64() * 1e6).collect();
    us.sort_by(f64::total_cmp);
    (
        common::nearest_rank(&us, 0.50),
        common::nearest_rank(&us, 0.99),
    )
}

fn report(op: &str, samples: Vec<Duration>) -> f64 {
    let n = samples.len();
    let (p50, p99) = percentiles(samples);
    println!("agent_ops: op={op} n={n} p50_us={p50:.1} p99_us={p99:.1}");
    p50
}

fn main() {
    // `cargo bench` passes `--bench`; nothing else is accepted.
    if std::env::args().skip(1).any(|a| a != "--bench") {
        fail("takes no arguments (set AGENT_OPS_SCALE to change the iteration counts)");
    }
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        fail("needs root: the local backend creates namespaces");
    }
    let scale: usize = std::env::var("AGENT_OPS_SCALE")
        .ok()
        .map(|s| {
            s.parse()
                .unwrap_or_else(|_| fail("AGENT_OPS_SCALE: not a number"))
        })
        .unwrap_or(1)
        .max(1);
    let agent = common::release_agent().unwrap_or_else(|e| fail(&e));
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    println!(
        "agent_ops: host nproc={cpus} kernel={} agent={}",
        common::first_line("/proc/sys/kernel/osrelease"),
        agent.display()
    );

    let runtime = PathBuf::from(format!(
        "/run/provium-bench/agent-ops-{}",
        std::process::id()
    ));
    let mut opts = LocalOptions::new(agent);
    opts.runtime_dir = runtime.clone();

    // Sandbox start-up: namespaces, overlay, agent, handshake, one ping.
    let mut i = 0;
    let starts = measure(20 * scale, 2, || {
        i += 1;
        let mut sb = LocalSandbox::start(&format!("bench-start-{i}"), &opts)
            .unwrap_or_else(|e| fail(&format!("start a sandbox: {e}")));
        sb.connect()
            .and_then(|c| {
                c.ping()
                    .map_err(|source| provium::backend::local::LocalError::Connect {
                        name: "bench".into(),
                        source,
                    })
            })
            .unwrap_or_else(|e| fail(&format!("first ping: {e}")));
        sb.shutdown()
            .unwrap_or_else(|e| fail(&format!("shutdown: {e}")));
    });
    report("sandbox_start", starts);

    let mut sb = LocalSandbox::start("bench-ops", &opts)
        .unwrap_or_else(|e| fail(&format!("start a sandbox: {e}")));
    let c = sb
        .connect()
        .unwrap_or_else(|e| fail(&format!("connect: {e}")));

    // The floor: a Unix-socket echo round trip to a thread of this process.
    let dir = tempfile::tempdir().unwrap_or_else(|e| fail(&format!("tempdir: {e}")));
    let sock = dir.path().join("echo.sock");
    let listener = UnixListener::bind(&sock).unwrap_or_else(|e| fail(&format!("bind: {e}")));
    let server = std::thread::spawn(move || {
        let (mut s, _) = listener.accept().expect("accept");
        let mut buf = [0u8; ECHO_BYTES];
        while s.read_exact(&mut buf).is_ok() {
            if s.write_all(&buf).is_err() {
                break;
            }
        }
    });
    let mut echo = UnixStream::connect(&sock).unwrap_or_else(|e| fail(&format!("connect: {e}")));
    let msg = [7u8; ECHO_BYTES];
    let mut back = [0u8; ECHO_BYTES];
    let echo_p50 = report(
        "echo_unix",
        measure(20_000 * scale, 1000, || {
            echo.write_all(&msg).expect("echo write");
            echo.read_exact(&mut back).expect("echo read");
        }),
    );
    drop(echo);
    let _ = server.join();

    let ping_p50 = report(
        "ping",
        measure(20_000 * scale, 1000, || c.ping().expect("ping")),
    );
    report(
        "run_true",
        measure(1000 * scale, 50, || {
            let r = c.run("true").expect("run");
            assert!(r.success(), "{r:?}");
        }),
    );
    let four_k = vec![0x5au8; 4096];
    c.write_file("/tmp/4k", &four_k).expect("write 4 KiB");
    report(
        "read_4k",
        measure(10_000 * scale, 500, || {
            let d = c.read_file("/tmp/4k").expect("read 4 KiB");
            assert_eq!(d.len(), 4096);
        }),
    );
    let one_m: Vec<u8> = (0..1 << 20).map(|i| (i % 251) as u8).collect();
    let wr_p50 = report(
        "write_read_1m",
        measure(300 * scale, 20, || {
            c.write_file("/tmp/1m", &one_m).expect("write 1 MiB");
            let d = c.read_file("/tmp/1m").expect("read 1 MiB");
            assert_eq!(d.len(), one_m.len());
        }),
    );
    println!(
        "agent_ops: ratio ping_p50/echo_p50={:.2}",
        ping_p50 / echo_p50
    );
    println!(
        "agent_ops: write_read_1m MiB_per_s_p50={:.0} (1 MiB written + 1 MiB read per iteration; 2 MiB / p50)",
        2.0 / (wr_p50 / 1e6)
    );
    drop(c);
    let _ = sb.shutdown();
    let _ = std::fs::remove_dir_all(&runtime);
}
