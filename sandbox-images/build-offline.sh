#!/usr/bin/env bash
# Build the Kiln sandbox image (default: kiln-sandbox:latest) WITHOUT a
# container registry: a Debian bookworm root filesystem is bootstrapped with
# mmdebstrap from the host's own Debian package mirror and loaded with
# `docker import`.  The result matches sandbox-images/Dockerfile.
#
# Usage: sandbox-images/build-offline.sh [--rebuild] [IMAGE]
#
#   IMAGE       image name; default $KILN_SANDBOX_IMAGE or kiln-sandbox:latest
#   --rebuild   build even if IMAGE already exists (default: exit 0 if it does)
#
# Environment:
#   KILN_SANDBOX_IMAGE   image name (the first argument wins)
#   KILN_DEBIAN_MIRROR   Debian mirror URL; default: read from the host's apt
#                        sources (/etc/apt/sources.list.d/*.sources, *.list,
#                        /etc/apt/sources.list)
#   TMPDIR               where the temporary build directory goes (/var/tmp)
#
# Needs root (mmdebstrap runs in "root" mode; apt-get may install mmdebstrap)
# and a running Docker daemon.
set -euo pipefail

SUITE=bookworm
PACKAGES=bash,coreutils,git,ripgrep,python3,findutils,sed,grep,diffutils,patch,procps,ca-certificates,tar,gzip
SANDBOX_UID=1000
SANDBOX_GID=1000
SANDBOX_USER=kiln

log() { printf 'build-offline: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

usage() { sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"; }

rebuild=0
image=""
while [ $# -gt 0 ]; do
    case "$1" in
        --rebuild) rebuild=1 ;;
        -h|--help) usage; exit 0 ;;
        -*) die "unknown option: $1 (see --help)" ;;
        *)
            [ -z "$image" ] || die "more than one image name given: $image, $1"
            image="$1" ;;
    esac
    shift
done
image="${image:-${KILN_SANDBOX_IMAGE:-kiln-sandbox:latest}}"

command -v docker >/dev/null 2>&1 || die "docker CLI not found"
docker info >/dev/null 2>&1 || die "cannot talk to the Docker daemon (is it running, and may this user use it?)"

if [ "$rebuild" -eq 0 ] && docker image inspect "$image" >/dev/null 2>&1; then
    echo "image $image already exists; nothing to do (use --rebuild to rebuild)"
    exit 0
fi

[ "$(id -u)" -eq 0 ] || die "must run as root (mmdebstrap --mode=root needs it); try: sudo $0 $*"

start=$SECONDS

# --- mmdebstrap ---------------------------------------------------------------
if ! command -v mmdebstrap >/dev/null 2>&1; then
    log "mmdebstrap not found; installing it with apt-get"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update >&2
    apt-get install -y --no-install-recommends mmdebstrap >&2
fi

# --- mirror -------------------------------------------------------------------
# Print the first URI of a deb822 stanza (Types: deb, Enabled not "no") whose
# Suites contain exactly $SUITE (so "bookworm-security" never matches).
mirror_from_deb822() {
    awk -v suite="$SUITE" '
        function flush() {
            if (uri != "" && is_deb && has_suite && enabled) { print uri; found = 1; exit }
            uri = ""; is_deb = 0; has_suite = 0; enabled = 1
        }
        BEGIN { uri = ""; is_deb = 0; has_suite = 0; enabled = 1; key = "" }
        FNR == 1 { flush() }
        /^[ \t]*#/ { next }
        /^[ \t]*$/ { flush(); key = ""; next }
        {
            line = $0
            if (line ~ /^[A-Za-z0-9-]+:/) {
                key = tolower(substr(line, 1, index(line, ":") - 1))
                line = substr(line, index(line, ":") + 1)
            }
            n = split(line, w, /[ \t]+/)
            for (i = 1; i <= n; i++) {
                if (w[i] == "") continue
                if (key == "types" && w[i] == "deb") is_deb = 1
                else if (key == "suites" && w[i] == suite) has_suite = 1
                else if (key == "uris" && uri == "") uri = w[i]
                else if (key == "enabled" && tolower(w[i]) == "no") enabled = 0
            }
        }
        END { if (!found) flush() }
    ' "$@"
}

# Print the URL of the first one-line-style "deb [opts] URL $SUITE ..." entry.
mirror_from_list() {
    awk -v suite="$SUITE" '
        $1 != "deb" { next }
        {
            i = 2
            if ($i ~ /^\[/) { while (i <= NF && $i !~ /\]$/) i++; i++ }
            if ($(i + 1) == suite) { print $i; exit }
        }
    ' "$@"
}

find_mirror() {
    local f m
    for f in /etc/apt/sources.list.d/*.sources; do
        [ -r "$f" ] || continue
        m=$(mirror_from_deb822 "$f")
        if [ -n "$m" ]; then echo "$m"; return 0; fi
    done
    for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
        [ -r "$f" ] || continue
        m=$(mirror_from_list "$f")
        if [ -n "$m" ]; then echo "$m"; return 0; fi
    done
    return 1
}

if [ -n "${KILN_DEBIAN_MIRROR:-}" ]; then
    mirror="$KILN_DEBIAN_MIRROR"
    log "using mirror from KILN_DEBIAN_MIRROR: $mirror"
else
    mirror=$(find_mirror) || die "no Debian '$SUITE' mirror found in the host's apt sources
  (looked for a 'Types: deb' stanza with 'Suites: $SUITE' in /etc/apt/sources.list.d/*.sources,
   and a 'deb URL $SUITE ...' line in /etc/apt/sources.list and /etc/apt/sources.list.d/*.list);
  set KILN_DEBIAN_MIRROR=http://<your-mirror>/debian"
    log "using mirror from host apt sources: $mirror"
fi

# --- build --------------------------------------------------------------------
workdir=$(mktemp -d "${TMPDIR:-/var/tmp}/kiln-sandbox-build.XXXXXX")
# mktemp makes it 0700; apt's download sandbox user (_apt) must be able to
# traverse it, or apt warns and downloads as root.
chmod 0755 "$workdir"
cleanup() { rm -rf -- "$workdir"; }
trap cleanup EXIT
tarball="$workdir/rootfs.tar"

log "bootstrapping $SUITE (minbase + $PACKAGES) into $tarball"
# mmdebstrap puts its temporary chroot directory under TMPDIR.  Its default
# cleanup already removes apt lists/caches and dpkg/apt logs.
TMPDIR="$workdir" mmdebstrap \
    --variant=minbase \
    --mode=root \
    --format=tar \
    --include="$PACKAGES" \
    --dpkgopt='path-exclude=/usr/share/man/*' \
    --dpkgopt='path-exclude=/usr/share/info/*' \
    --dpkgopt='path-exclude=/usr/share/locale/*' \
    --dpkgopt='path-include=/usr/share/locale/locale.alias' \
    --dpkgopt='path-exclude=/usr/share/doc/*' \
    --dpkgopt='path-include=/usr/share/doc/*/copyright' \
    --dpkgopt='path-exclude=/usr/share/lintian/*' \
    --customize-hook="chroot \"\$1\" groupadd --gid $SANDBOX_GID $SANDBOX_USER" \
    --customize-hook="chroot \"\$1\" useradd --uid $SANDBOX_UID --gid $SANDBOX_GID --create-home --home-dir /home/$SANDBOX_USER --shell /bin/bash $SANDBOX_USER" \
    --customize-hook="mkdir -p \"\$1/workspace\" && chown $SANDBOX_UID:$SANDBOX_GID \"\$1/workspace\"" \
    "$SUITE" "$tarball" "$mirror" >&2

old_id=$(docker image inspect --format '{{.Id}}' "$image" 2>/dev/null || true)
log "importing into docker as $image ($(du -h "$tarball" | cut -f1) tarball)"
docker import \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'WORKDIR /workspace' \
    --change "USER $SANDBOX_UID:$SANDBOX_GID" \
    --change 'CMD ["sleep","infinity"]' \
    --message "kiln sandbox: debian $SUITE minbase via mmdebstrap (sandbox-images/build-offline.sh)" \
    "$tarball" "$image" >&2

# On --rebuild, drop the previous image if nothing else uses it (docker
# refuses while a container or another tag still references it).
new_id=$(docker image inspect --format '{{.Id}}' "$image")
if [ -n "$old_id" ] && [ "$old_id" != "$new_id" ]; then
    docker image rm "$old_id" >/dev/null 2>&1 || log "kept previous image $old_id (still in use)"
fi

# --- verify -------------------------------------------------------------------
log "verifying $image"
out=$(docker run --rm --network none "$image" bash -c 'id -u; pwd; git --version; rg --version | head -n1; python3 --version')
printf '%s\n' "$out"
[ "$(printf '%s\n' "$out" | sed -n 1p)" = "$SANDBOX_UID" ] || die "image runs as uid $(printf '%s\n' "$out" | sed -n 1p), expected $SANDBOX_UID"
[ "$(printf '%s\n' "$out" | sed -n 2p)" = "/workspace" ] || die "image workdir is not /workspace"

size=$(docker image inspect --format '{{.Size}}' "$image")
echo "built $image ($((size / 1000000)) MB) in $((SECONDS - start))s"
