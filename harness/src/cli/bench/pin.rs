//! `--pin CPU`: the bench thread runs on one CPU, so the scheduler moving
//! it does not show up in the samples.

/// `--pin` could not be applied.
#[derive(Debug, thiserror::Error)]
pub enum PinError {
    #[error("--pin {cpu}: no such CPU")]
    NoSuchCpu { cpu: usize },
    #[error("--pin {cpu}: sched_setaffinity")]
    Affinity {
        cpu: usize,
        #[source]
        source: std::io::Error,
    },
}

/// Pins the calling thread to `cpu`.
pub(super) fn pin_to(cpu: usize) -> Result<(), PinError> {
    // SAFETY: cpu_set_t is plain data; CPU_ZERO/CPU_SET write inside it, and
    // sched_setaffinity reads `size_of::<cpu_set_t>()` bytes from it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_ZERO(&mut set);
        if cpu >= 8 * std::mem::size_of::<libc::cpu_set_t>() {
            return Err(PinError::NoSuchCpu { cpu });
        }
        libc::CPU_SET(cpu, &mut set);
        if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
            return Err(PinError::Affinity {
                cpu,
                source: std::io::Error::last_os_error(),
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cpu_past_the_set_is_refused() {
        assert_eq!(
            pin_to(1 << 20).unwrap_err().to_string(),
            "--pin 1048576: no such CPU"
        );
    }

    #[test]
    fn pinning_to_the_current_cpu_works() {
        // SAFETY: sched_getcpu has no preconditions.
        let cpu = unsafe { libc::sched_getcpu() };
        let cpu = usize::try_from(cpu).expect("sched_getcpu succeeds on Linux");
        // This test's own thread: pinning it to where it runs changes nothing else.
        assert!(pin_to(cpu).is_ok());
    }
}
