#!/usr/bin/env bash
# Snapshot and restore latency, ours against QEMU, side by side in one run
# (benches/README.md policy: same guest, same KVM, same host, ratios).
#
#   bash benches/snapshot_restore.sh [OUT_DIR]
#
# For guest memory MEMS (MiB; default "64 256 1024 2048") and touched
# fractions PCTS (default "1 10" %), REPS times (default 3):
#   ours: vmm/benches/snapshot_restore.rs boots the tiny guest, pauses it,
#         writes pseudo-random data into PCT % of its pages (every
#         100/PCT-th page above 16 MiB), `Vm::snapshot`s it (sparse zstd
#         image and the restore image beside it, fsync, rename), then
#         restores it into a new VM three times: the first restore ("1st")
#         uses the image the snapshot wrote; then the image is removed and
#         the next restore ("build") builds it from the memory section (what
#         every first restore did before snapshots wrote it); the third
#         reuses it.
#         Restore = `Vm::new` to `Vm::restore` returning with the vCPUs
#         started (also reported: to the guest's counter moving).
#   QEMU: qemu-system-x86_64 -enable-kvm -M microvm,acpi=off with the same
#         bzImage and RAM as a memory-backend-file in /dev/shm, the same
#         pages written into that file; snapshot = QMP `stop` + `migrate`
#         to `exec:cat > FILE` (QEMU 7.2 has no file: URI; bandwidth limit
#         lifted) until `completed`; restore = process start with
#         `-incoming "exec:cat FILE"` until that migration is `completed`.
# Then (unless MEMORY=0) resident memory: COUNT (default 10) restores of one 256 MiB, 10 %
# snapshot alive at once, ours (Rss/Pss of the VMs' RAM mappings) and QEMU
# (Rss/Pss of the processes), and ours against COUNT cold boots that touch
# the same pages.
#
# Note: QEMU enters a bzImage through its 32-bit entry (startup_32), which
# this host's kvm_pvm cannot run ("KVM internal error"), so under QEMU the
# tiny guest is stopped with the same RAM contents; RAM dominates the saved
# state either way. QEMU's restore ends when its VM could resume; ours when
# the vCPUs run (the guest running is reported separately).
#
# Installs Debian's qemu-system-x86 if missing (never in CI). Prints a table
# with ratios (ours / QEMU); writes the raw JSON lines to OUT_DIR.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT=$PWD
OUT=${1:-$ROOT/target/bench/snapshot-$(date +%Y%m%d-%H%M%S)}
MEMS=${MEMS:-"64 256 1024 2048"}
PCTS=${PCTS:-"1 10"}
REPS=${REPS:-3}
COUNT=${COUNT:-10}
mkdir -p "$OUT"
if ! command -v qemu-system-x86_64 >/dev/null; then
    apt-get install -y qemu-system-x86 >/dev/null
fi
cargo build --release -q -p provium-vmm --bench snapshot_restore
DRIVER=$(ls -t "$ROOT"/target/release/deps/snapshot_restore-* | grep -v '\.d$' | head -1)
# The tiny guest's bzImage, as built into provium-vmm.
KERNEL=$(ls -t "$ROOT"/target/release/build/provium-vmm-*/out/tiny_guest.bzImage | head -1)
work=$(mktemp -d /var/tmp/provium-snapbench.XXXXXX)
trap 'rm -rf "$work"; rm -f /dev/shm/provium-snapbench-*' EXIT

echo "host: $(uname -r), $(nproc) CPUs, kvm: $(ls /sys/module | grep -E '^kvm_(intel|amd|pvm)$' | head -1), load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "qemu: $(qemu-system-x86_64 --version | head -1)"

for mem in $MEMS; do
    for pct in $PCTS; do
        "$DRIVER" latency "$mem" "$pct" "$REPS" "$work" >>"$OUT/ours.jsonl"
        python3 "$ROOT/benches/qemu_snapshot.py" latency "$KERNEL" "$mem" "$pct" "$REPS" "$work" >>"$OUT/qemu.jsonl"
    done
done
if [ "${MEMORY:-1}" = 1 ]; then
    "$DRIVER" memory 256 10 "$COUNT" "$work" >>"$OUT/ours-memory.jsonl"
    python3 "$ROOT/benches/qemu_snapshot.py" memory "$KERNEL" 256 10 "$COUNT" "$work" >>"$OUT/qemu-memory.jsonl"
fi

python3 - "$OUT" <<'EOF'
import json, statistics, sys, os
out = sys.argv[1]
def rows(name):
    return [json.loads(l) for l in open(os.path.join(out, name)) if l.strip()]
ours = {(d["mem_mib"], d["touch_pct"]): d for d in rows("ours.jsonl")}
qemu = {(d["mem_mib"], d["touch_pct"]): d for d in rows("qemu.jsonl")}
med = statistics.median
print(f'{"MiB":>5} {"%":>3} | {"snapshot ms ours":>16} {"qemu":>8} {"ratio":>6} | {"restore ms ours":>15} {"(1st)":>8} {"1st/med":>7} {"(build)":>8} {"qemu":>8} {"ratio":>6} {"running":>8} | {"file MiB ours":>13} {"qemu":>7}')
for k in sorted(ours):
    o, q = ours[k], qemu.get(k)
    if q is None: continue
    s_o, s_q = med(o["snapshot_ms"]), med(q["snapshot_ms"])
    r_o, r1, r_q = med(o["restore_ms"]), med(o["first_restore_ms"]), med(q["restore_ms"])
    run = med(o["running_ms"])
    rb = med(o["build_restore_ms"])
    # 1st/med: the first restores' median against the later ones'.
    r1_ratio = r1 / r_o
    print(f'{k[0]:>5} {k[1]:>3} | {s_o:>16.1f} {s_q:>8.1f} {s_o/s_q:>6.2f} | {r_o:>15.1f} {r1:>8.1f} {r1_ratio:>7.2f} {rb:>8.1f} {r_q:>8.1f} {r_o/r_q:>6.3f} {run:>8.1f} | '
          f'{o["file_bytes"]/2**20:>13.1f} {q["file_bytes"]/2**20:>7.1f}')
if not os.path.exists(os.path.join(out, "ours-memory.jsonl")):
    sys.exit(0)
om, qm = rows("ours-memory.jsonl")[0], rows("qemu-memory.jsonl")[0]
n = om["count"]
mib = lambda b: b / 2**20
print(f'\nresident memory, {n} x {om["mem_mib"]} MiB guests with {om["touch_pct"]} % touched, all alive:')
print(f'  ours restored: Rss {mib(om["restored_rss"]):.1f} MiB, Pss {mib(om["restored_pss"]):.1f} MiB; '
      f'after the host read every page of each: Rss {mib(om["read_rss"]):.1f} MiB, Pss {mib(om["read_pss"]):.1f} MiB')
print(f'  ours cold boots (same pages written): Rss {mib(om["cold_rss"]):.1f} MiB, Pss {mib(om["cold_pss"]):.1f} MiB')
print(f'  qemu -incoming: Rss {mib(qm["restored_rss"]):.1f} MiB, Pss {mib(qm["restored_pss"]):.1f} MiB (whole processes)')
print(f'  ratio Pss ours restored (pages read) / qemu restored: {om["read_pss"]/qm["restored_pss"]:.3f}; '
      f'ours restored / ours cold: {om["read_pss"]/om["cold_pss"]:.3f}')
EOF
echo "raw: $OUT"
