//! The sandbox's init: the code that runs between `clone` and the agent's
//! `execve`, and the plan it follows.
//!
//! Why `clone` by hand rather than `Command::pre_exec`: the pid namespace only
//! applies to children of the process that creates it, and `/proc` must be
//! mounted from inside it; `clone(CLONE_NEWPID | …)` makes the child pid 1 of
//! the new namespace directly, with its own mount, uts, ipc and net
//! namespaces, so one process does the whole setup and then stays as the
//! namespace's init (reaping orphans, which the agent need not do).
//!
//! The child is a copy of a possibly multi-threaded process: only the cloning
//! thread exists in it, and any lock another thread held (malloc's included)
//! stays held forever. So everything it needs is built beforehand into an
//! [`InitPlan`] (C strings, argv/envp arrays, step list), and the child only
//! makes raw syscalls over that memory: no allocation, no formatting, no
//! panics. A failing step reports `(step index, errno)` on a pipe and exits;
//! the host turns the index back into the step's description.
//!
//! Lifetime: the child sets `PR_SET_PDEATHSIG(SIGKILL)`, so when the thread
//! that cloned it dies (the sandbox's keeper thread, or the whole `provium`
//! process under SIGKILL) it is killed; and when a pid namespace's init dies,
//! the kernel kills every other process in it. Every mount is made inside the
//! child's mount namespace after `/` is made recursively private, so none
//! propagates to the host and all of them vanish with the namespace.

use std::ffi::{c_char, c_int, c_ulong, CString};
use std::io;
use std::os::fd::RawFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::ptr;

use super::LocalError;

/// Step index reported when executing the agent failed.
pub(super) const STEP_EXEC: u32 = u32::MAX - 1;
/// Step index reported when forking the agent failed.
pub(super) const STEP_FORK: u32 = u32::MAX - 2;
/// Step index reported when moving the inherited descriptors failed.
pub(super) const STEP_FDS: u32 = u32::MAX - 3;

/// Where (relative to the plan's `fd_base`) the init keeps its descriptor
/// of the overlay's upper directory: the host reaches the upper layer, which
/// is on a tmpfs visible only inside the sandbox's mount namespace, through
/// `/proc/<init>/fd/<fd_base + UPPER_FD_OFFSET>` (see `snapshot.rs`).
pub(super) const UPPER_FD_OFFSET: RawFd = 4;

/// One setup action, with every argument prepared.
pub(super) enum Step {
    Mount {
        source: Option<CString>,
        target: CString,
        fstype: Option<CString>,
        flags: c_ulong,
        data: Option<CString>,
    },
    /// `mkdir`; an existing directory is fine.
    Mkdir {
        path: CString,
        mode: libc::mode_t,
    },
    /// Open `path` (O_PATH, close-on-exec) and keep it at descriptor `target`
    /// for the init's lifetime.
    KeepDir {
        path: CString,
        target: RawFd,
    },
    /// Create an empty file to bind-mount a device node over.
    Touch {
        path: CString,
    },
    Symlink {
        target: CString,
        link: CString,
    },
    Hostname {
        name: CString,
    },
    /// Bring `lo` up in the new network namespace.
    LoopbackUp,
    /// `pivot_root` into `root` and detach the old root.
    PivotRoot {
        root: CString,
    },
    /// Point stdin at the new root's /dev/null.
    StdinDevNull {
        dev_null: CString,
    },
}

/// Everything the child needs, built before `clone`.
pub(super) struct InitPlan {
    pub steps: Vec<Step>,
    /// What each step does, for error messages (host side only).
    pub descriptions: Vec<String>,
    /// The agent binary, opened before the pivot (it may not be visible inside).
    pub agent_fd: RawFd,
    /// Agent log file (stdout and stderr of init and agent).
    pub log_fd: RawFd,
    /// Write end of the error pipe (close-on-exec: EOF means the agent exec'd).
    pub err_fd: RawFd,
    /// Read end of the lifeline pipe whose write end the host holds: if it
    /// reads as hung up right after PDEATHSIG is set, the host died first.
    pub lifeline_fd: RawFd,
    /// Lowest descriptor number above all of the above; they are moved here.
    pub fd_base: RawFd,
    pub argv: Vec<CString>,
    pub envp: Vec<CString>,
    pub argv_ptrs: Vec<*const c_char>,
    pub envp_ptrs: Vec<*const c_char>,
    pub empty: CString,
}

// SAFETY: the raw pointers point into the plan's own CStrings, which move
// with it (a CString's heap buffer does not move when the CString does).
unsafe impl Send for InitPlan {}

impl InitPlan {
    /// Fill the argv/envp pointer arrays (null-terminated) from the strings.
    pub fn seal(&mut self) {
        self.argv_ptrs = self.argv.iter().map(|s| s.as_ptr()).collect();
        self.argv_ptrs.push(ptr::null());
        self.envp_ptrs = self.envp.iter().map(|s| s.as_ptr()).collect();
        self.envp_ptrs.push(ptr::null());
    }
}

/// What failed, for a `(step, errno)` report; `descriptions` are the plan's.
pub(super) fn describe_step(descriptions: &[String], step: u32) -> String {
    match step {
        STEP_EXEC => "execute the agent binary".into(),
        STEP_FORK => "fork the agent from the sandbox's init".into(),
        STEP_FDS => "move the inherited descriptors".into(),
        n => descriptions
            .get(n as usize)
            .cloned()
            .unwrap_or_else(|| format!("run unknown setup step {n}")),
    }
}

/// `clone` the sandbox's init into fresh namespaces. Returns its host pid in
/// the parent; never returns in the child.
///
/// # Safety
/// The plan must be sealed. The caller must not rely on anything in the
/// child but the plan (see the module comment).
pub(super) unsafe fn clone_init(plan: &InitPlan) -> io::Result<libc::pid_t> {
    let flags = libc::CLONE_NEWNS
        | libc::CLONE_NEWPID
        | libc::CLONE_NEWUTS
        | libc::CLONE_NEWIPC
        | libc::CLONE_NEWNET
        | libc::SIGCHLD;
    // SAFETY: a fork-like clone (no CLONE_VM, null stack: the child runs on a
    // copy of this stack); the child only calls `run_init`, which never returns.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_clone,
            flags as c_ulong,
            0usize,
            0usize,
            0usize,
            0usize,
        )
    };
    if ret < 0 {
        return Err(io::Error::last_os_error());
    }
    if ret == 0 {
        // SAFETY: we are the freshly cloned child.
        unsafe { run_init(plan) }
    }
    // pid_t is i32; clone returns a pid, which always fits.
    Ok(libc::pid_t::try_from(ret).expect("clone returned a pid_t"))
}

fn errno() -> c_int {
    // SAFETY: reading the thread's errno location is always valid.
    unsafe { *libc::__errno_location() }
}

/// Report `(step, errno)` on the error pipe and exit.
unsafe fn fail(err_fd: RawFd, step: u32, err: c_int) -> ! {
    let mut rec = [0u8; 8];
    rec[..4].copy_from_slice(&step.to_ne_bytes());
    rec[4..].copy_from_slice(&err.to_ne_bytes());
    // SAFETY: writing a stack buffer to a descriptor; then exiting without
    // running the parent's atexit handlers or flushing its stdio buffers.
    unsafe {
        libc::write(err_fd, rec.as_ptr().cast(), rec.len());
        libc::_exit(126)
    }
}

fn opt_ptr(s: &Option<CString>) -> *const c_char {
    s.as_ref().map_or(ptr::null(), |s| s.as_ptr())
}

/// Run one step; `Err(errno)` on failure.
unsafe fn run_step(step: &Step) -> Result<(), c_int> {
    // SAFETY: the whole function makes raw syscalls over the plan's C
    // strings and stack buffers.
    unsafe {
        let rc = match step {
            Step::Mount {
                source,
                target,
                fstype,
                flags,
                data,
            } => libc::mount(
                opt_ptr(source),
                target.as_ptr(),
                opt_ptr(fstype),
                *flags,
                opt_ptr(data).cast(),
            ),
            Step::Mkdir { path, mode } => {
                let rc = libc::mkdir(path.as_ptr(), *mode);
                if rc < 0 && errno() == libc::EEXIST {
                    0
                } else {
                    rc
                }
            }
            Step::KeepDir { path, target } => {
                let fd = libc::open(
                    path.as_ptr(),
                    libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC,
                );
                if fd < 0 || fd == *target {
                    fd
                } else {
                    let rc = libc::dup3(fd, *target, libc::O_CLOEXEC);
                    libc::close(fd);
                    rc
                }
            }
            Step::Touch { path } => {
                let fd = libc::open(
                    path.as_ptr(),
                    libc::O_WRONLY | libc::O_CREAT | libc::O_CLOEXEC,
                    0o666,
                );
                if fd >= 0 {
                    libc::close(fd);
                    0
                } else {
                    fd
                }
            }
            Step::Symlink { target, link } => libc::symlink(target.as_ptr(), link.as_ptr()),
            Step::Hostname { name } => libc::sethostname(name.as_ptr(), name.as_bytes().len()),
            Step::LoopbackUp => loopback_up(),
            Step::PivotRoot { root } => {
                // pivot_root(".", "."): the old root ends up stacked on the
                // new one and is detached right away (see pivot_root(2)).
                let dot = c".".as_ptr();
                if libc::chdir(root.as_ptr()) < 0
                    || libc::syscall(libc::SYS_pivot_root, dot, dot) < 0
                    || libc::umount2(dot, libc::MNT_DETACH) < 0
                    || libc::chdir(c"/".as_ptr()) < 0
                {
                    -1
                } else {
                    0
                }
            }
            Step::StdinDevNull { dev_null } => {
                let fd = libc::open(dev_null.as_ptr(), libc::O_RDONLY);
                if fd < 0 {
                    fd
                } else {
                    let rc = libc::dup2(fd, 0);
                    libc::close(fd);
                    rc
                }
            }
        };
        if rc < 0 {
            Err(errno())
        } else {
            Ok(())
        }
    }
}

unsafe fn loopback_up() -> c_int {
    // SAFETY: socket + two ioctls on a zeroed, correctly sized ifreq.
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0);
        if fd < 0 {
            return -1;
        }
        let mut ifr: libc::ifreq = std::mem::zeroed();
        for (dst, src) in ifr.ifr_name.iter_mut().zip(b"lo\0") {
            *dst = *src as c_char;
        }
        let mut rc = libc::ioctl(fd, libc::SIOCGIFFLAGS, &mut ifr);
        if rc >= 0 {
            // IFF_UP | IFF_RUNNING fit in the short flags field.
            ifr.ifr_ifru.ifru_flags |= (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short;
            rc = libc::ioctl(fd, libc::SIOCSIFFLAGS, &ifr);
        }
        libc::close(fd);
        rc
    }
}

/// The child: set up the namespaces, fork the agent, reap until it exits.
unsafe fn run_init(plan: &InitPlan) -> ! {
    // SAFETY: the whole function makes raw syscalls only, over the plan
    // (see the module docs).
    unsafe {
        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as c_ulong, 0, 0, 0);

        // Move the descriptors we keep above everything inherited, then close
        // the rest: a copy of the host's descriptors (other sandboxes' pipes,
        // listening sockets) must not live on in here.
        let keep = [plan.err_fd, plan.log_fd, plan.agent_fd, plan.lifeline_fd];
        let mut moved = [0 as RawFd; 4];
        for (i, fd) in keep.iter().enumerate() {
            let target = plan.fd_base + i as RawFd;
            if libc::dup3(*fd, target, libc::O_CLOEXEC) < 0 {
                fail(plan.err_fd, STEP_FDS, errno());
            }
            moved[i] = target;
        }
        let [err_fd, log_fd, agent_fd, lifeline_fd] = moved;
        libc::syscall(libc::SYS_close_range, 3u32, (plan.fd_base - 1) as u32, 0u32);
        libc::syscall(
            libc::SYS_close_range,
            (plan.fd_base + 4) as u32,
            u32::MAX,
            0u32,
        );

        // If the host died before PDEATHSIG was armed, nobody will kill us.
        let mut pfd = libc::pollfd {
            fd: lifeline_fd,
            events: libc::POLLIN,
            revents: 0,
        };
        if libc::poll(&mut pfd, 1, 0) > 0 && pfd.revents & libc::POLLHUP != 0 {
            libc::_exit(125);
        }

        if libc::dup2(log_fd, 1) < 0 || libc::dup2(log_fd, 2) < 0 {
            fail(err_fd, STEP_FDS, errno());
        }

        for (i, step) in plan.steps.iter().enumerate() {
            if let Err(e) = run_step(step) {
                fail(err_fd, i as u32, e);
            }
        }

        // Raw clone, not fork(3): glibc's fork takes malloc's locks, which a
        // thread that does not exist here may hold forever.
        let agent = libc::syscall(
            libc::SYS_clone,
            libc::SIGCHLD as c_ulong,
            0usize,
            0usize,
            0usize,
            0usize,
        );
        if agent < 0 {
            fail(err_fd, STEP_FORK, errno());
        }
        if agent == 0 {
            // The agent: its own session, fds 0-2 from init, nothing else
            // but the error pipe, which closes on a successful exec.
            libc::setsid();
            libc::close(log_fd);
            libc::close(lifeline_fd);
            libc::syscall(
                libc::SYS_execveat,
                agent_fd,
                plan.empty.as_ptr(),
                plan.argv_ptrs.as_ptr(),
                plan.envp_ptrs.as_ptr(),
                libc::AT_EMPTY_PATH,
            );
            fail(err_fd, STEP_EXEC, errno());
        }
        libc::close(err_fd);
        libc::close(agent_fd);

        // Reap everything; leave with the agent's status.
        loop {
            let mut status: c_int = 0;
            let pid = libc::waitpid(-1, &mut status, 0);
            if libc::c_long::from(pid) == agent {
                if libc::WIFEXITED(status) {
                    libc::_exit(libc::WEXITSTATUS(status));
                }
                libc::_exit(128 + libc::WTERMSIG(status));
            }
            if pid < 0 && errno() == libc::ECHILD {
                libc::_exit(127);
            }
        }
    }
}
pub(super) fn cstr(path: &Path) -> Result<CString, LocalError> {
    CString::new(path.as_os_str().as_bytes()).map_err(|_| LocalError::RuntimeDir {
        path: path.to_path_buf(),
        source: io::Error::other("path contains a NUL byte"),
    })
}

fn c(s: &str) -> CString {
    CString::new(s).expect("literal without NUL")
}

/// The setup steps, in order, with their descriptions: everything the
/// child will do, built here on the host (allocation and formatting are
/// allowed here, never in the child; see the module doc).
pub(super) fn build_plan(
    name: &str,
    runtime_base: &Path,
    fs_dir: &Path,
    sock_dir: &Path,
    socket: &Path,
    agent: &Path,
    fds: [RawFd; 4],
) -> Result<InitPlan, LocalError> {
    let root = fs_dir.join("root");
    let upper = fs_dir.join("upper");
    let work = fs_dir.join("work");
    let inside = |p: &str| root.join(p.trim_start_matches('/'));
    let fd_base = fds.iter().copied().max().unwrap_or(2).max(2) + 1;
    let mut steps = Vec::new();
    let mut descriptions = Vec::new();
    let mut add = |step: Step, what: String| {
        steps.push(step);
        descriptions.push(what);
    };
    let mount = |source: Option<&str>,
                 target: &Path,
                 fstype: Option<&str>,
                 flags: libc::c_ulong,
                 data: Option<&str>|
     -> Result<Step, LocalError> {
        Ok(Step::Mount {
            source: source.map(c),
            target: cstr(target)?,
            fstype: fstype.map(c),
            flags,
            data: data.map(c),
        })
    };
    let mkdir = |p: &Path, mode| -> Result<Step, LocalError> {
        Ok(Step::Mkdir {
            path: cstr(p)?,
            mode,
        })
    };
    let nosuid_nodev = libc::MS_NOSUID | libc::MS_NODEV;

    add(
        mount(
            None,
            Path::new("/"),
            None,
            libc::MS_REC | libc::MS_PRIVATE,
            None,
        )?,
        "make / recursively private (so no mount reaches the host)".into(),
    );
    add(
        mount(
            Some("tmpfs"),
            fs_dir,
            Some("tmpfs"),
            nosuid_nodev,
            Some("mode=0700"),
        )?,
        format!("mount the overlay's tmpfs on {}", fs_dir.display()),
    );
    for d in [&upper, &work, &root] {
        add(mkdir(d, 0o755)?, format!("create {}", d.display()));
    }
    add(
        Step::KeepDir {
            path: cstr(&upper)?,
            target: fd_base + UPPER_FD_OFFSET,
        },
        format!("open the overlay's upper directory {}", upper.display()),
    );
    let overlay = format!(
        "lowerdir=/,upperdir={},workdir={}",
        upper.display(),
        work.display()
    );
    add(
        mount(Some("overlay"), &root, Some("overlay"), 0, Some(&overlay))?,
        format!("mount the root overlay ({overlay}) on {}", root.display()),
    );
    add(
        mount(
            Some("proc"),
            &inside("/proc"),
            Some("proc"),
            nosuid_nodev | libc::MS_NOEXEC,
            None,
        )?,
        "mount a fresh /proc".into(),
    );
    add(
        mount(
            Some("sysfs"),
            &inside("/sys"),
            Some("sysfs"),
            nosuid_nodev | libc::MS_NOEXEC | libc::MS_RDONLY,
            None,
        )?,
        "mount /sys (read-only)".into(),
    );
    add(
        mount(
            Some("tmpfs"),
            &inside("/dev"),
            Some("tmpfs"),
            libc::MS_NOSUID,
            Some("mode=0755"),
        )?,
        "mount a tmpfs on /dev".into(),
    );
    for node in ["null", "zero", "full", "random", "urandom", "tty"] {
        let target = inside(&format!("/dev/{node}"));
        add(
            Step::Touch {
                path: cstr(&target)?,
            },
            format!("create /dev/{node}"),
        );
        add(
            mount(
                Some(&format!("/dev/{node}")),
                &target,
                None,
                libc::MS_BIND,
                None,
            )?,
            format!("bind-mount the host's /dev/{node}"),
        );
    }
    add(mkdir(&inside("/dev/pts"), 0o755)?, "create /dev/pts".into());
    add(
        mount(
            Some("devpts"),
            &inside("/dev/pts"),
            Some("devpts"),
            libc::MS_NOSUID | libc::MS_NOEXEC,
            Some("newinstance,ptmxmode=0666,mode=0620"),
        )?,
        "mount a new devpts instance on /dev/pts".into(),
    );
    add(
        mkdir(&inside("/dev/shm"), 0o1777)?,
        "create /dev/shm".into(),
    );
    add(
        mount(
            Some("tmpfs"),
            &inside("/dev/shm"),
            Some("tmpfs"),
            nosuid_nodev,
            Some("mode=1777"),
        )?,
        "mount a tmpfs on /dev/shm".into(),
    );
    for (target, link) in [
        ("pts/ptmx", "/dev/ptmx"),
        ("/proc/self/fd", "/dev/fd"),
        ("/proc/self/fd/0", "/dev/stdin"),
        ("/proc/self/fd/1", "/dev/stdout"),
        ("/proc/self/fd/2", "/dev/stderr"),
    ] {
        add(
            Step::Symlink {
                target: c(target),
                link: cstr(&inside(link))?,
            },
            format!("link {link} to {target}"),
        );
    }
    add(
        mount(
            Some("tmpfs"),
            &inside("/tmp"),
            Some("tmpfs"),
            nosuid_nodev,
            Some("mode=1777"),
        )?,
        "mount a fresh tmpfs on /tmp".into(),
    );
    // Hide the host's runtime directory (siblings' sockets) under a tmpfs,
    // then bring back only this sandbox's socket directory at the same path.
    let mut made = PathBuf::from("/");
    for comp in runtime_base.components().skip(1) {
        made.push(comp);
        let p = inside(&made.to_string_lossy());
        add(
            mkdir(&p, 0o755)?,
            format!("create {} inside", made.display()),
        );
    }
    add(
        mount(
            Some("tmpfs"),
            &inside(&runtime_base.to_string_lossy()),
            Some("tmpfs"),
            nosuid_nodev,
            Some("mode=0755"),
        )?,
        format!("hide {} under a tmpfs", runtime_base.display()),
    );
    let rel = sock_dir.strip_prefix(runtime_base).unwrap_or(sock_dir);
    let mut made = runtime_base.to_path_buf();
    for comp in rel.components() {
        made.push(comp);
        let p = inside(&made.to_string_lossy());
        add(
            mkdir(&p, 0o700)?,
            format!("create {} inside", made.display()),
        );
    }
    let sock_inside = inside(&sock_dir.to_string_lossy());
    add(
        Step::Mount {
            source: Some(cstr(sock_dir)?),
            target: cstr(&sock_inside)?,
            fstype: None,
            flags: libc::MS_BIND,
            data: None,
        },
        format!("bind-mount the socket directory {}", sock_dir.display()),
    );
    add(
        Step::Hostname { name: c(name) },
        format!("set the hostname to `{name}`"),
    );
    add(Step::LoopbackUp, "bring the loopback interface up".into());
    add(
        Step::PivotRoot { root: cstr(&root)? },
        "pivot_root into the overlay".into(),
    );
    add(
        Step::StdinDevNull {
            dev_null: c("/dev/null"),
        },
        "open /dev/null for stdin".into(),
    );

    let listen = format!("unix:{}", socket.display());
    let argv = vec![
        cstr(agent)?,
        c("--listen"),
        CString::new(listen).map_err(|_| LocalError::RuntimeDir {
            path: socket.to_path_buf(),
            source: io::Error::other("path contains a NUL byte"),
        })?,
        c("--no-clock"),
    ];
    let envp = vec![
        c("PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"),
        c("HOME=/root"),
        c("LANG=C.UTF-8"),
        CString::new(format!("PROVIUM_SANDBOX={name}")).expect("checked name has no NUL"),
    ];
    Ok(InitPlan {
        steps,
        descriptions,
        err_fd: fds[0],
        log_fd: fds[1],
        agent_fd: fds[2],
        lifeline_fd: fds[3],
        fd_base,
        argv,
        envp,
        argv_ptrs: Vec::new(),
        envp_ptrs: Vec::new(),
        empty: CString::default(),
    })
}
