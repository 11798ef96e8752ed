#!/usr/bin/env python3
"""QEMU's half of benches/snapshot_restore.sh: the same tiny guest, RAM and
touched pages as vmm/benches/snapshot_restore.rs, saved with `migrate` and
loaded with `-incoming`. Prints one JSON line, like the Rust driver.

  qemu_snapshot.py latency KERNEL MEM_MIB PCT REPS DIR
  qemu_snapshot.py memory  KERNEL MEM_MIB PCT COUNT DIR
"""
import json
import os
import random
import socket
import subprocess
import sys
import time

PAGE = 4096


def touched_pages(mem_mib, pct):
    stride = max(1, 100 // max(1, min(100, pct)))
    for p in range(0, (mem_mib << 20) // PAGE, stride):
        gpa = p * PAGE
        if (16 << 20) <= gpa < 0xC000_0000:
            yield gpa


class Qmp:
    def __init__(self, path, deadline=60.0):
        end = time.monotonic() + deadline
        while True:
            try:
                self.s = socket.socket(socket.AF_UNIX)
                self.s.connect(path)
                break
            except OSError:
                if time.monotonic() > end:
                    raise
                time.sleep(0.001)
        self.f = self.s.makefile("rw")
        self.f.readline()  # greeting
        self.cmd("qmp_capabilities")

    def cmd(self, name, **args):
        self.f.write(json.dumps({"execute": name, "arguments": args}) + "\n")
        self.f.flush()
        while True:
            r = json.loads(self.f.readline())
            if "return" in r:
                return r["return"]
            if "error" in r:
                raise RuntimeError(f"{name}: {r['error']}")


def qemu(kernel, mem_mib, qmp, extra):
    args = [
        "qemu-system-x86_64", "-enable-kvm", "-M", "microvm,acpi=off",
        # -arch-capabilities: this host's kvm_pvm refuses QEMU's write of
        # MSR 0x10a and QEMU aborts (as benches/side_by_side.py found).
        "-cpu", "host,-arch-capabilities",
        "-m", f"{mem_mib}M", "-smp", "1", "-nodefaults", "-no-user-config",
        "-display", "none", "-serial", "none", "-kernel", kernel,
        "-append", "console=ttyS0", "-qmp", f"unix:{qmp},server=on,wait=off",
    ] + extra
    return subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)


def stop(p):
    p.kill()
    p.wait()


def snapshot(kernel, mem_mib, pct, work, i):
    """Boots QEMU with file-backed RAM, writes the touched pages, migrates to
    a file. Returns (seconds, file bytes, state path)."""
    shm = f"/dev/shm/provium-snapbench-{os.getpid()}-{i}"
    qmp = os.path.join(work, f"qmp-{i}.sock")
    state = os.path.join(work, f"qemu-{mem_mib}-{pct}-{i}.state")
    p = qemu(kernel, mem_mib, qmp, [
        "-object", f"memory-backend-file,id=ram,size={mem_mib}M,mem-path={shm},share=on",
        "-M", "microvm,acpi=off,memory-backend=ram",
    ])
    try:
        q = Qmp(qmp)
        # Under QEMU the tiny guest is entered at startup_32, which this
        # host's kvm_pvm cannot run (KVM internal error): the VM stops at
        # once. Its RAM and device state still migrate like a running one's.
        time.sleep(0.2)
        q.cmd("stop")
        # Pseudo-random pages like the Rust driver's (incompressible; the
        # generator differs, the amount and layout do not).
        rnd = random.Random(0x9E3779B97F4A7C15)
        with open(shm, "r+b") as f:
            for gpa in touched_pages(mem_mib, pct):
                f.seek(gpa)
                f.write(rnd.randbytes(PAGE))
        q.cmd("migrate-set-parameters", **{"max-bandwidth": 1 << 40})
        t = time.monotonic()
        q.cmd("migrate", uri=f"exec:cat > {state}")
        while q.cmd("query-migrate").get("status") not in ("completed", "failed"):
            time.sleep(0.0005)
        took = time.monotonic() - t
        st = q.cmd("query-migrate").get("status")
        if st != "completed":
            raise RuntimeError(f"migrate {st}")
        return took, os.path.getsize(state), state
    finally:
        stop(p)
        os.unlink(shm)


def restore(kernel, mem_mib, state, work, i):
    """QEMU process start with -incoming until the incoming migration is
    `completed` (RAM and device state loaded; QEMU would then resume the VM
    if the source had been running). Returns (seconds, process)."""
    qmp = os.path.join(work, f"qmp-in-{i}.sock")
    if os.path.exists(qmp):
        os.unlink(qmp)
    t = time.monotonic()
    # The same RAM block id as the source ("ram"), anonymous and private.
    p = qemu(kernel, mem_mib, qmp, [
        "-object", f"memory-backend-ram,id=ram,size={mem_mib}M",
        "-M", "microvm,acpi=off,memory-backend=ram",
        "-incoming", f"exec:cat {state}",
    ])
    try:
        q = Qmp(qmp)
    except OSError:
        p.wait()
        raise RuntimeError("qemu -incoming exited: " + p.stderr.read().decode())
    while True:
        st = q.cmd("query-migrate").get("status")
        if st == "completed":
            break
        if st == "failed" or p.poll() is not None:
            raise RuntimeError(f"incoming migration {st}: {p.stderr.read().decode()}")
        time.sleep(0.0005)
    return time.monotonic() - t, p


def mem_of(pid):
    rss = pss = 0
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            k, _, v = line.partition(":")
            if k == "Rss":
                rss = int(v.split()[0]) * 1024
            elif k == "Pss":
                pss = int(v.split()[0]) * 1024
    return rss, pss


def main():
    mode, kernel, mem_mib, pct, n, work = sys.argv[1:7]
    mem_mib, pct, n = int(mem_mib), int(pct), int(n)
    if mode == "latency":
        snaps, restores, size = [], [], 0
        for i in range(n):
            took, size, state = snapshot(kernel, mem_mib, pct, work, i)
            snaps.append(took * 1e3)
            took, p = restore(kernel, mem_mib, state, work, i)
            restores.append(took * 1e3)
            stop(p)
            os.unlink(state)
        print(json.dumps({"who": "qemu", "mem_mib": mem_mib, "touch_pct": pct,
                          "file_bytes": size, "snapshot_ms": snaps, "restore_ms": restores}))
    elif mode == "memory":
        _, _, state = snapshot(kernel, mem_mib, pct, work, 0)
        procs = [restore(kernel, mem_mib, state, work, i)[1] for i in range(n)]
        try:
            rss = pss = 0
            for p in procs:
                r, s = mem_of(p.pid)
                rss += r
                pss += s
        finally:
            for p in procs:
                stop(p)
            os.unlink(state)
        print(json.dumps({"who": "qemu", "mem_mib": mem_mib, "touch_pct": pct, "count": n,
                          "restored_rss": rss, "restored_pss": pss}))
    else:
        sys.exit(f"unknown mode {mode}")


if __name__ == "__main__":
    main()
