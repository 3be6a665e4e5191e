#!/usr/bin/env bash
# Fails if the test suite left Kiln sandboxes, their volumes or session networks behind on
# the Docker engine. Counts only the tests' own:
# - containers of the tests' workers (ids `test-…` from tests/src/lib.rs's
#   worker_config, `proc-…` from its worker processes); a `kiln up`'s
#   (`up-…`), a bench's (`bench-…`) or a deployment's workers are not;
# - volumes of the tests' workers (the sandboxes' workspace, home and
#   toolbox volumes are anonymous; the worker labels them with the
#   container's labels, so one a removal without `v` left is found by its
#   `dev.kiln.worker` label, as containers are);
# - loop disks (the `loop` disk mechanism's images, mounts and loop devices)
#   under the default KILN_SANDBOX_DISK_DIR or a test's own
#   ($TMPDIR/kiln-disk-test-…) whose container is gone: each one's container
#   carries the disk's path in its `dev.kiln.disk` label;
# - networks of sessions that live in a test database (`kiln_test_…`, from
#   tests/src/lib.rs's fresh_database): a session network of a `kiln up` or
#   another deployment on the engine is not.
# Run after the suite (CI: .ci/run). On a machine where other test runs are
# going on, their containers count too. The harness removes what its
# workers leave when a test's TestApp drops (tests/src/leftovers.rs); what
# is found here escaped it (a test process killed, a test that does not
# drop its app).
#
# Environment: DATABASE_URL, the server the tests made their databases on
# (default: scripts/ensure-postgres.sh's).
set -euo pipefail
cd "$(dirname "$0")/.."

leaks=$(docker ps -a --filter label=dev.kiln.managed \
  --format '{{.Names}} {{.Label "dev.kiln.worker"}} {{.Status}}' | awk '$2 ~ /^(test|proc)-/' || true)

volumes=$(docker volume ls --filter label=dev.kiln.managed \
  --format '{{.Name}} {{.Label "dev.kiln.worker"}}' | awk '$2 ~ /^(test|proc)-/' || true)

in_use=$(docker ps -a --filter label=dev.kiln.disk --format '{{.Label "dev.kiln.disk"}}' || true)
disks=""
for d in /var/lib/kiln/sandbox-disks/kiln-disk-* "${TMPDIR:-/tmp}"/kiln-disk-test-*/kiln-disk-*; do
  [ -e "$d" ] || continue
  grep -qxF "$d" <<<"$in_use" || disks="$disks $d"
done

# Session networks, then those whose session is in a test database.
networks=""
session_networks=$(docker network ls --filter label=dev.kiln.session \
  --format '{{.Name}} {{.Label "dev.kiln.session"}}' || true)
if [ -n "$session_networks" ]; then
  url=${DATABASE_URL:-postgres://kiln:kiln@127.0.0.1:5432/kiln}
  dbs=$(psql "$url" -Atc "SELECT datname FROM pg_database WHERE datname LIKE 'kiln\_test\_%'")
  while read -r name session; do
    # A session id is a UUID; anything else is no session of Kiln's.
    [[ $session =~ ^[0-9a-f-]{36}$ ]] || continue
    for db in $dbs; do
      found=$(psql "${url%/*}/$db" -Atc "SELECT 1 FROM sessions WHERE id = '$session'" 2>/dev/null || true)
      if [ "$found" = 1 ]; then
        networks="$networks $name"
        break
      fi
    done
  done <<<"$session_networks"
fi

if [ -n "$leaks" ] || [ -n "$volumes" ] || [ -n "$disks" ] || [ -n "$networks" ]; then
  echo "the tests left these behind:" >&2
  [ -z "$leaks" ] || echo "$leaks" >&2
  [ -z "$volumes" ] || printf 'volumes:\n%s\n' "$volumes" >&2
  [ -z "$disks" ] || echo "loop disks:$disks" >&2
  [ -z "$networks" ] || echo "networks:$networks" >&2
  exit 1
fi
echo "no containers, volumes, loop disks or networks left behind by the tests"
