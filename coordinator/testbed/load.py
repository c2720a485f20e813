"""A steady load through the load balancer, reporting who answered: the load generator of the compose stack.

``python -m coordinator.testbed.load --url http://haproxy:8080 --rate 10``. Every ``--report-every``
seconds it prints one line: requests answered per server (the ``X-Served-By`` header of
``coordinator.testbed.app``) and failures, so that ``docker compose logs -f load`` shows traffic leaving a
VM while it drains and coming back after the event. Runs until SIGTERM or SIGINT, or for ``--duration``
seconds; exits 0, or 1 with ``--fail-on-error`` if any request failed.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from collections import Counter
from collections.abc import Callable

from coordinator.testbed.demo import LoadGenerator

__all__ = ["format_window", "main"]


def format_window(window: Counter[str]) -> str:
    """``served vm0=3 vm1=4 errors=0``: the servers in name order, then the failures."""
    servers = " ".join(f"{name}={count}" for name, count in sorted(window.items()) if name != "error")
    return f"served {servers or '-'} errors={window.get('error', 0)}"


def main(argv: list[str] | None = None, *, out: Callable[[str], None] = print) -> int:
    parser = argparse.ArgumentParser(description="Send GET requests at a fixed rate; report who answered.")
    parser.add_argument("--url", required=True, help="where to send the requests (the load balancer)")
    parser.add_argument("--rate", type=float, default=10.0, help="requests per second (default: %(default)s)")
    parser.add_argument("--report-every", type=float, default=5.0, metavar="S",
                        help="seconds between two report lines (default: %(default)s)")
    parser.add_argument("--duration", type=float, default=None, metavar="S",
                        help="stop after this many seconds (default: run until SIGTERM)")
    parser.add_argument("--fail-on-error", action="store_true", help="exit 1 if any request failed")
    args = parser.parse_args(argv)
    if not args.rate > 0 or not args.report_every > 0:
        parser.error("--rate and --report-every must be > 0")

    stop = threading.Event()
    if threading.current_thread() is threading.main_thread():
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, lambda _signum, _frame: stop.set())
    load = LoadGenerator(args.url, args.rate)
    load.start()
    out(f"load: {args.rate:g} requests/s to {args.url}")
    elapsed = 0.0
    try:
        while not stop.is_set() and (args.duration is None or elapsed < args.duration):
            step = args.report_every if args.duration is None else min(args.report_every, args.duration - elapsed)
            stop.wait(step)
            elapsed += step
            out(f"load: {format_window(load.take_window())}")
    finally:
        load.stop()
    failed = sum(load.failed.values())
    served = sum(load.served.values())
    out(f"load: stopped; answered {served}, failed {failed}" + (f" ({dict(load.failed)})" if failed else ""))
    return 1 if failed and args.fail_on_error else 0


if __name__ == "__main__":
    sys.exit(main())
