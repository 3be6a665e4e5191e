#!/usr/bin/env bash
# Installs `kubernetes-validate` (PyPI; it ships the Kubernetes JSON schemas)
# into a venv at DIR, pinned by deploy/tools/kubernetes-validate.txt, unless
# DIR already holds exactly that. tests/tests/deploy.rs checks the
# Kubernetes manifests with it.
#
# usage: scripts/ensure-kubernetes-validate.sh [DIR]   (default .kiln/tools/kubernetes-validate)
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-${KILN_STATE_DIR:-.kiln}/tools/kubernetes-validate}
req=deploy/tools/kubernetes-validate.txt
want=$(sha256sum <"$req" | cut -c1-64)
if [ -x "$dir/bin/kubernetes-validate" ] && [ "$(cat "$dir/.kiln-installed" 2>/dev/null)" = "$want" ]; then
  exit 0
fi
echo "ensure-kubernetes-validate: installing into $dir" >&2
rm -rf "$dir"
mkdir -p "$(dirname "$dir")"
if ! python3 -m venv "$dir" >/dev/null 2>&1; then
  # Debian splits venv support out of python3.
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q python3-venv >/dev/null
    rm -rf "$dir"
    python3 -m venv "$dir"
  else
    echo "ensure-kubernetes-validate: python3 -m venv failed: install python3-venv" >&2
    exit 1
  fi
fi
"$dir/bin/python" -m pip install --quiet --disable-pip-version-check --no-input -r "$req"
echo "$want" >"$dir/.kiln-installed"
