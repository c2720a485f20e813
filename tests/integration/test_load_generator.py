"""The compose stack's load generator (python -m coordinator.testbed.load) against the app server it loads
in the stack (python -m coordinator.testbed.app), both real processes on loopback."""

from __future__ import annotations

import re
import subprocess
import sys
from collections import Counter

import httpx

from coordinator.testbed.load import format_window
from coordinator.testbed.processes import free_port, stop_process
from coordinator.testbed.waiting import wait_until


def _load(url: str, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "coordinator.testbed.load", "--url", url, "--rate", "20", "--report-every", "0.5",
         "--duration", "1", *extra],
        capture_output=True, text=True, timeout=60, check=False,
    )


def _answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=1, trust_env=False).status_code == 200
    except httpx.HTTPError:
        return False


def test_the_load_reports_who_answered_and_fails_when_asked_to_on_errors() -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}/"
    app = subprocess.Popen([sys.executable, "-m", "coordinator.testbed.app", "--name", "vm7", "--port", str(port)],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
    try:
        assert wait_until(lambda: _answers(url), 30), "the app server did not start"
        served = _load(url, "--fail-on-error")
    finally:
        stop_process(app, timeout=5)
    assert served.returncode == 0, served.stdout + served.stderr
    windows = [line for line in served.stdout.splitlines() if line.startswith("load: served")]
    assert len(windows) == 2
    assert sum(int(n) for n in re.findall(r"vm7=(\d+)", served.stdout)) >= 5
    assert "errors=0" in windows[-1] and "failed 0" in served.stdout

    refused = _load(url, "--fail-on-error")  # nothing listens any more
    assert refused.returncode == 1
    assert re.search(r"failed [1-9]\d*", refused.stdout)
    assert _load(url).returncode == 0  # without --fail-on-error, failures are only reported


def test_a_window_lists_servers_in_order_then_errors() -> None:
    assert format_window(Counter({"vm1": 2, "error": 1, "vm0": 3})) == "served vm0=3 vm1=2 errors=1"
    assert format_window(Counter()) == "served - errors=0"
