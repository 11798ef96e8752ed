"""Our VMM vs QEMU -M microvm, same images, same KVM, alternating boot by boot.

Called by benches/boot_restore.sh (QEMU=1): argv = boot_serial binary, tiny
guest bzImage, probe kernel, probe initrd, probe cmdline, tiny runs, probe
runs, output JSON. Each boot is a fresh process with the guest's serial on a
pipe, timed from spawn: first byte, and the marker line (the tiny guest's
banner; the probe kernel's "Run /init as init process"). At the marker the
process's RSS beyond its guest RAM mapping is read from /proc/PID/smaps.
"""
import json
import os
import statistics
import subprocess
import sys
import time

ours_bin, tiny, kernel, initrd, cmdline, tiny_runs, probe_runs, out = sys.argv[1:9]
tiny_runs, probe_runs = int(tiny_runs), int(probe_runs)
MIB = 2**20


def qemu(kern, initrd, append, mem_mib):
    # acpi=off: QEMU then announces its virtio-mmio devices on the command
    # line (none here) and the kernel, which has no ACPI, boots as on ours.
    # -arch-capabilities: some KVMs (kvm_pvm on AMD hosts) refuse QEMU's
    # write of IA32_ARCH_CAPABILITIES (MSR 0x10a) and QEMU then aborts.
    cmd = ["qemu-system-x86_64", "-M", "microvm,acpi=off", "-enable-kvm", "-cpu", "host,-arch-capabilities",
           "-m", str(mem_mib), "-nodefaults", "-no-user-config", "-nographic",
           "-serial", "stdio", "-no-reboot", "-kernel", kern]
    if initrd:
        cmd += ["-initrd", initrd]
    if append:
        cmd += ["-append", append]
    return cmd


def ours(kern, initrd, append, mem_mib):
    cmd = [ours_bin, "--mem", str(mem_mib)]
    cmd += ["--tiny"] if kern == tiny else ["--kernel", kern]
    if initrd:
        cmd += ["--initrd", initrd]
    if append:
        cmd += ["--cmdline", append]
    return cmd


def rss_beyond_guest(pid, mem_mib):
    """RSS minus that of mappings at least as large as guest RAM (the guest's memory)."""
    total = guest = size = 0
    with open(f"/proc/{pid}/smaps") as f:
        for line in f:
            parts = line.split()
            if parts and "-" in parts[0] and not parts[0].endswith(":"):
                lo, hi = (int(x, 16) for x in parts[0].split("-"))
                size = hi - lo
            elif parts and parts[0] == "Rss:":
                b = int(parts[1]) * 1024
                total += b
                if size >= mem_mib * MIB:
                    guest += b
    return total - guest


def one(cmd, needle, mem_mib, limit_s):
    t0 = time.monotonic()
    p = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.DEVNULL)
    first = hit = rss = None
    buf = b""
    while True:
        b = os.read(p.stdout.fileno(), 65536)
        now = time.monotonic()
        if not b:
            break
        first = first or now
        buf = (buf + b)[-65536:]
        if needle in buf:
            hit = now
            try:
                rss = rss_beyond_guest(p.pid, mem_mib)
            except OSError:
                pass
            break
        if now - t0 > limit_s:
            break
    p.kill()
    p.wait()
    ms = lambda t: None if t is None else (t - t0) * 1e3
    return {"first_byte_ms": ms(first), "marker_ms": ms(hit), "rss_beyond_guest_bytes": rss}


rows = []


def fmt(v, div, unit):
    return "never" if v is None else f"{v / div:.2f}{unit}"


def series(name, cases, runs, needle, mem_mib, limit_s):
    for i in range(runs):
        for vmm, cmd in cases:  # ours, qemu, ours, qemu, ...
            r = one(cmd, needle, mem_mib, limit_s)
            r.update({"bench": name, "vmm": vmm, "run": i + 1})
            rows.append(r)
            print(f"  {name:<5} {vmm:<4} run {i + 1}: first byte {fmt(r['first_byte_ms'], 1, 'ms')}, "
                  f"{needle.decode()!r} {fmt(r['marker_ms'], 1, 'ms')}, "
                  f"RSS beyond guest RAM {fmt(r['rss_beyond_guest_bytes'], MIB, 'MiB')}", flush=True)


# The tiny guest: ours enters its 64-bit entry, QEMU's -kernel its 16-bit
# one; both print "PROVIUM-TINY-GUEST v1" first.
series("tiny", [("ours", ours(tiny, None, "console=ttyS0", 64)),
                ("qemu", qemu(tiny, None, "console=ttyS0", 64))],
       tiny_runs, b"PROVIUM-TINY-GUEST v1", 64, 60)
if probe_runs > 0 and os.path.isfile(kernel) and os.path.isfile(initrd):
    series("probe", [("ours", ours(kernel, initrd, cmdline, 256)),
                     ("qemu", qemu(kernel, initrd, cmdline, 256))],
           probe_runs, b"Run /init as init process", 256, 1800)

summary = {}
for name in ("tiny", "probe"):
    for key in ("first_byte_ms", "marker_ms", "rss_beyond_guest_bytes"):
        med = {}
        for vmm in ("ours", "qemu"):
            vals = [r[key] for r in rows
                    if r["bench"] == name and r["vmm"] == vmm and r[key] is not None]
            med[vmm] = statistics.median(vals) if vals else None
        if med["ours"] is not None and med["qemu"]:
            summary[f"{name}.{key}"] = {"ours_median": med["ours"], "qemu_median": med["qemu"],
                                        "ours_over_qemu": med["ours"] / med["qemu"]}
for k, v in summary.items():
    print(f"  {k:<32} median ours {v['ours_median']:.1f}  qemu {v['qemu_median']:.1f}  "
          f"ours/qemu {v['ours_over_qemu']:.2f}")
load = os.getloadavg()
print(f"  load average at the end: {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}")
with open(out, "w") as f:
    json.dump({"rows": rows, "summary": summary, "load_avg": load}, f, indent=1)
