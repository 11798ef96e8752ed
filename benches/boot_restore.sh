#!/usr/bin/env bash
# Boot, restore and agent round-trip numbers with `provium bench`, in one run
# (docs/benchmarking.md has what each phase means and the numbers measured).
#
#   bash benches/boot_restore.sh [OUT_DIR]            # root: restore/ops start sandboxes
#   QEMU=1 bash benches/boot_restore.sh [OUT_DIR]     # also QEMU -M microvm side by side
#   QEMU=1 ONLY_SIDE_BY_SIDE=1 bash benches/boot_restore.sh   # sections 2 (initrd) and 5 only
#
# Writes OUT_DIR (default target/bench/<date>) with one JSON-lines file per
# bench (`--json` output, comparable later with `provium bench compare`) and
# prints the tables. Knobs: RUNS (tiny guest, restore; default 50), PROBE_RUNS
# (probe kernel boots; default 3, each ~1 min on kvm_pvm), OPS_RUNS (default
# 1000), PIN (a CPU to pin to; default none).
#
# QEMU=1 installs Debian's qemu-system-x86 if missing (never in CI) and runs
# section 5: the tiny guest (TINY_RUNS, default 10) and the probe kernel
# (PROBE_RUNS) under our VMM and `qemu-system-x86_64 -M microvm,acpi=off`,
# alternating, each from process spawn to the first serial byte and to its
# marker line, plus each VMM's RSS beyond guest RAM (side-by-side.json;
# benches/side_by_side.py).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT=$PWD
OUT=${1:-$ROOT/target/bench/$(date +%Y%m%d-%H%M%S)}
RUNS=${RUNS:-50}
PROBE_RUNS=${PROBE_RUNS:-3}
OPS_RUNS=${OPS_RUNS:-1000}
PIN_ARGS=()
if [[ -n "${PIN:-}" ]]; then PIN_ARGS=(--pin "$PIN"); fi
mkdir -p "$OUT"

ONLY=${ONLY_SIDE_BY_SIDE:-0}
[[ $ONLY == 1 ]] || cargo build --release -q -p provium -p provium-agent
PROVIUM=$ROOT/target/release/provium
export PROVIUM_AGENT=$ROOT/target/release/provium-agent

bench() { # NAME ARGS...: JSON to $OUT/NAME.json, table to the terminal
    local name=$1
    shift
    echo "== provium bench $*"
    "$PROVIUM" bench "$@" "${PIN_ARGS[@]}" --json >"$OUT/$name.json"
    "$PROVIUM" bench compare "$OUT/$name.json" "$OUT/$name.json" >/dev/null # shape check
    python3 - "$OUT/$name.json" <<'EOF'
import json, sys
def f(x, unit):
    if x is None: return "-"
    if unit == "bytes": return f"{x/2**20:.1f}MiB"
    return f"{x/1e9:.2f}s" if x >= 1e9 else f"{x/1e6:.2f}ms" if x >= 1e6 else f"{x/1e3:.1f}us"
for line in open(sys.argv[1]):
    d = json.loads(line)
    if d["available"]:
        print(f'  {d["phase"]:<28} n={d["n"]:<4} min {f(d["min"], d["unit"]):>9}  median {f(d["median"], d["unit"]):>9}  '
              f'p90 {f(d["p90"], d["unit"]):>9}  p99 {f(d["p99"], d["unit"]):>9}  max {f(d["max"], d["unit"]):>9}')
    else:
        print(f'  {d["phase"]:<28} unavailable: {d["reason"]}')
EOF
}

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# 1. The tiny guest: VMM set-up and the VMM's own floor.
[[ $ONLY == 1 ]] || bench boot-tiny boot --tiny-guest -n "$RUNS" --warmup 5

# 2. The probe kernel (scripts/build-probe-kernel.sh). With the guest initrd
# (scripts/build-guest-initrd.sh: busybox, /init idling) the agent is
# injected and the boot is timed up to its Hello (--until ready), and a Linux
# vm_fixture is restored on kvm (2b); without it, a one-line /init, up to
# "Run /init". On kvm_pvm the backend adds its own command-line words.
KERNEL=${PROVIUM_PROBE_KERNEL:-$ROOT/target/probe-kernel/bzImage}
GUEST_INITRD=${PROVIUM_GUEST_INITRD:-$ROOT/target/guest-initrd/initrd.cpio}
CMDLINE="console=ttyS0 noxsave nokaslr tsc=reliable clearcpuid=308,141,151,145,158,288,298,306,291,296,156,293"
if [[ -f "$KERNEL" ]]; then
    mkdir -p "$work/probe/root/dev"
    if [[ -f "$GUEST_INITRD" ]]; then
        cp "$GUEST_INITRD" "$work/probe/initrd.cpio"
        UNTIL=(--until ready --timeout 1500 --ready-timeout 900)
    else
        printf '#!/bin/sh\necho provium bench init\n' >"$work/probe/root/init"
        chmod 755 "$work/probe/root/init"
        mknod "$work/probe/root/dev/console" c 5 1
        (cd "$work/probe/root" && find . | cpio -o -H newc --quiet) >"$work/probe/initrd.cpio"
        UNTIL=(--timeout 1500)
    fi
    cat >"$work/probe/provium.toml" <<EOF
[provium]
roots = ["$ROOT/tests/lua/linux"]
cache_dir = "$work/probe/cache"

[profiles.probe]
kernel = "$(readlink -f "$KERNEL")"
initrd = "$work/probe/initrd.cpio"
cmdline = "console=ttyS0"

[profiles.linux]
kernel = "$(readlink -f "$KERNEL")"
initrd = "$work/probe/initrd.cpio"
cmdline = "console=ttyS0"
EOF
    [[ $ONLY == 1 ]] || (cd "$work/probe" && bench boot-probe boot probe -n "$PROBE_RUNS" --warmup 0 "${UNTIL[@]}")
    # 2b. Restore of the real-guest tier's base fixture (a Linux guest with
    # the agent, booted once into the cache) on kvm, to the agent's answer.
    if [[ $ONLY != 1 && -f "$GUEST_INITRD" ]]; then
        (cd "$work/probe" && bench restore-linux restore base --vmm kvm -n "${LINUX_RESTORE_RUNS:-3}" --warmup 1)
    fi
else
    echo "== probe kernel $KERNEL missing: run scripts/build-probe-kernel.sh (skipping its boot bench)"
fi

# 3. Restore of a local vm_fixture, 1 and 4 at once.
if [[ $ONLY != 1 ]]; then
mkdir -p "$work/fix/fixtures" "$work/fix/k"
echo "not booted by the local backend" >"$work/fix/k/bzImage"
printf '[provium]\nroots = ["."]\ncache_dir = "cache"\n\n[profiles.linux]\nkernel = "k/bzImage"\ncmdline = "q"\n' >"$work/fix/provium.toml"
printf 'local vm = provium:vm("base", "linux"):boot()\nvm:write_file("/srv/tag", "bench")\nreturn vm:snapshot()\n' \
    >"$work/fix/fixtures/base.fixture.lua"
(cd "$work/fix" && bench restore-p1 restore fixtures/base --vmm local -n "$RUNS" --warmup 3)
(cd "$work/fix" && bench restore-p4 restore fixtures/base --vmm local -n "$RUNS" --warmup 4 --parallel 4)

# 4. Agent round trips on the local backend.
(cd "$work" && bench ops-local ops --vmm local -n "$OPS_RUNS" --warmup 50)
fi

# 5. Side by side with QEMU -M microvm (opt-in): the same images on the same
# KVM in one run, alternating ours and QEMU's boot by boot so a load change on
# the machine hits both. Each VMM runs as its own process with the guest's
# serial on a pipe: ours is vmm/examples/boot_serial.rs, QEMU has `-serial
# stdio`; a reader timestamps the bytes as they arrive, from the moment the
# process is spawned. When the marker line arrives, each process's RSS beyond
# its guest RAM mapping (the VMM's own memory) is read from /proc/PID/smaps.
if [[ "${QEMU:-0}" == 1 ]]; then
    if ! command -v qemu-system-x86_64 >/dev/null; then
        apt-get install -y -q qemu-system-x86 >/dev/null
    fi
    cargo build --release -q -p provium-vmm --example boot_serial
    TINY="$work/tiny.bzImage"
    cp "$(ls -t "$ROOT"/target/release/build/provium-vmm-*/out/tiny_guest.bzImage | head -n 1)" "$TINY"
    echo "== side by side: ours (boot_serial) vs $(qemu-system-x86_64 --version | head -1) -M microvm,acpi=off"
    python3 "$ROOT/benches/side_by_side.py" "$ROOT/target/release/examples/boot_serial" "$TINY" "$KERNEL" \
        "$work/probe/initrd.cpio" "$CMDLINE" "${TINY_RUNS:-10}" "$PROBE_RUNS" "$OUT/side-by-side.json"
fi
echo "== results in $OUT"
