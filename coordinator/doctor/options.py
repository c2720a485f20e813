"""The options of ``coordinator doctor``. Kept apart from ``coordinator.doctor.command`` so that building the
command line imports nothing of the checks."""

from __future__ import annotations

import argparse
from pathlib import Path

__all__ = ["CHECK_NAMES", "DEFAULT_TIMEOUT", "add_arguments"]

DEFAULT_TIMEOUT = 30.0
#: The checks, in the order they run (``coordinator.doctor.checks.CHECKS`` holds the same names).
CHECK_NAMES = ("config", "imds-proxy", "imds", "clock", "zookeeper", "zookeeper-acl", "session-timeout", "probe",
               "members", "azure")


def _skip_list(text: str) -> list[str]:
    names = [part.strip() for part in text.split(",") if part.strip()]
    unknown = [name for name in names if name not in CHECK_NAMES]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"unknown check {', '.join(unknown) or repr(text)}; the checks are "
                                         + ", ".join(CHECK_NAMES))
    return names


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", type=Path, required=True,
                        help="the agent's configuration file (its IMDS, ZooKeeper, probe and timing settings)")
    parser.add_argument("--json", action="store_true",
                        help="print one JSON object (every check, its status, fix and details) instead of lines")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT, metavar="SECONDS",
                        help=f"bound on the whole run (default {DEFAULT_TIMEOUT:g}); a check still running then "
                        "FAILs and the rest are skipped")
    parser.add_argument("--skip", type=_skip_list, action="append", default=[], metavar="CHECK[,CHECK]",
                        help="do not run these checks (for instance imds,clock,probe when run from outside the "
                        "group's VMs); one of " + ", ".join(CHECK_NAMES))
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="log what the ZooKeeper and HTTP clients do to stderr")
