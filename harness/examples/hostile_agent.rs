//! A test-only double of `provium-agent` that misbehaves on purpose
//! (harness/tests/hostile_agent.rs; docs/reliability.md, "A hostile agent").
//!
//! It is started where the real agent would be (`PROVIUM_AGENT` points at
//! it) with the real agent's arguments. The local backend names the sandbox
//! after the VM (`PROVIUM_SANDBOX`): a VM named `hostile-<mode>` gets the
//! misbehaving double; any other VM gets the real agent, exec'ed from
//! `../provium-agent` next to this example's directory (`target/<profile>/`),
//! so the other VMs of a file behave normally.
//!
//! The double listens, answers every Hello with a valid HelloOk, and
//! misbehaves on the first request of a connection according to `<mode>`:
//! - `garbage`: a 4096-byte frame of random bytes, then 1 MiB more;
//! - `hugelen`: a frame whose length field is 2^32-1, then bytes forever;
//! - `stall`: a 1000-byte frame of which 10 bytes come, then nothing;
//! - `unknownid`: an answer to a request id never sent, and no other;
//! - `dupanswer`: a correct exec answer, sent twice;
//! - `dupend`: the exec's stdout ended twice;
//! - `flood`: stdout chunks at full speed (within the window) that never end;
//! - `stdin`: spawn succeeds, stdin is never acknowledged;
//! - `connflood`: exec's script is a Unix socket path; opens `CONNFLOOD`
//!   connections to it (fewer if the exec's timeout plus
//!   `CONNFLOOD_DEADLINE` passes first) and answers with how many succeeded
//!   of how many tried.
//!
//! Afterwards it keeps the connection open and reads (and ignores)
//! whatever the host sends, until the host hangs up or the sandbox is killed.
//!
//! In a kvm guest (harness/tests/hostile_guest.rs) it is the overlay's
//! `/sbin/provium-agent`, started as PID 1 (`rdinit=`), and there is no
//! sandbox name, so one guest serves every mode, chosen per request:
//! - PID 1 forks. The parent stays PID 1 and execs the real agent, which the
//!   overlay ships as [`REAL_AGENT`], told to listen on [`REAL_SOCKET`]; as
//!   PID 1 the real agent mounts /proc and friends, forks, and execs the
//!   initrd's `/init`, so the guest boots as usual.
//! - The child (the double) listens on the agent's vsock port and relays
//!   each host connection, frame by frame, to the real agent: the Hello and
//!   every healthy request get the real agent's answers (fixture builds and
//!   restores work as with the real agent).
//! - A request `exec("hostile:<mode>")` ends the relay of that connection:
//!   the double answers it itself, misbehaving as above. `connflood` there
//!   (`hostile:connflood:<count>`) opens `<count>` (default `CONNFLOOD`)
//!   AF_VSOCK connections to the host (CID 2), on the agent's port.
//!
//! With `provium.agent_channel=console` on the kernel command line (the
//! profile's `agent_channel = "console"`), the double serves the
//! virtio-console port `org.provium.agent` instead of vsock: one session at
//! a time, as the real agent does (docs/agent.md, "Channels"), each bridged
//! to a socketpair whose other end is relayed as above, so every mode's
//! bytes cross the console channel.

use std::io::{Read, Write};
use std::os::fd::FromRawFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use provium_protocol::frame::{read_message, write_message, DEFAULT_MAX_FRAME_BYTES};
use provium_protocol::handshake::HelloOk;
use provium_protocol::op::{Command, Op};
use provium_protocol::result::{ExitInfo, OpResult, OpValue};
use provium_protocol::wire::{
    AgentFrame, Channel, HostFrame, Request, Response, StreamChunk, StreamEnd, StreamEndReason,
};
use provium_protocol::{AGENT_VSOCK_PORT, MAX_CHUNK_BYTES, STREAM_WINDOW_BYTES};

/// Connections `connflood` opens.
const CONNFLOOD: usize = 4000;
/// How long `connflood` may try beyond the exec's own timeout, if it has
/// not opened all its connections yet: an emulated guest kernel (kvm_pvm)
/// takes tens of ms a connect, and the answer must come before the host's
/// deadline for the call (its op timeout, at least 60 s, plus the exec's
/// timeout).
const CONNFLOOD_DEADLINE: Duration = Duration::from_secs(40);

/// Where the kvm guest's overlay puts the real agent.
const REAL_AGENT: &str = "/sbin/provium-agent-real";
/// Where the real agent listens in a kvm guest: on the initramfs root,
/// which nothing mounts over (the agent and /init mount /proc, /sys, /dev,
/// /tmp and /run).
const REAL_SOCKET: &str = "/.provium-real-agent.sock";
/// The request that turns a relayed connection hostile: `exec("hostile:<mode>")`.
const HOSTILE_PREFIX: &str = "hostile:";
/// The host's vsock CID (virtio 1.2, 5.10).
const HOST_CID: u32 = 2;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if std::process::id() == 1 {
        guest_main(&args);
    }
    let name = std::env::var("PROVIUM_SANDBOX").unwrap_or_default();
    let Some(mode) = name.strip_prefix("hostile-").map(str::to_string) else {
        exec_real_agent(&args);
    };
    let Some(path) = args
        .iter()
        .position(|a| a == "--listen")
        .and_then(|i| args.get(i + 1))
        .and_then(|a| a.strip_prefix("unix:"))
    else {
        eprintln!("hostile_agent: expected `--listen unix:PATH` in {args:?}");
        std::process::exit(2);
    };
    let _ = std::fs::remove_file(path);
    let listener = UnixListener::bind(path).unwrap_or_else(|e| {
        eprintln!("hostile_agent: bind {path}: {e}");
        std::process::exit(2);
    });
    eprintln!("hostile_agent: mode `{mode}` on {path}");
    for conn in listener.incoming() {
        let Ok(conn) = conn else { continue };
        let mode = mode.clone();
        std::thread::spawn(move || serve(conn, &mode));
    }
}

/// Replace this process with the real agent (same arguments).
fn exec_real_agent(args: &[String]) -> ! {
    use std::os::unix::process::CommandExt;
    let me = std::path::Path::new(&args[0]);
    let real = me
        .parent()
        .and_then(|d| d.parent())
        .map(|d| d.join("provium-agent"))
        .unwrap_or_default();
    let err = std::process::Command::new(&real).args(&args[1..]).exec();
    eprintln!(
        "hostile_agent: cannot exec the real agent {}: {err}",
        real.display()
    );
    std::process::exit(2);
}

fn send(conn: &mut UnixStream, frame: &AgentFrame) -> bool {
    write_message(conn, frame, DEFAULT_MAX_FRAME_BYTES).is_ok()
}

fn recv(conn: &mut UnixStream) -> Option<HostFrame> {
    read_message(conn, DEFAULT_MAX_FRAME_BYTES).ok().flatten()
}

fn serve(mut conn: UnixStream, mode: &str) {
    match recv(&mut conn) {
        Some(HostFrame::Hello(_)) => {}
        _ => return,
    }
    let ok = AgentFrame::HelloOk(HelloOk {
        agent_version: "0.0.0-hostile".into(),
        guest_os: format!("hostile double ({mode})"),
        agent_features: Vec::new(),
    });
    if !send(&mut conn, &ok) {
        return;
    }
    let req = loop {
        match recv(&mut conn) {
            Some(HostFrame::Request(r)) => break r,
            Some(_) => continue,
            None => return,
        }
    };
    misbehave(&mut conn, mode, &req);
    // Keep the connection open; ignore what the host sends.
    let mut sink = [0u8; 64 * 1024];
    while matches!(conn.read(&mut sink), Ok(n) if n > 0) {}
}

fn answer(id: u64, value: OpValue) -> AgentFrame {
    AgentFrame::Response(Response {
        id,
        result: OpResult::Ok(value),
    })
}

fn end(stream: u64, channel: Channel) -> AgentFrame {
    AgentFrame::StreamEnd(StreamEnd {
        stream,
        channel,
        reason: StreamEndReason::Eof,
        message: None,
    })
}

fn misbehave(conn: &mut UnixStream, mode: &str, req: &Request) {
    let id = req.id;
    match mode {
        "garbage" => {
            // A frame of a plausible length whose body is a fixed xorshift
            // stream (no valid msgpack, the same every run), then more.
            let _ = conn.write_all(&4096u32.to_be_bytes());
            let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
            let bytes: Vec<u8> = (0..1 << 20)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    (x >> 24) as u8 | 0x80
                })
                .collect();
            let _ = conn.write_all(&bytes);
        }
        "hugelen" => {
            let _ = conn.write_all(&u32::MAX.to_be_bytes());
            let junk = vec![0x5a_u8; 1 << 20];
            while conn.write_all(&junk).is_ok() {}
        }
        "stall" => {
            let _ = conn.write_all(&1000u32.to_be_bytes());
            let _ = conn.write_all(&[0x82; 10]);
            std::thread::sleep(Duration::from_secs(100_000));
        }
        "unknownid" => {
            let _ = send(conn, &answer(id + 1000, OpValue::Unit));
        }
        "dupanswer" | "dupend" => {
            for ch in [Channel::Stdout, Channel::Stderr] {
                let _ = send(conn, &end(id, ch));
            }
            if mode == "dupend" {
                let _ = send(conn, &end(id, Channel::Stdout));
            }
            let done = answer(id, OpValue::Exit(ExitInfo::exited(0)));
            let _ = send(conn, &done);
            let _ = send(conn, &done);
        }
        "flood" => flood(conn, id),
        "stdin" => {
            // Spawned; whatever stdin comes is never acknowledged.
            let _ = send(conn, &answer(id, OpValue::Spawned { pid: 4242 }));
        }
        "connflood" => {
            let target = shell_script(req).unwrap_or_default().trim().to_string();
            // In a guest the script is `hostile:connflood[:<count>]`:
            // connect to the host over vsock; locally it is a Unix socket
            // path.
            let vsock = target.starts_with(HOSTILE_PREFIX);
            let count = target
                .strip_prefix("hostile:connflood:")
                .and_then(|n| n.parse().ok())
                .unwrap_or(CONNFLOOD);
            // Answer before the host gives up on the call: its deadline is
            // its op timeout (at least 60 s) plus the command's timeout.
            let timeout_ms = match &req.op {
                Op::Exec(spec) => spec.timeout_ms.unwrap_or(0),
                _ => 0,
            };
            let budget = Duration::from_millis(timeout_ms) + CONNFLOOD_DEADLINE;
            let mut held = Vec::new();
            let mut refused = String::new();
            let started = Instant::now();
            let mut tried = 0;
            while tried < count && started.elapsed() < budget {
                tried += 1;
                let conn = if vsock {
                    vsock_connect(HOST_CID, AGENT_VSOCK_PORT)
                } else {
                    UnixStream::connect(&target)
                };
                match conn {
                    Ok(c) => held.push(c),
                    Err(e) => refused = e.to_string(),
                }
            }
            let report = format!(
                "connected {} of {tried} in {} ms: {refused}\n",
                held.len(),
                started.elapsed().as_millis()
            );
            let _ = send(
                conn,
                &AgentFrame::StreamChunk(StreamChunk {
                    stream: id,
                    channel: Channel::Stdout,
                    data: report.into_bytes(),
                }),
            );
            for ch in [Channel::Stdout, Channel::Stderr] {
                let _ = send(conn, &end(id, ch));
            }
            let _ = send(conn, &answer(id, OpValue::Exit(ExitInfo::exited(0))));
            std::mem::forget(held);
        }
        other => {
            eprintln!("hostile_agent: unknown mode `{other}`");
            std::process::exit(2);
        }
    }
}

/// Stdout of request `id` at full speed, never ending, keeping within the
/// stream window (acks are read as they come), so only a cap on what the
/// host collects can stop it.
fn flood(conn: &mut UnixStream, id: u64) {
    let Ok(mut acks) = conn.try_clone() else {
        return;
    };
    let unacked = std::sync::Arc::new((std::sync::Mutex::new(0u64), std::sync::Condvar::new()));
    let u2 = unacked.clone();
    std::thread::spawn(move || {
        while let Some(frame) = recv(&mut acks) {
            if let HostFrame::StreamAck(a) = frame {
                let (m, c) = &*u2;
                let mut n = m.lock().unwrap();
                *n = n.saturating_sub(a.bytes);
                c.notify_all();
            }
        }
        let (m, c) = &*u2;
        *m.lock().unwrap() = u64::MAX;
        c.notify_all();
    });
    let chunk = vec![b'y'; MAX_CHUNK_BYTES];
    let (m, c) = &*unacked;
    loop {
        {
            let mut n = m.lock().unwrap();
            while *n != u64::MAX && *n + chunk.len() as u64 > STREAM_WINDOW_BYTES {
                n = c.wait(n).unwrap();
            }
            if *n == u64::MAX {
                return;
            }
            *n += chunk.len() as u64;
        }
        let frame = AgentFrame::StreamChunk(StreamChunk {
            stream: id,
            channel: Channel::Stdout,
            data: chunk.clone(),
        });
        if !send(conn, &frame) {
            return;
        }
    }
}

/// The script of an `exec` request in shell form.
fn shell_script(req: &Request) -> Option<&str> {
    match &req.op {
        Op::Exec(spec) => match &spec.run.command {
            Command::Shell { script } => Some(script),
            _ => None,
        },
        _ => None,
    }
}

/// PID 1 in a kvm guest (module docs): fork; the parent becomes the real
/// agent, the child relays the agent's vsock port to it.
fn guest_main(args: &[String]) -> ! {
    use std::os::unix::process::CommandExt;
    // SAFETY: still single-threaded, so the child may run anything.
    match unsafe { libc::fork() } {
        -1 => eprintln!("hostile_agent: fork: {}", std::io::Error::last_os_error()),
        0 => relay_main(args),
        _ => {}
    }
    let err = std::process::Command::new(REAL_AGENT)
        .args(["--listen", &format!("unix:{REAL_SOCKET}")])
        .exec();
    // PID 1 must not exit (the kernel panics): say why and wait forever.
    eprintln!("hostile_agent: cannot exec the real agent {REAL_AGENT}: {err}");
    loop {
        std::thread::sleep(Duration::from_secs(3600));
    }
}

/// The double proper in a guest: waits for the real agent's socket, then
/// relays every connection on the agent's vsock port.
fn relay_main(args: &[String]) -> ! {
    let port = args
        .iter()
        .position(|a| a == "--listen")
        .and_then(|i| args.get(i + 1))
        .and_then(|a| a.strip_prefix("vsock:"))
        .and_then(|p| p.parse().ok())
        .unwrap_or(AGENT_VSOCK_PORT);
    // The real agent mounts and forks before it binds: poll for its socket.
    let deadline = Instant::now() + Duration::from_secs(600);
    while UnixStream::connect(REAL_SOCKET).is_err() {
        if Instant::now() > deadline {
            eprintln!("hostile_agent: the real agent never listened on {REAL_SOCKET}");
            std::process::exit(2);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    if console_channel() {
        console_relay_main();
    }
    let listener = vsock_listen(port).unwrap_or_else(|e| {
        eprintln!("hostile_agent: listen on vsock port {port}: {e}");
        std::process::exit(2);
    });
    eprintln!(
        "hostile_agent: relaying vsock:{port} to {REAL_SOCKET}; \
         `exec(\"{HOSTILE_PREFIX}<mode>\")` turns a connection hostile"
    );
    loop {
        use std::os::fd::AsRawFd;
        // SAFETY: accept4 on our listener; the peer address is not wanted.
        let fd = unsafe {
            libc::accept4(
                listener.as_raw_fd(),
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                libc::SOCK_CLOEXEC,
            )
        };
        if fd < 0 {
            continue;
        }
        // SAFETY: a fresh fd nothing else owns; see vsock_socket for why a
        // UnixStream can hold it.
        let conn = unsafe { UnixStream::from_raw_fd(fd) };
        std::thread::spawn(move || relay(conn));
    }
}

/// Whether the harness put the agent on the console channel.
fn console_channel() -> bool {
    std::fs::read_to_string("/proc/cmdline").is_ok_and(|c| {
        c.split_whitespace()
            .any(|w| w == "provium.agent_channel=console")
    })
}

/// The console port's /dev path, once the driver has named it.
fn console_port_path() -> String {
    loop {
        if let Ok(dir) = std::fs::read_dir("/sys/class/virtio-ports") {
            for e in dir.flatten() {
                let named = std::fs::read_to_string(e.path().join("name"))
                    .is_ok_and(|n| n.trim_end() == "org.provium.agent");
                if named {
                    return format!("/dev/{}", e.file_name().to_string_lossy());
                }
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Serves the console port's sessions one after another: open the port,
/// wait for the host (POLLHUP while none), bridge the session to a
/// socketpair relayed to the real agent until the port reads end of file,
/// close the port (so the device may start the next session) and again.
fn console_relay_main() -> ! {
    use std::os::fd::AsRawFd;
    let path = console_port_path();
    eprintln!("hostile_agent: relaying console port {path} to {REAL_SOCKET}");
    loop {
        let port = match std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
        {
            Ok(f) => f,
            Err(e) => {
                eprintln!("hostile_agent: open {path}: {e}");
                std::thread::sleep(Duration::from_secs(1));
                continue;
            }
        };
        loop {
            let mut p = libc::pollfd {
                fd: port.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one valid pollfd for the call.
            unsafe { libc::poll(&mut p, 1, 0) };
            if p.revents & libc::POLLHUP == 0 {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let (Ok((mine, theirs)), Ok(mut port_r), Ok(mut port_w)) =
            (UnixStream::pair(), port.try_clone(), port.try_clone())
        else {
            std::thread::sleep(Duration::from_secs(1));
            continue;
        };
        let Ok(mut from_relay) = mine.try_clone() else {
            continue;
        };
        let relayed = std::thread::spawn(move || relay(theirs));
        let writer = std::thread::spawn(move || {
            let _ = std::io::copy(&mut from_relay, &mut port_w);
        });
        // Until the session ends: the host closed, or the device ended it.
        let _ = std::io::copy(&mut port_r, &mut &mine);
        let _ = mine.shutdown(std::net::Shutdown::Both);
        // A mode that writes forever blocks its writer on a port whose host
        // is gone: that guest serves no further session, which no test asks.
        let _ = writer.join();
        let _ = relayed.join();
    }
}

/// The raw bytes of one frame (length prefix included), or None at EOF or
/// on a frame over the cap.
fn read_raw_frame(conn: &mut UnixStream) -> Option<Vec<u8>> {
    let mut len = [0u8; 4];
    conn.read_exact(&mut len).ok()?;
    let body = usize::try_from(u32::from_be_bytes(len)).ok()?;
    if body > DEFAULT_MAX_FRAME_BYTES {
        return None;
    }
    let mut frame = vec![0u8; 4 + body];
    frame[..4].copy_from_slice(&len);
    conn.read_exact(&mut frame[4..]).ok()?;
    Some(frame)
}

/// Relays one host connection to a fresh connection to the real agent until
/// the host asks for `hostile:<mode>`; then the double answers that request
/// itself and the real agent's side goes quiet.
fn relay(host: UnixStream) {
    let Ok(mut real) = UnixStream::connect(REAL_SOCKET) else {
        return;
    };
    let (Ok(mut host_reader), Ok(mut real_reader)) = (host.try_clone(), real.try_clone()) else {
        return;
    };
    // The host side's writer; None once the connection turned hostile, so a
    // late answer of the real agent never interleaves with the double's.
    let to_host = Arc::new(Mutex::new(Some(host)));
    let to_host2 = to_host.clone();
    std::thread::spawn(move || {
        while let Some(frame) = read_raw_frame(&mut real_reader) {
            let mut w = to_host2.lock().unwrap();
            let Some(host) = w.as_mut() else { return };
            if host.write_all(&frame).is_err() {
                return;
            }
        }
        if let Some(host) = to_host2.lock().unwrap().as_ref() {
            let _ = host.shutdown(std::net::Shutdown::Both);
        }
    });
    while let Some(frame) = read_raw_frame(&mut host_reader) {
        let decoded = read_message::<HostFrame, _>(&mut &frame[..], DEFAULT_MAX_FRAME_BYTES);
        if let Ok(Some(HostFrame::Request(req))) = decoded {
            let mode = shell_script(&req).and_then(|s| s.trim().strip_prefix(HOSTILE_PREFIX));
            if let Some(mode) = mode.map(str::to_string) {
                let Some(mut host) = to_host.lock().unwrap().take() else {
                    return;
                };
                let _ = real.shutdown(std::net::Shutdown::Both);
                eprintln!("hostile_agent: request {}: mode `{mode}`", req.id);
                misbehave(&mut host, &mode, &req);
                let mut sink = [0u8; 64 * 1024];
                while matches!(host.read(&mut sink), Ok(n) if n > 0) {}
                return;
            }
        }
        if real.write_all(&frame).is_err() {
            return;
        }
    }
    let _ = real.shutdown(std::net::Shutdown::Both);
}

/// A vsock stream socket. The double holds its connections as
/// `UnixStream`s: it only reads, writes, clones (dup) and shuts them down,
/// which work on any stream socket, whatever its address family (std's
/// accept and peer-address calls, which do not, are never used on them).
fn vsock_socket() -> std::io::Result<std::os::fd::OwnedFd> {
    // SAFETY: plain socket(2); the fd is owned from here on.
    let fd = unsafe { libc::socket(libc::AF_VSOCK, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a fresh fd nothing else owns.
    Ok(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) })
}

fn vsock_addr(cid: u32, port: u32) -> libc::sockaddr_vm {
    // SAFETY: sockaddr_vm is plain data; all-zero is a valid value.
    let mut addr: libc::sockaddr_vm = unsafe { std::mem::zeroed() };
    addr.svm_family = libc::AF_VSOCK as libc::sa_family_t;
    addr.svm_cid = cid;
    addr.svm_port = port;
    addr
}

const SOCKADDR_VM_LEN: libc::socklen_t =
    std::mem::size_of::<libc::sockaddr_vm>() as libc::socklen_t;

/// A listener on vsock `port` of any CID (as the real agent listens).
fn vsock_listen(port: u32) -> std::io::Result<std::os::fd::OwnedFd> {
    use std::os::fd::AsRawFd;
    let fd = vsock_socket()?;
    let addr = vsock_addr(libc::VMADDR_CID_ANY, port);
    // SAFETY: addr is a valid sockaddr_vm of the length given.
    let bound = unsafe {
        libc::bind(
            fd.as_raw_fd(),
            std::ptr::from_ref(&addr).cast(),
            SOCKADDR_VM_LEN,
        )
    };
    // SAFETY: listen(2) on our own socket.
    if bound < 0 || unsafe { libc::listen(fd.as_raw_fd(), 128) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(fd)
}

/// A guest-initiated connection to vsock `cid:port`.
fn vsock_connect(cid: u32, port: u32) -> std::io::Result<UnixStream> {
    use std::os::fd::{AsRawFd, IntoRawFd};
    let fd = vsock_socket()?;
    let addr = vsock_addr(cid, port);
    // SAFETY: addr is a valid sockaddr_vm of the length given.
    let rc = unsafe {
        libc::connect(
            fd.as_raw_fd(),
            std::ptr::from_ref(&addr).cast(),
            SOCKADDR_VM_LEN,
        )
    };
    if rc < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: we own fd; see vsock_socket for why a UnixStream can hold it.
    Ok(unsafe { UnixStream::from_raw_fd(fd.into_raw_fd()) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_relayed_frame_keeps_its_bytes_and_decodes() {
        let (mut a, mut b) = UnixStream::pair().unwrap();
        let ack = AgentFrame::Response(Response {
            id: 7,
            result: OpResult::Ok(OpValue::Unit),
        });
        write_message(&mut a, &ack, DEFAULT_MAX_FRAME_BYTES).unwrap();
        let mut sent = Vec::new();
        write_message(&mut sent, &ack, DEFAULT_MAX_FRAME_BYTES).unwrap();
        let raw = read_raw_frame(&mut b).unwrap();
        assert_eq!(raw, sent);
        let back: AgentFrame = read_message(&mut &raw[..], DEFAULT_MAX_FRAME_BYTES)
            .unwrap()
            .unwrap();
        assert!(matches!(back, AgentFrame::Response(Response { id: 7, .. })));
    }

    #[test]
    fn a_frame_over_the_cap_or_cut_short_ends_the_relay() {
        let (mut a, mut b) = UnixStream::pair().unwrap();
        a.write_all(&u32::MAX.to_be_bytes()).unwrap();
        assert_eq!(read_raw_frame(&mut b), None);
        let (mut a, mut b) = UnixStream::pair().unwrap();
        a.write_all(&10u32.to_be_bytes()).unwrap();
        a.write_all(&[1, 2, 3]).unwrap();
        drop(a);
        assert_eq!(read_raw_frame(&mut b), None);
    }

    #[test]
    fn vsock_addresses_carry_cid_and_port() {
        let addr = vsock_addr(HOST_CID, AGENT_VSOCK_PORT);
        assert_eq!(addr.svm_family, libc::AF_VSOCK as libc::sa_family_t);
        assert_eq!((addr.svm_cid, addr.svm_port), (2, AGENT_VSOCK_PORT));
    }
}
