#!/usr/bin/env bash
# A throwaway OCI registry on the loopback interface (docker-registry, filesystem storage).
#
#   scripts/registry.sh start [--port P] [--dir D]   start (or reuse) it; prints host:port
#   scripts/registry.sh url                          print host:port of the running one
#   scripts/registry.sh stop                         stop it (and delete its storage if we made it)
#
# Without --port a free port is picked; without --dir storage goes to a new temp dir.
# State lives in $STACKFORGE_STATE_DIR (default /var/tmp/stackforge)/registry.state.
# Docker trusts 127.0.0.1 registries as insecure by default, so `docker push 127.0.0.1:P/x:y`
# works without daemon configuration.
set -euo pipefail

state_dir=${STACKFORGE_STATE_DIR:-/var/tmp/stackforge}
state="$state_dir/registry.state"
host=127.0.0.1

say() { printf 'registry: %s\n' "$*" >&2; }
die() { printf 'registry: error: %s\n' "$*" >&2; exit 1; }

cmd=${1:-}
[ -n "$cmd" ] && shift
port=""
dir=""
while [ $# -gt 0 ]; do
    case "$1" in
        --port) port=${2:?--port needs a value}; shift 2 ;;
        --port=*) port=${1#*=}; shift ;;
        --dir) dir=${2:?--dir needs a value}; shift 2 ;;
        --dir=*) dir=${1#*=}; shift ;;
        *) die "unknown argument $1 (usage: registry.sh start|stop|url [--port P] [--dir D])" ;;
    esac
done

answers() { curl -fsS --noproxy '*' -o /dev/null --max-time 2 "http://$1/v2/" 2>/dev/null; }

# Sets pid, url, rdir, owned from the state file; returns 1 when nothing is running.
load_state() {
    [ -r "$state" ] || return 1
    # shellcheck disable=SC1090
    . "$state"
    kill -0 "$pid" 2>/dev/null || return 1
    answers "$url" || return 1
}

free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()'
}

case "$cmd" in
    start)
        if load_state; then
            say "already running at $url (pid $pid, storage $rdir)"
            echo "$url"
            exit 0
        fi
        command -v docker-registry >/dev/null 2>&1 || die "docker-registry is not installed; fix: run scripts/engine-setup.sh (or apt-get install docker-registry)"
        owned=0
        if [ -z "$dir" ]; then dir=$(mktemp -d "${TMPDIR:-/tmp}/stackforge-registry.XXXXXX"); owned=1; fi
        mkdir -p "$dir/data" "$state_dir"
        dir=$(cd "$dir" && pwd)
        [ -n "$port" ] || port=$(free_port)
        url="$host:$port"
        cat >"$dir/config.yml" <<EOF
version: 0.1
log:
  level: warn
storage:
  filesystem:
    rootdirectory: $dir/data
  delete:
    enabled: true
http:
  addr: $url
EOF
        setsid docker-registry serve "$dir/config.yml" >"$dir/registry.log" 2>&1 </dev/null &
        pid=$!
        for _ in $(seq 1 100); do
            answers "$url" && break
            kill -0 "$pid" 2>/dev/null || { cat "$dir/registry.log" >&2; die "docker-registry exited; log: $dir/registry.log"; }
            sleep 0.1
        done
        answers "$url" || { kill "$pid" 2>/dev/null || true; die "registry at $url did not answer GET /v2/ within 10 s; log: $dir/registry.log"; }
        printf 'pid=%q\nurl=%q\nrdir=%q\nowned=%q\n' "$pid" "$url" "$dir" "$owned" >"$state"
        say "started at $url (pid $pid, storage $dir, log $dir/registry.log)"
        echo "$url"
        ;;
    url)
        load_state || die "no registry running; start one with scripts/registry.sh start"
        echo "$url"
        ;;
    stop)
        if [ -r "$state" ]; then
            # shellcheck disable=SC1090
            . "$state"
            if kill -0 "$pid" 2>/dev/null; then
                kill "$pid"
                for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
                kill -0 "$pid" 2>/dev/null && kill -9 "$pid" 2>/dev/null || true
            fi
            [ "$owned" = 1 ] && rm -rf "$rdir"
            rm -f "$state"
            say "stopped $url"
        else
            say "no registry running"
        fi
        ;;
    *)
        die "usage: registry.sh start|stop|url [--port P] [--dir D]"
        ;;
esac
