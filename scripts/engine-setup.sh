#!/usr/bin/env bash
# Make a BuildKit engine available: dockerd + docker buildx, plus the tools the
# tests and the base image need (docker-registry, debootstrap, ccache).
#
# Idempotent and fast when everything is already up: it only checks, prints what
# it found and exits 0. On a Debian host as root it installs what is missing and
# starts dockerd; anywhere else it stops with a message naming what to install.
#
# Environment:
#   STACKFORGE_DOCKERD_LOG   dockerd log file (default /var/log/stackforge-dockerd.log)
#   STACKFORGE_DOCKERD_WAIT  seconds to wait for the daemon (default 60)
#   STACKFORGE_BUILDX_SUITE  Debian suite that provides docker-buildx (default trixie)
set -euo pipefail

DOCKERD_LOG=${STACKFORGE_DOCKERD_LOG:-/var/log/stackforge-dockerd.log}
DOCKERD_WAIT=${STACKFORGE_DOCKERD_WAIT:-60}
BUILDX_SUITE=${STACKFORGE_BUILDX_SUITE:-trixie}
DEBIAN_MIRROR=${STACKFORGE_DEBIAN_MIRROR:-http://deb.debian.org/debian}

# Host tools beside the engine: command -> Debian package.
declare -A TOOLS=([docker-registry]=docker-registry [debootstrap]=debootstrap [ccache]=ccache)

say() { printf 'engine-setup: %s\n' "$*"; }
die() { printf 'engine-setup: error: %s\n' "$*" >&2; exit 1; }

docker_ok() { docker info >/dev/null 2>&1; }
buildx_ok() { docker buildx version >/dev/null 2>&1; }

missing_tools() {
    local cmd out=()
    for cmd in "${!TOOLS[@]}"; do
        command -v "$cmd" >/dev/null 2>&1 || out+=("${TOOLS[$cmd]}")
    done
    echo "${out[@]:-}"
}

report() {
    local server
    server=$(docker version --format '{{.Server.Version}}' 2>/dev/null || echo '?')
    say "docker daemon $server ($(docker info --format '{{.Driver}}' 2>/dev/null) storage, root $(docker info --format '{{.DockerRootDir}}' 2>/dev/null))"
    say "buildx: $(docker buildx version 2>/dev/null | head -n1)"
    local bk
    bk=$(docker buildx inspect 2>/dev/null | awk -F': *' '
        /^Name:/ && !n {printf "%s ", $2; n=1}
        /^Driver:/ {printf "driver=%s ", $2}
        /^(Buildkit|BuildKit version):/ {printf "buildkit=%s ", $2}')
    say "builder: ${bk:-?}"
    local cmd
    for cmd in docker-registry debootstrap ccache; do
        if command -v "$cmd" >/dev/null 2>&1; then say "$cmd: $(command -v "$cmd")"; else say "$cmd: not installed"; fi
    done
}

# ---- fast path: everything already there ------------------------------------------------
if command -v docker >/dev/null 2>&1 && docker_ok && buildx_ok && [ -z "$(missing_tools)" ]; then
    report
    exit 0
fi

is_debian() { [ -r /etc/debian_version ] && command -v apt-get >/dev/null 2>&1 && command -v dpkg >/dev/null 2>&1; }

if [ "$(id -u)" != 0 ] || ! is_debian; then
    # We cannot install here; say exactly what is missing.
    need=()
    command -v docker >/dev/null 2>&1 || need+=("the docker CLI")
    if command -v docker >/dev/null 2>&1 && ! docker_ok; then need+=("a running Docker daemon (dockerd >= 20.10) that this user can reach (docker info fails)"); fi
    command -v docker >/dev/null 2>&1 && ! buildx_ok && need+=("the docker buildx plugin (>= 0.10; https://github.com/docker/buildx)")
    if [ ${#need[@]} -gt 0 ]; then
        die "no usable build engine. Install: $(IFS=';'; echo "${need[*]}"). $( [ "$(id -u)" != 0 ] && echo 'Or run this script as root on Debian to install them.' || echo 'Automatic install is supported on Debian only.')"
    fi
    tools=$(missing_tools)
    say "engine is usable; missing optional tools: ${tools} (tests need docker-registry; scripts/base-image.sh needs debootstrap)"
    report
    exit 0
fi

# ---- root on Debian: install what is missing ---------------------------------------------
export DEBIAN_FRONTEND=noninteractive
apt_updated=0
apt_update_once() {
    [ "$apt_updated" = 1 ] && return 0
    say "apt-get update"
    # Unreachable third-party sources only warn; the install below fails loudly if Debian's do.
    apt-get update -qq || say "apt-get update reported errors (continuing; install will tell)"
    apt_updated=1
}

pkgs=()
command -v dockerd >/dev/null 2>&1 || pkgs+=(docker.io)
command -v docker >/dev/null 2>&1 || pkgs+=(docker.io)
for p in $(missing_tools); do pkgs+=("$p"); done
# curl for the registry readiness probe; the keyring for debootstrap and the buildx fetch.
command -v curl >/dev/null 2>&1 || pkgs+=(curl)
[ -r /usr/share/keyrings/debian-archive-keyring.gpg ] || pkgs+=(debian-archive-keyring)
if [ ${#pkgs[@]} -gt 0 ]; then
    mapfile -t pkgs < <(printf '%s\n' "${pkgs[@]}" | sort -u)
    apt_update_once
    say "apt-get install ${pkgs[*]}"
    t0=$SECONDS
    apt-get install -y -qq --no-install-recommends "${pkgs[@]}" >/dev/null
    say "installed in $((SECONDS - t0)) s"
fi

if ! buildx_ok; then
    # bookworm has no docker-buildx package; the newer suite's one is a static Go binary
    # needing only libc6 >= 2.34. Fetch that single .deb through a private sources list so
    # the machine's own apt lists stay as they are.
    tmp=$(mktemp -d /tmp/stackforge-buildx.XXXXXX)
    trap 'rm -rf "$tmp"' EXIT
    mkdir -p "$tmp/lists/partial" "$tmp/parts" "$tmp/cache/archives/partial"
    keyring=/usr/share/keyrings/debian-archive-keyring.gpg
    [ -r "$keyring" ] || die "$keyring missing (apt-get install debian-archive-keyring)"
    echo "deb [signed-by=$keyring] $DEBIAN_MIRROR $BUILDX_SUITE main" >"$tmp/sources.list"
    aptx=(apt-get -qq
        -oDir::Etc::SourceList="$tmp/sources.list"
        -oDir::Etc::SourceParts="$tmp/parts"
        -oDir::State::Lists="$tmp/lists"
        -oDir::Cache="$tmp/cache"
        -oDir::Cache::pkgcache= -oDir::Cache::srcpkgcache=
        -oAPT::Get::List-Cleanup=0
        -oAPT::Sandbox::User=root)
    say "fetching docker-buildx from Debian $BUILDX_SUITE"
    t0=$SECONDS
    "${aptx[@]}" update
    (cd "$tmp" && "${aptx[@]}" download docker-buildx)
    deb=$(ls "$tmp"/docker-buildx_*.deb 2>/dev/null | head -n1)
    [ -n "$deb" ] || die "could not download docker-buildx from $DEBIAN_MIRROR $BUILDX_SUITE"
    dpkg -i "$deb" >/dev/null
    say "installed $(basename "$deb") in $((SECONDS - t0)) s"
    buildx_ok || die "docker buildx still not usable after installing $(basename "$deb"); see 'docker buildx version'"
fi

if ! docker_ok; then
    if pgrep -x dockerd >/dev/null 2>&1; then
        say "dockerd is running but not answering yet; waiting"
    else
        mkdir -p "$(dirname "$DOCKERD_LOG")"
        say "starting dockerd (log: $DOCKERD_LOG)"
        setsid dockerd >>"$DOCKERD_LOG" 2>&1 </dev/null &
    fi
    deadline=$((SECONDS + DOCKERD_WAIT))
    until docker_ok; do
        if [ $SECONDS -ge $deadline ]; then
            tail -n 20 "$DOCKERD_LOG" >&2 2>/dev/null || true
            die "dockerd did not answer within ${DOCKERD_WAIT} s; see $DOCKERD_LOG"
        fi
        sleep 0.5
    done
fi

# buildx must see a builder backed by the daemon.
docker buildx ls 2>/dev/null | grep -Eq '^[[:alnum:]_-]+\*?[[:space:]]' \
    || die "docker buildx ls shows no builder; run 'docker buildx ls' to see why"
docker buildx inspect >/dev/null 2>&1 || die "docker buildx inspect fails on the current builder"

report
