#!/usr/bin/env bash
# Install what the demo needs and is missing (scripts/setup.sh --demo), then run the local demo: ZooKeeper,
# the IMDS simulator, three VMs behind HAProxy under load, and their agents, through one maintenance story
# (a Freeze, a rolling Reboot, a Redeploy, a Preempt). `make demo ARGS="--strategy wait"` plays it under
# another strategy.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --demo
# ARGS holds several options: split into words on purpose.
# shellcheck disable=SC2086
exec .venv/bin/coordinator demo "$@" ${ARGS:-}
