#!/usr/bin/env bash
# Installs a PyPI command-line tool the tests use into its own venv at
# .kiln/tools/NAME (under KILN_STATE_DIR), pinned by a requirements file,
# unless the venv already holds exactly that pin:
#
#   scripts/ensure-pip-tool.sh kubernetes-validate deploy/tools/kubernetes-validate.txt
#       (the Kubernetes JSON schemas; tests/tests/deploy.rs checks the manifests)
#   scripts/ensure-pip-tool.sh openapi-spec-validator tests/tools/openapi-spec-validator.txt
#       (the OpenAPI 3.1 schema; tests/tests/openapi.rs checks Kiln's document)
#
# NAME is also the command the venv must provide.
set -euo pipefail
cd "$(dirname "$0")/.."
name=$1
req=$2
dir=${KILN_STATE_DIR:-.kiln}/tools/$name
want=$(sha256sum <"$req" | cut -c1-64)
if [ -x "$dir/bin/$name" ] && [ "$(cat "$dir/.kiln-installed" 2>/dev/null)" = "$want" ]; then
  exit 0
fi
echo "ensure-pip-tool: installing $name into $dir" >&2
rm -rf "$dir"
mkdir -p "$(dirname "$dir")"
if ! python3 -m venv "$dir" >/dev/null 2>&1; then
  # Debian splits venv support out of python3.
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q python3-venv >/dev/null
    rm -rf "$dir"
    python3 -m venv "$dir"
  else
    echo "ensure-pip-tool: python3 -m venv failed: install python3-venv" >&2
    exit 1
  fi
fi
"$dir/bin/python" -m pip install --quiet --disable-pip-version-check --no-input -r "$req"
echo "$want" >"$dir/.kiln-installed"
