#!/usr/bin/env bash
# Installs specdec_jax with its test extras into ./.venv-test and runs every
# test (slow statistical tests included). Usage: bash scripts/test.sh [pytest args]
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${SPECDEC_TEST_VENV:-.venv-test}"
if [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install --quiet --upgrade pip
# torch==2.13.0 (CPU) is pinned in the [hf] extra; never let pip pick another.
"$VENV/bin/python" -m pip install --quiet -e ".[hf,seqio,dev]"
export JAX_PLATFORMS=cpu TF_CPP_MIN_LOG_LEVEL=2
exec "$VENV/bin/python" -m pytest -q -n 2 --durations=15 "$@" tests
