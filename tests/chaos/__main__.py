"""``python -m tests.chaos``: runs the command line of ``tests.chaos.cli``."""

from __future__ import annotations

import sys

from tests.chaos.cli import main

__all__: list[str] = []

if __name__ == "__main__":
    sys.exit(main())
