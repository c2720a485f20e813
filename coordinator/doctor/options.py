"""The options of ``coordinator doctor``. Kept apart from ``coordinator.doctor.command`` so that building the
command line imports nothing of the checks."""

from __future__ import annotations

import argparse
from pathlib import Path

__all__ = ["CHECK_NAMES", "DEFAULT_TIMEOUT", "add_arguments"]

DEFAULT_TIMEOUT = 30.0
#: The checks, in the order they run (``coordinator.doctor.checks.CHECKS`` holds the same names).
CHECK_NAMES = ("config", "actions", "imds-proxy", "imds", "clock", "zookeeper", "zookeeper-acl",
               "session-timeout", "probe", "members", "delivery", "azure", "azure-probe", "azure-repairs",
               "azure-terminate", "azure-approve", "azure-spot", "azure-lb")


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
    arm = parser.add_argument_group("Azure Resource Manager (on with an azure-lb action, or with --arm)")
    arm.add_argument("--arm", action="store_true",
                     help="read the load balancer and this VM's scale set or VM with its managed identity "
                     "(Reader on them), even without an azure-lb action")
    arm.add_argument("--arm-url", metavar="URL",
                     help="ARM's base URL (default: the azure-lb action's arm_url, else https://management.azure.com);"
                     " implies --arm")
    arm.add_argument("--resource-id", metavar="ID",
                     help="this VM's scale set (or scale-set instance) or VM resource id; default: IMDS's "
                     "compute.resourceId; implies --arm")
    arm.add_argument("--load-balancer", action="append", default=[], metavar="ID",
                     help="a load balancer resource id to read probes from (repeatable); default: those of the "
                     "azure-lb action's pools; implies --arm")
    arm.add_argument("--client-id", metavar="GUID",
                     help="a user-assigned identity's client id (default: the azure-lb action's client_id, else the "
                     "system-assigned identity)")
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="log what the ZooKeeper and HTTP clients do to stderr")
