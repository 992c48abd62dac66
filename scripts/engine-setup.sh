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
#   STACKFORGE_BUILDX_SUITE  Debian suite that provides docker-buildx (default: STACKFORGE_ENGINE_SUITE)
#   STACKFORGE_ENGINE        modern (default): when no daemon is running and the installed dockerd is
#                            older than Docker 27, install Debian trixie-backports' docker.io (Docker 28,
#                            with docker-cli, docker-buildx and tini-static of the same suite) in its place.
#                            Docker 27 is the first whose BuildKit (0.14+) records a build's history without
#                            walking every cache key linked to its result (moby/buildkit#4976): on Docker 26
#                            a fully cached build of a big stack waited 77-115 s after its last step for that.
#                            A daemon that is already running is used as it is (say modern! to
#                            replace it anyway). host: never replace the installed engine.
#   STACKFORGE_ENGINE_SUITE  Debian suite that provides the modern docker.io (default trixie-backports)
#   STACKFORGE_EMULATE       foreign platforms to run under emulation (default arm64; none: leave binfmt alone):
#                            as root on Debian, mounts binfmt_misc when it is not, installs qemu-user-static and
#                            binfmt-support from Debian and registers the handler, so BuildKit builds and runs
#                            linux/arm64 on an x86_64 host (a native host needs none)
#   STACKFORGE_STORE         the image store the engine keeps images in (make engine STORE=…): classic (the
#                            default: whatever the running engine has; a new one gets the overlay2 store) or
#                            containerd (the containerd image store, daemon.json "features":
#                            {"containerd-snapshotter": true}). With containerd: a daemon this script starts gets
#                            it in /etc/docker/daemon.json; a daemon that already runs with the classic store is
#                            never reconfigured or restarted: a second dockerd with the containerd store is started
#                            beside it (scripts/second-engine.sh start --store containerd NAME, NAME from
#                            STACKFORGE_STORE_ENGINE, default ctrd) and the script says how to reach it
#                            (DOCKER_HOST, docker context, --builder).
set -euo pipefail

DOCKERD_LOG=${STACKFORGE_DOCKERD_LOG:-/var/log/stackforge-dockerd.log}
DOCKERD_WAIT=${STACKFORGE_DOCKERD_WAIT:-60}
ENGINE=${STACKFORGE_ENGINE:-modern}
ENGINE_SUITE=${STACKFORGE_ENGINE_SUITE:-trixie-backports}
BUILDX_SUITE=${STACKFORGE_BUILDX_SUITE:-$ENGINE_SUITE}
ENGINE_MIN_MAJOR=27
case "$ENGINE" in modern|modern!|host) ;; *) printf 'engine-setup: error: STACKFORGE_ENGINE=%s: use modern, modern! or host\n' "$ENGINE" >&2; exit 2;; esac
DEBIAN_MIRROR=${STACKFORGE_DEBIAN_MIRROR:-http://deb.debian.org/debian}

# Tools the tests need beside the engine (command → Debian package): the registry, the base image, the
# compiler cache, a headless browser for the history site, and unpigz, which Docker's own packages
# recommend: dockerd and BuildKit inflate gzip layers with it, in a process beside the unpacking, when it is
# on the daemon's PATH as the daemon starts (a second host's rebuild from gzip layers: 17.8 s to 12.5 s in
# docs/benchmarks.md); and skopeo, the tag-only copy the copy tests check `verify` against.
declare -A TOOLS=([docker-registry]=docker-registry [debootstrap]=debootstrap [ccache]=ccache [chromium]=chromium [unpigz]=pigz [skopeo]=skopeo)

STORE=${STACKFORGE_STORE:-classic}
case "$STORE" in classic|containerd) ;; *) printf 'engine-setup: error: STACKFORGE_STORE=%s: use classic or containerd\n' "$STORE" >&2; exit 2;; esac
STORE_ENGINE=${STACKFORGE_STORE_ENGINE:-ctrd}

EMULATE=${STACKFORGE_EMULATE:-arm64}
case "$EMULATE" in arm64|none) ;; *) printf 'engine-setup: error: STACKFORGE_EMULATE=%s: use arm64 or none\n' "$EMULATE" >&2; exit 2;; esac
BINFMT=/proc/sys/fs/binfmt_misc

say() { printf 'engine-setup: %s\n' "$*"; }
die() { printf 'engine-setup: error: %s\n' "$*" >&2; exit 1; }

docker_ok() { docker info >/dev/null 2>&1; }
# The image store of the daemon the CLI reaches: containerd when its driver is a containerd snapshotter.
store_of() { docker "$@" info --format '{{json .DriverStatus}}' 2>/dev/null | grep -q 'io.containerd.snapshotter' && echo containerd || echo classic; }
# STORE=containerd on a daemon started here: the feature in /etc/docker/daemon.json (merged into what is there).
daemon_json_store() {
    local conf=/etc/docker/daemon.json
    [ "$STORE" = containerd ] || return 0
    mkdir -p /etc/docker
    python3 - "$conf" <<'PY' || die "could not set features.containerd-snapshotter in /etc/docker/daemon.json"
import json, os, sys
path = sys.argv[1]
doc = json.load(open(path)) if os.path.exists(path) and os.path.getsize(path) else {}
if not isinstance(doc, dict):
    sys.exit(f"{path} is not a JSON object")
doc.setdefault("features", {})["containerd-snapshotter"] = True
tmp = path + ".stackforge"
with open(tmp, "w") as fh:
    json.dump(doc, fh, indent=2)
    fh.write("\n")
os.replace(tmp, path)
PY
    say "containerd image store: features.containerd-snapshotter=true in /etc/docker/daemon.json"
}
# STORE=containerd while the running daemon has the classic store: a second dockerd with it, beside the first.
second_store_engine() {
    local here
    [ "$STORE" = containerd ] || return 0
    [ "$(store_of)" = containerd ] && { say "image store: containerd (the running daemon has it)"; return 0; }
    here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
    say "the running daemon keeps the classic image store and is left as it is; starting a second dockerd with the containerd image store"
    [ "$(id -u)" = 0 ] || die "STORE=containerd: the running daemon has the classic store, and starting a second dockerd needs root (or set features.containerd-snapshotter in daemon.json and restart the daemon yourself)"
    bash "$here/second-engine.sh" start --store containerd "$STORE_ENGINE"
    say "image store: containerd on the second engine $STORE_ENGINE: export DOCKER_HOST=unix:///run/stackforge-engines/$STORE_ENGINE/docker.sock (or docker context use stackforge-$STORE_ENGINE, or --builder stackforge-$STORE_ENGINE on build, bake and nightly); load the base image into it: docker save stackforge/base:bookworm | docker --context stackforge-$STORE_ENGINE load"
}
buildx_ok() { docker buildx version >/dev/null 2>&1; }
# Major version of the installed dockerd binary (0 when there is none or it does not say).
dockerd_major() {
    command -v dockerd >/dev/null 2>&1 || { echo 0; return; }
    dockerd --version 2>/dev/null | sed -n 's/^Docker version \([0-9]*\)\..*/\1/p' | head -n1 | grep . || echo 0
}
wants_modern() {
    case "$ENGINE" in
        host) return 1 ;;
        modern!) [ "$(dockerd_major)" -lt "$ENGINE_MIN_MAJOR" ] ;;
        modern) ! docker_ok && [ "$(dockerd_major)" -lt "$ENGINE_MIN_MAJOR" ] ;;
    esac
}

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
    say "docker daemon $server ($(docker info --format '{{.Driver}}' 2>/dev/null) storage, $(store_of) image store, root $(docker info --format '{{.DockerRootDir}}' 2>/dev/null))"
    say "buildx: $(docker buildx version 2>/dev/null | head -n1)"
    local bk
    bk=$(docker buildx inspect 2>/dev/null | awk -F': *' '
        /^Name:/ && !n {printf "%s ", $2; n=1}
        /^Driver:/ {printf "driver=%s ", $2}
        /^(Buildkit|BuildKit version):/ {printf "buildkit=%s ", $2}')
    say "builder: ${bk:-?}"
    say "platforms: $(docker buildx inspect 2>/dev/null | sed -n 's/^Platforms: *//p' | head -n1)"
    local cmd
    for cmd in docker-registry debootstrap ccache chromium unpigz skopeo; do
        if command -v "$cmd" >/dev/null 2>&1; then say "$cmd: $(command -v "$cmd")"; else say "$cmd: not installed"; fi
    done
}

# ---- emulation of foreign platforms (binfmt_misc + qemu-user-static) ----------------------
# The handler of a platform this host does not run natively, or nothing when it runs it or emulation is off.
wanted_handler() {
    [ "$EMULATE" = arm64 ] && [ "$(uname -m)" != aarch64 ] && echo qemu-aarch64 || true
}
handler_ok() { [ -r "$BINFMT/$1" ] && grep -qx enabled "$BINFMT/$1" && grep -q '^flags:.*F' "$BINFMT/$1"; }
emulators() {
    local handler
    handler=$(wanted_handler)
    [ -n "$handler" ] || return 0
    if handler_ok "$handler"; then
        say "emulation: linux/arm64 through $(sed -n 's/^interpreter //p' "$BINFMT/$handler") (binfmt handler $handler, $(grep '^flags:' "$BINFMT/$handler"))"
        return 0
    fi
    if [ "$(id -u)" != 0 ] || ! is_debian; then
        say "emulation: linux/arm64 is not registered (binfmt handler $handler); as root on Debian this script installs qemu-user-static and binfmt-support and registers it, or build arm64 on a native builder node"
        return 0
    fi
    if [ ! -e "$BINFMT/register" ]; then
        mount -t binfmt_misc binfmt_misc "$BINFMT" || die "could not mount binfmt_misc on $BINFMT (a container needs it from its host)"
        say "mounted binfmt_misc on $BINFMT"
    fi
    local need=()
    command -v qemu-aarch64-static >/dev/null 2>&1 || need+=(qemu-user-static)
    command -v update-binfmts >/dev/null 2>&1 || need+=(binfmt-support)
    if [ ${#need[@]} -gt 0 ]; then
        apt_update_once
        say "apt-get install ${need[*]} (emulation of linux/arm64)"
        apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
    fi
    # Debian's qemu-user-static declares its handlers with fix_binary (flag F): the interpreter is opened at
    # registration, so it runs inside containers and chroots that do not hold it.
    update-binfmts --enable "$handler" >/dev/null 2>&1 || update-binfmts --import "$handler" >/dev/null 2>&1 || true
    handler_ok "$handler" || die "the binfmt handler $handler is not enabled with flag F after installing qemu-user-static (see $BINFMT/$handler and update-binfmts --display $handler)"
    say "registered binfmt handler $handler: $(sed -n 's/^interpreter //p' "$BINFMT/$handler") ($(grep '^flags:' "$BINFMT/$handler")); linux/arm64 builds and runs under emulation"
}

is_debian() { [ -r /etc/debian_version ] && command -v apt-get >/dev/null 2>&1 && command -v dpkg >/dev/null 2>&1; }
export DEBIAN_FRONTEND=noninteractive
apt_updated=0
apt_update_once() {
    [ "$apt_updated" = 1 ] && return 0
    say "apt-get update"
    # Unreachable third-party sources only warn; the install below fails loudly if Debian's do.
    apt-get update -qq || say "apt-get update reported errors (continuing; install will tell)"
    apt_updated=1
}

# ---- fast path: everything already there ------------------------------------------------
if command -v docker >/dev/null 2>&1 && docker_ok && buildx_ok && [ -z "$(missing_tools)" ] && ! wants_modern; then
    emulators
    report
    second_store_engine
    major=$(docker version --format '{{.Server.Version}}' 2>/dev/null | cut -d. -f1)
    if [ "${major:-0}" -lt "$ENGINE_MIN_MAJOR" ] 2>/dev/null; then
        say "note: this engine predates Docker $ENGINE_MIN_MAJOR (before 25: no RUN --network=none, no SOURCE_DATE_EPOCH; before 27: every build's history record walks the cache, minutes on a big cached build); STACKFORGE_ENGINE=modern! replaces it"
    fi
    exit 0
fi

if [ "$(id -u)" != 0 ] || ! is_debian; then
    # We cannot install here; say exactly what is missing.
    need=()
    command -v docker >/dev/null 2>&1 || need+=("the docker CLI")
    if command -v docker >/dev/null 2>&1 && ! docker_ok; then
        denied=$(docker info 2>&1 | grep -o 'permission denied while trying to connect to the [A-Za-z ]*socket at [^ ]*' | head -n1 || true)
        socket=${denied##* at unix://}
        if [ -n "$denied" ]; then
            die "the Docker daemon runs, but this user may not use its socket (${socket%:}: permission denied). Fix: add the user to the 'docker' group (sudo usermod -aG docker \$USER) and log in again (or run: newgrp docker); or set DOCKER_HOST to a daemon this user can reach (a rootless dockerd: unix://\$XDG_RUNTIME_DIR/docker.sock)."
        fi
        need+=("a running Docker daemon (dockerd >= 20.10) that this user can reach (docker info fails)")
    fi
    command -v docker >/dev/null 2>&1 && ! buildx_ok && need+=("the docker buildx plugin (>= 0.10; https://github.com/docker/buildx)")
    if [ ${#need[@]} -gt 0 ]; then
        die "no usable build engine. Install: $(IFS=';'; echo "${need[*]}"). $( [ "$(id -u)" != 0 ] && echo 'Or run this script as root on Debian to install them.' || echo 'Automatic install is supported on Debian only.')"
    fi
    tools=$(missing_tools)
    say "engine is usable; missing optional tools: ${tools} (tests need docker-registry; scripts/base-image.sh needs debootstrap)"
    report
    second_store_engine
    exit 0
fi

# ---- root on Debian: install what is missing ---------------------------------------------

# A daemon that already runs looked for unpigz when it started: it needs a restart to use one installed now.
unpigz_late=0
if docker_ok && ! command -v unpigz >/dev/null 2>&1; then unpigz_late=1; fi

pkgs=()
if [ "$ENGINE" = host ]; then
    command -v dockerd >/dev/null 2>&1 || pkgs+=(docker.io)
    command -v docker >/dev/null 2>&1 || pkgs+=(docker.io)
fi
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

# fetch_debs SUITE PKG...: download single .debs from another Debian suite through a private
# sources list, so the machine's own apt lists stay as they are. Prints the .deb paths.
fetch_tmp=$(mktemp -d /tmp/stackforge-debs.XXXXXX)
trap 'rm -rf "$fetch_tmp"' EXIT
fetch_debs() {
    local suite=$1; shift
    local tmp="$fetch_tmp/$suite"
    mkdir -p "$tmp/lists/partial" "$tmp/parts" "$tmp/cache/archives/partial" "$tmp/debs"
    local keyring=/usr/share/keyrings/debian-archive-keyring.gpg
    [ -r "$keyring" ] || die "$keyring missing (apt-get install debian-archive-keyring)"
    echo "deb [signed-by=$keyring] $DEBIAN_MIRROR $suite main" >"$tmp/sources.list"
    local aptx=(apt-get -qq
        -oDir::Etc::SourceList="$tmp/sources.list"
        -oDir::Etc::SourceParts="$tmp/parts"
        -oDir::State::Lists="$tmp/lists"
        -oDir::Cache="$tmp/cache"
        -oDir::Cache::pkgcache= -oDir::Cache::srcpkgcache=
        -oAPT::Get::List-Cleanup=0
        -oAPT::Sandbox::User=root)
    [ -e "$tmp/lists/updated" ] || { "${aptx[@]}" update >&2 && touch "$tmp/lists/updated"; }
    (cd "$tmp/debs" && "${aptx[@]}" download "$@" >&2)
    local p deb
    for p in "$@"; do
        deb=$(ls "$tmp/debs/${p}"_*.deb 2>/dev/null | head -n1)
        [ -n "$deb" ] || die "could not download $p from $DEBIAN_MIRROR $suite"
        echo "$deb"
    done
}

if wants_modern; then
    # Debian trixie-backports' docker.io (Docker 28) runs on bookworm: its dependencies (containerd >= 1.4,
    # runc, iptables, sysvinit-utils, systemd's sysusers, libc6 >= 2.34) are met by bookworm's packages, and
    # tini-static comes from the same suite (it replaces bookworm's tini). Since Docker 27.5 the client is
    # its own package (docker-cli), and buildx comes along so client, plugin and daemon match.
    if docker_ok; then
        say "stopping the running dockerd $(docker version --format '{{.Server.Version}}' 2>/dev/null) to replace it"
        pkill -x dockerd || true
        for _ in $(seq 1 60); do pgrep -x dockerd >/dev/null 2>&1 || break; sleep 0.5; done
    fi
    say "fetching docker.io from Debian $ENGINE_SUITE (installed dockerd: $(dockerd --version 2>/dev/null || echo none))"
    t0=$SECONDS
    mapfile -t debs < <(fetch_debs "$ENGINE_SUITE" docker.io docker-cli docker-buildx tini-static)
    [ ${#debs[@]} -eq 4 ] || die "could not download docker.io, docker-cli, docker-buildx and tini-static from $DEBIAN_MIRROR $ENGINE_SUITE"
    apt_update_once
    apt-get install -y -qq --no-install-recommends "${debs[@]}" >/dev/null \
        || die "could not install $(basename -a "${debs[@]}" | tr '\n' ' ')(STACKFORGE_ENGINE=host keeps the installed engine; STACKFORGE_ENGINE_SUITE names another suite)"
    say "installed $(basename -a "${debs[@]}" | tr '\n' ' ')in $((SECONDS - t0)) s: $(dockerd --version)"
fi

if ! buildx_ok; then
    # bookworm has no docker-buildx package; the newer suite's one is a static Go binary
    # needing only libc6 >= 2.34.
    say "fetching docker-buildx from Debian $BUILDX_SUITE"
    t0=$SECONDS
    deb=$(fetch_debs "$BUILDX_SUITE" docker-buildx)
    dpkg -i "$deb" >/dev/null
    say "installed $(basename "$deb") in $((SECONDS - t0)) s"
    buildx_ok || die "docker buildx still not usable after installing $(basename "$deb"); see 'docker buildx version'"
fi

if ! docker_ok; then
    if pgrep -x dockerd >/dev/null 2>&1; then
        say "dockerd is running but not answering yet; waiting"
    else
        mkdir -p "$(dirname "$DOCKERD_LOG")"
        daemon_json_store
        say "starting dockerd (log: $DOCKERD_LOG)"
        # The daemon outlives this script: it keeps none of its caller's descriptors (a `flock` around this
        # script would otherwise stay held for as long as dockerd runs).
        setsid dockerd >>"$DOCKERD_LOG" 2>&1 </dev/null 3>&- 4>&- 5>&- 6>&- 7>&- 8>&- 9>&- &
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
# (Captured first: grep -q closing the pipe early would fail the pipeline under pipefail.)
builders=$(docker buildx ls 2>/dev/null || true)
grep -Eq '^[[:alnum:]_-]+\*?[[:space:]]' <<<"$builders" \
    || die "docker buildx ls shows no builder; run 'docker buildx ls' to see why"
docker buildx inspect >/dev/null 2>&1 || die "docker buildx inspect fails on the current builder"

emulators
report
second_store_engine
if [ "$unpigz_late" = 1 ] && command -v unpigz >/dev/null 2>&1; then
    say "note: unpigz was installed while dockerd ran; restart dockerd for its layer pulls and BuildKit to use it"
fi
