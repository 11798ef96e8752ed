#!/usr/bin/env bash
# Scale: N local sandboxes on one bridge against N network namespaces with
# veth pairs on one Linux bridge, in one run (needs root: sandboxes, TAPs,
# veths, a bridge).
#
#   bash benches/scale.sh [N ...]        # default: 10 40 100
#
# Per N, provium runs one generated Lua file on the local backend: boot N
# sandboxes, attach them all to one bridge, give each an address, ping the
# first from every other, close the bridge, end (the sandboxes' teardown).
# The phases are read from the host clock (`date` run in the first sandbox,
# which shares it), the sandboxes' teardown from the bridge's close to
# provium's exit. A sampler reads provium's peak RSS, threads and open
# descriptors from /proc every 0.1 s.
#
# The peer, in the same run: N network namespaces, one Linux bridge in one
# more, a veth pair per namespace (one end in it, one on the bridge), all
# set up by one `ip -batch` and torn down by another; every namespace then
# pings the first (`ip netns exec`, one ping each, as provium's `vm:run`).
#
# SCALE_PROVIUM (default target/release/provium, built here unless set)
# and SCALE_KERNEL_PATH (default true; false makes the bridge with
# `{kernel_path = false}`) select what runs. SCALE_VMM=kvm runs the same
# file on the kvm backend instead: N Linux guests restored from one fixture
# (booted once, kept in SCALE_CACHE, default target/scale-cache), each
# joining the bridge through a NIC slot after boot. SCALE_KERNEL and
# SCALE_INITRD name the guest (default: the probe kernel and the test
# initrd the tiers build under target/). On a machine whose KVM emulates
# guest kernel code (kvm_pvm) every figure of the guests' own work is an
# emulated-kernel figure: label it so. Prints `scale: ...` lines and
# the ratios of the bridge to the peer: attach / setup and close / teardown.
# The peer's `netns del` returns before the kernel has freed the
# namespaces: its teardown is what a caller waits for, and its
# teardown_done is when the kernel had removed the last veth pair (polled
# from the bridge's namespace, kept until then), the work itself.
# Results are recorded in docs/benchmarking.md ("Scale").
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
if [ "$(id -u)" -ne 0 ]; then
    echo "scale: needs root (sandboxes, TAPs, veth pairs and a bridge)" >&2
    exit 2
fi
for tool in ip tc ping; do
    command -v "$tool" >/dev/null || { echo "scale: \`$tool\` is missing (apt-get install iproute2 iputils-ping)" >&2; exit 2; }
done
sizes=("$@")
[ "${#sizes[@]}" -gt 0 ] || sizes=(10 40 100)
kernel_path=${SCALE_KERNEL_PATH:-true}
vmm=${SCALE_VMM:-local}
case "$vmm" in
local | kvm) ;;
*) echo "scale: SCALE_VMM must be local or kvm, not \`$vmm\`" >&2; exit 2 ;;
esac
if [ "$vmm" = kvm ]; then
    kernel=${SCALE_KERNEL:-$(ls -t target/probe-kernel/*/bzImage 2>/dev/null | head -1)}
    initrd=${SCALE_INITRD:-$(ls -t target/guest-initrd/*/initrd.cpio 2>/dev/null | head -1)}
    if [ ! -f "$kernel" ] || [ ! -f "$initrd" ]; then
        echo "scale: SCALE_VMM=kvm needs a guest: set SCALE_KERNEL and SCALE_INITRD (or build the tiers' probe kernel and initrd: cargo test -p provium --test real_kernel)" >&2
        exit 2
    fi
    kernel=$(realpath "$kernel")
    initrd=$(realpath "$initrd")
    cache=${SCALE_CACHE:-$PWD/target/scale-cache}
    mkdir -p "$cache"
fi
if [ -z "${SCALE_PROVIUM:-}" ]; then
    cargo build --release -q -p provium -p provium-agent
    SCALE_PROVIUM=$PWD/target/release/provium
    # Sandboxes run the host's agent; a kvm guest gets the static one the
    # build put inside provium (a host build may not run in the guest).
    [ "$vmm" = kvm ] || export PROVIUM_AGENT=$PWD/target/release/provium-agent
fi
echo "scale: machine nproc=$(nproc) kernel=$(uname -r) load=$(cut -d' ' -f1-3 /proc/loadavg) provium=$SCALE_PROVIUM vmm=$vmm kernel_path=$kernel_path"

work=$(mktemp -d /tmp/provium-scale.XXXXXX)
trap 'rm -rf "$work"' EXIT
now() { date +%s.%N; }
sub() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", b - a }'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "n/a" }'; }

# Peak RSS (KiB), threads and descriptors of pid $1 until it exits, into $2.
sample() {
    local pid=$1 out=$2 rss=0 thr=0 fds=0 r t f
    while [ -d "/proc/$pid" ]; do
        r=$(awk '/^VmRSS/ { print $2 }' "/proc/$pid/status" 2>/dev/null || echo 0)
        t=$(awk '/^Threads/ { print $2 }' "/proc/$pid/status" 2>/dev/null || echo 0)
        f=$(ls "/proc/$pid/fd" 2>/dev/null | wc -l)
        [ "${r:-0}" -gt "$rss" ] && rss=$r
        [ "${t:-0}" -gt "$thr" ] && thr=$t
        [ "${f:-0}" -gt "$fds" ] && fds=$f
        sleep 0.1
    done
    echo "$rss $thr $fds" >"$out"
}

provium_run() {
    local n=$1 dir=$work/p$n
    mkdir -p "$dir"
    local make_vm
    if [ "$vmm" = kvm ]; then
        cat >"$dir/provium.toml" <<TOML
[provium]
roots = ["."]
cache_dir = "$cache"
[profiles.linux]
kernel = "$kernel"
initrd = "$initrd"
cmdline = "console=ttyS0 quiet"
guest_os = "linux"
TOML
        cat >"$dir/base.fixture.lua" <<LUA
return provium:vm("base", "linux"):boot():snapshot()
LUA
        make_vm='provium:vm_fixture("base")'
    else
        cat >"$dir/provium.toml" <<TOML
[provium]
roots = ["."]
[profiles.linux]
kernel = "/nonexistent/bzImage"
initrd = "/nonexistent/initrd"
cmdline = "quiet"
guest_os = "linux"
TOML
        make_vm='provium:vm("m" .. i, "linux"):boot()'
    fi
    cat >"$dir/scale.test.lua" <<LUA
local n = $n
local marks = io.open("$dir/marks", "w")
-- Marks on the host's clock (a kvm guest's clock is its own).
local function mark(what)
  local date = assert(io.popen("date +%s.%N"))
  marks:write(what .. " " .. date:read("l") .. "\n")
  date:close()
  marks:flush()
end
local vms = {}
for i = 1, n do
  vms[i] = $make_vm
end
mark("booted")
local lan = provium:bridge("lan", {kernel_path = $kernel_path})
lan:attach(vms)
mark("attached")
local function ip(i)
  return string.format("10.9.%d.%d", (i - 1) // 250, (i - 1) % 250 + 1)
end
for i = 1, n do
  local eth = vms[i]:nic("lan"):ifname()
  vms[i]:run("ip addr add " .. ip(i) .. "/16 dev " .. eth .. " && ip link set " .. eth .. " up"):assert_ok()
end
-- One test: the marks must come between the phases, and a file's tests
-- run after its top level.
test("every member reaches the first", function(t)
  for i = 2, n do
    t:assert(vms[i]:run("ping -c 1 -W 2 " .. ip(1)):ok(), "m" .. i .. " -> m1")
  end
  mark("reached")
  lan:close()
  mark("closed")
end)
LUA
    local t0 t_end
    t0=$(now)
    (cd "$dir" && exec "$SCALE_PROVIUM" --vmm "$vmm" --no-build --timeout 3600s scale.test.lua) >"$dir/out" 2>&1 &
    local pid=$!
    sample "$pid" "$dir/peak" &
    local sampler=$!
    local rc=0
    wait "$pid" || rc=$?
    t_end=$(now)
    wait "$sampler" || true
    if [ "$rc" -ne 0 ] || ! grep -q '^closed' "$dir/marks" 2>/dev/null; then
        echo "scale: provium N=$n FAILED (exit $rc):" >&2
        tail -20 "$dir/out" >&2
        return 1
    fi
    local booted attached reached closed rss thr fds
    booted=$(awk '$1 == "booted" { print $2 }' "$dir/marks")
    attached=$(awk '$1 == "attached" { print $2 }' "$dir/marks")
    reached=$(awk '$1 == "reached" { print $2 }' "$dir/marks")
    closed=$(awk '$1 == "closed" { print $2 }' "$dir/marks")
    read -r rss thr fds <"$dir/peak"
    P_SETUP=$(sub "$booted" "$attached")
    P_DOWN=$(sub "$reached" "$closed")
    echo "scale: provium vmm=$vmm N=$n boot=$(sub "$t0" "$booted")s attach=$(sub "$booted" "$attached")s reach=$(sub "$attached" "$reached")s bridge_close=${P_DOWN}s sandbox_teardown=$(sub "$closed" "$t_end")s whole=$(sub "$t0" "$t_end")s peak_rss=$((rss / 1024))MiB peak_threads=$thr peak_fds=$fds"
}

peer_run() {
    local n=$1 p=pvscale$$ i
    # Host side: the namespaces and each veth pair, its ends placed at
    # creation. The bridge's side: one batch in its namespace.
    {
        echo "netns add ${p}br"
        for i in $(seq 1 "$n"); do
            echo "netns add ${p}$i"
            echo "link add eth0 netns ${p}$i type veth peer name v$i netns ${p}br"
        done
    } >"$work/up$n"
    {
        echo "link add br0 type bridge"
        echo "link set br0 up"
        for i in $(seq 1 "$n"); do echo "link set v$i master br0 up"; done
    } >"$work/br$n"
    # The members' namespaces go in one batch; the bridge's stays until the
    # kernel has freed them (their veths' bridge ends vanish with them).
    for i in $(seq 1 "$n"); do echo "netns del ${p}$i"; done >"$work/down$n"
    local t0 t1 t2 t3
    t0=$(now)
    ip -batch "$work/up$n"
    ip -n "${p}br" -batch "$work/br$n"
    t1=$(now)
    # As provium's file: an address per member, then the pings.
    for i in $(seq 1 "$n"); do
        printf 'addr add 10.9.%d.%d/16 dev eth0\nlink set eth0 up\n' $(((i - 1) / 250)) $(((i - 1) % 250 + 1)) |
            ip -n "${p}$i" -batch -
    done
    local failed=0
    for i in $(seq 2 "$n"); do
        ip netns exec "${p}$i" ping -c 1 -W 2 10.9.0.1 >/dev/null || failed=$((failed + 1))
    done
    t2=$(now)
    ip -batch "$work/down$n"
    t3=$(now)
    # `netns del` returns at once; the kernel frees the namespaces, and
    # with them the veth pairs, afterwards in a worker. Done is when the
    # last pair's bridge end is gone.
    while [ "$(ip -n "${p}br" -o link show type veth | wc -l)" -gt 0 ]; do sleep 0.005; done
    t4=$(now)
    ip netns del "${p}br"
    Q_SETUP=$(sub "$t0" "$t1")
    Q_DOWN=$(sub "$t2" "$t3")
    Q_DONE=$(sub "$t2" "$t4")
    echo "scale: peer N=$n setup=${Q_SETUP}s reach=$(sub "$t1" "$t2")s teardown=${Q_DOWN}s teardown_done=${Q_DONE}s unreached=$failed"
}

for n in "${sizes[@]}"; do
    provium_run "$n" || continue
    peer_run "$n"
    echo "scale: ratio N=$n setup=$(ratio "$P_SETUP" "$Q_SETUP") teardown=$(ratio "$P_DOWN" "$Q_DOWN") teardown_done=$(ratio "$P_DOWN" "$Q_DONE") (bridge attach / peer setup; bridge close / peer teardown returned; / peer teardown done)"
done
