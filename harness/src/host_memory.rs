//! What a machine costs the host in memory, read from /proc: resident
//! (Rss) and proportional (Pss, shared pages split between sharers) bytes,
//! for a local sandbox's processes or a kvm VM's guest RAM mappings in this
//! process. Used by `provium bench` and [`crate::backend::Guest::resident_memory`].

/// Resident and proportional memory of a set of processes, from /proc.
pub fn memory_of(pids: &[i32]) -> (u64, u64) {
    let kib = |text: &str, key: &str| -> u64 {
        text.lines()
            .find(|l| l.starts_with(key))
            .and_then(|l| l[key.len()..].split_whitespace().next())
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
            * 1024
    };
    let mut rss = 0;
    let mut pss = 0;
    for pid in pids {
        if let Ok(s) = std::fs::read_to_string(format!("/proc/{pid}/status")) {
            rss += kib(&s, "VmRSS:");
        }
        if let Ok(s) = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")) {
            pss += kib(&s, "Pss:");
        }
    }
    (rss, pss)
}

/// Resident (Rss) and proportional (Pss) bytes of the mappings of this
/// process that start inside `ranges` (a VM's guest RAM), from
/// /proc/self/smaps.
pub fn mapping_memory(ranges: &[(u64, u64)]) -> (u64, u64) {
    let Ok(smaps) = std::fs::read_to_string("/proc/self/smaps") else {
        return (0, 0);
    };
    let (mut rss, mut pss) = (0, 0);
    let mut inside = false;
    for line in smaps.lines() {
        let head = line.split_whitespace().next().unwrap_or("");
        if let Some((a, _)) = head.split_once('-') {
            if let Ok(start) = u64::from_str_radix(a, 16) {
                inside = ranges.iter().any(|&(s, l)| start >= s && start < s + l);
                continue;
            }
        }
        if !inside {
            continue;
        }
        let kib = |key: &str| {
            line.strip_prefix(key)
                .and_then(|v| v.split_whitespace().next())
                .and_then(|v| v.parse::<u64>().ok())
                .map(|k| k * 1024)
        };
        if let Some(b) = kib("Rss:") {
            rss += b;
        } else if let Some(b) = kib("Pss:") {
            pss += b;
        }
    }
    (rss, pss)
}
