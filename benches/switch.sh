#!/usr/bin/env bash
# The userspace switch against the kernel bridge (veth pairs), between the
# same two local sandboxes, in one run (needs root: sandboxes, TAPs, veths).
#
#   bash benches/switch.sh
#
# Installs iperf3, ethtool and ping from Debian's packages when they are missing
# (bench tools, never installed by CI), builds the release agent, and runs
# harness/benches/switch.rs. Prints the machine, then `switch: ...` lines:
# per run and path, TCP throughput with one stream and four, and 64-byte UDP
# packets per second (iperf3), each with its CPU cost (`switch: cpu ...`:
# busy share of all CPUs, CPU seconds per Gbit or per million packets); RTT
# p50/p99 per path (ping); and the ratios, each followed by its ceiling at
# ours' CPU per unit (`switch: cpu_ceiling ...`): ours / bridge (offloads on both sides: our TAPs carry TSO super-frames) and
# ours_no_offload / bridge_no_offload (TSO/GSO/GRO off in the sandboxes, so
# MTU-sized frames on both); then impaired traffic, ours_switch against the
# bridge with netem (or the closest qdisc this kernel has) carrying the same
# latency, drop rate or cap (harness/benches/switch_impaired/). SWITCH_BENCH_SECONDS (default 5),
# SWITCH_BENCH_REPS (default 3) and SWITCH_BENCH_PINGS (default 1000) set the
# sizes. Results are recorded in docs/networking.md ("Numbers").
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
if [ "$(id -u)" -ne 0 ]; then
    echo "switch: needs root (sandboxes, TAPs, veth pairs and a bridge)" >&2
    exit 2
fi
missing=()
command -v iperf3 >/dev/null || missing+=(iperf3)
command -v ethtool >/dev/null || missing+=(ethtool)
command -v ping >/dev/null || missing+=(iputils-ping)
command -v tc >/dev/null || missing+=(iproute2)
if [ "${#missing[@]}" -gt 0 ]; then
    echo "switch: installing ${missing[*]} (apt-get)" >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}" >/dev/null ||
        { apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}" >/dev/null; }
fi
# No KVM involved: nothing boots, the sandboxes are namespaces.
echo "switch: machine nproc=$(nproc) kernel=$(uname -r) cpu=\"$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')\" iperf3=\"$(iperf3 --version | head -1)\""
cargo build --release -q -p provium-agent
PROVIUM_AGENT=$PWD/target/release/provium-agent exec cargo bench -q -p provium --bench switch
