use std::os::unix::fs::PermissionsExt;

use provium_protocol::op::{Op, OpenMode, Whence};
use provium_protocol::result::{EntryType, ErrorCode};
use provium_protocol::OpValue;

use crate::client::*;

fn mode(read: bool, write: bool) -> OpenMode {
    OpenMode {
        read,
        write,
        ..OpenMode::default()
    }
}

fn handle(v: OpValue) -> u64 {
    match v {
        OpValue::Handle { handle } => handle,
        other => panic!("{other:?}"),
    }
}

#[test]
fn whole_files_stat_listdir_mkdir_unlink_rename() {
    let a = Agent::start();
    let mut c = a.client();
    let f = a.path("f.txt");
    c.ok(Op::WriteFile {
        path: f.clone(),
        data: b"hello".to_vec(),
    });
    assert_eq!(
        c.ok(Op::ReadFile { path: f.clone() }),
        OpValue::Bytes(b"hello".to_vec())
    );
    let e = c.err(Op::ReadFile {
        path: a.path("missing"),
    });
    assert_code(&e, ErrorCode::Io);
    assert_eq!(e.errno, Some(libc::ENOENT));
    assert_eq!(
        e.message,
        format!(
            "No such file or directory (os error 2): {}",
            a.path("missing")
        )
    );
    let OpValue::Stat(s) = c.ok(Op::Stat { path: f.clone() }) else {
        panic!()
    };
    assert_eq!((s.size, s.entry_type), (5, EntryType::File));
    let meta = std::fs::metadata(&f).unwrap();
    assert_eq!(s.perm, meta.permissions().mode() & 0o7777);
    assert!(s.mtime_ns > 0);

    let d = a.path("x/y/z");
    assert_code(
        &c.err(Op::Mkdir {
            path: d.clone(),
            parents: false,
            perm: None,
        }),
        ErrorCode::Io,
    );
    c.ok(Op::Mkdir {
        path: d.clone(),
        parents: true,
        perm: Some(0o750),
    });
    let OpValue::Stat(s) = c.ok(Op::Stat { path: d.clone() }) else {
        panic!()
    };
    assert_eq!((s.perm, s.entry_type), (0o750, EntryType::Directory));

    c.ok(Op::Rename {
        from: f.clone(),
        to: a.path("x/g.txt"),
    });
    assert_eq!(
        c.ok(Op::ListDir { path: a.path("x") }),
        OpValue::Entries(vec![
            provium_protocol::result::DirEntry {
                name: "g.txt".into(),
                entry_type: EntryType::File
            },
            provium_protocol::result::DirEntry {
                name: "y".into(),
                entry_type: EntryType::Directory
            },
        ])
    );
    // unlink: files and empty directories; a non-empty directory is refused.
    assert_code(
        &c.err(Op::Unlink {
            path: a.path("x/y"),
        }),
        ErrorCode::Io,
    );
    c.ok(Op::Unlink { path: d });
    c.ok(Op::Unlink {
        path: a.path("x/g.txt"),
    });
    c.ok(Op::Unlink {
        path: a.path("x/y"),
    });
    assert_eq!(
        c.ok(Op::ListDir { path: a.path("x") }),
        OpValue::Entries(vec![])
    );
}

#[test]
fn handles_read_write_seek_tell() {
    let a = Agent::start();
    let mut c = a.client();
    let p = a.path("h");
    let w = handle(c.ok(Op::Open {
        path: p.clone(),
        mode: OpenMode {
            write: true,
            create: true,
            truncate: true,
            ..OpenMode::default()
        },
        perm: Some(0o600),
    }));
    assert_eq!(
        c.ok(Op::Write {
            handle: w,
            data: b"hello world".to_vec()
        }),
        OpValue::Written { bytes: 11 }
    );
    assert_eq!(c.ok(Op::Tell { handle: w }), OpValue::Offset { offset: 11 });
    c.ok(Op::Close { handle: w });
    assert_code(&c.err(Op::Tell { handle: w }), ErrorCode::UnknownHandle);
    assert_eq!(
        std::fs::metadata(&p).unwrap().permissions().mode() & 0o7777,
        0o600
    );

    let r = handle(c.ok(Op::Open {
        path: p.clone(),
        mode: mode(true, false),
        perm: None,
    }));
    let seek = |c: &mut Client, offset, whence| {
        c.ok(Op::Seek {
            handle: r,
            offset,
            whence,
        })
    };
    assert_eq!(seek(&mut c, 6, Whence::Set), OpValue::Offset { offset: 6 });
    assert_eq!(
        c.ok(Op::Read { handle: r, len: 5 }),
        OpValue::Bytes(b"world".to_vec())
    );
    assert_eq!(c.ok(Op::Tell { handle: r }), OpValue::Offset { offset: 11 });
    // EOF: empty, not an error.
    assert_eq!(c.ok(Op::Read { handle: r, len: 5 }), OpValue::Bytes(vec![]));
    assert_eq!(seek(&mut c, -5, Whence::Cur), OpValue::Offset { offset: 6 });
    assert_eq!(
        seek(&mut c, -11, Whence::End),
        OpValue::Offset { offset: 0 }
    );
    assert_eq!(
        c.ok(Op::Read { handle: r, len: 5 }),
        OpValue::Bytes(b"hello".to_vec())
    );
    assert_code(
        &c.err(Op::Seek {
            handle: r,
            offset: -1,
            whence: Whence::Set,
        }),
        ErrorCode::InvalidArgument,
    );
    // Writing to a read-only handle is the kernel's EBADF.
    let e = c.err(Op::Write {
        handle: r,
        data: b"x".to_vec(),
    });
    assert_eq!(e.errno, Some(libc::EBADF));
}

#[test]
fn open_mode_errors() {
    let a = Agent::start();
    let mut c = a.client();
    let e = c.err(Op::Open {
        path: a.path("x"),
        mode: OpenMode::default(),
        perm: None,
    });
    assert_code(&e, ErrorCode::InvalidArgument);
    assert!(
        e.message.contains("at least one of read, write or append"),
        "{}",
        e.message
    );
    let e = c.err(Op::Open {
        path: a.path("x"),
        mode: OpenMode {
            write: true,
            exclusive: true,
            ..OpenMode::default()
        },
        perm: None,
    });
    assert_code(&e, ErrorCode::InvalidArgument);
    let e = c.err(Op::Open {
        path: a.path("missing"),
        mode: mode(true, false),
        perm: None,
    });
    assert_eq!(e.errno, Some(libc::ENOENT));
    // exclusive create of an existing file: EEXIST.
    std::fs::write(a.path("exists"), b"").unwrap();
    let e = c.err(Op::Open {
        path: a.path("exists"),
        mode: OpenMode {
            write: true,
            create: true,
            exclusive: true,
            ..OpenMode::default()
        },
        perm: None,
    });
    assert_eq!(e.errno, Some(libc::EEXIST));
    // append always writes at the end.
    let h = handle(c.ok(Op::Open {
        path: a.path("exists"),
        mode: OpenMode {
            append: true,
            ..OpenMode::default()
        },
        perm: None,
    }));
    c.ok(Op::Write {
        handle: h,
        data: b"ab".to_vec(),
    });
    c.ok(Op::Seek {
        handle: h,
        offset: 0,
        whence: Whence::Set,
    });
    c.ok(Op::Write {
        handle: h,
        data: b"cd".to_vec(),
    });
    assert_eq!(std::fs::read(a.path("exists")).unwrap(), b"abcd");
}

#[test]
fn partial_write_is_reported() {
    let a = Agent::start();
    let mut c = a.client();
    // A FIFO opened read-write never blocks on open; made non-blocking through
    // fcntl on the handle (a handle is the agent's fd), a big write is partial.
    let fifo = a.path("fifo");
    let (exit, _, _) = c.sh(&format!("mkfifo {fifo}"));
    assert_eq!(exit.exit_code, 0);
    let h = handle(c.ok(Op::Open {
        path: fifo,
        mode: mode(true, true),
        perm: None,
    }));
    let OpValue::Syscall(r) = c.ok(Op::Syscall(provium_protocol::op::SyscallSpec {
        nr: libc::SYS_fcntl,
        args: vec![h as i64, libc::F_SETFL as i64, libc::O_NONBLOCK as i64],
        bufs: vec![],
        ptrs: vec![],
        nested: vec![],
    })) else {
        panic!()
    };
    assert_eq!(r.ret, 0);
    let data = vec![b'x'; 1024 * 1024];
    let OpValue::Written { bytes } = c.ok(Op::Write { handle: h, data }) else {
        panic!()
    };
    assert!(bytes > 0 && bytes < 1024 * 1024, "wrote {bytes}");
}
