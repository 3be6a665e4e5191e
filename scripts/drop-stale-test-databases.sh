#!/usr/bin/env bash
# Drops the databases earlier test runs left behind: every test creates its
# own `kiln_test_<unix seconds>_<uuid>` database and none drops it (a failed
# test's data is worth keeping until the next run). Left to pile up they cost
# gigabytes, and after an unclean stop Postgres must fsync every one of their
# files before it accepts connections.
#
# Only databases nobody is connected to and created over ten minutes ago are
# dropped, so a test run going on beside this one keeps its own.
#
#   scripts/drop-stale-test-databases.sh "$DATABASE_URL"
set -euo pipefail
url=${1:?usage: drop-stale-test-databases.sh DATABASE_URL}

stale() {
    psql -X -q -tA -v ON_ERROR_STOP=1 "$url" <<'SQL'
SELECT datname
FROM pg_database d
WHERE datname LIKE 'kiln\_test\_%'
  AND NOT EXISTS (SELECT 1 FROM pg_stat_activity a WHERE a.datname = d.datname)
  -- Names from before the creation time was part of them count as old.
  AND coalesce(to_timestamp(substring(datname FROM '^kiln_test_([0-9]{10})_')::bigint), 'epoch')
      < now() - interval '10 minutes'
SQL
}

start=$(date +%s)
names=$(stale)
[ -n "$names" ] || exit 0
# One DROP per statement (DROP DATABASE cannot run in a transaction block);
# one that fails because a connection appeared meanwhile is left for next time.
sed 's/.*/DROP DATABASE IF EXISTS "&";/' <<<"$names" | psql -X -q -v ON_ERROR_STOP=0 "$url" >/dev/null 2>&1 || true
echo "drop-stale-test-databases: dropped $(wc -l <<<"$names") in $(( $(date +%s) - start )) s" >&2
