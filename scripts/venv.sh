#!/usr/bin/env bash
# Create the project's virtual environment and install stackforge (editable, with the builder's extras and the
# test tools) into it.
#
#   scripts/venv.sh VENV_DIR [PYTHON]
#
# Works on hosts whose Python is "externally managed" (PEP 668, e.g. Debian 12): nothing is installed
# into the system Python. On Debian, `python3 -m venv` needs the python3-venv package; as root it is
# installed here, otherwise the message says what to install. Run by `make` only when pyproject.toml
# changed since the last install (a stamp file in the venv), so it costs nothing on later runs.
set -euo pipefail

VENV=${1:?usage: scripts/venv.sh VENV_DIR [PYTHON]}
PYTHON=${2:-python3}

say() { printf 'venv: %s\n' "$*"; }
die() { printf 'venv: error: %s\n' "$*" >&2; exit 1; }

command -v "$PYTHON" >/dev/null 2>&1 || die "no '$PYTHON' on PATH; install Python 3.10 or newer, or pass PYTHON=/path/to/python3"
"$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 10))' \
    || die "$("$PYTHON" -V 2>&1) is too old: stackforge needs Python 3.10 or newer (PYTHON=/path/to/python3.11)"

make_venv() { "$PYTHON" -m venv "$VENV" >/dev/null 2>&1; }

if [ ! -x "$VENV/bin/python" ]; then
    say "creating $VENV with $("$PYTHON" -V 2>&1)"
    if ! make_venv; then
        rm -rf "$VENV"
        pyver=$("$PYTHON" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
        if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
            say "python -m venv failed: installing python3-venv (python$pyver-venv) with apt-get"
            apt-get update -qq >/dev/null
            DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "python$pyver-venv" >/dev/null 2>&1 \
                || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv >/dev/null
            make_venv || { rm -rf "$VENV"; die "python -m venv still fails after installing python3-venv"; }
        else
            die "'$PYTHON -m venv' failed; install the venv module (Debian/Ubuntu: sudo apt-get install python$pyver-venv) and re-run"
        fi
    fi
fi

say "installing stackforge, the builder's extras and the test tools into $VENV"
# lock: uv for `stackforge lock`; zstd: zstandard for `publish --compression zstd` (an operator's install leaves
# both out); test: pytest and the linters
"$VENV/bin/python" -m pip install -q --disable-pip-version-check -e '.[lock,zstd,test]'
touch "$VENV/.stackforge-installed"
say "ready: $VENV/bin/stackforge"
