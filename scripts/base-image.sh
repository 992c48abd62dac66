#!/usr/bin/env bash
# Build the local stand-in base image if it is missing.
#
#   scripts/base-image.sh [NAME:TAG] [--suite SUITE] [--mirror URL] [--platform linux/arm64] [--force]
#
# NAME:TAG defaults to stackforge/base:bookworm (stackforge/base:bookworm-arm64 with --platform linux/arm64).
# Steps, each skipped when its result exists:
#   1. debootstrap --variant=minbase SUITE into a temporary directory and
#      `docker import` it as NAME-rootfs:TAG; for a platform the host does not run natively, debootstrap's
#      --foreign first stage, then its second stage in a chroot under emulation (qemu-aarch64-static copied in
#      for it, removed after; scripts/engine-setup.sh registers the binfmt handler);
#   2. build tools/stackforge/images/base/Dockerfile on top (python3, venv, pip, dev headers, git, gcc, ccache),
#      for the same platform.
# No registry is contacted. --force rebuilds both steps.
#
# Environment: STACKFORGE_LOG_DIR (default /var/tmp/stackforge) holds base-image build logs;
# STACKFORGE_DEBOOTSTRAP_CACHE (default /var/cache/stackforge/debootstrap) keeps downloaded .debs.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/.." && pwd)

ref=stackforge/base:bookworm
suite=bookworm
mirror=${STACKFORGE_DEBIAN_MIRROR:-http://deb.debian.org/debian}
force=0
platform=""
while [ $# -gt 0 ]; do
    case "$1" in
        --platform) platform=${2:?--platform needs a value}; shift 2 ;;
        --platform=*) platform=${1#*=}; shift ;;
        --suite) suite=${2:?--suite needs a value}; shift 2 ;;
        --suite=*) suite=${1#*=}; shift ;;
        --mirror) mirror=${2:?--mirror needs a value}; shift 2 ;;
        --mirror=*) mirror=${1#*=}; shift ;;
        --force) force=1; shift ;;
        -h|--help) sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        -*) echo "base-image: error: unknown option $1" >&2; exit 2 ;;
        *) ref=$1; named=1; shift ;;
    esac
done
host_arch=$(dpkg --print-architecture 2>/dev/null || { [ "$(uname -m)" = aarch64 ] && echo arm64 || echo amd64; })
case "${platform:-linux/$host_arch}" in
    linux/amd64) arch=amd64 ;;
    linux/arm64) arch=arm64 ;;
    *) echo "base-image: error: --platform $platform: use linux/amd64 or linux/arm64" >&2; exit 2 ;;
esac
platform=linux/$arch
# a base for another platform than the default's is named apart, so the two never replace each other
[ "${named:-0}" = 1 ] || [ "$arch" = amd64 ] || ref="$ref-$arch"

say() { printf 'base-image: %s\n' "$*"; }
die() { printf 'base-image: error: %s\n' "$*" >&2; exit 1; }

case "$ref" in
    *:*) name=${ref%:*}; tag=${ref##*:} ;;
    *) name=$ref; tag=latest; ref="$name:$tag" ;;
esac
[[ "$tag" =~ ^[A-Za-z0-9_][A-Za-z0-9._-]{0,127}$ ]] || die "invalid tag '$tag' in $ref"
rootfs_ref="$name-rootfs:$tag"

exists() { docker image inspect "$1" >/dev/null 2>&1; }

docker info >/dev/null 2>&1 || die "no Docker daemon answers; fix: run scripts/engine-setup.sh"
docker buildx version >/dev/null 2>&1 || die "docker buildx is missing; fix: run scripts/engine-setup.sh"

if [ "$force" = 0 ] && exists "$ref"; then
    say "$ref present ($(docker image inspect --format '{{.Id}}' "$ref" | cut -c1-19)); nothing to do"
    exit 0
fi

# One builder per image name at a time (tests and scripts may race to build it).
lockdir=${STACKFORGE_LOG_DIR:-/var/tmp/stackforge}
mkdir -p "$lockdir"
lock="$lockdir/base-image-$(printf '%s' "$ref" | tr '/:' '__').lock"
exec 9>"$lock"
flock 9
if [ "$force" = 0 ] && exists "$ref"; then
    say "$ref was built meanwhile; nothing to do"
    exit 0
fi

t_all=$SECONDS

# ---- 1. root filesystem ------------------------------------------------------------------
if [ "$force" = 1 ] || ! exists "$rootfs_ref"; then
    command -v debootstrap >/dev/null 2>&1 || die "debootstrap is not installed; fix: run scripts/engine-setup.sh (as root on Debian) or apt-get install debootstrap"
    [ "$(id -u)" = 0 ] || die "debootstrap needs root; run as root or build $rootfs_ref elsewhere and 'docker load' it"
    cache=${STACKFORGE_DEBOOTSTRAP_CACHE:-/var/cache/stackforge/debootstrap}
    mkdir -p "$cache"
    dir=$(mktemp -d "${TMPDIR:-/var/tmp}/stackforge-rootfs.XXXXXX")
    trap 'rm -rf --one-file-system "$dir"' EXIT
    dlog="$lockdir/debootstrap-$suite-$arch.log"
    t0=$SECONDS
    if [ "$arch" = "$host_arch" ]; then
        say "debootstrap --variant=minbase $suite from $mirror"
        debootstrap --variant=minbase --cache-dir="$cache" "$suite" "$dir" "$mirror" >"$dlog" 2>&1 \
            || { tail -n 30 "$dlog" >&2; die "debootstrap failed; log: $dlog"; }
    else
        qemu=$(command -v qemu-aarch64-static || true)
        [ -n "$qemu" ] || die "qemu-aarch64-static is not installed; fix: run scripts/engine-setup.sh (as root on Debian: it installs qemu-user-static and binfmt-support and registers the handler)"
        grep -qx enabled /proc/sys/fs/binfmt_misc/qemu-aarch64 2>/dev/null \
            || die "no binfmt handler runs arm64 binaries (/proc/sys/fs/binfmt_misc/qemu-aarch64); fix: run scripts/engine-setup.sh"
        say "debootstrap --arch=$arch --foreign --variant=minbase $suite from $mirror (first stage)"
        debootstrap --arch="$arch" --foreign --variant=minbase --cache-dir="$cache" "$suite" "$dir" "$mirror" >"$dlog" 2>&1 \
            || { tail -n 30 "$dlog" >&2; die "debootstrap (first stage) failed; log: $dlog"; }
        say "debootstrap second stage in the chroot under emulation ($qemu)"
        cp "$qemu" "$dir/usr/bin/qemu-aarch64-static"
        chroot "$dir" /debootstrap/debootstrap --second-stage >>"$dlog" 2>&1 \
            || { tail -n 30 "$dlog" >&2; die "debootstrap (second stage) failed; log: $dlog"; }
        rm -f "$dir/usr/bin/qemu-aarch64-static"
        [ "$(chroot "$dir" uname -m)" = aarch64 ] || die "the $arch root filesystem does not run as aarch64"
    fi
    say "debootstrap done in $((SECONDS - t0)) s ($(du -sh --one-file-system "$dir" | cut -f1))"
    # Nothing host-specific or cache-like goes into the image.
    rm -rf "$dir"/var/cache/apt/archives/*.deb "$dir"/var/lib/apt/lists/* "$dir"/tmp/* "$dir"/debootstrap
    t0=$SECONDS
    tar --numeric-owner -C "$dir" -c . | docker import --platform "$platform" \
        --message "debootstrap --variant=minbase $suite $mirror ($platform)" - "$rootfs_ref" >/dev/null
    say "imported $rootfs_ref in $((SECONDS - t0)) s"
    rm -rf --one-file-system "$dir"
    trap - EXIT
else
    say "$rootfs_ref present; reusing it"
fi

# ---- 2. toolchain layer ------------------------------------------------------------------
log="$lockdir/base-image-$(printf '%s' "$ref" | tr '/:' '__').log"
say "building $ref on $rootfs_ref (log: $log)"
t0=$SECONDS
if ! docker buildx build --load --progress=plain --platform "$platform" \
        --build-arg BASE="$rootfs_ref" --build-arg SUITE="$suite" --build-arg DEBIAN_MIRROR="$mirror" \
        -t "$ref" -f "$root/tools/stackforge/images/base/Dockerfile" "$root/tools/stackforge/images/base" >"$log" 2>&1; then
    tail -n 40 "$log" >&2
    die "building $ref failed; log: $log"
fi
say "built $ref ($platform) in $((SECONDS - t0)) s ($(docker image inspect --format '{{.Size}}' "$ref" | awk '{printf "%d MB", $1/1e6}'))"
say "total $((SECONDS - t_all)) s"
