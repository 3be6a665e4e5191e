#!/usr/bin/env bash
# Installs `openapi-spec-validator` (PyPI; it checks a document against the
# OpenAPI Initiative's 3.1 schema, then its references and parameters) into a
# venv at DIR, pinned by tests/tools/openapi-spec-validator.txt, unless DIR
# already holds exactly that. tests/tests/openapi.rs checks Kiln's OpenAPI
# document with it.
#
# usage: scripts/ensure-openapi-spec-validator.sh [DIR]   (default .kiln/tools/openapi-spec-validator)
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-${KILN_STATE_DIR:-.kiln}/tools/openapi-spec-validator}
req=tests/tools/openapi-spec-validator.txt
want=$(sha256sum <"$req" | cut -c1-64)
if [ -x "$dir/bin/openapi-spec-validator" ] && [ "$(cat "$dir/.kiln-installed" 2>/dev/null)" = "$want" ]; then
  exit 0
fi
echo "ensure-openapi-spec-validator: installing into $dir" >&2
rm -rf "$dir"
mkdir -p "$(dirname "$dir")"
if ! python3 -m venv "$dir" >/dev/null 2>&1; then
  # Debian splits venv support out of python3.
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q python3-venv >/dev/null
    rm -rf "$dir"
    python3 -m venv "$dir"
  else
    echo "ensure-openapi-spec-validator: python3 -m venv failed: install python3-venv" >&2
    exit 1
  fi
fi
"$dir/bin/python" -m pip install --quiet --disable-pip-version-check --no-input -r "$req"
echo "$want" >"$dir/.kiln-installed"
