#!/usr/bin/env python3
"""Join the files of a long chaos run played in parts side by side (each ``--json``, other seeds) into one.

    .venv/bin/python scripts/chaos_join.py OUT.json PART.json [PART.json ...]

Two halves of a 200-seed run, each in a process of its own (``--seed 1 --runs 100`` and ``--seed 101
--runs 100``), fit on two cores in about half the time. The parts must have run the same code (source
digest) with the same configuration, and no seed twice: anything else is refused, as ``--resume`` refuses
it. Each part keeps its own entry (seeds, commit, start, how long it took); the joined file's
``wall_seconds`` adds them up, so for parts played side by side it is the sum of their times, not how
long the run took on the clock.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path

# The chaos harness and its oracle are test tools (tests/), run from the repository.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.chaos.ledger import Ledger, LedgerError


def join(paths: Sequence[Path]) -> Ledger:
    joined: Ledger | None = None
    for path in paths:
        body = json.loads(path.read_text())
        part = Ledger.resume(path, body["config"], body["code"])  # a file of this command's runs, or refused
        if joined is None:
            joined = part
            continue
        if part.config != joined.config:
            raise LedgerError(f"{path}: another configuration than {paths[0]}")
        if part.code.get("digest") != joined.code.get("digest"):
            raise LedgerError(f"{path}: other code (source digest {part.code.get('digest')}, "
                              f"not {joined.code.get('digest')})")
        twice = sorted(joined.done() & part.done())
        if twice:
            raise LedgerError(f"{path}: seeds already joined from another part: {twice[:10]}")
        joined.results = sorted([*joined.results, *part.results], key=lambda r: int(r["seed"]))
        joined.parts = [*joined.parts, *part.parts]
    if joined is None:
        raise LedgerError("no part given")
    return joined


def main(argv: Sequence[str]) -> int:
    if len(argv) < 2:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    out, parts = Path(argv[0]), [Path(p) for p in argv[1:]]
    try:
        joined = join(parts)
    except (LedgerError, OSError, ValueError, KeyError) as exc:
        print(f"chaos_join: {exc}", file=sys.stderr)
        return 1
    joined.write(out)
    print(f"chaos_join: {len(joined.results)} runs of {len(parts)} part(s) in {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
