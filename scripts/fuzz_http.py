#!/usr/bin/env python3
"""Fuzz the agent's HTTP surface (both listeners, on loopback) with generated raw requests.

    .venv/bin/python scripts/fuzz_http.py --inputs 20000 --seed 1

Prints ``inputs tried: N, server crashes: K, unanswered health checks: K`` and exits 1 if either count
is not zero, after showing the first inputs that did it. The generator is in
``tests/tools/httpfuzz.py``; the test suite runs the same with a few hundred inputs.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.tools.httpfuzz import run


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--inputs", type=int, default=2000, help="how many requests to generate (default 2000)")
    parser.add_argument("--seed", type=int, default=None, help="a seed, to reproduce a run")
    args = parser.parse_args()
    started = time.monotonic()
    report = run(args.inputs, random_seed=args.seed)
    print(report.line())
    print(f"in {time.monotonic() - started:.0f} s", file=sys.stderr)
    for payload in report.failing:
        print(f"failing input: {payload[:300]!r}", file=sys.stderr)
    return 1 if report.crashes or report.unanswered else 0


if __name__ == "__main__":
    sys.exit(main())
