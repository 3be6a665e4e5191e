#!/usr/bin/env bash
# Installs gVisor's `runsc` and registers it with the Docker engine as the
# runtime `runsc`, unless that is done already. Idempotent; never restarts
# the engine (running containers are left alone): the registration is
# reloaded with SIGHUP.
#
# Which runsc: Debian's package, from the suite KILN_RUNSC_SUITE (default
# trixie), fetched with `apt-get download` through a private source list
# (the machine's own apt configuration is not touched) and unpacked to
# /usr/local/lib/kiln-runsc/runsc (it is one static binary). Not bookworm's
# own runsc (release 20221219): it rejects `statx` with AT_NO_AUTOMOUNT
# (EINVAL), so coreutils' `ls` and `stat` fail in every sandbox, and it
# gives a `docker exec` as a non-root user the container's capabilities
# (with CAP_SETUID such a process can become root).
#
# Runtime arguments: `--platform=ptrace` (no KVM here) and `--network=host`:
# runsc's own network stack refuses to start on these engines ("cannot run
# with network enabled in root network namespace"); with `host` the sandbox
# uses the network namespace Docker made for the container (`none`, or the
# session's egress network), so Docker's network isolation holds, but
# network system calls reach the host kernel's stack rather than gVisor's.
#
# Needs root (or sudo); without either it says so and exits 0, and the
# runsc test pass fails clearly at the worker's runtime check.
set -euo pipefail

log() { printf 'ensure-runsc: %s\n' "$*" >&2; }

SUITE=${KILN_RUNSC_SUITE:-trixie}
MIRROR=${KILN_RUNSC_MIRROR:-http://deb.debian.org/debian}
DEST=/usr/local/lib/kiln-runsc/runsc
DAEMON_JSON=/etc/docker/daemon.json
RUNTIME_ARGS='["--platform=ptrace", "--network=host"]'

if [ "$(id -u)" -eq 0 ]; then
    as_root=()
elif command -v sudo >/dev/null 2>&1; then
    as_root=(sudo)
else
    log "not root and no sudo: runsc is not installed or registered"
    exit 0
fi

install_runsc() {
    local work
    work=$(mktemp -d "${TMPDIR:-/var/tmp}/kiln-runsc.XXXXXX")
    # shellcheck disable=SC2064
    trap "rm -rf '$work'" RETURN
    mkdir -p "$work/lists/partial" "$work/cache/archives/partial"
    echo "deb $MIRROR $SUITE main" >"$work/sources.list"
    local opts=(-o "Dir::Etc::sourcelist=$work/sources.list" -o "Dir::Etc::sourceparts=-"
        -o "Dir::State::Lists=$work/lists" -o "Dir::Cache=$work/cache" -o "APT::Sandbox::User=root")
    log "fetching runsc from Debian $SUITE"
    apt-get "${opts[@]}" update -q >&2
    (cd "$work" && apt-get "${opts[@]}" download runsc >&2)
    dpkg-deb -x "$work"/runsc_*.deb "$work/root"
    "${as_root[@]}" install -D -m 0755 "$work/root/usr/bin/runsc" "$DEST"
}

[ -x "$DEST" ] && "$DEST" --version >/dev/null 2>&1 || install_runsc
log "$("$DEST" --version | head -1)"

# Registered with these arguments already: nothing to reload.
want=$(python3 -c 'import json,sys; print(json.dumps({"path": sys.argv[1], "runtimeArgs": json.loads(sys.argv[2])}, sort_keys=True))' \
    "$DEST" "$RUNTIME_ARGS")
have=$(python3 -c 'import json,sys
try: d = json.load(open(sys.argv[1]))
except FileNotFoundError: d = {}
print(json.dumps(d.get("runtimes", {}).get("runsc"), sort_keys=True))' "$DAEMON_JSON")
if [ "$want" != "$have" ] || ! docker info --format '{{json .Runtimes}}' | grep -q '"runsc"'; then
    log "registering runsc in $DAEMON_JSON (the engine's other settings are kept)"
    "${as_root[@]}" python3 - "$DAEMON_JSON" "$want" <<'PY'
import json, os, sys
path, entry = sys.argv[1], json.loads(sys.argv[2])
try:
    with open(path) as f:
        conf = json.load(f)
except FileNotFoundError:
    conf = {}
conf.setdefault("runtimes", {})["runsc"] = entry
tmp = path + ".kiln-tmp"
with open(tmp, "w") as f:
    json.dump(conf, f, indent=2)
os.replace(tmp, path)
PY
    # SIGHUP reloads the runtimes; a restart would stop running containers.
    "${as_root[@]}" kill -HUP "$(pidof dockerd)"
    for _ in $(seq 50); do
        docker info --format '{{json .Runtimes}}' | grep -q '"runsc"' && break
        sleep 0.2
    done
fi
docker info --format '{{json .Runtimes}}' | grep -q '"runsc"' || { log "the engine did not pick up runsc"; exit 1; }
