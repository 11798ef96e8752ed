//! The agent client against the real `provium-agent`, run directly on the
//! host on a Unix socket (no sandbox: this tests the client and the wire,
//! the local backend has its own tests). Work happens in a temp directory.
mod common;

use common::agent as agent_bin;

use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::thread;
use std::time::{Duration, Instant};

use provium::client::{AgentClient, AgentOps, ClientOptions};
use provium_protocol::op::{
    CommandSpec, ExecSpec, Op, OpenMode, SpawnSpec, SyscallSpec, TailSource, TailStart, Whence,
};
use provium_protocol::result::{EntryType, ExitStatus, OpValue};
use provium_protocol::STREAM_WINDOW_BYTES;

/// A host-run agent on a socket in its own temp dir; killed on drop.
struct Agent {
    child: Child,
    dir: PathBuf,
    socket: PathBuf,
}

impl Agent {
    fn start(tag: &str) -> Agent {
        let dir = std::env::temp_dir().join(format!("provium-client-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let socket = dir.join("agent.sock");
        let child = Command::new(agent_bin())
            .arg("--listen")
            .arg(format!("unix:{}", socket.display()))
            .arg("--no-clock")
            .spawn()
            .expect("start provium-agent");
        let agent = Agent { child, dir, socket };
        let deadline = Instant::now() + Duration::from_secs(10);
        while !agent.socket.exists() {
            assert!(Instant::now() < deadline, "agent socket never appeared");
            thread::sleep(Duration::from_millis(5));
        }
        agent
    }

    fn connect(&self) -> AgentClient {
        AgentClient::connect_unix(&self.socket, ClientOptions::default()).expect("connect")
    }

    fn path(&self, name: &str) -> String {
        self.dir.join(name).display().to_string()
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn shell(script: &str) -> ExecSpec {
    CommandSpec::shell(script).into()
}

fn spawn_spec(script: &str) -> SpawnSpec {
    SpawnSpec::shell(script)
}

#[test]
fn handshake_ping_and_exec() {
    let agent = Agent::start("exec");
    let c = agent.connect();
    assert!(!c.agent_info().agent_version.is_empty());
    c.ping().unwrap();
    let r = c.run("echo out; echo err >&2; exit 3").unwrap();
    assert_eq!(r.stdout, b"out\n");
    assert_eq!(r.stderr, b"err\n");
    assert_eq!(r.exit.status, ExitStatus::Exited);
    assert_eq!(r.exit.exit_code, 3);

    // Output far beyond the window arrives whole.
    let n = 4 * STREAM_WINDOW_BYTES + 7;
    let r = c.run(&format!("head -c {n} /dev/zero")).unwrap();
    assert!(r.success(), "{r:?}");
    assert_eq!(r.stdout.len() as u64, n);

    let mut spec = shell("sleep 10");
    spec.timeout_ms = Some(200);
    let r = c.exec(spec).unwrap();
    assert_eq!(r.exit.status, ExitStatus::TimedOut);
}

#[test]
fn concurrent_callers_share_one_connection() {
    let agent = Agent::start("concurrent");
    let c = agent.connect();
    let threads: Vec<_> = (0..8)
        .map(|i| {
            let c = c.clone();
            thread::spawn(move || {
                for j in 0..20 {
                    let r = c.run(&format!("echo {i}-{j}")).unwrap();
                    assert_eq!(r.stdout_str(), format!("{i}-{j}\n"));
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
}

#[test]
fn spawned_process_stdin_streams_signals_and_wait() {
    let agent = Agent::start("spawn");
    let c = agent.connect();

    // More stdin than the window, echoed back through cat.
    let mut p = c.spawn(spawn_spec("cat")).unwrap();
    assert!(p.pid().unwrap() > 0);
    let data: Vec<u8> = (0..(2 * STREAM_WINDOW_BYTES as usize + 99))
        .map(|i| (i % 253) as u8)
        .collect();
    let writer = {
        let data = data.clone();
        thread::scope(|s| {
            let h = s.spawn(|| p.stdin_write(&data));
            h.join().unwrap()
        })
    };
    writer.unwrap();
    p.close_stdin().unwrap();
    let r = p.wait(Some(Duration::from_secs(20))).unwrap();
    assert!(r.success(), "{:?}", r.exit);
    assert!(r.stdout == data, "cat echoed {} bytes", r.stdout.len());

    // Reading stdout while it runs.
    let mut p = c
        .spawn(spawn_spec("echo ready; sleep 0.3; echo done"))
        .unwrap();
    let mut out = p.stdout();
    let mut seen = Vec::new();
    while !String::from_utf8_lossy(&seen).contains("ready") {
        let chunk = out
            .next(Duration::from_secs(10))
            .unwrap()
            .expect("stdout ended before `ready`");
        seen.extend(chunk);
    }
    let r = p.wait(Some(Duration::from_secs(10))).unwrap();
    assert!(r.success());
    let rest = String::from_utf8_lossy(&r.stdout).into_owned();
    let all = String::from_utf8_lossy(&seen).into_owned() + &rest;
    assert_eq!(all, "ready\ndone\n");

    // Signals end a process; status reports it.
    let mut p = c.spawn(spawn_spec("sleep 100")).unwrap();
    assert!(p.status().unwrap().running);
    p.signal(9).unwrap();
    let r = p.wait(Some(Duration::from_secs(10))).unwrap();
    assert_eq!(r.exit.status, ExitStatus::Signalled);
    assert_eq!(r.exit.signal, Some(9));

    let mut p = c.spawn(spawn_spec("sleep 100")).unwrap();
    let r = p.wait(Some(Duration::from_millis(200))).unwrap();
    assert_eq!(r.exit.status, ExitStatus::TimedOut);
    let err = p.wait(Some(Duration::from_secs(1))).unwrap_err();
    assert!(err.to_string().contains("already waited"), "{err}");

    let mut p = c.spawn(spawn_spec("sleep 100")).unwrap();
    p.release().unwrap();
}

#[test]
fn files_handles_and_errors() {
    let agent = Agent::start("files");
    let c = agent.connect();
    let f = agent.path("a.txt");
    c.write_file(&f, b"hello").unwrap();
    assert_eq!(c.read_file(&f).unwrap(), b"hello");
    let st = c.stat(&f).unwrap();
    assert_eq!(st.size, 5);
    assert_eq!(st.entry_type, EntryType::File);
    let d = agent.path("sub/deeper");
    c.mkdir(&d, true, None).unwrap();
    let g = agent.path("b.txt");
    c.rename(&f, &g).unwrap();
    let mut names: Vec<String> = c
        .listdir(&agent.dir.display().to_string())
        .unwrap()
        .into_iter()
        .map(|e| e.name)
        .collect();
    names.sort();
    assert!(names.contains(&"b.txt".to_string()), "{names:?}");
    assert!(names.contains(&"sub".to_string()), "{names:?}");

    let err = c.read_file(&f).unwrap_err();
    assert_eq!(err.errno(), Some(libc::ENOENT), "{err}");
    assert!(
        err.to_string()
            .starts_with("`read_file` failed in the agent: "),
        "{err}"
    );

    let h = c
        .open(
            &g,
            OpenMode {
                read: true,
                write: true,
                ..OpenMode::default()
            },
            None,
        )
        .unwrap();
    assert_eq!(c.seek(h, 0, Whence::End).unwrap(), 5);
    assert_eq!(c.write(h, b" world").unwrap(), 6);
    assert_eq!(c.tell(h).unwrap(), 11);
    c.seek(h, 0, Whence::Set).unwrap();
    assert_eq!(c.read(h, 100).unwrap(), b"hello world");
    assert_eq!(c.read(h, 100).unwrap(), b"");
    // The inherent `close()` closes the connection; this closes the handle.
    AgentOps::close(&c, h).unwrap();
    c.unlink(&g).unwrap();
    assert!(!Path::new(&g).exists());

    // A mode with nothing to do is refused before it is sent.
    let err = c.open(&g, OpenMode::default(), None).unwrap_err();
    assert!(err.to_string().contains("invalid `open` request"), "{err}");
}

#[test]
fn tail_follows_a_growing_file() {
    let agent = Agent::start("tail");
    let c = agent.connect();
    let f = agent.path("log");
    c.write_file(&f, b"one\n").unwrap();
    let mut t = c
        .tail(TailSource::Path { path: f.clone() }, TailStart::Beginning)
        .unwrap();
    assert_eq!(t.start_offset(), Some(0));
    let mut got = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    while got != b"one\n" {
        assert!(Instant::now() < deadline, "tail gave {got:?}");
        if let Some(chunk) = t.next(Duration::from_secs(1)).unwrap() {
            got.extend(chunk);
        }
    }
    c.run(&format!("echo two >> {f}")).unwrap();
    while got != b"one\ntwo\n" {
        assert!(Instant::now() < deadline, "tail gave {got:?}");
        if let Some(chunk) = t.next(Duration::from_secs(1)).unwrap() {
            got.extend(chunk);
        }
    }
    t.close().unwrap();
    assert!(t.is_eof());
    assert_eq!(t.next(Duration::from_millis(10)).unwrap(), None);
}

#[test]
fn syscalls_clock_workers_and_batches() {
    let agent = Agent::start("misc");
    let c = agent.connect();
    let r = c
        .syscall(SyscallSpec {
            nr: libc::SYS_getpid,
            args: vec![],
            bufs: vec![],
            ptrs: vec![],
            nested: vec![],
        })
        .unwrap();
    assert_eq!(r.ret, i64::from(agent.child.id()));

    let clock = c.clock_get().unwrap();
    assert!(clock.realtime_ns > 0);
    let err = c.clock_set(0).unwrap_err();
    assert!(err.op_error().is_some(), "{err}");

    let w = c.spawn_worker().unwrap();
    let r = w.run("echo from-worker").unwrap();
    assert_eq!(r.stdout, b"from-worker\n");
    let f = agent.path("w");
    w.write_file(&f, b"x").unwrap();
    w.join().unwrap();
    w.close().unwrap();

    let results = c
        .batch(vec![
            Op::Ping,
            Op::ReadFile {
                path: agent.path("missing"),
            },
            Op::ReadFile { path: f },
        ])
        .unwrap();
    assert_eq!(results.len(), 3);
    assert_eq!(results[0], Ok(OpValue::Unit));
    assert_eq!(results[1].as_ref().unwrap_err().errno, Some(libc::ENOENT));
    assert_eq!(results[2], Ok(OpValue::Bytes(b"x".to_vec())));
}

#[test]
fn agent_death_wakes_pending_calls() {
    let mut agent = Agent::start("death");
    let c = agent.connect();
    let c2 = c.clone();
    let t = thread::spawn(move || c2.run("sleep 100"));
    thread::sleep(Duration::from_millis(200));
    agent.child.kill().unwrap();
    agent.child.wait().unwrap();
    let started = Instant::now();
    let err = t.join().unwrap().unwrap_err();
    assert!(
        err.to_string().starts_with("agent connection closed: "),
        "{err}"
    );
    assert!(started.elapsed() < Duration::from_secs(30));
    assert!(c.ping().unwrap_err().is_connection_lost());
}
