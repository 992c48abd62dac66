#!/usr/bin/env bash
# A second Docker engine on this host, for a nightly shard: its own dockerd, as a second build host would be.
#
#   scripts/second-engine.sh start [--store classic|containerd] [NAME]   start it (a no-op when it runs); prints how
#                                            to use it
#   scripts/second-engine.sh stop [NAME]     stop it; remove its bridge, its three iptables rules and its context
#   scripts/second-engine.sh purge [NAME]    stop it and delete its data root (its images and build cache)
#   scripts/second-engine.sh status [NAME]   whether it runs, and where (and its image store)
#
# NAME (default sf2; 1-8 of a-z 0-9) names everything of it. Once started, `--builder stackforge-NAME` on
# `stackforge build`, `bake` and `nightly` builds, gates, tests and publishes on it (a buildx builder of the docker
# context stackforge-NAME, created in $DOCKER_CONFIG), and `docker --context stackforge-NAME …` reaches it.
#
# --store picks its image store: classic (the default: the overlay2 graph driver and its layer store) or containerd
# (the containerd image store, daemon.json "features": {"containerd-snapshotter": true}: images and their layers in
# containerd's content store and overlayfs snapshotter, multi-platform images and OCI export in the docker driver).
# It is written to the engine's own daemon.json; an engine that runs is never switched (stop it, or purge it: the
# two stores do not see each other's images). Without --store a start keeps the store NAME had.
#
# Nothing of the first engine (the one at /var/run/docker.sock) is touched. The second dockerd has its own
#   -H unix socket, --pidfile   /run/stackforge-engines/NAME/docker.{sock,pid}
#   --exec-root                 /run/stackforge-engines/NAME/exec      (its containerd, runc state, netns)
#   --data-root                 $STACKFORGE_ENGINES/NAME/data          (default /var/lib/stackforge-engines)
#   --config-file               $STACKFORGE_ENGINES/NAME/daemon.json   (so /etc/docker/daemon.json is not read)
#   --bridge                    sfe-NAME, a bridge this script creates with its own /24 (10.213.X.1/24 by
#                               default, X from the name; STACKFORGE_ENGINE_SUBNET=A.B.C.0/24 to choose)
#   --cgroup-parent, containerd namespaces   stackforge-NAME
# and never --bridge=none: a dockerd with the bridge disabled deletes the interface docker0 at start (dockerd's
# "remove default bridge interface if present (--bridge=none use case)"), the first engine's own bridge, and every
# later RUN of the first engine fails until that engine restarts. dockerd refuses --bip together with --bridge, so
# the address is set on the bridge here. It runs with --iptables=false --ip6tables=false --ip-forward=false
# --ip-masq=false: a dockerd that manages iptables rebuilds the DOCKER chains of the host's tables, which hold the
# first engine's rules (dockerd's docs, "Run multiple daemons": daemons that manage iptables may overwrite each
# other's rules). Its containers reach out through three rules this script adds and removes by their comment
# "stackforge-engine NAME": a MASQUERADE of its subnet in nat POSTROUTING and two FORWARD accepts for its bridge.
#
# Needs root (dockerd, ip, iptables), as scripts/engine-setup.sh does.
set -euo pipefail

cmd=${1:-}
shift || true
store=""
say() { printf 'second-engine: %s\n' "$*"; }
die() { printf 'second-engine: error: %s\n' "$*" >&2; exit 1; }
usage() { sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }

case "$cmd" in start|stop|purge|status) ;; *) usage ;; esac
args=()
while [ $# -gt 0 ]; do
    case "$1" in
        --store) store=${2:-}; shift 2 || usage ;;
        --store=*) store=${1#*=}; shift ;;
        -*) usage ;;
        *) args+=("$1"); shift ;;
    esac
done
[ ${#args[@]} -le 1 ] || usage
name=${args[0]:-${STACKFORGE_ENGINE_NAME:-sf2}}
case "$store" in ""|classic|containerd) ;; *) die "--store $store: use classic or containerd" ;; esac
[ -z "$store" ] || [ "$cmd" = start ] || die "--store is an option of start"
[[ "$name" =~ ^[a-z0-9]{1,8}$ ]] || die "NAME $name: use 1 to 8 of a-z and 0-9 (it names the bridge sfe-NAME)"

engines=${STACKFORGE_ENGINES:-/var/lib/stackforge-engines}
home="$engines/$name"
run="/run/stackforge-engines/$name"
data="$home/data"
config="$home/daemon.json"
log="$home/dockerd.log"
exec_root="$run/exec"
sock="$run/docker.sock"
pidfile="$run/docker.pid"
bridge="sfe-$name"
context="stackforge-$name"
comment="stackforge-engine $name"

# The first engine's places, never ours (a typo in STACKFORGE_ENGINES must not reach them).
for p in "$data" "$exec_root" "$sock" "$pidfile"; do
    case "$p" in
        /var/lib/docker|/var/lib/docker/*|/var/run/docker|/var/run/docker/*|/run/docker|/run/docker/*|/var/run/docker.sock|/run/docker.sock|/var/run/docker.pid|/run/docker.pid)
            die "$p is the first engine's; set STACKFORGE_ENGINES to a directory of its own" ;;
    esac
done

subnet() {
    if [ -n "${STACKFORGE_ENGINE_SUBNET:-}" ]; then
        [[ "$STACKFORGE_ENGINE_SUBNET" =~ ^([0-9]+\.[0-9]+\.[0-9]+)\.0/24$ ]] \
            || die "STACKFORGE_ENGINE_SUBNET=$STACKFORGE_ENGINE_SUBNET: give a /24 as A.B.C.0/24"
        echo "${BASH_REMATCH[1]}"
        return
    fi
    local sum
    sum=$(printf '%s' "$name" | cksum | cut -d' ' -f1)
    echo "10.213.$((sum % 200 + 20))"
}
net=$(subnet)

pid_alive() { [ -f "$pidfile" ] && kill -0 "$(cat "$pidfile")" 2>/dev/null; }
answers() { docker -H "unix://$sock" version --format '{{.Server.Version}}' >/dev/null 2>&1; }
# The image store of the running engine: containerd when its driver is a containerd snapshotter, else classic.
running_store() {
    docker -H "unix://$sock" info --format '{{json .DriverStatus}}' 2>/dev/null | grep -q 'io.containerd.snapshotter' \
        && echo containerd || echo classic
}
# The store NAME's daemon.json asks for.
config_store() {
    grep -Eq '"containerd-snapshotter"[[:space:]]*:[[:space:]]*true' "$config" 2>/dev/null && echo containerd || echo classic
}

rules() {  # the three rules, as iptables arguments after -A/-C/-D CHAIN (one per line: table|chain|spec)
    printf '%s\n' \
        "nat|POSTROUTING|-s $net.0/24 ! -o $bridge -j MASQUERADE" \
        "filter|FORWARD|-i $bridge -j ACCEPT" \
        "filter|FORWARD|-o $bridge -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT"
}

add_rules() {
    local table chain spec
    while IFS='|' read -r table chain spec; do
        # shellcheck disable=SC2086  # spec is our own words
        iptables -t "$table" -C "$chain" $spec -m comment --comment "$comment" 2>/dev/null \
            || iptables -t "$table" -A "$chain" $spec -m comment --comment "$comment"
    done < <(rules)
}

remove_rules() {
    local table chain spec
    while IFS='|' read -r table chain spec; do
        # shellcheck disable=SC2086
        while iptables -t "$table" -D "$chain" $spec -m comment --comment "$comment" 2>/dev/null; do :; done
    done < <(rules)
}

add_bridge() {
    if ip link show "$bridge" >/dev/null 2>&1; then
        ip -4 -o addr show dev "$bridge" | grep -q " $net.1/24 " \
            || die "a link named $bridge exists without $net.1/24; remove it (ip link del $bridge) or choose another NAME"
    else
        # the /24 must be nobody's: no address or route of this host in it
        if ip -4 -o addr show | grep -q " $net\." || ip -4 route show | grep -q "^$net\."; then
            die "$net.0/24 is in use on this host; set STACKFORGE_ENGINE_SUBNET to a free /24"
        fi
        ip link add name "$bridge" type bridge
        ip addr add "$net.1/24" dev "$bridge"
    fi
    ip link set "$bridge" up
}

remove_bridge() {
    if ip link show "$bridge" >/dev/null 2>&1 && ip -4 -o addr show dev "$bridge" | grep -q " $net.1/24 "; then
        ip link del "$bridge"
    fi
}

unmount_ours() {  # mounts a killed dockerd left under its own roots (deepest first); nothing else
    local m
    { awk '{print $2}' /proc/self/mounts | grep -E "^($data|$exec_root)(/|$)" || true; } | sort -r | while read -r m; do
        umount -l "$m" 2>/dev/null || true
    done
}

stop_engine() {
    if pid_alive; then
        local pid
        pid=$(cat "$pidfile")
        say "stopping dockerd $pid ($sock)"
        kill -TERM "$pid"
        for _ in $(seq 1 60); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
        if kill -0 "$pid" 2>/dev/null; then
            say "dockerd $pid did not stop in 30 s; killing it"
            kill -KILL "$pid" 2>/dev/null || true
            for _ in $(seq 1 20); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
        fi
    fi
    unmount_ours
    rm -f "$pidfile" "$sock"
    remove_rules
    remove_bridge
    docker context rm -f "$context" >/dev/null 2>&1 || true
}

case "$cmd" in
status)
    if pid_alive && answers; then
        say "$name runs: pid $(cat "$pidfile"), DOCKER_HOST=unix://$sock, bridge $bridge $net.1/24, data $data, $(running_store) image store"
        exit 0
    fi
    say "$name does not run"
    exit 1
    ;;
stop)
    stop_engine
    say "$name stopped (its data root $data is kept; purge deletes it)"
    exit 0
    ;;
purge)
    stop_engine
    rm -rf "$data"
    rm -rf "$home" "$run"
    rmdir "$engines" /run/stackforge-engines 2>/dev/null || true  # when no other engine is left in them
    say "$name purged"
    exit 0
    ;;
esac

[ "$(id -u)" = 0 ] || die "start needs root (dockerd, ip, iptables)"
for tool in dockerd docker ip iptables; do command -v "$tool" >/dev/null 2>&1 || die "$tool is not installed"; done
if pid_alive && answers; then
    have=$(running_store)
    [ -z "$store" ] || [ "$store" = "$have" ] \
        || die "$name runs with the $have image store, not $store; stop it first (scripts/second-engine.sh stop $name) or use another NAME"
    say "$name already runs (pid $(cat "$pidfile"), $have image store): --builder $context, DOCKER_HOST=unix://$sock"
    exit 0
fi
pid_alive && die "dockerd $(cat "$pidfile") of $name runs but does not answer on $sock; stop it first"

mkdir -p "$data" "$exec_root"
chmod 0711 "$engines" "$home" 2>/dev/null || true
[ -f "$config" ] || echo '{}' >"$config"
store=${store:-$(config_store)}
if [ "$store" = containerd ]; then
    echo '{"features": {"containerd-snapshotter": true}}' >"$config"
else
    echo '{}' >"$config"
fi
add_bridge
add_rules
[ "$(cat /proc/sys/net/ipv4/ip_forward 2>/dev/null)" = 1 ] \
    || say "note: net.ipv4.ip_forward is 0: containers of $name reach nothing outside the host (left as it is)"

say "starting dockerd $name ($store image store): socket $sock, bridge $bridge $net.1/24, data $data (log $log)"
setsid dockerd \
    --config-file "$config" \
    -H "unix://$sock" \
    --pidfile "$pidfile" \
    --data-root "$data" \
    --exec-root "$exec_root" \
    --bridge "$bridge" \
    --iptables=false --ip6tables=false --ip-forward=false --ip-masq=false \
    --userland-proxy=false \
    --default-address-pool "base=10.214.${net##*.}.0/24,size=28" \
    --cgroup-parent "stackforge-$name" \
    --containerd-namespace "stackforge-$name" \
    --containerd-plugins-namespace "stackforge-$name-plugins" \
    >>"$log" 2>&1 </dev/null 3>&- 4>&- 5>&- 6>&- 7>&- 8>&- 9>&- &
deadline=$((SECONDS + ${STACKFORGE_DOCKERD_WAIT:-60}))
until answers; do
    if [ $SECONDS -ge $deadline ] || ! kill -0 $! 2>/dev/null; then
        tail -n 20 "$log" >&2 || true
        stop_engine
        die "dockerd $name did not answer on $sock; see $log"
    fi
    sleep 0.5
done
docker context rm -f "$context" >/dev/null 2>&1 || true
docker context create "$context" --description "stackforge second engine $name" --docker "host=unix://$sock" >/dev/null 2>&1
have=$(running_store)
[ "$have" = "$store" ] || { stop_engine; die "dockerd $name started with the $have image store, not $store; see $log"; }
say "$name runs (pid $(cat "$pidfile"), $store image store): --builder $context (docker context $context), DOCKER_HOST=unix://$sock"
