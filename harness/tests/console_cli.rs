//! `provium console <PROFILE>` end to end on the microVMM: the tiny test
//! guest (banner, command line, input echoed back, Ctrl-A X, guest power-off)
//! and the kernel-probe tier's Linux kernel (reaches "Run /init as init
//! process" with no agent injected).
//!
//! Needs /dev/kvm (`PROVIUM_SKIP_KVM=1` skips, printing why). The probe test
//! needs `target/probe-kernel/bzImage` (or `PROVIUM_PROBE_KERNEL`); without it
//! it fails and says how to build it, unless `PROVIUM_SKIP_PROBE_KERNEL=1`.

mod common;

use common::{kvm_or_skip, probe_initrd, probe_kernel, PROBE_CMDLINE};

use std::io::{Read, Write};
use std::path::Path;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use provium_vmm::tiny_guest;

struct Session {
    child: Child,
    stdin: Option<ChildStdin>,
    out: Arc<Mutex<Vec<u8>>>,
    err: Arc<Mutex<Vec<u8>>>,
}

fn collect(mut r: impl Read + Send + 'static) -> Arc<Mutex<Vec<u8>>> {
    let buf = Arc::new(Mutex::new(Vec::new()));
    let b = buf.clone();
    std::thread::spawn(move || {
        let mut chunk = [0u8; 4096];
        while let Ok(n) = r.read(&mut chunk) {
            if n == 0 {
                break;
            }
            b.lock().unwrap().extend_from_slice(&chunk[..n]);
        }
    });
    buf
}

impl Session {
    fn start(dir: &Path, args: &[&str]) -> Session {
        let mut child = Command::new(env!("CARGO_BIN_EXE_provium"))
            .arg("--config")
            .arg(dir.join("provium.toml"))
            .arg("console")
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stdin = child.stdin.take();
        let out = collect(child.stdout.take().unwrap());
        let err = collect(child.stderr.take().unwrap());
        Session {
            child,
            stdin,
            out,
            err,
        }
    }

    fn stdout(&self) -> String {
        String::from_utf8_lossy(&self.out.lock().unwrap()).into_owned()
    }

    fn stderr(&self) -> String {
        String::from_utf8_lossy(&self.err.lock().unwrap()).into_owned()
    }

    /// Waits until stdout, from byte `from`, contains `needle`; returns the
    /// offset just past it.
    fn wait_out(&mut self, from: usize, needle: &str, within: Duration) -> usize {
        let end = Instant::now() + within;
        loop {
            {
                let out = self.out.lock().unwrap();
                let hay = &out[from.min(out.len())..];
                if let Some(p) = hay
                    .windows(needle.len())
                    .position(|w| w == needle.as_bytes())
                {
                    return from + p + needle.len();
                }
            }
            if let Ok(Some(st)) = self.child.try_wait() {
                // Let the readers catch up before judging.
                std::thread::sleep(Duration::from_millis(200));
                let out = self.stdout();
                assert!(
                    out[from.min(out.len())..].contains(needle),
                    "console exited ({st}) before {needle:?}; stdout:\n{out}\nstderr:\n{}",
                    self.stderr()
                );
                continue;
            }
            assert!(
                Instant::now() < end,
                "no {needle:?} on the console within {within:?}; stdout:\n{}\nstderr:\n{}",
                self.stdout(),
                self.stderr()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn send(&mut self, bytes: &[u8]) {
        let s = self.stdin.as_mut().expect("stdin open");
        s.write_all(bytes).unwrap();
        s.flush().unwrap();
    }

    fn wait_exit(&mut self, within: Duration) -> i32 {
        let end = Instant::now() + within;
        loop {
            if let Some(st) = self.child.try_wait().unwrap() {
                std::thread::sleep(Duration::from_millis(100));
                return st.code().unwrap_or(-1);
            }
            if Instant::now() > end {
                let _ = self.child.kill();
                panic!(
                    "console did not exit within {within:?}; stderr:\n{}",
                    self.stderr()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn tiny_project() -> tempfile::TempDir {
    let d = tempfile::tempdir().unwrap();
    std::fs::write(d.path().join("tiny.bzImage"), tiny_guest::BZIMAGE).unwrap();
    std::fs::write(
        d.path().join("provium.toml"),
        "[profiles.tiny]\nkernel = \"tiny.bzImage\"\ncmdline = \"provium-tiny-words\"\nguest_os = \"linux\"\n",
    )
    .unwrap();
    d
}

#[test]
fn tiny_guest_banner_cmdline_echo_and_ctrl_a_x() {
    if !kvm_or_skip("tiny_guest_banner_cmdline_echo_and_ctrl_a_x") {
        return;
    }
    let d = tiny_project();
    let mut s = Session::start(d.path(), &["tiny", "--mem", "64M"]);
    let at = s.wait_out(0, tiny_guest::BANNER, Duration::from_secs(60));
    // The profile's words, then console=ttyS0 appended, then our devices.
    let at = s.wait_out(
        at,
        "provium-tiny-words console=ttyS0 virtio_mmio.device=",
        Duration::from_secs(30),
    );
    let at = s.wait_out(at, tiny_guest::READY, Duration::from_secs(30));
    s.send(b"hello-console");
    s.wait_out(at, "hello-console", Duration::from_secs(30));
    s.send(b"\x01x");
    assert_eq!(s.wait_exit(Duration::from_secs(30)), 0);
    let err = s.stderr();
    assert!(err.contains("Ctrl-A X quits"), "{err}");
    assert!(err.contains("detached (Ctrl-A X)"), "{err}");
}

#[test]
fn tiny_guest_power_off_ends_the_console() {
    if !kvm_or_skip("tiny_guest_power_off_ends_the_console") {
        return;
    }
    let d = tiny_project();
    let mut s = Session::start(d.path(), &["tiny", "--mem", "64M", "--cmdline", "other"]);
    let at = s.wait_out(0, "other console=ttyS0", Duration::from_secs(60));
    s.wait_out(at, tiny_guest::READY, Duration::from_secs(30));
    s.send(&[tiny_guest::CMD_POWER_OFF]);
    assert_eq!(s.wait_exit(Duration::from_secs(30)), 0);
    let err = s.stderr();
    assert!(
        err.contains("the VM stopped: the guest powered off"),
        "{err}"
    );
    assert!(
        !s.stdout().contains("provium-tiny-words"),
        "--cmdline replaces the profile's"
    );
}

#[test]
fn unknown_profile_and_bad_mem_are_errors() {
    let d = tiny_project();
    let mut s = Session::start(d.path(), &["nope"]);
    assert_eq!(s.wait_exit(Duration::from_secs(30)), 2);
    assert!(
        s.stderr().contains("profile `nope` not found"),
        "{}",
        s.stderr()
    );
    let mut s = Session::start(d.path(), &["tiny", "--mem", "lots"]);
    assert_eq!(s.wait_exit(Duration::from_secs(30)), 2);
    let err = s.stderr();
    assert!(err.contains("--mem") || err.contains("/dev/kvm"), "{err}");
}

#[test]
fn probe_kernel_reaches_init_without_the_agent() {
    if !kvm_or_skip("probe_kernel_reaches_init_without_the_agent") {
        return;
    }
    let Some(kernel) = probe_kernel("probe_kernel_reaches_init_without_the_agent") else {
        return;
    };
    let d = tempfile::tempdir().unwrap();
    let initrd = probe_initrd(d.path());
    std::fs::write(
        d.path().join("provium.toml"),
        format!(
            "[profiles.probe]\nkernel = {kernel:?}\ninitrd = {initrd:?}\ncmdline = {PROBE_CMDLINE:?}\nguest_os = \"linux\"\n"
        ),
    )
    .unwrap();
    let t0 = Instant::now();
    let mut s = Session::start(d.path(), &["probe", "--mem", "256M"]);
    // ~35 s on idle cores; a 2-core machine shared with builds (load 9)
    // got only to "Switched to clocksource kvm-clock" in 900 s.
    s.wait_out(0, "Run /init as init process", Duration::from_secs(1500));
    eprintln!("probe kernel: \"Run /init\" after {:?}", t0.elapsed());
    assert!(
        !s.stdout().contains("provium-agent"),
        "no agent without --agent"
    );
    s.send(b"\x01x");
    assert_eq!(s.wait_exit(Duration::from_secs(60)), 0);
}
