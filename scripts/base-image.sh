#!/usr/bin/env bash
# Build the local stand-in base image if it is missing.
#
#   scripts/base-image.sh [NAME:TAG] [--suite SUITE] [--mirror URL] [--force]
#
# NAME:TAG defaults to stackforge/base:bookworm. Steps, each skipped when its result exists:
#   1. debootstrap --variant=minbase SUITE into a temporary directory and
#      `docker import` it as NAME-rootfs:TAG;
#   2. build tools/stackforge/images/base/Dockerfile on top (python3, venv, pip, dev headers, git, gcc, ccache).
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
while [ $# -gt 0 ]; do
    case "$1" in
        --suite) suite=${2:?--suite needs a value}; shift 2 ;;
        --suite=*) suite=${1#*=}; shift ;;
        --mirror) mirror=${2:?--mirror needs a value}; shift 2 ;;
        --mirror=*) mirror=${1#*=}; shift ;;
        --force) force=1; shift ;;
        -h|--help) sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        -*) echo "base-image: error: unknown option $1" >&2; exit 2 ;;
        *) ref=$1; shift ;;
    esac
done

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
    say "debootstrap --variant=minbase $suite from $mirror"
    t0=$SECONDS
    debootstrap --variant=minbase --cache-dir="$cache" "$suite" "$dir" "$mirror" \
        >"$lockdir/debootstrap-$suite.log" 2>&1 \
        || { tail -n 30 "$lockdir/debootstrap-$suite.log" >&2; die "debootstrap failed; log: $lockdir/debootstrap-$suite.log"; }
    say "debootstrap done in $((SECONDS - t0)) s ($(du -sh --one-file-system "$dir" | cut -f1))"
    # Nothing host-specific or cache-like goes into the image.
    rm -rf "$dir"/var/cache/apt/archives/*.deb "$dir"/var/lib/apt/lists/* "$dir"/tmp/* "$dir"/debootstrap
    t0=$SECONDS
    tar --numeric-owner -C "$dir" -c . | docker import \
        --message "debootstrap --variant=minbase $suite $mirror" - "$rootfs_ref" >/dev/null
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
if ! docker buildx build --load --progress=plain \
        --build-arg BASE="$rootfs_ref" --build-arg SUITE="$suite" --build-arg DEBIAN_MIRROR="$mirror" \
        -t "$ref" -f "$root/tools/stackforge/images/base/Dockerfile" "$root/tools/stackforge/images/base" >"$log" 2>&1; then
    tail -n 40 "$log" >&2
    die "building $ref failed; log: $log"
fi
say "built $ref in $((SECONDS - t0)) s ($(docker image inspect --format '{{.Size}}' "$ref" | awk '{printf "%d MB", $1/1e6}'))"
say "total $((SECONDS - t_all)) s"
