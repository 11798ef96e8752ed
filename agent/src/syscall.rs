//! Raw `syscall` and `ioctl`, with buffers the host supplies.
//!
//! Buffers are copied into agent-owned `Vec`s that are never resized during
//! the call, so every address handed to the kernel stays valid until it
//! returns. Nested pointers are written first (child address into parent at
//! `offset`, 8 bytes native endian), then argument slots (syscall) or data
//! offsets (ioctl) receive buffer addresses. The answer carries every buffer
//! as it is after the call.
//!
//! These ops do exactly what the test asks of the guest kernel, on the agent's
//! own process: a syscall that closes the agent's socket or exits the agent
//! does just that. That is the op's purpose, not a hazard to defend against.

use provium_protocol::op::{IoctlSpec, NestedPtr, SyscallSpec, MAX_SYSCALL_ARGS};
use provium_protocol::result::{IoctlResult, OpError, SyscallResult};
use provium_protocol::OpValue;

use crate::op_error;

fn errno_after(ret: i64) -> i32 {
    if ret == -1 {
        std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
    } else {
        0
    }
}

/// Write the address of `bufs[child]` into `bufs[parent]` at `offset` for
/// each nested pointer. The spec was checked, so indices and offsets fit.
fn apply_nested(bufs: &mut [Vec<u8>], nested: &[NestedPtr]) -> Result<(), OpError> {
    for (i, n) in nested.iter().enumerate() {
        let addr = bufs
            .get(n.child as usize)
            .map(|b| b.as_ptr() as u64)
            .ok_or_else(|| op_error::invalid(format!("nested[{i}].child is out of range")))?;
        let off = n.offset as usize;
        let slot = bufs
            .get_mut(n.parent as usize)
            .and_then(|p| p.get_mut(off..off + 8))
            .ok_or_else(|| op_error::invalid(format!("nested[{i}] does not fit its parent")))?;
        slot.copy_from_slice(&addr.to_ne_bytes());
    }
    Ok(())
}

pub fn syscall(spec: SyscallSpec) -> Result<OpValue, OpError> {
    spec.check().map_err(|e| op_error::invalid(e.to_string()))?;
    let mut bufs = spec.bufs;
    apply_nested(&mut bufs, &spec.nested)?;
    let mut args = [0i64; MAX_SYSCALL_ARGS];
    for (slot, value) in args.iter_mut().zip(&spec.args) {
        *slot = *value;
    }
    for (i, slot) in spec.ptrs.iter().enumerate() {
        let addr = bufs[i].as_mut_ptr() as i64;
        args[*slot as usize] = addr;
    }
    let nr = libc::c_long::from(spec.nr);
    // SAFETY: the test asked for exactly this syscall. Every pointer argument
    // the agent made points into `bufs`, which live, unmoved, until after the
    // call; integers are passed through as given.
    let ret: i64 =
        unsafe { libc::syscall(nr, args[0], args[1], args[2], args[3], args[4], args[5]) };
    let errno = errno_after(ret);
    Ok(OpValue::Syscall(SyscallResult {
        ret,
        errno,
        out_bufs: bufs,
    }))
}

pub fn ioctl(spec: IoctlSpec) -> Result<OpValue, OpError> {
    spec.check().map_err(|e| op_error::invalid(e.to_string()))?;
    let mut bufs = spec.bufs;
    let mut data = spec.data;
    for (i, off) in spec.ptr_offsets.iter().enumerate() {
        let addr = bufs[i].as_mut_ptr() as u64;
        let off = *off as usize;
        let slot = data
            .as_mut()
            .and_then(|d| d.get_mut(off..off + 8))
            .ok_or_else(|| op_error::invalid(format!("ptr_offsets[{i}] does not fit in data")))?;
        slot.copy_from_slice(&addr.to_ne_bytes());
    }
    let arg: *mut libc::c_void = data
        .as_mut()
        .map_or(std::ptr::null_mut(), |d| d.as_mut_ptr().cast());
    // SAFETY: as for syscall: `data` and `bufs` stay live and unmoved for the
    // call; the fd and request are the test's.
    let ret = unsafe { libc::ioctl(spec.fd, spec.cmd as libc::Ioctl, arg) };
    let ret = i64::from(ret);
    let errno = errno_after(ret);
    Ok(OpValue::Ioctl(IoctlResult {
        ret,
        errno,
        out_data: data,
        out_bufs: bufs,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn getpid_and_errno() {
        let OpValue::Syscall(r) = syscall(SyscallSpec {
            nr: libc::SYS_getpid,
            args: vec![],
            bufs: vec![],
            ptrs: vec![],
            nested: vec![],
        })
        .unwrap() else {
            panic!()
        };
        assert_eq!(r.ret, i64::from(std::process::id()));
        assert_eq!(r.errno, 0);
        let OpValue::Syscall(r) = syscall(SyscallSpec {
            nr: libc::SYS_close,
            args: vec![-1],
            bufs: vec![],
            ptrs: vec![],
            nested: vec![],
        })
        .unwrap() else {
            panic!()
        };
        assert_eq!((r.ret, r.errno), (-1, libc::EBADF));
    }

    #[test]
    fn nested_pointer_lands_in_parent() {
        let mut bufs = vec![vec![0u8; 16], vec![1, 2, 3]];
        apply_nested(
            &mut bufs,
            &[NestedPtr {
                parent: 0,
                child: 1,
                offset: 8,
            }],
        )
        .unwrap();
        let addr = u64::from_ne_bytes(bufs[0][8..16].try_into().unwrap());
        assert_eq!(addr, bufs[1].as_ptr() as u64);
    }

    #[test]
    fn bad_specs_are_invalid_arguments() {
        let err = syscall(SyscallSpec {
            nr: 0,
            args: vec![0; 7],
            bufs: vec![],
            ptrs: vec![],
            nested: vec![],
        })
        .unwrap_err();
        assert_eq!(
            err.code,
            provium_protocol::result::ErrorCode::InvalidArgument
        );
    }
}
