#!/usr/bin/env bash
# Install Debian packages the tests need, only where their command is
# missing:
#
#   scripts/ensure-packages.sh chromium:chromium chromedriver:chromium-driver
#
# Each argument is COMMAND:PACKAGE. Recommended packages come too (for
# Chromium: the fonts its screenshots need). Needs root (or sudo) to install; without
# either it says what is missing and exits 0, so the tests that need the
# command can skip (or fail, where CI requires them).
set -euo pipefail

log() { printf 'ensure-packages: %s\n' "$*" >&2; }

missing=()
for pair in "$@"; do
    command -v "${pair%%:*}" >/dev/null 2>&1 || missing+=("${pair#*:}")
done
[ ${#missing[@]} -eq 0 ] && exit 0

if [ "$(id -u)" -eq 0 ]; then
    as_root=()
elif command -v sudo >/dev/null 2>&1; then
    as_root=(sudo)
else
    log "missing ${missing[*]}; not root and no sudo, so not installing (tests needing them skip)"
    exit 0
fi
log "installing ${missing[*]} with apt-get"
"${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -q >&2
"${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}" >&2
