#!/usr/bin/env bash
# Build the three test images that have no C library at all, from Debian's
# statically linked `bash-static` and `busybox-static` packages (fetched with
# `apt-get download`, so from the machine's own apt sources), imported with
# `docker import`:
#
#   kiln-test-static:1   bash (bash-static) and busybox's commands; no glibc,
#                        no dynamic loader; /etc/passwd knows root only
#   kiln-test-nobash:1   the same without bash: busybox's POSIX sh only
#   kiln-test-noshell:1  no shell at all: an empty root filesystem with
#                        /workspace, /tmp, a root-only /etc/passwd and the
#                        two programs the worker runs in any sandbox
#                        (busybox's binary as `sleep` and `true` only, no
#                        other applet linked): the container's idle process
#                        is `sleep infinity`, the disk probe runs `true`;
#                        the toolbox is copied in by the worker
#
# The sandbox tests (tests/tests/any_image.rs) run the toolbox in these. An
# image that already exists is left as it is (--rebuild to build anyway).
#
# Usage: sandbox-images/build-static-test-images.sh [--rebuild]
# Needs a running Docker daemon, apt-get and dpkg-deb.
set -euo pipefail

STATIC_IMAGE=kiln-test-static:1
NOBASH_IMAGE=kiln-test-nobash:1
NOSHELL_IMAGE=kiln-test-noshell:1

log() { printf 'build-static-test-images: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

rebuild=0
case "${1:-}" in
    --rebuild) rebuild=1 ;;
    "") ;;
    *) die "unknown argument: $1" ;;
esac

command -v docker >/dev/null 2>&1 || die "docker CLI not found"
have() { docker image inspect "$1" >/dev/null 2>&1; }
if [ "$rebuild" -eq 0 ] && have "$STATIC_IMAGE" && have "$NOBASH_IMAGE" && have "$NOSHELL_IMAGE"; then
    exit 0
fi

work=$(mktemp -d "${TMPDIR:-/var/tmp}/kiln-static-images.XXXXXX")
trap 'rm -rf "$work"' EXIT
cd "$work"

# `apt-get download` takes the package from the configured sources; refresh
# the lists once if they do not know it yet.
if ! apt-get download bash-static busybox-static >&2 2>/dev/null; then
    log "apt-get download failed; updating the package lists and trying again"
    apt-get update >&2
    apt-get download bash-static busybox-static >&2
fi

root="$work/root"
mkdir -p "$root"
for deb in ./*.deb; do dpkg-deb -x "$deb" "$root"; done
# Only the two binaries are wanted; docs and such are dropped.
rm -rf "$root/usr/share"
[ -x "$root/bin/busybox" ] || die "busybox-static did not provide /bin/busybox"
[ -x "$root/bin/bash-static" ] || die "bash-static did not provide /bin/bash-static"

# busybox's commands as links (it is static: it runs here too). `kill`,
# `timeout` and `sleep` are what the worker itself runs in a sandbox.
for applet in $("$root/bin/busybox" --list); do
    [ -e "$root/bin/$applet" ] || ln -s busybox "$root/bin/$applet"
done
mkdir -p "$root/tmp" "$root/workspace" "$root/etc" "$root/usr/bin" "$root/usr/local/bin"
chmod 1777 "$root/tmp"
echo 'root:x:0:0:root:/root:/bin/sh' > "$root/etc/passwd"
echo 'root:x:0:' > "$root/etc/group"

# Nothing dynamically linked may be in it.
if find "$root" -name 'ld-linux*' -o -name 'libc.so*' | grep -q .; then
    die "a C library slipped into the image"
fi

# Only the images missing (or all, with --rebuild): one in use stays as it is.
import() {
    local image=$1 dir=$2
    if [ "$rebuild" -eq 0 ] && have "$image"; then
        return
    fi
    tar -C "$dir" -c . | docker import \
        -c 'ENV PATH=/usr/local/bin:/usr/bin:/bin' -c 'WORKDIR /workspace' - "$image" >/dev/null
    log "built $image"
}

# No shell: nothing but the directories and busybox under the names `sleep`
# and `true` (busybox picks the applet by the name it was run as, so it is
# those two and nothing else here).
noshell="$work/noshell"
mkdir -p "$noshell/bin" "$noshell/tmp" "$noshell/workspace" "$noshell/etc"
chmod 1777 "$noshell/tmp"
cp "$root/bin/busybox" "$noshell/bin/sleep"
ln "$noshell/bin/sleep" "$noshell/bin/true"
cp "$root/etc/passwd" "$root/etc/group" "$noshell/etc/"

rm -f "$root/bin/bash"
cp -a "$root" "$work/nobash"
rm -f "$work/nobash/bin/bash-static"
ln -s bash-static "$root/bin/bash"
import "$STATIC_IMAGE" "$root"
import "$NOBASH_IMAGE" "$work/nobash"
import "$NOSHELL_IMAGE" "$noshell"
