use provium_protocol::op::{IoctlSpec, NestedPtr, Op, OpenMode, SyscallSpec};
use provium_protocol::result::ErrorCode;
use provium_protocol::OpValue;

use crate::client::*;

fn sys(c: &mut Client, spec: SyscallSpec) -> provium_protocol::result::SyscallResult {
    match c.ok(Op::Syscall(spec)) {
        OpValue::Syscall(r) => r,
        other => panic!("{other:?}"),
    }
}

fn open(c: &mut Client, path: &str, write: bool) -> i64 {
    match c.ok(Op::Open {
        path: path.into(),
        mode: OpenMode {
            read: !write,
            write,
            create: write,
            ..OpenMode::default()
        },
        perm: None,
    }) {
        OpValue::Handle { handle } => handle as i64,
        other => panic!("{other:?}"),
    }
}

#[test]
fn getpid_and_read_style_syscall() {
    let a = Agent::start();
    let mut c = a.client();
    let r = sys(
        &mut c,
        SyscallSpec {
            nr: libc::SYS_getpid,
            args: vec![],
            bufs: vec![],
            ptrs: vec![],
            nested: vec![],
        },
    );
    assert_eq!(r.ret, i64::from(a.child.id()));
    assert_eq!(r.errno, 0);
    let p = a.path("data");
    std::fs::write(&p, b"syscall data").unwrap();
    let fd = open(&mut c, &p, false);
    // read(fd, buf, 7): buf is bufs[0] in argument slot 1.
    let r = sys(
        &mut c,
        SyscallSpec {
            nr: libc::SYS_read,
            args: vec![fd, 0, 7],
            bufs: vec![vec![0; 7]],
            ptrs: vec![1],
            nested: vec![],
        },
    );
    assert_eq!(r.ret, 7);
    assert_eq!(r.out_bufs, vec![b"syscall".to_vec()]);
    let r = sys(
        &mut c,
        SyscallSpec {
            nr: libc::SYS_close,
            args: vec![-1],
            bufs: vec![],
            ptrs: vec![],
            nested: vec![],
        },
    );
    assert_eq!((r.ret, r.errno), (-1, libc::EBADF));
    let e = c.err(Op::Syscall(SyscallSpec {
        nr: 0,
        args: vec![],
        bufs: vec![],
        ptrs: vec![9],
        nested: vec![],
    }));
    assert_code(&e, ErrorCode::InvalidArgument);
}

/// struct iovec { void *base; size_t len; } with base as a nested pointer.
fn iovec(len: usize) -> Vec<u8> {
    let mut v = vec![0u8; 16];
    v[8..].copy_from_slice(&(len as u64).to_ne_bytes());
    v
}

#[test]
fn nested_pointers_writev_and_readv() {
    let a = Agent::start();
    let mut c = a.client();
    let p = a.path("v");
    let w = open(&mut c, &p, true);
    let r = sys(
        &mut c,
        SyscallSpec {
            nr: libc::SYS_writev,
            args: vec![w, 0, 1],
            bufs: vec![iovec(6), b"nested".to_vec()],
            ptrs: vec![1],
            nested: vec![NestedPtr {
                parent: 0,
                child: 1,
                offset: 0,
            }],
        },
    );
    assert_eq!(r.ret, 6);
    assert_eq!(std::fs::read(&p).unwrap(), b"nested");
    let rd = open(&mut c, &p, false);
    let r = sys(
        &mut c,
        SyscallSpec {
            nr: libc::SYS_readv,
            args: vec![rd, 0, 1],
            bufs: vec![iovec(6), vec![0; 6]],
            ptrs: vec![1],
            nested: vec![NestedPtr {
                parent: 0,
                child: 1,
                offset: 0,
            }],
        },
    );
    assert_eq!(r.ret, 6);
    assert_eq!(r.out_bufs[1], b"nested");
}

#[test]
fn ioctl_fionread_and_enotty() {
    let a = Agent::start();
    let mut c = a.client();
    let p = a.path("f");
    std::fs::write(&p, b"0123456789").unwrap();
    let fd = open(&mut c, &p, false);
    let OpValue::Ioctl(r) = c.ok(Op::Ioctl(IoctlSpec {
        fd: fd as i32,
        cmd: libc::FIONREAD,
        data: Some(vec![0; 4]),
        bufs: vec![],
        ptr_offsets: vec![],
    })) else {
        panic!()
    };
    assert_eq!(r.ret, 0);
    assert_eq!(r.out_data, Some(10i32.to_ne_bytes().to_vec()));
    let OpValue::Ioctl(r) = c.ok(Op::Ioctl(IoctlSpec {
        fd: fd as i32,
        cmd: libc::TCGETS,
        data: Some(vec![0; 64]),
        bufs: vec![],
        ptr_offsets: vec![],
    })) else {
        panic!()
    };
    assert_eq!((r.ret, r.errno), (-1, libc::ENOTTY));
    let e = c.err(Op::Ioctl(IoctlSpec {
        fd: fd as i32,
        cmd: 0,
        data: Some(vec![0; 4]),
        bufs: vec![vec![1]],
        ptr_offsets: vec![0],
    }));
    assert_code(&e, ErrorCode::InvalidArgument);
}

#[test]
fn clock_get_and_refused_set() {
    let a = Agent::start();
    let mut c = a.client();
    let OpValue::Clock {
        realtime_ns,
        monotonic_ns,
    } = c.ok(Op::ClockGet)
    else {
        panic!()
    };
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as i64;
    assert!((now - realtime_ns).abs() < 60_000_000_000);
    assert!(monotonic_ns > 0);
    for op in [
        Op::ClockSet { realtime_ns: 0 },
        Op::ClockAdvance { delta_ns: 1 },
    ] {
        let e = c.err(op);
        assert_code(&e, ErrorCode::Unsupported);
        assert_eq!(
            e.message,
            "setting the clock is not supported on the local backend (the sandbox shares the host's clock)"
        );
    }
}
