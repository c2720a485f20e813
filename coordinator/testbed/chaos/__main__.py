"""``python -m coordinator.testbed.chaos``: runs the command line of ``coordinator.testbed.chaos.cli``."""

from __future__ import annotations

import sys

from coordinator.testbed.chaos.cli import main

__all__: list[str] = []

if __name__ == "__main__":
    sys.exit(main())
