#!/bin/sh
# One system layer, as stackforge wrote it into SPEC (system/<layer>.spec; every value already checked
# against its grammar, so no value holds a space, a quote or a shell character):
#   layer NAME | install auto|always|never | probe CMD | mirror FROM TO | source DEB-LINE
#   package KEY|LOGICAL|MODE|WANT|CANDIDATES | ld DIR | link KEY|LINK|TARGET
# never: nothing is done. auto: a base that has the probe command keeps its stack (no apt; the loader
# dirs and links are still written and checked). Otherwise: the mirror rewrite, the layer's sources,
# apt-get update, the packages resolved by apt-resolve.sh and installed in ONE apt transaction.
# The record goes to /stackforge/system/packages.txt: the layers' lines, then `dpkg-query -W`.
#
# `apt-layer.sh --rewrite FROM TO FILE…` replaces the URL prefix FROM by TO in apt source files.
# `apt-layer.sh --local DIR SPEC` (an offline build from a mirror): the sources are written as above, but apt
# resolves and installs from the flat repository DIR alone (the mirror's .debs, checked against its manifest).
set -eu

rewrite() {
    from=$1 to=$2
    shift 2
    for f in "$@"; do
        [ -f "$f" ] || continue
        awk -v from="$from" -v to="$to" '{
            out = ""; line = $0
            while ((i = index(line, from)) > 0) { out = out substr(line, 1, i - 1) to; line = substr(line, i + length(from)) }
            print out line }' "$f" > "$f.stackforge" && cat "$f.stackforge" > "$f" && rm -f "$f.stackforge"
    done
}

if [ "${1:-}" = --rewrite ]; then
    shift
    rewrite "$@"
    exit 0
fi

local=""
if [ "${1:-}" = --local ]; then
    local=$2
    shift 2
fi
spec=$1
here=$(dirname "$0")
record=/stackforge/system
layer="" install=always probe="" mirror="" packages="" lds="" links=""
while read -r kw rest; do
    case "$kw" in
        layer) layer=$rest ;;
        install) install=$rest ;;
        probe) probe=$rest ;;
        mirror) mirror=$rest ;;
        source) ;;
        package) packages="$packages$rest
" ;;
        ld) lds="$lds $rest" ;;
        link) links="$links $rest" ;;
        *) echo "error: $spec: unknown line '$kw'" >&2; exit 2 ;;
    esac
done < "$spec"
mkdir -p "$record"

note() { echo "$*"; echo "$*" >> "$record/layers.txt"; }

finish() {
    { cat "$record/layers.txt"; echo "installed:"; dpkg-query -W -f '${Package} ${Version}\n' | sort; } \
        > "$record/packages.txt"
}

if [ "$install" = never ]; then
    note "layer $layer: install=never: skipped"
    finish
    exit 0
fi

kept=""
if [ "$install" = auto ] && found=$(command -v "$probe" 2>/dev/null); then
    kept=$found
    note "layer $layer: install=auto: kept the base's stack ($probe is $found)"
fi

if [ -z "$kept" ]; then
    export DEBIAN_FRONTEND=noninteractive
    if [ -n "$mirror" ]; then
        # shellcheck disable=SC2086  # FROM TO
        rewrite $mirror /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources
        note "layer $layer: mirror $mirror"
    fi
    list=/etc/apt/sources.list.d/stackforge-$layer.list
    sed -n 's/^source //p' "$spec" > "$list"
    [ -s "$list" ] || rm -f "$list"
    if [ -n "$local" ]; then
        conf=$(mktemp -d /tmp/stackforge-apt.XXXXXX)
        mkdir -p "$conf/lists/partial" "$conf/parts"
        echo "deb [trusted=yes] file:$local ./" > "$conf/sources.list"
        printf '%s\n' "Dir::Etc::SourceList \"$conf/sources.list\";" "Dir::Etc::SourceParts \"$conf/parts\";" \
            "Dir::State::Lists \"$conf/lists\";" 'Dir::Cache::pkgcache "";' 'Dir::Cache::srcpkgcache "";' 'APT::Sandbox::User "root";' \
            > "$conf/apt.conf"
        export APT_CONFIG="$conf/apt.conf"
        note "layer $layer: apt packages from the mirror's repository $local"
    fi
    apt-get update -q
    resolved=$(printf '%s' "$packages" | sh "$here/apt-resolve.sh") || {
        printf '%s\n' "$resolved"
        echo "error: system layer $layer: a package has no match in the apt sources (above)" >&2
        exit 1
    }
    count=$(printf '%s' "$packages" | grep -c . || true)
    note "layer $layer: install=$install: $count package(s) in one apt transaction"
    printf '%s\n' "$resolved" | while read -r line; do note "$line"; done
    if [ -n "$resolved" ]; then
        # shellcheck disable=SC2046  # one word per resolved NAME[=VERSION]
        apt-get install -y -q --allow-downgrades --no-install-recommends -o APT::Keep-Downloaded-Packages=true \
            $(printf '%s\n' "$resolved" | sed 's/^resolved [^:]*: //')
    fi
    if [ -n "$local" ]; then
        rm -rf "$conf"
    fi
fi

failed=0
for entry in $links; do
    key=${entry%%|*} rest=${entry#*|}
    link=${rest%%|*} target=${rest#*|}
    mkdir -p "$(dirname "$link")"
    ln -sfn "$target" "$link"
    if [ ! -e "$link" ]; then
        echo "error: $key: the link target $target does not exist after the install" >&2
        failed=1
        continue
    fi
    note "link $link -> $target"
done
[ "$failed" = 0 ] || exit 1
if [ -n "$lds" ]; then
    printf '%s\n' $lds > "/etc/ld.so.conf.d/$layer.conf"
    note "ld /etc/ld.so.conf.d/$layer.conf:$lds"
fi
ldconfig
finish
