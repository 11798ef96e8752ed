#!/usr/bin/env bash
# Fetches Debian 12's stock kernel (the package linux-image-amd64 points at)
# and unpacks it, for the own-kernel tests (issues 24 and 25): `kernel check`
# on a distro kernel with its module tree, and a boot of its vmlinux that shows
# how far a stock kernel gets on this machine's KVM.
#
#   scripts/fetch-debian-kernel.sh     fetch if needed; print the unpacked root
#
# The root holds boot/vmlinuz-<release>, boot/config-<release>,
# lib/modules/<release>/ (uncompressed, signed .ko files, no modules.dep) and
# vmlinux (the ELF extracted from vmlinuz with the kernel's own
# scripts/extract-vmlinux logic: booting it skips the xz decompression, which
# kvm_pvm would emulate for minutes).
#
# Cache: target/debian-kernel/<package>_<version>/, with target/debian-kernel/current
# linking to it; a rerun with the same candidate version only prints the path.
# About 70 MB downloaded once. Needs apt (Debian's registry) and root or sudo
# only to install xz-utils/binutils when missing.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT=$(pwd)
OUT="${CARGO_TARGET_DIR:-$ROOT/target}/debian-kernel"

log() { printf 'fetch-debian-kernel: %s\n' "$*" >&2; }
die() { log "$*"; exit 1; }

sudo=()
[ "$(id -u)" -eq 0 ] || sudo=(sudo)
missing=()
command -v xz >/dev/null || missing+=(xz-utils)
command -v dpkg-deb >/dev/null || missing+=(dpkg)
if [ "${#missing[@]}" -gt 0 ]; then
    log "installing ${missing[*]}"
    "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -q >&2
    "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}" >&2
fi

# The concrete image package the metapackage depends on (linux-image-6.1.0-N-amd64).
pkg=$(apt-cache depends linux-image-amd64 2>/dev/null | awk '/Depends: linux-image-[0-9]/ {print $2; exit}')
if [ -z "$pkg" ]; then
    "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -q >&2
    pkg=$(apt-cache depends linux-image-amd64 | awk '/Depends: linux-image-[0-9]/ {print $2; exit}')
fi
[ -n "$pkg" ] || die "apt knows no linux-image-amd64 (is this Debian 12 with its archive reachable?)"
version=$(apt-cache policy "$pkg" | awk '/Candidate:/ {print $2}')
dest="$OUT/${pkg}_$version"
mkdir -p "$OUT"
exec 9>"$OUT/.lock"
flock 9

if [ -f "$dest/.complete" ]; then
    ln -sfn "$(basename "$dest")" "$OUT/current"
    log "cached ($pkg $version)"
    echo "$dest"
    exit 0
fi

tmp="$dest.tmp"
rm -rf "$tmp"
mkdir -p "$tmp/deb"
log "downloading $pkg $version"
(cd "$tmp/deb" && apt-get download "$pkg" >&2) || die "apt-get download $pkg failed"
dpkg-deb -x "$tmp"/deb/*.deb "$tmp"
rm -rf "$tmp/deb"

release=${pkg#linux-image-}
vmlinuz="$tmp/boot/vmlinuz-$release"
[ -f "$vmlinuz" ] || die "the package has no boot/vmlinuz-$release"
# extract-vmlinux: find the xz stream inside the bzImage and unpack it.
offset=$(grep -abo $'\xfd7zXZ\x00' "$vmlinuz" | head -n 1 | cut -d: -f1)
[ -n "$offset" ] || die "no xz payload in $vmlinuz (not an xz-compressed bzImage?)"
tail -c +"$((offset + 1))" "$vmlinuz" | xz -dc >"$tmp/vmlinux" 2>/dev/null || true
head -c 4 "$tmp/vmlinux" | grep -q $'\x7fELF' || die "extracting vmlinux from $vmlinuz failed"
echo "$pkg $version" >"$tmp/source"
touch "$tmp/.complete"
rm -rf "$dest"
mv "$tmp" "$dest"
ln -sfn "$(basename "$dest")" "$OUT/current"
echo "$dest"
