#!/usr/bin/env bash
# The floor under the switch's added RTT (issue 29): how long a thread
# asleep in epoll_wait, as the switch's TAP poller is between echoes, takes
# to run once an eventfd it waits on is written, pinned to another CPU than
# the writer and to the same one, with the writes GAP_US apart (default
# 5000, the bench's ping interval) so that the sleeper's CPU goes idle in
# between.
#
#   bash benches/wakeup.sh [N [GAP_US]]
#
# Needs a C compiler (cc). Prints `wakeup: other_cpu ...` and `wakeup:
# same_cpu ...` lines with p50/p90/p99 in microseconds. No peer: a bridge
# forwards an echo with no wake-up at all, so this is what one wake-up per
# echo costs on the machine. Results in docs/networking.md ("The switch's
# own path").
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
cc -O2 -pthread -o "$out/wakeup" benches/wakeup.c
echo "wakeup: machine nproc=$(nproc) kernel=$(uname -r) loadavg=\"$(cat /proc/loadavg)\""
"$out/wakeup" "${1:-1000}" "${2:-5000}"
