#!/usr/bin/env bash
# Soak: one `provium` run of many files with `reset_between_tests` on the
# local backend, watching provium's own memory and descriptors for growth
# (docs/reliability.md, "Soak", records the figures). Not in CI.
#
#   sudo bash benches/soak.sh            # 300 files
#   FILES=1000 sudo bash benches/soak.sh
#
# Each file boots a file-scope VM, writes a baseline, and runs 3 tests that
# mutate it (reset_between_tests restores the baseline before each). A
# sampler reads /proc/<provium>/status (VmRSS, VmHWM) and counts
# /proc/<provium>/fd every 0.2 s, next to how many files have reported.
# Prints the first sample taken after 10 files reported ("start"), the
# last one ("end"), the peaks, and fails if the end exceeds the start by
# more than the documented bounds (RSS_GROWTH_MIB, default 32; FD_GROWTH,
# default 8) or if any file failed. PROFILE=release builds and uses the
# release binaries (default: debug, as the tests build them).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
FILES=${FILES:-300}
RSS_GROWTH_MIB=${RSS_GROWTH_MIB:-32}
FD_GROWTH=${FD_GROWTH:-8}
PROFILE=${PROFILE:-debug}
if [ "$PROFILE" = release ]; then
    cargo build -q --release -p provium -p provium-agent
else
    cargo build -q -p provium -p provium-agent
fi
BIN=$PWD/target/$PROFILE
work=$(mktemp -d /var/tmp/provium-soak.XXXXXX)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/tests"
printf '[provium]\nroots = ["tests"]\n\n[profiles.linux]\ncmdline = "quiet"\nguest_os = "linux"\n' >"$work/provium.toml"
for i in $(seq -w 1 "$FILES"); do
    cat >"$work/tests/soak_$i.test.lua" <<EOF
provium.reset_between_tests = true
local vm = provium:vm("soak-$i", "linux"):boot()
vm:write_file("/srv/baseline", "base")

test("mutates", function(t)
  t:assert_eq(vm:read_file("/srv/baseline"), "base")
  vm:write_file("/srv/baseline", "mutated")
  vm:write_file("/srv/extra", string.rep("x", 65536))
end)
test("sees the baseline", function(t)
  t:assert_eq(vm:read_file("/srv/baseline"), "base")
  t:assert_raises(function() vm:stat("/srv/extra") end)
  t:assert_eq(vm:run("echo ok").stdout, "ok\n")
end)
test("streams", function(t)
  local p = vm:run_async("seq 1 2000")
  t:assert_eq(p:wait().exit_code, 0)
end)
EOF
done
started=$(date +%s.%N)
(cd "$work" && PROVIUM_AGENT=$BIN/provium-agent PROVIUM_RERUN_STATE=$work/rerun.json \
    exec "$BIN/provium" --vmm local --no-preflight --json >"$work/out.json" 2>"$work/err.txt") &
pid=$!
: >"$work/samples"
while kill -0 "$pid" 2>/dev/null; do
    if st=$(cat "/proc/$pid/status" 2>/dev/null); then
        rss=$(awk '/^VmRSS:/ {print $2}' <<<"$st")
        hwm=$(awk '/^VmHWM:/ {print $2}' <<<"$st")
        fds=$(ls "/proc/$pid/fd" 2>/dev/null | wc -l)
        done_files=$(wc -l <"$work/out.json")
        [ -n "$rss" ] && echo "$done_files $rss $hwm $fds" >>"$work/samples"
    fi
    sleep 0.2
done
rc=0
wait "$pid" || rc=$?
elapsed=$(awk -v a="$started" -v b="$(date +%s.%N)" 'BEGIN {printf "%.1f", b - a}')
reported=$(wc -l <"$work/out.json")
failed=$(grep -c '"passed":false' "$work/out.json" || true)
start=$(awk '$1 >= 10 {print; exit}' "$work/samples")
end=$(tail -n 1 "$work/samples")
peak_rss=$(awk 'm < $2 {m = $2} END {print m}' "$work/samples")
peak_fds=$(awk 'm < $4 {m = $4} END {print m}' "$work/samples")
read -r s_files s_rss _ s_fds <<<"$start"
read -r e_files e_rss e_hwm e_fds <<<"$end"
echo "soak: machine nproc=$(nproc) kernel=$(uname -r) profile=$PROFILE"
echo "soak: files=$FILES reported=$reported failed=$failed exit=$rc elapsed_s=$elapsed samples=$(wc -l <"$work/samples")"
echo "soak: start (after $s_files files) rss_kib=$s_rss fds=$s_fds"
echo "soak: end (after $e_files files) rss_kib=$e_rss fds=$e_fds hwm_kib=$e_hwm"
echo "soak: peak rss_kib=$peak_rss fds=$peak_fds"
ok=1
if [ "$rc" -ne 0 ] || [ "$failed" -ne 0 ] || [ "$reported" -ne "$FILES" ]; then
    echo "soak: FAIL: the run did not pass every file"; tail -n 20 "$work/err.txt"; ok=0
fi
if [ $((e_rss - s_rss)) -gt $((RSS_GROWTH_MIB * 1024)) ]; then
    echo "soak: FAIL: RSS grew by $(((e_rss - s_rss) / 1024)) MiB (bound $RSS_GROWTH_MIB MiB)"; ok=0
fi
if [ $((e_fds - s_fds)) -gt "$FD_GROWTH" ]; then
    echo "soak: FAIL: open fds grew by $((e_fds - s_fds)) (bound $FD_GROWTH)"; ok=0
fi
[ "$ok" = 1 ] && echo "soak: PASS"
[ "$ok" = 1 ]
