#!/usr/bin/env bash
# Fails if the test suite left Kiln sandboxes or session networks behind on
# the Docker engine: containers of the tests' workers (ids `test-…` from
# tests/src/lib.rs's worker_config, `proc-…` from its worker processes) and
# networks of Kiln sessions. Run after the suite on a machine where nothing
# else uses Kiln (CI: .ci/run); elsewhere another test run's containers would
# count too. The harness removes what its workers leave when a test's
# TestApp drops (tests/src/leftovers.rs); what is found here escaped it (a
# test process killed, a test that does not drop its app).
set -euo pipefail

leaks=$(docker ps -a --filter label=dev.kiln.managed \
  --format '{{.Names}} {{.Label "dev.kiln.worker"}} {{.Status}}' | awk '$2 ~ /^(test|proc)-/' || true)
networks=$(docker network ls --filter label=dev.kiln.session --format '{{.Name}}' || true)
if [ -n "$leaks" ] || [ -n "$networks" ]; then
  echo "the tests left these behind:" >&2
  [ -z "$leaks" ] || echo "$leaks" >&2
  [ -z "$networks" ] || echo "networks: $networks" >&2
  exit 1
fi
echo "no containers or networks left behind by the tests"
