#!/usr/bin/env bash
# Install what is missing, then run lint, type checks and the whole test suite. Tests start their
# own ZooKeeper servers, simulator and agents on loopback and stop exactly the processes they started.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
echo "test: ruff"
.venv/bin/ruff check coordinator tests bench scripts stubs sim
echo "test: mypy --strict"
.venv/bin/mypy
echo "test: every safety fix is caught by its regression test when undone"
.venv/bin/python scripts/check_regressions.py
# The slowest tests are listed at the end, so that the suite's time (aim: the whole of this script well
# under 30 minutes on 2 cores) is watched where it grows.
pytest=(.venv/bin/pytest -p no:cacheprovider --durations=30)
if [ "$#" -gt 0 ] || [ "${TEST_ONE_PROCESS:-0}" = 1 ]; then
    echo "test: pytest"
    exec "${pytest[@]}" "$@"
fi

# Two pytest processes side by side, one per core: the end-to-end stories (marker `e2e`) one after
# another in the background, everything else in the foreground. The stories spend most of their time
# waiting on notices and drains; two of them at once would share the ZooKeeper session timeouts and the
# probe's timing they judge with each other, so they keep a process of their own.
# TEST_ONE_PROCESS=1 runs the whole suite in one process, as any arguments do.
e2e_log=$(mktemp -t coordinator-e2e.XXXXXX.log)
set -m  # the background pytest in a process group of its own, with SIGINT not ignored: stopped cleanly below
"${pytest[@]}" -m e2e > "$e2e_log" 2>&1 &
e2e_pid=$!
set +m
stop_e2e() { kill -INT "$e2e_pid" 2>/dev/null && wait "$e2e_pid" 2>/dev/null; }
trap 'stop_e2e; exit 130' INT TERM
echo "test: pytest, the end-to-end stories in the background (progress in $e2e_log)"
echo "test: pytest, every other test"
status=0
"${pytest[@]}" -m "not e2e" || status=$?
echo "test: pytest, the end-to-end stories (run beside the tests above)"
e2e_status=0
wait "$e2e_pid" || e2e_status=$?
trap - INT TERM
cat "$e2e_log"
rm -f "$e2e_log"
if [ "$status" -ne 0 ] || [ "$e2e_status" -ne 0 ]; then
    echo "test: FAILED (other tests: exit $status, end-to-end stories: exit $e2e_status)"
    exit 1
fi
