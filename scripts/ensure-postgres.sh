#!/usr/bin/env bash
# Make sure a PostgreSQL server (Debian cluster 15/main) is running on
# 127.0.0.1:5432 with a superuser role kiln/kiln and a database kiln, then
# print its URL as the only line on stdout:
#
#   DATABASE_URL=$(scripts/ensure-postgres.sh)
#
# All progress output goes to stderr. Idempotent: safe to run again while the
# server is up. Installs the `postgresql` package with apt if no server is
# installed. Needs root (or sudo) to install, start the cluster and create the
# role.
#
# Environment: KILN_PG_VERSION (default 15).
set -euo pipefail

PG_VERSION="${KILN_PG_VERSION:-15}"
PG_CLUSTER=main
PG_HOST=127.0.0.1
PG_PORT=5432
ROLE=kiln
PASSWORD=kiln
DATABASE=kiln
URL="postgres://$ROLE:$PASSWORD@$PG_HOST:$PG_PORT/$DATABASE"

# Keep stdout for the URL only.
exec 3>&1 1>&2

log() { printf 'ensure-postgres: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

# Run a command as root: directly, or through sudo.
as_root() {
    if [ "$(id -u)" -eq 0 ]; then
        "$@"
    elif command -v sudo >/dev/null 2>&1; then
        sudo "$@"
    else
        die "need root for: $* (run as root or install sudo)"
    fi
}

# Run a command as the postgres OS user (peer auth over the Unix socket).
as_postgres() {
    if [ "$(id -un)" = postgres ]; then
        (cd / && "$@")
    elif [ "$(id -u)" -eq 0 ]; then
        (cd / && runuser -u postgres -- "$@")
    elif command -v sudo >/dev/null 2>&1; then
        (cd / && sudo -u postgres -- "$@")
    else
        die "need root or sudo to run as postgres: $*"
    fi
}

# Run a command with every file descriptor above 2 closed. Used for anything
# that may start the server: the postmaster would otherwise inherit them, and
# one of them is the caller's $(...) pipe (our fd 3), so the caller would never
# see EOF while the server runs.
without_extra_fds() {
    (
        for fdpath in /proc/"$BASHPID"/fd/*; do
            fd=${fdpath##*/}
            if [ "$fd" -gt 2 ]; then eval "exec $fd>&-" 2>/dev/null || true; fi
        done
        "$@"
    )
}

psql_admin() {
    as_postgres psql -X -q -v ON_ERROR_STOP=1 -p "$PG_PORT" -d postgres "$@"
}

# --- install ------------------------------------------------------------------
if ! compgen -G '/usr/lib/postgresql/*/bin/postgres' >/dev/null \
    || ! command -v pg_lsclusters >/dev/null 2>&1; then
    log "PostgreSQL server not installed; installing it with apt-get"
    as_root env DEBIAN_FRONTEND=noninteractive apt-get update
    without_extra_fds as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends postgresql
fi
[ -x "/usr/lib/postgresql/$PG_VERSION/bin/postgres" ] \
    || die "PostgreSQL $PG_VERSION is not installed (found: $(echo /usr/lib/postgresql/*/bin/postgres)); set KILN_PG_VERSION or install postgresql-$PG_VERSION"

# --- cluster ------------------------------------------------------------------
# pg_lsclusters --no-header: "Ver Cluster Port Status Owner Datadir Logfile"
cluster_line() {
    pg_lsclusters --no-header 2>/dev/null | awk -v v="$PG_VERSION" -v c="$PG_CLUSTER" '$1 == v && $2 == c'
}

# After an unclean stop (a machine powered off with the server running),
# Postgres fsyncs every file of the data directory before it accepts
# connections: one call per file, minutes with many databases. syncfs(2)
# does the same in one call per file system.
tune_cluster() {
    local confd="/etc/postgresql/$PG_VERSION/$PG_CLUSTER/conf.d"
    local want="recovery_init_sync_method = syncfs"
    [ -d "$confd" ] || return 0
    if [ "$(cat "$confd/kiln.conf" 2>/dev/null)" != "$want" ]; then
        log "setting $want ($confd/kiln.conf)"
        printf '%s\n' "$want" | as_root tee "$confd/kiln.conf" >/dev/null
    fi
}

# How long a start may take (crash recovery included) before we give up.
START_TIMEOUT_S=600

line=$(cluster_line)
if [ -z "$line" ]; then
    log "creating cluster $PG_VERSION/$PG_CLUSTER on port $PG_PORT"
    without_extra_fds as_root pg_createcluster "$PG_VERSION" "$PG_CLUSTER" --port "$PG_PORT"
    tune_cluster
    without_extra_fds as_root pg_ctlcluster "$PG_VERSION" "$PG_CLUSTER" start -- -t "$START_TIMEOUT_S"
else
    port=$(awk '{print $3}' <<<"$line")
    status=$(awk '{print $4}' <<<"$line")
    [ "$port" = "$PG_PORT" ] \
        || die "cluster $PG_VERSION/$PG_CLUSTER uses port $port, not $PG_PORT (see /etc/postgresql/$PG_VERSION/$PG_CLUSTER/postgresql.conf)"
    case "$status" in
        online*) log "cluster $PG_VERSION/$PG_CLUSTER already running" ;;
        *)
            tune_cluster
            log "starting cluster $PG_VERSION/$PG_CLUSTER (was: $status; waiting up to ${START_TIMEOUT_S}s for recovery)"
            without_extra_fds as_root pg_ctlcluster "$PG_VERSION" "$PG_CLUSTER" start -- -t "$START_TIMEOUT_S" ;;
    esac
fi

# --- wait ---------------------------------------------------------------------
ready=0
for _ in $(seq 1 60); do
    if pg_isready -q -h "$PG_HOST" -p "$PG_PORT"; then ready=1; break; fi
    sleep 0.5
done
[ "$ready" -eq 1 ] || die "server not accepting connections on $PG_HOST:$PG_PORT after 30s; see /var/log/postgresql/postgresql-$PG_VERSION-$PG_CLUSTER.log"

# --- role and database --------------------------------------------------------
if [ "$(psql_admin -tA -c "SELECT 1 FROM pg_roles WHERE rolname = '$ROLE'")" = 1 ]; then
    log "role $ROLE exists"
else
    log "creating role $ROLE"
    psql_admin -c "CREATE ROLE $ROLE WITH SUPERUSER LOGIN PASSWORD '$PASSWORD'"
fi
# Re-assert the attributes the tests rely on, in case the role was changed.
psql_admin -c "ALTER ROLE $ROLE WITH SUPERUSER LOGIN PASSWORD '$PASSWORD'"

if [ "$(psql_admin -tA -c "SELECT 1 FROM pg_database WHERE datname = '$DATABASE'")" = 1 ]; then
    log "database $DATABASE exists"
else
    log "creating database $DATABASE"
    psql_admin -c "CREATE DATABASE $DATABASE OWNER $ROLE"
fi

# --- check over TCP with the password, as the tests will -----------------------
PGCONNECT_TIMEOUT=10 psql -X -q -tA "$URL" -c 'SELECT 1' >/dev/null \
    || die "cannot connect to $URL"
log "ready: $URL"

printf '%s\n' "$URL" >&3
