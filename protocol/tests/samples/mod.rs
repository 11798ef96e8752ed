//! One sample of every wire variant, shared by the pin and strictness tests.

use std::collections::BTreeMap;

use provium_protocol::event::*;
use provium_protocol::handshake::{Hello, HelloErr, HelloOk};
use provium_protocol::meta::{MetaMap, MetaValue};
use provium_protocol::op::*;
use provium_protocol::result::*;
use provium_protocol::wire::*;
use provium_protocol::{AgentFrame, EventFrame, HostFrame, Op};

pub fn ops() -> Vec<Op> {
    let env: BTreeMap<String, String> = [("K".to_string(), "v".to_string())].into();
    vec![
        Op::Ping,
        Op::Exec(ExecSpec {
            run: CommandSpec {
                command: Command::Shell {
                    script: "echo hi".into(),
                },
                env: env.clone(),
                env_clear: false,
                cwd: Some("/tmp".into()),
                stdin: Some(b"in".to_vec()),
            },
            timeout_ms: Some(5000),
        }),
        Op::Spawn(SpawnSpec {
            command: Command::Argv {
                program: "cat".into(),
                args: vec!["-u".into()],
            },
            env,
            env_clear: true,
            cwd: None,
            stdin: None,
        }),
        Op::StdinClose { process: 7 },
        Op::Wait {
            process: 7,
            timeout_ms: None,
        },
        Op::Signal {
            process: 7,
            signal: 15,
        },
        Op::ProcessStatus { process: 7 },
        Op::Pid { process: 7 },
        Op::Release { process: 7 },
        Op::ReadFile {
            path: "/etc/hostname".into(),
        },
        Op::WriteFile {
            path: "/tmp/a".into(),
            data: b"1".to_vec(),
        },
        Op::Stat {
            path: "/tmp/a".into(),
        },
        Op::ListDir {
            path: "/tmp".into(),
        },
        Op::Mkdir {
            path: "/tmp/d/e".into(),
            parents: true,
            perm: Some(0o750),
        },
        Op::Unlink {
            path: "/tmp/a".into(),
        },
        Op::Rename {
            from: "/tmp/a".into(),
            to: "/tmp/b".into(),
        },
        Op::Open {
            path: "/tmp/f".into(),
            mode: OpenMode {
                read: true,
                write: true,
                create: true,
                truncate: false,
                append: false,
                exclusive: true,
            },
            perm: Some(0o600),
        },
        Op::Read {
            handle: 3,
            len: 4096,
        },
        Op::Write {
            handle: 3,
            data: b"xyz".to_vec(),
        },
        Op::Seek {
            handle: 3,
            offset: -2,
            whence: Whence::End,
        },
        Op::Tell { handle: 3 },
        Op::Close { handle: 3 },
        Op::Tail {
            source: TailSource::Path {
                path: "/var/log/m".into(),
            },
            start: TailStart::FromEnd { bytes: 512 },
        },
        Op::Tail {
            source: TailSource::Handle { handle: 3 },
            start: TailStart::Offset { offset: 10 },
        },
        Op::Tail {
            source: TailSource::Path { path: "/l".into() },
            start: TailStart::Beginning,
        },
        Op::Tail {
            source: TailSource::Path { path: "/l".into() },
            start: TailStart::End,
        },
        Op::CloseStream { stream: 9 },
        Op::Syscall(SyscallSpec {
            nr: 16,
            args: vec![3, 0x5401, 0],
            bufs: vec![vec![0; 16], vec![1, 2]],
            ptrs: vec![2],
            nested: vec![NestedPtr {
                parent: 0,
                child: 1,
                offset: 8,
            }],
        }),
        Op::Ioctl(IoctlSpec {
            fd: 0,
            cmd: 0x541b,
            data: Some(vec![0; 4]),
            bufs: vec![],
            ptr_offsets: vec![],
        }),
        Op::ClockGet,
        Op::ClockSet {
            realtime_ns: -1_000_000_000,
        },
        Op::ClockAdvance {
            delta_ns: 3_600_000_000_000,
        },
        Op::WorkerSpawn,
        Op::WorkerJoin { worker: 2 },
        Op::WorkerKill {
            worker: 2,
            signal: 9,
        },
        Op::WorkerClose { worker: 2 },
        Op::Batch {
            ops: vec![Op::Ping, Op::Stat { path: "/x".into() }],
        },
    ]
}

pub fn values() -> Vec<OpValue> {
    vec![
        OpValue::Unit,
        OpValue::Exit(ExitInfo::exited(3)),
        OpValue::Exit(ExitInfo::signalled(9)),
        OpValue::Exit(ExitInfo::timed_out()),
        OpValue::Ran {
            exit: ExitInfo::exited(0),
            stdout: b"hi\n".to_vec(),
            stderr: vec![],
        },
        OpValue::Spawned { pid: 42 },
        OpValue::ProcessStatus(ProcessState {
            running: false,
            pid: 42,
            exit: Some(ExitInfo::exited(0)),
        }),
        OpValue::Pid { pid: 42 },
        OpValue::Bytes(b"data".to_vec()),
        OpValue::Stat(StatInfo {
            size: 5,
            mtime_ns: 1_700_000_000_123_456_789,
            perm: 0o644,
            entry_type: EntryType::File,
        }),
        OpValue::Entries(vec![DirEntry {
            name: "a".into(),
            entry_type: EntryType::Directory,
        }]),
        OpValue::Handle { handle: 3 },
        OpValue::Written { bytes: 3 },
        OpValue::Offset { offset: 10 },
        OpValue::Tail {
            stream: 9,
            offset: 100,
        },
        OpValue::Syscall(SyscallResult {
            ret: 0,
            errno: 0,
            out_bufs: vec![],
        }),
        OpValue::Syscall(SyscallResult {
            ret: -1,
            errno: 25,
            out_bufs: vec![vec![1, 2]],
        }),
        OpValue::Ioctl(IoctlResult {
            ret: 0,
            errno: 0,
            out_data: Some(vec![0, 0, 0, 5]),
            out_bufs: vec![],
        }),
        OpValue::Clock {
            realtime_ns: 1,
            monotonic_ns: 2,
        },
        OpValue::Worker { worker: 2 },
        OpValue::Batch(vec![
            OpResult::Ok(OpValue::Unit),
            OpResult::Err(OpError {
                code: ErrorCode::Io,
                errno: Some(2),
                message: "No such file or directory".into(),
            }),
        ]),
    ]
}

pub fn host_frames() -> Vec<(String, HostFrame)> {
    let mut out = vec![(
        "hello".to_string(),
        HostFrame::Hello(Hello {
            protocol_version: 1,
        }),
    )];
    for (i, op) in ops().into_iter().enumerate() {
        let worker = if i == 0 { Some(2) } else { None };
        out.push((
            format!("request.{}.{i}", op.kind()),
            HostFrame::Request(Request {
                id: i as u64 + 1,
                worker,
                op,
            }),
        ));
    }
    out.push((
        "stdin_data".into(),
        HostFrame::StdinData(StdinData {
            process: 7,
            data: b"abc".to_vec(),
        }),
    ));
    out.push((
        "stream_ack".into(),
        HostFrame::StreamAck(StreamAck {
            stream: 7,
            channel: Channel::Stdout,
            bytes: 4096,
        }),
    ));
    out
}

pub fn agent_frames() -> Vec<(String, AgentFrame)> {
    let mut out = vec![
        (
            "hello_ok".to_string(),
            AgentFrame::HelloOk(HelloOk {
                agent_version: "0.1.0".into(),
                guest_os: "linux 6.1.0 x86_64".into(),
                agent_features: vec!["clock_set".into()],
            }),
        ),
        (
            "hello_err".to_string(),
            AgentFrame::HelloErr(HelloErr {
                agent_protocol_version: 1,
                host_protocol_version: 2,
                message: "protocol version mismatch".into(),
            }),
        ),
    ];
    for (i, value) in values().into_iter().enumerate() {
        let name = format!("response.ok.{i}");
        out.push((
            name,
            AgentFrame::Response(Response {
                id: 1,
                result: OpResult::Ok(value),
            }),
        ));
    }
    for code in ErrorCode::ALL {
        out.push((
            format!("response.err.{code}"),
            AgentFrame::Response(Response {
                id: 2,
                result: OpResult::Err(OpError {
                    code: *code,
                    errno: None,
                    message: "m".into(),
                }),
            }),
        ));
    }
    for ch in Channel::ALL {
        out.push((
            format!("stream_chunk.{ch}"),
            AgentFrame::StreamChunk(StreamChunk {
                stream: 7,
                channel: *ch,
                data: b"out".to_vec(),
            }),
        ));
    }
    for reason in StreamEndReason::ALL {
        out.push((
            format!("stream_end.{reason}"),
            AgentFrame::StreamEnd(StreamEnd {
                stream: 7,
                channel: Channel::Stdout,
                reason: *reason,
                message: None,
            }),
        ));
    }
    out.push((
        "stdin_ack".into(),
        AgentFrame::StdinAck(StdinAck {
            process: 7,
            bytes: 3,
        }),
    ));
    out
}

pub fn meta() -> MetaMap {
    let mut m = MetaMap::new();
    m.insert("null".into(), MetaValue::Null);
    m.insert("bool".into(), MetaValue::Bool(true));
    m.insert("int".into(), MetaValue::Int(-5));
    m.insert("float".into(), MetaValue::Float(1.5));
    m.insert("str".into(), MetaValue::Str("s".into()));
    m.insert("bytes".into(), MetaValue::Bytes(b"utf8".to_vec()));
    m.insert("array".into(), MetaValue::Array(vec![MetaValue::Int(1)]));
    m.insert(
        "map".into(),
        MetaValue::Map([("k".to_string(), MetaValue::Null)].into()),
    );
    m
}

pub fn events() -> Vec<(String, EventFrame)> {
    let r = ResourceAmount {
        memory_bytes: 268435456,
        cpus: 2,
    };
    let events = vec![
        Event::FileDiscovered(FileDiscovered {
            path: "a.test.lua".into(),
            fixture_refs: vec!["base".into()],
            declared_claim: Some(r),
        }),
        Event::FileDispatched(FileDispatched {
            path: "a.test.lua".into(),
            reservation: r,
        }),
        Event::FileBlocked(FileBlocked {
            path: "a.test.lua".into(),
            waiting_for: r,
            reason: "pool_full".into(),
        }),
        Event::FileCompleted(FileCompleted {
            path: "a.test.lua".into(),
            status: FileStatus::TimedOut,
            duration_ns: 5,
        }),
        Event::TestStarted(TestStarted {
            path: "a.test.lua".into(),
            name: "t".into(),
            meta: meta(),
        }),
        Event::TestPassed(TestPassed {
            path: "a.test.lua".into(),
            name: "t".into(),
            duration_ns: 1,
            meta: MetaMap::new(),
        }),
        Event::TestFailed(TestFailed {
            path: "a.test.lua".into(),
            name: "t".into(),
            duration_ns: 1,
            reason: "assert".into(),
            console_excerpt: "".into(),
            meta: MetaMap::new(),
        }),
        Event::TestSkipped(TestSkipped {
            path: "a.test.lua".into(),
            name: "t".into(),
            reason: "todo".into(),
            meta: MetaMap::new(),
        }),
        Event::VmSpawned(VmSpawned {
            file: "a.test.lua".into(),
            vm_name: "v".into(),
            profile: "p".into(),
            memory_bytes: 1,
            cid: 3,
        }),
        Event::VmShutdown(VmShutdown {
            file: "a.test.lua".into(),
            vm_name: "v".into(),
            duration_ns: 9,
        }),
        Event::PoolState(PoolState {
            used: r,
            available: r,
        }),
        Event::ClaimAcquired(ClaimAcquired {
            path: "a.test.lua".into(),
            amount: r,
        }),
        Event::ClaimReleased(ClaimReleased {
            path: "a.test.lua".into(),
            amount: r,
        }),
        Event::FixtureBuildStarted(FixtureBuildStarted {
            path: "base".into(),
        }),
        Event::FixtureBuildDone(FixtureBuildDone {
            path: "base".into(),
            duration_ns: 2,
            snapshot_bytes: 3,
        }),
        Event::FixtureBuildWaiting(FixtureBuildWaiting {
            path: "base".into(),
            held_by_file: "b.test.lua".into(),
        }),
        Event::FixtureCacheHit(FixtureCacheHit {
            path: "base".into(),
        }),
        Event::RunStarted(RunStarted {
            run_id: "5f3c2a1b".into(),
            suite_id: "9e8d7c6b".into(),
            suite_files: 3,
            partition: Some("count:1/3".into()),
        }),
        Event::VmForked(VmForked {
            file: "a.test.lua".into(),
            source: "a".into(),
            copies: vec!["a.1".into(), "a.2".into()],
            source_paused_ns: 5,
        }),
    ];
    events
        .into_iter()
        .map(|e| {
            (
                e.kind().to_string(),
                EventFrame {
                    ts: 1_700_000_000_000_000_000,
                    event: e,
                },
            )
        })
        .collect()
}
