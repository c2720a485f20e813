#!/usr/bin/env bash
# Install what is missing, then run the local demo: ZooKeeper, the IMDS simulator, three VMs behind
# HAProxy under load, and their agents, through one maintenance story (a Freeze, a rolling Reboot, a
# Redeploy, a Preempt); `make demo ARGS="--strategy wait"` plays it under another strategy.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/coordinator demo "$@" ${ARGS:-}
