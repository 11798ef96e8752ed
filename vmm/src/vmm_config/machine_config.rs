//! vCPU count, memory size and CPU template.

use crate::arch::cpuid::CpuTemplate;

/// Smallest guest memory accepted: low memory, the kernel at 1 MiB and room to run.
pub const MIN_MEM_SIZE_MIB: u64 = 16;
/// Largest vCPU count (APIC IDs are one byte in xAPIC mode).
pub const MAX_VCPUS: u8 = 254;

/// Machine shape.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MachineConfig {
    /// Number of vCPUs (1..=`MAX_VCPUS`, and at most what KVM allows).
    pub vcpu_count: u8,
    /// Guest RAM in MiB (at least `MIN_MEM_SIZE_MIB`).
    pub mem_size_mib: u64,
    /// CPU template applied to KVM's supported CPUID.
    pub cpu_template: CpuTemplate,
}

impl Default for MachineConfig {
    fn default() -> Self {
        MachineConfig {
            vcpu_count: 1,
            mem_size_mib: 128,
            cpu_template: CpuTemplate::default(),
        }
    }
}

/// An invalid machine config.
#[derive(Debug, thiserror::Error)]
pub enum MachineConfigError {
    /// vCPU count out of range.
    #[error("vcpu count {0} is out of range (use 1 to {MAX_VCPUS})")]
    VcpuCount(u8),
    /// vCPU count above what KVM allows.
    #[error("vcpu count {count} exceeds this KVM's limit of {max}")]
    VcpuCountKvm {
        /// Requested.
        count: u8,
        /// KVM_CAP_MAX_VCPUS.
        max: usize,
    },
    /// Too little memory.
    #[error("memory of {0} MiB is too small (use at least {MIN_MEM_SIZE_MIB} MiB)")]
    MemTooSmall(u64),
    /// Memory size overflows.
    #[error("memory of {0} MiB is too large")]
    MemTooLarge(u64),
}

impl MachineConfig {
    /// Checks ranges that do not depend on the host.
    pub fn validate(&self) -> Result<(), MachineConfigError> {
        if self.vcpu_count == 0 || self.vcpu_count > MAX_VCPUS {
            return Err(MachineConfigError::VcpuCount(self.vcpu_count));
        }
        if self.mem_size_mib < MIN_MEM_SIZE_MIB {
            return Err(MachineConfigError::MemTooSmall(self.mem_size_mib));
        }
        self.mem_bytes()?;
        Ok(())
    }

    /// Memory in bytes.
    pub fn mem_bytes(&self) -> Result<u64, MachineConfigError> {
        self.mem_size_mib
            .checked_mul(1 << 20)
            .ok_or(MachineConfigError::MemTooLarge(self.mem_size_mib))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_are_checked() {
        assert!(MachineConfig::default().validate().is_ok());
        let bad = |vcpu_count, mem_size_mib| {
            MachineConfig {
                vcpu_count,
                mem_size_mib,
                cpu_template: CpuTemplate::Host,
            }
            .validate()
            .is_err()
        };
        assert!(bad(0, 128));
        assert!(bad(255, 128));
        assert!(bad(1, 8));
        assert!(bad(1, u64::MAX));
    }
}
