//! `/dev/kvm`: open it, check the capabilities the VMM relies on, and read the
//! supported CPUID list once.

use std::io;

use kvm_bindings::{CpuId, KVM_MAX_CPUID_ENTRIES};
use kvm_ioctls::{Cap, Kvm};

/// The KVM API version every kernel since 2.6.22 reports.
pub const KVM_API_VERSION: i32 = 12;

const REQUIRED_CAPS: &[(Cap, &str)] = &[
    (Cap::Irqchip, "KVM_CAP_IRQCHIP"),
    (Cap::UserMemory, "KVM_CAP_USER_MEMORY"),
    (Cap::SetTssAddr, "KVM_CAP_SET_TSS_ADDR"),
    (Cap::Pit2, "KVM_CAP_PIT2"),
    (Cap::Irqfd, "KVM_CAP_IRQFD"),
    (Cap::ImmediateExit, "KVM_CAP_IMMEDIATE_EXIT"),
];

/// An error opening or probing `/dev/kvm`.
#[derive(Debug, thiserror::Error)]
pub enum KvmError {
    /// /dev/kvm does not exist.
    #[error("/dev/kvm not found (load the kvm module, or use `--vmm local`)")]
    NotFound(#[source] io::Error),
    /// /dev/kvm exists but cannot be opened read-write.
    #[error("/dev/kvm not writable (add your user to the `kvm` group, or use `--vmm local`)")]
    PermissionDenied(#[source] io::Error),
    /// Some other open failure.
    #[error("cannot open /dev/kvm")]
    Open(#[source] io::Error),
    /// Unexpected API version.
    #[error("/dev/kvm reports API version {0}, expected {KVM_API_VERSION}")]
    ApiVersion(i32),
    /// A capability the VMM needs is missing.
    #[error("/dev/kvm lacks {0}, which the VMM needs (use a newer host kernel, or `--vmm local`)")]
    MissingCap(&'static str),
    /// KVM_GET_SUPPORTED_CPUID failed.
    #[error("KVM_GET_SUPPORTED_CPUID failed")]
    SupportedCpuid(#[source] io::Error),
}

/// An open `/dev/kvm` with what the VMM read from it.
pub struct KvmContext {
    /// The handle.
    pub kvm: Kvm,
    /// KVM_GET_SUPPORTED_CPUID, the base every CPU template filters.
    pub supported_cpuid: CpuId,
    /// KVM_CAP_MAX_VCPUS (at least 1).
    pub max_vcpus: usize,
}

impl KvmContext {
    /// Opens `/dev/kvm` and checks it is usable.
    pub fn open() -> Result<KvmContext, KvmError> {
        let kvm = Kvm::new().map_err(|e| {
            let io = io::Error::from_raw_os_error(e.errno());
            match e.errno() {
                libc::ENOENT | libc::ENODEV | libc::ENXIO => KvmError::NotFound(io),
                libc::EACCES | libc::EPERM | libc::EROFS => KvmError::PermissionDenied(io),
                _ => KvmError::Open(io),
            }
        })?;
        let v = kvm.get_api_version();
        if v != KVM_API_VERSION {
            return Err(KvmError::ApiVersion(v));
        }
        for (cap, name) in REQUIRED_CAPS {
            if !kvm.check_extension(*cap) {
                return Err(KvmError::MissingCap(name));
            }
        }
        let supported_cpuid = kvm
            .get_supported_cpuid(KVM_MAX_CPUID_ENTRIES)
            .map_err(|e| KvmError::SupportedCpuid(io::Error::from_raw_os_error(e.errno())))?;
        let max_vcpus = kvm.get_max_vcpus().max(1);
        Ok(KvmContext {
            kvm,
            supported_cpuid,
            max_vcpus,
        })
    }
}
