#!/usr/bin/env bash
# Builds the minimal Linux kernel of the kernel-probe test tier (DESIGN.md,
# "This machine's KVM" and "How we test", tier 5) from Debian's linux-source-6.1
# package, and caches it.
#
#   scripts/build-probe-kernel.sh            build if needed; print the bzImage path
#   scripts/build-probe-kernel.sh --modular  the distro-shaped kernel of the
#       real-guest tier (issue 25): the same source, options and shims, with
#       scripts/probe-kernel/options-modular on top (virtio, its transports,
#       vsock, blk, net, rng and console as modules, CONFIG_MODULES=y); cached in
#       target/probe-kernel-modular/<key>/ with its modules installed under
#       lib/modules/<release>/ there (the harness packs what the agent loads)
#
# Recipe: `make tinyconfig`, then every line of scripts/probe-kernel/options
# (scripts/config --enable/--disable), `make olddefconfig`, a check that each
# option really took, and every scripts/probe-kernel/*.patch in name order:
#   skip-int3-selftest.patch      kvm_pvm emulates no int3;
#   kvm-pvm-syscall-fault.patch   serves kvm_pvm's broken user-mode SYSCALL
#                                 (a #PF at LSTAR) as the system call it was;
#   kvm-pvm-no-fwait.patch        no FWAIT in fpu__drop (not emulated).
# Each patch's header says the exact fault it serves; hardware KVM needs none of
# them (docs/vmm.md, "The probe kernel's kvm_pvm shims"). The image is
# LZ4-compressed and has ACPI, PCI (MSI) and virtio-mmio with its command-line
# route built in: the probe tier boots it with ACPI discovery, over virtio-pci,
# and with the virtio_mmio.device= words.
#
# Cache: target/probe-kernel/<key>/{bzImage,vmlinux}, where <key> is the
# SHA-256 of the options, the patches, this script, the linux-source package
# version and the compiler version; target/probe-kernel/bzImage and
# target/probe-kernel/vmlinux link to the newest. vmlinux is the same kernel as
# a stripped ELF: booting it skips the LZ4 decompression, which kvm_pvm
# emulates (about 25 s here). A rerun with the same inputs only prints the path. The source tree is extracted under
# target/probe-kernel/src-<version>/ (kept, so a config change rebuilds only what
# changed). vmm/tests/probe_kernel.rs boots target/probe-kernel/bzImage, or the
# file PROVIUM_PROBE_KERNEL names.
#
# Build dependencies (installed with apt-get when missing; needs root or sudo):
# linux-source-6.1 make gcc flex bison bc libelf-dev lz4 perl xz-utils.
# About 2.5 min on 2 cores once the source is extracted.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT=$(pwd)
HERE="$ROOT/scripts/probe-kernel"
OUT="${CARGO_TARGET_DIR:-$ROOT/target}/probe-kernel"
MODULAR=0
case "${1:-}" in
'') ;;
--modular)
    MODULAR=1
    OUT="${CARGO_TARGET_DIR:-$ROOT/target}/probe-kernel-modular"
    ;;
*)
    echo "usage: $0 [--modular]" >&2
    exit 2
    ;;
esac
SOURCE_PKG=linux-source-6.1
SOURCE_TAR=/usr/src/linux-source-6.1.tar.xz

log() {
    printf 'build-probe-kernel: %s\n' "$*" >&2
}

die() {
    log "$*"
    exit 1
}

# Install Debian packages, as root or through sudo.
apt_install() {
    local sudo=()
    if [ "$(id -u)" -ne 0 ]; then
        command -v sudo >/dev/null ||
            die "need to install $* but not root and no sudo (install them, then rerun)"
        sudo=(sudo)
    fi
    log "installing $*"
    "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -q >&2
    "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive \
        apt-get install -y -q --no-install-recommends "$@" >&2
}

missing=()
[ -f "$SOURCE_TAR" ] || missing+=("$SOURCE_PKG")
for tool in make:make gcc:gcc flex:flex bison:bison bc:bc lz4:lz4 perl:perl xz:xz-utils; do
    command -v "${tool%%:*}" >/dev/null || missing+=("${tool#*:}")
done
[ -f /usr/include/gelf.h ] || missing+=(libelf-dev)
if [ "${#missing[@]}" -gt 0 ]; then
    apt_install "${missing[@]}"
fi

version=$(dpkg-query -W -f='${Version}' "$SOURCE_PKG" 2>/dev/null || echo unknown)
key=$(
    {
        cat "$HERE/options" "$HERE"/*.patch "${BASH_SOURCE[0]}"
        [ "$MODULAR" = 0 ] || cat "$HERE/options-modular"
        echo "$SOURCE_PKG $version"
        gcc --version | head -n 1
    } | sha256sum | cut -c1-16
)
dest="$OUT/$key"
mkdir -p "$OUT"

# One build at a time per target directory.
exec 9>"$OUT/.lock"
flock 9

if [ -f "$dest/bzImage" ] && [ -f "$dest/vmlinux" ]; then
    ln -sfn "$key/bzImage" "$OUT/bzImage"
    ln -sfn "$key/vmlinux" "$OUT/vmlinux"
    log "cached ($SOURCE_PKG $version, key $key)"
    echo "$dest/bzImage"
    exit 0
fi

src="$OUT/src-$version"
if [ ! -f "$src/.provium-extracted" ]; then
    log "extracting $SOURCE_TAR into $src"
    rm -rf "$src"
    mkdir -p "$src"
    tar -xJf "$SOURCE_TAR" -C "$src" --strip-components=1
    touch "$src/.provium-extracted"
fi

cd "$src"
# Each patch is applied once per tree: one whose reverse applies cleanly is
# already in (a tree kept from an earlier build).
for patch_file in "$HERE"/*.patch; do
    name=$(basename "$patch_file")
    if patch -p1 -R --dry-run --force <"$patch_file" >/dev/null 2>&1; then
        continue
    fi
    log "applying $name"
    patch -p1 --forward <"$patch_file" >&2 || die "$name does not apply to $SOURCE_PKG $version"
done

# The options in effect: options, then (--modular) options-modular, the last
# line about an option winning.
effective=$(
    {
        cat "$HERE/options"
        [ "$MODULAR" = 0 ] || cat "$HERE/options-modular"
    } | awk '$1 !~ /^#/ && NF == 2 { if (!($2 in at)) order[n++] = $2; at[$2] = $1 }
             END { for (i = 0; i < n; i++) print at[order[i]], order[i] }'
)
log "configuring (tinyconfig + scripts/probe-kernel/options$([ "$MODULAR" = 0 ] || echo ' + options-modular'))"
make -s ARCH=x86 tinyconfig >&2
args=()
while read -r action option; do
    case "$action" in
    '' | '#'*) continue ;;
    enable) args+=(--enable "$option") ;;
    disable) args+=(--disable "$option") ;;
    module) args+=(--module "$option") ;;
    *) die "scripts/probe-kernel/options: unknown action '$action' (use enable, disable or module)" ;;
    esac
done <<<"$effective"
scripts/config "${args[@]}"
make -s ARCH=x86 olddefconfig >&2

bad=()
while read -r action option; do
    case "$action" in
    enable) grep -qx "CONFIG_$option=y" .config || bad+=("$option should be y") ;;
    disable) ! grep -qx "CONFIG_$option=y" .config || bad+=("$option should be off") ;;
    module) grep -qx "CONFIG_$option=m" .config || bad+=("$option should be m") ;;
    esac
done <<<"$effective"
if [ "${#bad[@]}" -gt 0 ]; then
    die "the kernel config did not take: ${bad[*]} (a dependency is missing: add it to scripts/probe-kernel/options)"
fi

jobs=$(nproc)
log "building bzImage with $jobs jobs (log: $src/build.log)"
start=$(date +%s)
targets=(bzImage vmlinux)
[ "$MODULAR" = 0 ] || targets+=(modules)
if ! make ARCH=x86 -j"$jobs" "${targets[@]}" >"$src/build.log" 2>&1; then
    tail -n 40 "$src/build.log" >&2
    die "kernel build failed; full log: $src/build.log"
fi
log "built in $(($(date +%s) - start)) s"

mkdir -p "$dest.tmp"
cp arch/x86/boot/bzImage "$dest.tmp/bzImage"
# The loader needs only the loadable segments; symbols stay in the tree's
# vmlinux (and System.map) for resolving initcall_debug addresses.
objcopy --strip-all vmlinux "$dest.tmp/vmlinux"
cp System.map "$dest.tmp/System.map"
cp .config "$dest.tmp/config"
echo "$SOURCE_PKG $version" >"$dest.tmp/source"
if [ "$MODULAR" = 1 ]; then
    # lib/modules/<release>/ beside the kernel: where the harness looks.
    make -s ARCH=x86 INSTALL_MOD_PATH="$dest.tmp" INSTALL_MOD_STRIP=1 DEPMOD=true \
        modules_install >>"$src/build.log" 2>&1 || die "modules_install failed; log: $src/build.log"
    rm -f "$dest.tmp"/lib/modules/*/build "$dest.tmp"/lib/modules/*/source
fi
rm -rf "$dest"
mv "$dest.tmp" "$dest"
ln -sfn "$key/bzImage" "$OUT/bzImage"
ln -sfn "$key/vmlinux" "$OUT/vmlinux"
echo "$dest/bzImage"
