//! Issue 3's test matrix, through the real agent in a local sandbox (root,
//! as in CI): binary data, a 200 MiB stream with bounded memory on both
//! sides, stdin beyond the window, missing executables, ENOENT/EACCES,
//! signalling an exited process, 8 threads on one connection, two workers
//! in parallel, a process that closes stdout and keeps running, timeouts,
//! uname via `syscall`, nested pointers (ioctl and two-level syscall),
//! malformed frames at the sandbox's agent, and what the local backend
//! cannot honour, through the Lua API.
//!
//! The points proven elsewhere are not repeated here: raw-frame agent tests
//! in `agent/tests/agent/` (bad frames, window overrun, PID-1 chain) and the
//! client's fake-agent unit tests in `harness/src/client/connection.rs`.
mod common;

use common::agent;

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::thread;
use std::time::{Duration, Instant};

use provium::backend::local::{LocalOptions, LocalSandbox};
use provium::client::{AgentClient, AgentOps, ClientError};
use provium_protocol::op::{
    CommandSpec, ExecSpec, IoctlSpec, NestedPtr, OpenMode, SpawnSpec, SyscallSpec, Whence,
};
use provium_protocol::result::{ErrorCode, ExitInfo, ExitStatus};
use provium_protocol::STREAM_WINDOW_BYTES;

/// A sandbox named `name` under its own runtime directory.
fn sandbox(name: &str) -> (LocalSandbox, AgentClient) {
    let mut o = LocalOptions::new(agent());
    o.runtime_dir = PathBuf::from(format!("/run/provium-test/matrix-{name}"));
    let sb = LocalSandbox::start(name, &o).expect("start sandbox (needs root)");
    let c = sb.connect().expect("connect");
    (sb, c)
}

fn shell(script: &str) -> ExecSpec {
    CommandSpec::shell(script).into()
}

fn argv(program: &str, args: &[&str]) -> ExecSpec {
    CommandSpec::argv(program, args.iter().copied()).into()
}

fn spawn_sh(script: &str) -> SpawnSpec {
    SpawnSpec::shell(script)
}

/// Every byte value, NULs included, `len` bytes long.
fn binary(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 7 % 256) as u8).collect()
}

/// A `/proc/<pid>/status` field in KiB.
fn status_kib(pid: &str, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim_start_matches(':').split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("{field} in /proc/{pid}/status"))
}

/// The host pid of the sandbox's agent.
fn agent_host_pid(sb: &LocalSandbox) -> String {
    let agents: Vec<String> = sb
        .host_pids()
        .into_iter()
        .map(|p| p.to_string())
        .filter(|p| {
            std::fs::read_to_string(format!("/proc/{p}/comm"))
                .is_ok_and(|c| c.trim() == "provium-agent")
        })
        .collect();
    assert_eq!(agents.len(), 1, "agent processes: {agents:?}");
    agents.into_iter().next().unwrap()
}

fn getpid() -> SyscallSpec {
    SyscallSpec {
        nr: libc::SYS_getpid,
        args: vec![],
        bufs: vec![],
        ptrs: vec![],
        nested: vec![],
    }
}

fn op_error(err: &ClientError) -> &provium_protocol::result::OpError {
    err.op_error()
        .unwrap_or_else(|| panic!("not an agent-side error: {err}"))
}

/// Poll `cond` until it holds, failing after 20 s with `what`.
fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn binary_data_with_nul_bytes_both_ways() {
    let (_sb, c) = sandbox("mx-binary");
    let data = binary(70_000);
    assert!(data.contains(&0));
    // Host -> guest file, guest file -> host (whole-file ops).
    c.write_file("/tmp/bin", &data).unwrap();
    assert_eq!(c.read_file("/tmp/bin").unwrap(), data);
    // The guest sees exactly those bytes: its own count of NULs agrees.
    let nuls = data.iter().filter(|b| **b == 0).count();
    let r = c.run("tr -cd '\\000' < /tmp/bin | wc -c").unwrap();
    assert_eq!(r.stdout_str().trim(), nuls.to_string(), "{r:?}");
    // Guest stdout -> host, exec stdin -> guest.
    let r = c.run("cat /tmp/bin").unwrap();
    assert!(r.stdout == data, "cat returned {} bytes", r.stdout.len());
    let r = c
        .exec(
            CommandSpec {
                stdin: Some(data.clone()),
                ..CommandSpec::shell("cat > /tmp/from-stdin; printf 'a\\000b' >&2")
            }
            .into(),
        )
        .unwrap();
    assert!(r.success(), "{r:?}");
    assert_eq!(r.stderr, b"a\0b");
    assert_eq!(c.read_file("/tmp/from-stdin").unwrap(), data);
    // Handles: write and read back with NULs, at offsets.
    let h = c
        .open(
            "/tmp/handle",
            OpenMode {
                read: true,
                write: true,
                create: true,
                ..OpenMode::default()
            },
            None,
        )
        .unwrap();
    assert_eq!(c.write(h, b"\0\0x\0").unwrap(), 4);
    assert_eq!(c.seek(h, 1, Whence::Set).unwrap(), 1);
    assert_eq!(c.read(h, 10).unwrap(), b"\0x\0");
    AgentOps::close(&c, h).unwrap();
    // A NUL inside a path or an argument cannot be passed to the kernel:
    // refused with a clear error, not truncated.
    let err = c.read_file("/tmp/bin\0suffix").unwrap_err();
    assert_eq!(op_error(&err).code, ErrorCode::InvalidArgument, "{err}");
    assert!(err.to_string().contains("NUL byte"), "{err}");
    let err = c.exec(argv("echo", &["a\0b"])).unwrap_err();
    assert_eq!(op_error(&err).code, ErrorCode::InvalidArgument, "{err}");
}

#[test]
fn stream_200_mib_of_stdout_with_bounded_memory() {
    const TOTAL: u64 = 200 * 1024 * 1024;
    let (sb, c) = sandbox("mx-stream");
    let agent_pid = agent_host_pid(&sb);
    // Warm up threads and allocators on both sides before the baseline.
    let r = c.run("head -c 4194304 /dev/zero").unwrap();
    assert_eq!(r.stdout.len(), 4 << 20);
    drop(r);
    let agent_hwm_before = status_kib(&agent_pid, "VmHWM");
    let self_hwm_before = status_kib("self", "VmHWM");

    // `exec` collects all output by design; a stream is read through spawn
    // and the stdout reader, and discarded as it arrives.
    let mut p = c
        .spawn(spawn_sh(&format!("head -c {TOTAL} /dev/zero")))
        .unwrap();
    let mut out = p.stdout();
    let (mut got, mut nonzero, mut max_chunk) = (0u64, 0u64, 0usize);
    let mut agent_rss_max = 0;
    let deadline = Instant::now() + Duration::from_secs(300);
    while !out.is_eof() {
        assert!(Instant::now() < deadline, "stream stalled at {got} bytes");
        if let Some(chunk) = out.next(Duration::from_secs(10)).unwrap() {
            got += chunk.len() as u64;
            nonzero += chunk.iter().filter(|b| **b != 0).count() as u64;
            max_chunk = max_chunk.max(chunk.len());
            if got % (16 << 20) < chunk.len() as u64 {
                agent_rss_max = agent_rss_max.max(status_kib(&agent_pid, "VmRSS"));
            }
        }
    }
    let r = p.wait(Some(Duration::from_secs(60))).unwrap();
    assert!(r.success(), "{:?}", r.exit);
    assert_eq!(got, TOTAL, "bytes streamed");
    assert_eq!(nonzero, 0);
    assert!(r.stdout.is_empty(), "the reader consumed all of stdout");
    assert!(max_chunk as u64 <= STREAM_WINDOW_BYTES);

    let agent_hwm = status_kib(&agent_pid, "VmHWM");
    let self_hwm = status_kib("self", "VmHWM");
    let limit_kib = 64 * 1024;
    assert!(
        agent_hwm < agent_hwm_before + limit_kib,
        "agent peak RSS grew from {agent_hwm_before} KiB to {agent_hwm} KiB (sampled VmRSS max {agent_rss_max} KiB) streaming 200 MiB"
    );
    assert!(
        self_hwm < self_hwm_before + limit_kib,
        "the client's peak RSS grew from {self_hwm_before} KiB to {self_hwm} KiB streaming 200 MiB"
    );
    eprintln!(
        "200 MiB streamed: agent VmHWM {agent_hwm_before} -> {agent_hwm} KiB, client VmHWM {self_hwm_before} -> {self_hwm} KiB"
    );
}

#[test]
fn stdin_larger_than_the_window_round_trips() {
    let (_sb, c) = sandbox("mx-stdin");
    // 12 windows of binary stdin through `cat`, read back concurrently.
    let data = binary(12 * STREAM_WINDOW_BYTES as usize + 1234);
    let mut p = c.spawn(spawn_sh("cat")).unwrap();
    let mut out = p.stdout();
    let got = thread::scope(|s| {
        let writer = s.spawn(|| {
            p.stdin_write(&data)?;
            p.close_stdin()
        });
        let mut got = Vec::with_capacity(data.len());
        let deadline = Instant::now() + Duration::from_secs(120);
        while !out.is_eof() {
            assert!(Instant::now() < deadline, "stalled at {} bytes", got.len());
            if let Some(chunk) = out.next(Duration::from_secs(10)).unwrap() {
                got.extend(chunk);
            }
        }
        writer.join().unwrap().unwrap();
        got
    });
    let r = p.wait(Some(Duration::from_secs(30))).unwrap();
    assert!(r.success(), "{:?}", r.exit);
    assert_eq!(got.len(), data.len());
    assert!(got == data, "cat echoed different bytes");
    // exec's own stdin (sent whole in the request) beyond the window too.
    let r = c
        .exec(
            CommandSpec {
                stdin: Some(data.clone()),
                ..CommandSpec::shell("wc -c")
            }
            .into(),
        )
        .unwrap();
    assert_eq!(r.stdout_str().trim(), data.len().to_string());
}

#[test]
fn missing_executables_enoent_and_eacces() {
    let (_sb, c) = sandbox("mx-errors");
    // argv: the program is looked up and not found.
    let err = c.exec(argv("no-such-program-xyz", &["a"])).unwrap_err();
    let e = op_error(&err);
    assert_eq!(
        (e.code, e.errno),
        (ErrorCode::Io, Some(libc::ENOENT)),
        "{err}"
    );
    assert!(
        e.message.contains("no-such-program-xyz") && e.message.contains("No such file"),
        "{err}"
    );
    let err = c
        .spawn(SpawnSpec::argv("/no/such/bin", Vec::<String>::new()))
        .unwrap_err();
    assert_eq!(err.errno(), Some(libc::ENOENT), "{err}");
    assert!(err.to_string().contains("/no/such/bin"), "{err}");
    // Through the shell it is the shell's 127, with its message.
    let r = c.run("no-such-program-xyz").unwrap();
    assert_eq!(r.exit, ExitInfo::exited(127));
    assert!(r.stderr_str().contains("not found"), "{r:?}");
    // The connection is fine after errors.
    c.ping().unwrap();

    // ENOENT from file ops names the path.
    for err in [
        c.read_file("/tmp/missing/file").unwrap_err(),
        c.stat("/tmp/missing").unwrap_err(),
        c.listdir("/tmp/missing").unwrap_err(),
        c.open(
            "/tmp/missing",
            OpenMode {
                read: true,
                ..OpenMode::default()
            },
            None,
        )
        .unwrap_err(),
    ] {
        assert_eq!(err.errno(), Some(libc::ENOENT), "{err}");
        let msg = err.to_string();
        assert!(
            msg.contains("/tmp/missing") && msg.contains("No such file or directory"),
            "{msg}"
        );
    }

    // EACCES as root: execve needs an execute bit, and sysctl files check
    // their mode bits whatever the caller's capabilities.
    c.write_file("/tmp/not-executable", b"#!/bin/sh\necho hi\n")
        .unwrap();
    let err = c.exec(argv("/tmp/not-executable", &[])).unwrap_err();
    assert_eq!(err.errno(), Some(libc::EACCES), "{err}");
    let msg = err.to_string();
    assert!(
        msg.contains("cannot run `/tmp/not-executable`") && msg.contains("Permission denied"),
        "{msg}"
    );
    let err = c
        .write_file("/proc/sys/kernel/osrelease", b"0.0.0")
        .unwrap_err();
    assert_eq!(err.errno(), Some(libc::EACCES), "{err}");
    let msg = err.to_string();
    assert!(
        msg.contains("/proc/sys/kernel/osrelease") && msg.contains("Permission denied"),
        "{msg}"
    );
}

#[test]
fn signalling_an_already_exited_process() {
    let (_sb, c) = sandbox("mx-kill");
    let mut p = c.spawn(spawn_sh("exit 3")).unwrap();
    wait_until("the process to exit", || !p.status().unwrap().running);
    // Exited, not yet waited for: a signal is a no-op, not an error, and
    // does not rewrite how it ended.
    p.signal(9).unwrap();
    p.signal(15).unwrap();
    assert_eq!(p.status().unwrap().exit, Some(ExitInfo::exited(3)));
    let r = p.wait(Some(Duration::from_secs(10))).unwrap();
    assert_eq!(r.exit, ExitInfo::exited(3));
    // After wait the slot is gone: a clear "unknown process" error.
    let err = p.signal(9).unwrap_err();
    assert_eq!(op_error(&err).code, ErrorCode::UnknownProcess, "{err}");
    assert!(
        err.to_string().contains(&p.handle().to_string()),
        "the error names the process: {err}"
    );
    // A process killed with SIGKILL reports -1 and the signal.
    let mut p = c.spawn(spawn_sh("sleep 30")).unwrap();
    p.signal(9).unwrap();
    let r = p.wait(Some(Duration::from_secs(10))).unwrap();
    assert_eq!(r.exit, ExitInfo::signalled(9));
    assert_eq!(r.exit.exit_code, -1);
}

#[test]
fn eight_threads_issue_mixed_ops_on_one_connection() {
    let (_sb, c) = sandbox("mx-threads");
    let agent_pid = c.syscall(getpid()).unwrap().ret;
    let threads: Vec<_> = (0..8)
        .map(|i| {
            let c = c.clone();
            thread::spawn(move || {
                for j in 0..25 {
                    let tag = format!("{i}-{j}");
                    let path = format!("/tmp/t{i}");
                    let payload = [tag.as_bytes(), b"\0", &binary(i * 1000 + j)].concat();
                    c.write_file(&path, &payload).unwrap();
                    assert_eq!(c.read_file(&path).unwrap(), payload, "{tag}");
                    assert_eq!(c.stat(&path).unwrap().size, payload.len() as u64);
                    let r = c.run(&format!("echo {tag}")).unwrap();
                    assert_eq!(r.stdout_str(), format!("{tag}\n"));
                    let h = c
                        .open(
                            &path,
                            OpenMode {
                                read: true,
                                ..OpenMode::default()
                            },
                            None,
                        )
                        .unwrap();
                    assert_eq!(c.read(h, tag.len() as u64).unwrap(), tag.as_bytes());
                    AgentOps::close(&c, h).unwrap();
                    c.ping().unwrap();
                    assert_eq!(c.syscall(getpid()).unwrap().ret, agent_pid);
                    let err = c.read_file(&format!("/tmp/none-{tag}")).unwrap_err();
                    assert!(err.to_string().contains(&tag), "{err}");
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
}

#[test]
fn two_workers_run_processes_in_parallel() {
    let (_sb, c) = sandbox("mx-workers");
    let wa = c.spawn_worker().unwrap();
    let wb = c.spawn_worker().unwrap();
    // Each waits for the file the other creates: both finish only if their
    // processes overlap. Were workers serialised, the first would time out.
    let handshake = |me: &str, other: &str| {
        ExecSpec {
        timeout_ms: Some(30_000),
        ..shell(&format!(
            "touch /tmp/{me}; while [ ! -e /tmp/{other} ]; do sleep 0.01; done; echo {me} saw {other}"
        ))
    }
    };
    let (ra, rb) = thread::scope(|s| {
        let a = s.spawn(|| wa.exec(handshake("a", "b")));
        let b = s.spawn(|| wb.exec(handshake("b", "a")));
        (a.join().unwrap().unwrap(), b.join().unwrap().unwrap())
    });
    assert_eq!(ra.exit, ExitInfo::exited(0), "worker a: {ra:?}");
    assert_eq!(rb.exit, ExitInfo::exited(0), "worker b: {rb:?}");
    assert_eq!(ra.stdout_str(), "a saw b\n");
    assert_eq!(rb.stdout_str(), "b saw a\n");
    // The same with spawned processes, one per worker, and the first one
    // waited for while the second still runs.
    let mut pa = wa
        .spawn(spawn_sh(
            "touch /tmp/pa; while [ ! -e /tmp/pb ]; do sleep 0.01; done",
        ))
        .unwrap();
    let mut pb = wb
        .spawn(spawn_sh(
            "while [ ! -e /tmp/pa ]; do sleep 0.01; done; touch /tmp/pb; while [ ! -e /tmp/pc ]; do sleep 0.01; done",
        ))
        .unwrap();
    assert!(pa.wait(Some(Duration::from_secs(30))).unwrap().success());
    assert!(pb.status().unwrap().running, "pb waits for /tmp/pc");
    wb.write_file("/tmp/pc", b"").unwrap();
    assert!(pb.wait(Some(Duration::from_secs(30))).unwrap().success());
    wa.close().unwrap();
    wb.close().unwrap();
}

#[test]
fn a_process_that_closes_stdout_keeps_running() {
    let (_sb, c) = sandbox("mx-closeout");
    let mut p = c
        .spawn(spawn_sh(
            "echo before; exec 1>&-; while [ ! -e /tmp/go ]; do sleep 0.01; done; echo after >&2",
        ))
        .unwrap();
    let mut out = p.stdout();
    let mut seen = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    while !out.is_eof() {
        assert!(Instant::now() < deadline, "stdout never ended: {seen:?}");
        if let Some(chunk) = out.next(Duration::from_secs(1)).unwrap() {
            seen.extend(chunk);
        }
    }
    assert_eq!(seen, b"before\n");
    // Its stdout ended, the process did not.
    assert!(p.status().unwrap().running);
    c.write_file("/tmp/go", b"").unwrap();
    let r = p.wait(Some(Duration::from_secs(20))).unwrap();
    assert_eq!(r.exit, ExitInfo::exited(0));
    assert_eq!(r.stderr_str(), "after\n");
    // exec: the answer comes at exit, not when stdout closes.
    let (r, finished_early) = thread::scope(|s| {
        let t = s.spawn(|| {
            c.run("echo x; exec 1>&-; touch /tmp/closed; while [ ! -e /tmp/go2 ]; do sleep 0.01; done; echo y >&2")
        });
        wait_until("stdout to be closed", || c.stat("/tmp/closed").is_ok());
        let early = t.is_finished();
        c.write_file("/tmp/go2", b"").unwrap();
        (t.join().unwrap().unwrap(), early)
    });
    assert!(!finished_early, "exec answered before the process exited");
    assert_eq!(r.exit, ExitInfo::exited(0));
    assert_eq!(
        (r.stdout_str(), r.stderr_str()),
        ("x\n".into(), "y\n".into())
    );
}

#[test]
fn timeouts_kill_the_group_and_name_the_op() {
    let (_sb, c) = sandbox("mx-timeouts");
    // exec's own timeout: the whole group dies, -2, `timed_out`.
    let r = c
        .exec(ExecSpec {
            timeout_ms: Some(300),
            ..shell("sleep 30 & echo $!; wait")
        })
        .unwrap();
    assert_eq!(r.exit, ExitInfo::timed_out());
    assert_eq!(r.exit.exit_code, -2);
    let bg = r.stdout_str().trim().to_string();
    assert!(bg.parse::<u32>().is_ok(), "{r:?}");
    // Gone, or a zombie not yet reaped by the sandbox's init.
    let probe = format!(
        "s=$(cut -d' ' -f3 /proc/{bg}/stat 2>/dev/null); if [ -z \"$s\" ] || [ \"$s\" = Z ]; then echo gone; fi"
    );
    wait_until("the background sleep to die", || {
        c.run(&probe).unwrap().stdout_str() == "gone\n"
    });
    // wait's timeout kills the spawned process.
    let mut p = c.spawn(spawn_sh("sleep 30")).unwrap();
    let r = p.wait(Some(Duration::from_millis(200))).unwrap();
    assert_eq!(r.exit, ExitInfo::timed_out());
    assert_eq!(r.exit.status, ExitStatus::TimedOut);
    // The client's per-op timeout: a clear error naming the op, and the
    // connection carries on.
    let short = c.with_timeout(Duration::from_millis(300));
    let err = short.run("sleep 3").unwrap_err();
    assert!(matches!(err, ClientError::Timeout { .. }), "{err:?}");
    assert!(
        err.to_string()
            .starts_with("agent did not answer `exec` within 300 ms"),
        "{err}"
    );
    let err = short
        .exec(ExecSpec {
            timeout_ms: Some(100),
            ..shell("sleep 3")
        })
        .unwrap();
    assert_eq!(err.exit, ExitInfo::timed_out(), "the op's own timeout wins");
    c.ping().unwrap();
    assert_eq!(c.run("echo still").unwrap().stdout_str(), "still\n");
}

#[test]
fn uname_via_syscall_with_a_buffer() {
    let (_sb, c) = sandbox("mx-uname");
    const FIELD: usize = 65;
    let r = c
        .syscall(SyscallSpec {
            nr: libc::SYS_uname,
            args: vec![0],
            bufs: vec![vec![0xff; 6 * FIELD]],
            ptrs: vec![0],
            nested: vec![],
        })
        .unwrap();
    assert_eq!((r.ret, r.errno), (0, 0));
    let buf = &r.out_bufs[0];
    assert_eq!(buf.len(), 6 * FIELD);
    let field = |i: usize| {
        let f = &buf[i * FIELD..(i + 1) * FIELD];
        let end = f
            .iter()
            .position(|b| *b == 0)
            .expect("NUL-terminated field");
        String::from_utf8_lossy(&f[..end]).into_owned()
    };
    assert_eq!(field(0), "Linux");
    // The sandbox's own UTS namespace: the VM's name.
    assert_eq!(field(1), "mx-uname");
    let host_release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
    assert_eq!(field(2), host_release.trim(), "the host's kernel");
    assert_eq!(field(4), std::env::consts::ARCH);
    // A bad pointer slot is refused before the kernel sees it.
    let err = c
        .syscall(SyscallSpec {
            nr: libc::SYS_uname,
            args: vec![0],
            bufs: vec![vec![0; 8]],
            ptrs: vec![9],
            nested: vec![],
        })
        .unwrap_err();
    assert!(
        err.to_string().contains("invalid `syscall` request"),
        "{err}"
    );
}

fn sys(c: &AgentClient, nr: i64, args: Vec<i64>) -> i64 {
    let r = c
        .syscall(SyscallSpec {
            nr,
            args,
            bufs: vec![],
            ptrs: vec![],
            nested: vec![],
        })
        .unwrap();
    assert!(r.ret >= 0, "syscall {nr}: errno {}", r.errno);
    r.ret
}

#[test]
fn nested_pointer_ioctl_siocgifconf() {
    let (_sb, c) = sandbox("mx-ioctl");
    // struct ifconf { int ifc_len; char *ifc_buf; }: the buffer is a
    // pointer inside the data the ioctl's argument points to.
    let sock = sys(
        &c,
        libc::SYS_socket,
        vec![libc::AF_INET.into(), libc::SOCK_DGRAM.into(), 0],
    );
    const IFREQ: usize = 40;
    let mut ifc = vec![0u8; 16];
    ifc[..4].copy_from_slice(&((4 * IFREQ) as i32).to_ne_bytes());
    let r = c
        .ioctl(IoctlSpec {
            fd: sock as i32,
            cmd: libc::SIOCGIFCONF,
            data: Some(ifc),
            bufs: vec![vec![0xaa; 4 * IFREQ]],
            ptr_offsets: vec![8],
        })
        .unwrap();
    assert_eq!((r.ret, r.errno), (0, 0));
    let data = r.out_data.unwrap();
    // Only `lo` has an address in the sandbox's network namespace.
    let used = i32::from_ne_bytes(data[..4].try_into().unwrap());
    assert_eq!(used as usize, IFREQ, "one ifreq filled");
    let req = &r.out_bufs[0][..IFREQ];
    assert_eq!(&req[..3], b"lo\0");
    let family = u16::from_ne_bytes(req[16..18].try_into().unwrap());
    assert_eq!(i32::from(family), libc::AF_INET);
    assert_eq!(&req[20..24], &[127, 0, 0, 1]);
    assert!(
        r.out_bufs[0][IFREQ..].iter().all(|b| *b == 0xaa),
        "the kernel wrote past what it reported"
    );
    // The pointer slot must fit the data: refused on the host.
    let err = c
        .ioctl(IoctlSpec {
            fd: sock as i32,
            cmd: libc::SIOCGIFCONF,
            data: Some(vec![0; 12]),
            bufs: vec![vec![0; 8]],
            ptr_offsets: vec![8],
        })
        .unwrap_err();
    assert!(err.to_string().contains("invalid `ioctl` request"), "{err}");
    sys(&c, libc::SYS_close, vec![sock]);
}

/// A msghdr whose iovec array points at two buffers: two levels of nesting.
fn msg_spec(fd: i64, nr: i64, parts: Vec<Vec<u8>>) -> SyscallSpec {
    let mut msghdr = vec![0u8; 56];
    msghdr[24..32].copy_from_slice(&(parts.len() as u64).to_ne_bytes());
    let mut iov = vec![0u8; 16 * parts.len()];
    for (i, p) in parts.iter().enumerate() {
        iov[16 * i + 8..16 * i + 16].copy_from_slice(&(p.len() as u64).to_ne_bytes());
    }
    let mut nested = vec![NestedPtr {
        parent: 0,
        child: 1,
        offset: 16,
    }];
    for i in 0..parts.len() {
        nested.push(NestedPtr {
            parent: 1,
            child: 2 + i as u32,
            offset: 16 * i as u32,
        });
    }
    let mut bufs = vec![msghdr, iov];
    bufs.extend(parts);
    SyscallSpec {
        nr,
        args: vec![fd, 0, 0],
        bufs,
        ptrs: vec![1],
        nested,
    }
}

#[test]
fn two_level_nested_pointers_sendmsg_recvmsg() {
    let (_sb, c) = sandbox("mx-nested");
    let r = c
        .syscall(SyscallSpec {
            nr: libc::SYS_socketpair,
            args: vec![libc::AF_UNIX.into(), libc::SOCK_DGRAM.into(), 0, 0],
            bufs: vec![vec![0; 8]],
            ptrs: vec![3],
            nested: vec![],
        })
        .unwrap();
    assert_eq!(r.ret, 0, "errno {}", r.errno);
    let fds = &r.out_bufs[0];
    let fd0 = i64::from(i32::from_ne_bytes(fds[..4].try_into().unwrap()));
    let fd1 = i64::from(i32::from_ne_bytes(fds[4..].try_into().unwrap()));
    let (a, b) = (b"head\0".to_vec(), b"\0tail\xff".to_vec());
    let sent = c
        .syscall(msg_spec(fd0, libc::SYS_sendmsg, vec![a.clone(), b.clone()]))
        .unwrap();
    assert_eq!((sent.ret, sent.errno), (11, 0));
    let got = c
        .syscall(msg_spec(
            fd1,
            libc::SYS_recvmsg,
            vec![vec![0; a.len()], vec![0; b.len()]],
        ))
        .unwrap();
    assert_eq!((got.ret, got.errno), (11, 0));
    assert_eq!(got.out_bufs[2], a);
    assert_eq!(got.out_bufs[3], b);
    // The agent wrote the child addresses into the parents: the iovec's
    // bases are real pointers, distinct and non-null.
    let base =
        |i: usize| u64::from_ne_bytes(got.out_bufs[1][16 * i..16 * i + 8].try_into().unwrap());
    assert!(base(0) != 0 && base(1) != 0 && base(0) != base(1));
    sys(&c, libc::SYS_close, vec![fd0]);
    sys(&c, libc::SYS_close, vec![fd1]);
}

/// Read until the peer closes; a reset counts as closed.
fn closed_by_peer(s: &mut UnixStream) -> bool {
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return true,
            Err(e) => panic!("reading from the agent: {e}"),
        }
    }
}

fn raw_connection(sock: &Path, handshake: bool) -> UnixStream {
    use provium_protocol::frame::{read_message, write_message, DEFAULT_MAX_FRAME_BYTES};
    use provium_protocol::{AgentFrame, Hello, HostFrame};
    let mut s = UnixStream::connect(sock).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    if handshake {
        write_message(
            &mut s,
            &HostFrame::Hello(Hello::current()),
            DEFAULT_MAX_FRAME_BYTES,
        )
        .unwrap();
        let answer: Option<AgentFrame> = read_message(&mut s, DEFAULT_MAX_FRAME_BYTES).unwrap();
        assert!(matches!(answer, Some(AgentFrame::HelloOk(_))), "{answer:?}");
    }
    s
}

#[test]
fn malformed_frames_at_the_sandbox_agent_close_only_that_connection() {
    let (sb, c) = sandbox("mx-frames");
    let cases: [(&str, bool, &[u8]); 4] = [
        ("text instead of hello", false, b"GET / HTTP/1.1\r\n\r\n"),
        (
            "undecodable body",
            true,
            &[0, 0, 0, 4, 0xc1, 0xc1, 0xc1, 0xc1],
        ),
        ("oversize length", true, &[0xff, 0xff, 0xff, 0xff, 1, 2, 3]),
        ("zero-length frame", true, &[0, 0, 0, 0]),
    ];
    for (what, handshake, bytes) in cases {
        let mut s = raw_connection(sb.socket_path(), handshake);
        s.write_all(bytes).unwrap();
        assert!(closed_by_peer(&mut s), "{what}");
        // The sandbox and its other connection live on.
        c.ping().unwrap_or_else(|e| panic!("after {what}: {e}"));
    }
    // A peer that vanishes mid-frame.
    let mut s = raw_connection(sb.socket_path(), true);
    s.write_all(&[0, 0, 1, 0, 0x81]).unwrap();
    drop(s);
    assert!(sb.is_running());
    let c2 = sb.connect().unwrap();
    assert_eq!(c2.run("echo ok").unwrap().stdout_str(), "ok\n");
    // Each refusal is logged with its reason; nothing panicked.
    let log = std::fs::read_to_string(sb.log_path()).unwrap();
    assert!(!log.contains("panicked"), "{log}");
    let closes = log.matches("closing a connection").count();
    assert!(closes >= 4, "{closes} refusals logged:\n{log}");
}

#[test]
fn what_a_sandbox_cannot_honour_fails_naming_backend_and_operation() {
    agent();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("provium.toml"),
        "[provium]\nroots = [\".\"]\n\n[profiles.linux]\nkernel = \"/nonexistent/bzImage\"\ninitrd = \"/nonexistent/initrd\"\ncmdline = \"quiet\"\nguest_os = \"linux\"\n",
    )
    .unwrap();
    std::fs::write(dir.path().join("limits.test.lua"), LIMITS_LUA).unwrap();
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_provium"))
        .args([
            "--vmm",
            "local",
            "--json",
            "--config",
            "provium.toml",
            "limits.test.lua",
        ])
        .current_dir(dir.path())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("--json output: {e}\n{stderr}"));
    let tests = v["tests"].as_array().unwrap_or_else(|| panic!("{v}"));
    let statuses: Vec<(String, String, String)> = tests
        .iter()
        .map(|t| {
            let s = |k: &str| t[k].as_str().unwrap_or("").to_string();
            (s("name"), s("status"), s("message"))
        })
        .collect();
    assert_eq!(statuses.len(), 3, "{statuses:#?}\n{stderr}");
    assert!(
        statuses.iter().all(|(_, s, _)| s == "passed"),
        "{statuses:#?}\n{stderr}"
    );
    assert_eq!(o.status.code(), Some(0), "{stderr}");
}

/// Each refusal must name the operation and the `local` backend; a local
/// snapshot holds files, so it refuses while a process runs (its memory
/// cannot be captured) and a restored VM has the files and no processes.
const LIMITS_LUA: &str = r#"
local vm = provium:vm("limits", "linux"):boot()

local function refused(t, f, ...)
  local ok, e = pcall(f)
  t:assert(not ok, "expected an error")
  e = tostring(e)
  for _, want in ipairs({...}) do t:assert_contains(e, want) end
  return e
end

test("clock set and advance are refused", function(t)
  refused(t, function() vm:clock():set(0) end, "clock:set", "local backend")
  refused(t, function() vm:clock():set_ns(0) end, "clock:set_ns", "local backend")
  refused(t, function() vm:clock():advance(3600) end, "clock:advance", "local backend")
  -- Nothing moved: the guest's clock is the host's.
  t:assert(math.abs(vm:clock():get() - os.time()) < 5)
end)

test("the kernel console is refused", function(t)
  -- vm:console() itself succeeds (the reference); its first use is refused.
  local c = vm:console()
  refused(t, function() c:read() end, "console:read", "local backend")
end)

test("snapshots hold files, not process memory", function(t)
  local pid = vm:run("sleep 300 >/dev/null 2>&1 & echo $!").stdout:gsub("%s", "")
  refused(t, function() vm:snapshot() end, "vm:snapshot", "local snapshot", "process memory", "sleep")
  vm:run("kill " .. pid):assert_ok()
  local tries = 0
  while vm:run("test -e /proc/" .. pid .. " && echo y").stdout == "y\n" do
    tries = tries + 1
    t:assert(tries < 1000, "the killed sleep was never reaped")
    vm:run("sleep 0.01")
  end
  vm:write_file("/srv/limits-kept", "kept")
  local s = vm:snapshot()
  t:assert(s:size() > 0)
  local v2 = provium:vm("limits-restored", "linux")
  v2:restore(s)
  t:assert_eq(v2:read_file("/srv/limits-kept"), "kept")
  t:assert_eq(v2:run("pgrep -x sleep || echo none").stdout, "none\n")
end)
"#;
