#!/usr/bin/env bash
# Agent op latency on the local backend, with a plain Unix-socket echo round
# trip measured in the same run (needs root: it starts sandboxes).
#
#   bash benches/agent_ops.sh
#
# Prints the machine, then `agent_ops: op=NAME n=N p50_us=X p99_us=Y` per op
# (sandbox_start, echo_unix, ping, run_true, read_4k, write_read_1m), the
# ratio ping/echo and the 1 MiB throughput. AGENT_OPS_SCALE=N multiplies the
# iteration counts. Results are recorded in docs/agent.md.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
kvm=none
for m in kvm_pvm kvm_intel kvm_amd; do
    if [ -d "/sys/module/$m" ]; then kvm=$m; break; fi
done
echo "agent_ops: machine nproc=$(nproc) kernel=$(uname -r) kvm=$kvm cpu=\"$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')\""
cargo build --release -q -p provium-agent
PROVIUM_AGENT=$PWD/target/release/provium-agent exec cargo bench -q -p provium --bench agent_ops
