#!/usr/bin/env bash
# Builds the guest userland of the real-guest test tier (DESIGN.md, "How we
# test", tier 6; docs/vmm.md, "Linux guests on this machine") from Debian's
# busybox-static package, and caches it.
#
#   scripts/build-guest-initrd.sh        build if needed; print the initrd path
#
# The initrd is an uncompressed newc cpio (an emulated kernel pays dearly for
# gunzip) holding:
#   /bin/busybox and a link for each of its applets at the path busybox itself
#     lists (`busybox --list-full`): sh, coreutils (cat, dd, date, ...), ip,
#     ping, mount, /usr/bin/env, poweroff, ...;
#   /init: mounts proc, sys, dev and tmp (unless already mounted; the agent
#     mounts them first), then idles, with shell builtins only.
#     It is PID 1 when nothing else is: the kvm backend injects the agent as
#     rdinit=/sbin/provium-agent, which forks the agent and execs this /init.
#     It turns the kernel's Ctrl-Alt-Del reboot off, so the power button
#     arrives as SIGINT, on which it powers off gracefully: SIGTERM to every
#     process, up to 5 s, SIGKILL, sync, power off. That trap is its first
#     command: a restored VM can be pressed while init is still mounting;
#   /etc/passwd, /etc/group, /etc/hosts; empty /proc /sys /dev /tmp /root /mnt.
#
# Cache: target/guest-initrd/<key>/initrd.cpio, where <key> is the SHA-256 of
# this script and the busybox-static package file; target/guest-initrd/initrd.cpio
# links to the newest. A rerun with the same inputs only prints the path.
#
# Needs: apt-get (the package is downloaded with `apt-get download`, not
# installed), dpkg-deb, cpio (installed with apt-get when missing; needs root
# or sudo).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT=$(pwd)
OUT="${CARGO_TARGET_DIR:-$ROOT/target}/guest-initrd"
PACKAGE=busybox-static

log() {
    printf 'build-guest-initrd: %s\n' "$*" >&2
}

die() {
    log "$*"
    exit 1
}

as_root() {
    if [ "$(id -u)" -eq 0 ]; then
        "$@"
    elif command -v sudo >/dev/null; then
        sudo "$@"
    else
        die "need root or sudo for: $* (run it, then rerun this script)"
    fi
}

mkdir -p "$OUT"
exec 9>"$OUT/.lock"
flock 9

command -v cpio >/dev/null || {
    log "installing cpio"
    as_root env DEBIAN_FRONTEND=noninteractive apt-get update -q >&2
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends cpio >&2
}

# The package file, downloaded once into the cache (apt-get download needs
# package lists; update them once if it cannot find the package).
debs=("$OUT"/${PACKAGE}_*.deb)
if [ ! -f "${debs[0]}" ]; then
    log "downloading $PACKAGE"
    if ! (cd "$OUT" && apt-get download "$PACKAGE" >&2); then
        as_root env DEBIAN_FRONTEND=noninteractive apt-get update -q >&2
        (cd "$OUT" && apt-get download "$PACKAGE" >&2) || die "cannot download $PACKAGE with apt-get"
    fi
    debs=("$OUT"/${PACKAGE}_*.deb)
fi
deb=${debs[-1]}

key=$(cat "${BASH_SOURCE[0]}" "$deb" | sha256sum | cut -c1-16)
dest="$OUT/$key"
if [ -f "$dest/initrd.cpio" ]; then
    ln -sfn "$key/initrd.cpio" "$OUT/initrd.cpio"
    log "cached ($(basename "$deb"), key $key)"
    echo "$dest/initrd.cpio"
    exit 0
fi

stage="$OUT/stage.$$"
rm -rf "$stage" "$dest.tmp"
trap 'rm -rf "$stage" "$dest.tmp"' EXIT
mkdir -p "$stage/pkg" "$stage/root" "$dest.tmp"
dpkg-deb -x "$deb" "$stage/pkg"
busybox="$stage/pkg/bin/busybox"
[ -x "$busybox" ] || die "$(basename "$deb") has no bin/busybox"

r="$stage/root"
mkdir -p "$r"/{bin,sbin,usr/bin,usr/sbin,etc,proc,sys,dev,tmp,root,mnt,run,var}
chmod 1777 "$r/tmp"
cp "$busybox" "$r/bin/busybox"
# Every applet at the path busybox itself gives, as a relative symlink.
"$busybox" --list-full | while read -r applet; do
    [ "$applet" = bin/busybox ] && continue
    dir=$(dirname "$applet")
    up=$(echo "$dir" | sed -E 's#[^/]+#..#g')
    mkdir -p "$r/$dir"
    ln -sfn "$up/bin/busybox" "$r/$applet"
done
for tool in sh env ip ping dd date mount poweroff; do
    [ -e "$r/bin/$tool" ] || [ -e "$r/sbin/$tool" ] || [ -e "$r/usr/bin/$tool" ] ||
        die "busybox in $(basename "$deb") has no $tool applet"
done

cat >"$r/etc/passwd" <<'EOF'
root:x:0:0:root:/root:/bin/sh
nobody:x:65534:65534:nobody:/nonexistent:/bin/false
EOF
cat >"$r/etc/group" <<'EOF'
root:x:0:
nogroup:x:65534:
EOF
printf '127.0.0.1 localhost\n' >"$r/etc/hosts"

cat >"$r/init" <<'EOF'
#!/bin/sh
# provium guest initrd's init (scripts/build-guest-initrd.sh).
#
# Shell builtins only, except where something must be done: every fork+exec
# costs seconds where the guest kernel is emulated (kvm_pvm), and tests run
# while this script does, so it must reach its idle loop at once.
export PATH=/usr/sbin:/usr/bin:/sbin:/bin

# The power button arrives as SIGINT. Its trap is set before anything else:
# ash running a script catches SIGINT from its start and, with no trap yet,
# exits 130, which panics the kernel ("Attempted to kill init"). A VM
# restored from a snapshot taken while this script was still mounting
# (seconds per fork on kvm_pvm) is pressed right there.

# A pipe nobody writes: `read -t` on it is a sleep without a fork, once
# it is open (fd 3, below); before that, `sleep`.
idle_fd=
pause() {
    if [ -n "$idle_fd" ]; then
        read -r -t "$1" _ <&3
    else
        sleep "$1"
    fi
}

# Whether a user process other than this init is left (kernel threads have an
# empty cmdline).
others_alive() {
    for d in /proc/[0-9]*; do
        [ "${d#/proc/}" = 1 ] && continue
        c=
        read -r c <"$d/cmdline" 2>/dev/null
        [ -n "$c" ] && return 0
    done
    return 1
}

# Stop everything gracefully (SIGTERM, up to 5 s, SIGKILL), then power off.
power_off() {
    echo "init: power button: stopping processes" >/dev/console
    kill -TERM -1 2>/dev/null
    i=0
    while [ "$i" -lt 10 ] && others_alive; do
        pause 0.5
        i=$((i + 1))
    done
    kill -KILL -1 2>/dev/null
    sync
    poweroff -f
}
trap power_off INT TERM

# Whether $1 is a mount point, from /proc/mounts (false before proc is).
mounted() {
    while read -r _ point _; do
        [ "$point" = "$1" ] && return 0
    done </proc/mounts 2>/dev/null
    return 1
}
mounted /proc || mount -t proc proc /proc
# Ctrl-Alt-Del (the power button) is signalled to init as SIGINT instead of
# rebooting at once (the kernel's default, ctrl-alt-del = 1).
echo 0 >/proc/sys/kernel/ctrl-alt-del
mounted /sys || mount -t sysfs sysfs /sys
mounted /dev || mount -t devtmpfs devtmpfs /dev
mounted /tmp || mount -t tmpfs tmpfs /tmp

mkfifo /run/init.idle && exec 3<>/run/init.idle && idle_fd=3

# Idle: `read` returns when a trapped signal arrives, so the trap runs at once.
while :; do
    pause 3600
done
EOF
chmod 755 "$r/init"

(cd "$r" && find . -mindepth 1 | LC_ALL=C sort | cpio --quiet -o -H newc -R 0:0) >"$dest.tmp/initrd.cpio"
basename "$deb" >"$dest.tmp/source"
rm -rf "$dest"
mv "$dest.tmp" "$dest"
ln -sfn "$key/initrd.cpio" "$OUT/initrd.cpio"
log "built $(stat -c %s "$dest/initrd.cpio") bytes from $(basename "$deb")"
echo "$dest/initrd.cpio"
