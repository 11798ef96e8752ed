#!/usr/bin/env bash
# Harness overhead, side by side with a peer (pytest) in one run.
#
#   bash benches/harness_overhead.sh [REPS]
#
# Shapes (from the harness issue): one file with 1000 trivial tests, and 50
# files of 10 trivial tests each on --cpus 2. The peer runs the same shapes as
# pytest tests in the same run. Reports the median wall time of REPS runs
# (default 5) of each, and the ratio provium/pytest. Nothing boots: this is
# the harness's own cost (Lua state per file, scheduling, reporting).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
REPS=${1:-5}
cargo build --release -q -p provium
PROVIUM=$PWD/target/release/provium
if ! python3 -c 'import pytest' 2>/dev/null; then
    python3 -m pip install -q pytest
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/one/lua" "$work/one/py" "$work/many/lua" "$work/many/py"
{
    for i in $(seq 1 1000); do echo "test(\"t$i\", function(t) t:assert_eq($i, $i) end)"; done
} >"$work/one/lua/thousand.test.lua"
{
    for i in $(seq 1 1000); do printf 'def test_%d():\n    assert %d == %d\n' "$i" "$i" "$i"; done
} >"$work/one/py/test_thousand.py"
for f in $(seq 1 50); do
    for i in $(seq 1 10); do echo "test(\"t$i\", function(t) t:assert_eq($i, $i) end)"; done >"$work/many/lua/f$f.test.lua"
    for i in $(seq 1 10); do printf 'def test_%d():\n    assert %d == %d\n' "$i" "$i" "$i"; done >"$work/many/py/test_f$f.py"
done

# Median wall time in milliseconds of REPS runs of a command.
median_ms() {
    local samples=()
    for _ in $(seq 1 "$REPS"); do
        local t0 t1
        t0=$(date +%s%N)
        "$@" >/dev/null 2>&1
        t1=$(date +%s%N)
        samples+=($(((t1 - t0) / 1000000)))
    done
    printf '%s\n' "${samples[@]}" | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'
}

report() {
    local shape=$1 ours=$2 peer=$3
    awk -v s="$shape" -v o="$ours" -v p="$peer" \
        'BEGIN { printf "%-28s provium %6d ms   pytest %6d ms   ratio %.2f\n", s, o, p, o / p }'
}

echo "host: $(nproc) cores, $(uname -r); reps: $REPS (median)"
ours=$(median_ms "$PROVIUM" --vmm local --no-preflight --no-ksm "$work/one/lua")
peer=$(median_ms python3 -m pytest -q -p no:cacheprovider "$work/one/py")
report "1 file x 1000 tests" "$ours" "$peer"
ours=$(median_ms "$PROVIUM" --vmm local --no-preflight --no-ksm --cpus 2 "$work/many/lua")
peer=$(median_ms python3 -m pytest -q -p no:cacheprovider "$work/many/py")
report "50 files x 10 tests, --cpus 2" "$ours" "$peer"
