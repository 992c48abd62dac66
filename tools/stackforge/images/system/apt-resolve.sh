#!/bin/sh
# Resolve a system layer's packages against the configured apt sources (apt-cache madison).
#
# Input (file or stdin), one package a line:  KEY|LOGICAL|MODE|WANT|CANDIDATE [CANDIDATE…]
#   MODE any:   the first candidate apt knows (apt-cache policy), unpinned
#   MODE exact: the first candidate that has version WANT (with or without its epoch)
#   MODE line:  the first candidate with a version of line WANT: WANT followed by '-', '+', '~' or
#               nothing (exact) beats WANT followed by '.' (a longer version of the line), so 2.4.1
#               takes 2.4.1-1 over 2.4.10-1 and 2.4.1.3, and 5.2 takes 5.2.0-1 but never 5.20.0.
# Output: one "resolved LOGICAL: NAME[=VERSION]" line per package, in input order. A package with no
# match is reported on stderr as "error: KEY (LOGICAL): …"; every package is tried, then exit 1.
set -u
input=${1:-/dev/stdin}
status=0
while IFS='|' read -r key logical mode want names; do
    [ -n "$key" ] || continue
    spec=""
    seen=""
    set -f
    # shellcheck disable=SC2086  # candidate names are a space-separated list (grammar: no spaces in a name)
    set -- $names
    set +f
    if [ "$mode" = any ]; then
        # Known to apt (a virtual package with a provider counts): apt-cache policy prints its entry.
        for pkg in "$@"; do
            if [ -n "$(apt-cache policy "$pkg" 2>/dev/null </dev/null)" ]; then
                spec="$pkg"
                break
            fi
        done
    else
        for pkg in "$@"; do
            versions=$(apt-cache madison "$pkg" 2>/dev/null </dev/null | awk -F'|' '{ v = $2; gsub(/^[ \t]+|[ \t]+$/, "", v); if (v != "") print v }')
            [ -n "$versions" ] || continue
            seen="$seen $pkg ($(printf '%s\n' "$versions" | tr '\n' ' ' | sed 's/ $//'))"
            found=$(printf '%s\n' "$versions" | awk -v w="$want" -v mode="$mode" '
                { u = $0; sub(/^[0-9]+:/, "", u) }
                mode == "exact" { if ($0 == w || u == w) { print $0; exit } next }
                substr(u, 1, length(w)) == w {
                    c = substr(u, length(w) + 1, 1)
                    if (c == "" || c == "-" || c == "+" || c == "~") { if (ex == "") ex = $0 }
                    else if (c == "." && pf == "") pf = $0
                }
                END { if (mode == "line") print (ex != "" ? ex : pf) }')
            if [ -n "$found" ]; then
                spec="$pkg=$found"
                break
            fi
        done
    fi
    if [ -z "$spec" ]; then
        case "$mode" in
            any) what="no package" ;;
            exact) what="no version $want" ;;
            *) what="no version of line $want" ;;
        esac
        echo "error: $key ($logical): $what in the apt sources; candidates: $*; versions found:${seen:- none}" >&2
        status=1
        continue
    fi
    echo "resolved $logical: $spec"
done < "$input"
exit "$status"
