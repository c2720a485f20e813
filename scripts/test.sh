#!/usr/bin/env bash
# Install what is missing, then run lint, type checks and the whole test suite. Tests start their
# own ZooKeeper servers, simulator and agents on loopback and stop exactly the processes they started.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
echo "test: ruff"
.venv/bin/ruff check coordinator tests bench scripts stubs
echo "test: mypy --strict"
.venv/bin/mypy
echo "test: every safety fix is caught by its regression test when undone"
.venv/bin/python scripts/check_regressions.py
echo "test: pytest"
# The slowest tests are listed at the end, so that the suite's time (aim: the whole of this script well
# under 30 minutes on 2 cores) is watched where it grows.
exec .venv/bin/pytest -p no:cacheprovider --durations=30 "$@"
