//! What machine a bench ran on: CPU, kernel, KVM kind, load; reported with
//! every result so numbers from different hosts are never mixed up.

use std::path::Path;

use serde_json::{json, Value};

fn read_trim(path: &str) -> Option<String> {
    std::fs::read_to_string(path)
        .ok()
        .map(|s| s.trim().to_string())
}

/// What KVM this host has: "kvm_pvm" (paravirtual, nested: guest kernel
/// code is emulated, so slow; user space needs a kernel with the kvm_pvm
/// shims), "kvm", or "none".
pub fn kvm_kind() -> &'static str {
    if Path::new("/sys/module/kvm_pvm").exists() {
        "kvm_pvm"
    } else if Path::new("/dev/kvm").exists() {
        "kvm"
    } else {
        "none"
    }
}

/// The machine a run was measured on.
pub fn host_info(pinned_cpu: Option<usize>) -> Value {
    let cpu_model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
        })
        .unwrap_or_else(|| "?".into());
    let loadavg: Vec<f64> = read_trim("/proc/loadavg")
        .unwrap_or_default()
        .split_whitespace()
        .take(3)
        .filter_map(|x| x.parse().ok())
        .collect();
    json!({
        "hostname": read_trim("/proc/sys/kernel/hostname"),
        "kernel": read_trim("/proc/sys/kernel/osrelease"),
        "arch": std::env::consts::ARCH,
        "cpu_model": cpu_model,
        "nproc": std::thread::available_parallelism().map_or(0, |n| n.get()),
        "kvm": kvm_kind(),
        "loadavg": loadavg,
        "pinned_cpu": pinned_cpu,
        "provium_version": env!("CARGO_PKG_VERSION"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_info_names_the_machine_and_the_pin() {
        let h = host_info(Some(2));
        assert_eq!(h["pinned_cpu"], 2);
        assert_eq!(h["arch"], std::env::consts::ARCH);
        assert!(["kvm_pvm", "kvm", "none"].contains(&h["kvm"].as_str().unwrap()));
        assert!(h["nproc"].as_u64().unwrap() >= 1);
        assert!(host_info(None)["pinned_cpu"].is_null());
    }

    #[test]
    fn read_trim_strips_and_misses_quietly() {
        assert!(read_trim("/proc/sys/kernel/osrelease").is_some_and(|s| !s.ends_with('\n')));
        assert_eq!(read_trim("/nonexistent/file"), None);
    }
}
