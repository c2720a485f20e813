#!/usr/bin/env bash
# Install what is missing, then run the local demo: ZooKeeper, the IMDS simulator and three agents,
# one Freeze drained, approved early and recovered.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/coordinator demo "$@"
