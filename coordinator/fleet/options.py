"""The options of ``coordinator fleet``. Kept apart from ``command`` so that building the command line
imports nothing heavy."""

from __future__ import annotations

import argparse
from pathlib import Path

__all__ = ["DEFAULT_FINISHED_HOURS", "DEFAULT_WATCH_INTERVAL", "MIN_WATCH_INTERVAL", "add_arguments"]

DEFAULT_WATCH_INTERVAL = 30.0
#: Resource Graph allows about 15 queries per 5 s per user: one read every 5 s leaves room for paging.
MIN_WATCH_INTERVAL = 5.0
DEFAULT_FINISHED_HOURS = 24.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--subscription", action="append", default=[], metavar="ID", required=True,
                        help="a subscription whose scheduled events to list (repeatable)")
    parser.add_argument("--config", type=Path, help="an agent's configuration file: ZooKeeper and its root, IMDS "
                        "(for the managed identity's token), the azure-lb action's ARM URL and identity, and the "
                        "policy used to work out what holds each event")
    parser.add_argument("--zookeeper", metavar="HOSTS", help="ensemble as host:port[,host:port] (overrides --config)")
    parser.add_argument("--root", metavar="PATH", help="ZooKeeper root of the clusters (default: the "
                        "configuration's, else /azure-maintenance); every child is a group")
    parser.add_argument("--json", action="store_true", help="print JSON (schema in docs/fleet.md); with --watch, "
                        "one object per line")
    parser.add_argument("--watch", nargs="?", type=float, const=DEFAULT_WATCH_INTERVAL, metavar="SECONDS",
                        help=f"re-read every SECONDS (default {DEFAULT_WATCH_INTERVAL:g}, at least "
                        f"{MIN_WATCH_INTERVAL:g}: Resource Graph's throttle) until Ctrl-C or SIGTERM")
    parser.add_argument("--auth", choices=("msi", "cli"), default="msi",
                        help="the token: this VM's managed identity from IMDS (msi, the default), or the Azure "
                        "CLI's signed-in account (cli: az account get-access-token)")
    parser.add_argument("--arm-url", metavar="URL", help="Azure Resource Manager's base URL (default: the "
                        "azure-lb action's, else https://management.azure.com)")
    parser.add_argument("--imds-url", metavar="URL", help="IMDS base URL for --auth msi (default: the "
                        "configuration's, else http://169.254.169.254)")
    parser.add_argument("--client-id", metavar="ID", help="a user-assigned identity's client id, for --auth msi "
                        "(default: the azure-lb action's, else the system-assigned identity)")
    parser.add_argument("--finished-hours", type=float, default=DEFAULT_FINISHED_HOURS, metavar="H",
                        help=f"show events Completed or Canceled in the last H hours (default "
                        f"{DEFAULT_FINISHED_HOURS:g})")
    parser.add_argument("--timeout", type=float, metavar="SECONDS",
                        help="bound on connecting to ZooKeeper and on each read (default: the configuration's "
                        "zookeeper.operation_timeout, 5 s)")
    parser.add_argument("-v", "--verbose", action="store_true", help="log what the clients do to stderr")
