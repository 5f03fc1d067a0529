#!/usr/bin/env bash
# Set up, lint, build the documentation site strictly, and run the test suite (slow experiment
# runs and slow doc examples are skipped; run them with: .venv/bin/python -m pytest -m slow).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check src tests benchmarks tools
NO_MKDOCS_2_WARNING=1 .venv/bin/mkdocs build --strict --site-dir "${TMPDIR:-/tmp}/isouq-site"
exec .venv/bin/python -m pytest -q -p no:cacheprovider "$@"
