"""``coordinator fleet --subscription ID --zookeeper HOSTS`` (or ``--config FILE``): every pending scheduled
event of the subscriptions, from Azure Resource Graph, with who holds it among the groups under the
ZooKeeper root; once, or every few seconds (``--watch``).

Nothing is written anywhere: ZooKeeper is read through the status command's read-only reader, Resource
Graph only answers a query. Exit status: 0 once shown (and on Ctrl-C or SIGTERM under ``--watch``); 1 when
ZooKeeper or Resource Graph cannot be read (one line on stderr naming the cause); 2 for bad arguments or
configuration.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import threading
import time
from collections.abc import Callable

from coordinator.azure_arm import ManagedIdentity
from coordinator.azure_graph import DEFAULT_ARM_URL, CliToken, GraphError, ResourceGraphClient, TokenSource
from coordinator.config import Settings
from coordinator.errors import ConfigError
from coordinator.fleet.join import build_fleet
from coordinator.fleet.model import FleetStatus
from coordinator.fleet.options import MIN_WATCH_INTERVAL
from coordinator.fleet.read import LISTER, Groups
from coordinator.fleet.render import render, render_error
from coordinator.groupstatus.command import frames, quiet_logging, sigterm_as_ctrl_c, status_console, wait_or_stop
from coordinator.groupstatus.options import group_settings
from coordinator.groupstatus.read import GroupStatusError

__all__ = ["endpoints", "run"]


def run(args: argparse.Namespace) -> int:
    refused = _refusal(args)
    if refused is not None:
        print(f"coordinator: fleet: {refused}", file=sys.stderr)
        return 2
    try:
        settings = group_settings(argparse.Namespace(config=args.config, zookeeper=args.zookeeper, root=args.root,
                                                     cluster=None if args.config is not None else LISTER), "fleet")
    except ConfigError as exc:
        print(f"coordinator: {exc}", file=sys.stderr)
        return 2
    with quiet_logging(args.verbose):
        return _run(args, settings)


def _refusal(args: argparse.Namespace) -> str | None:
    if args.config is None and args.zookeeper is None:
        return "give --config FILE (an agent's configuration), or --zookeeper HOSTS"
    if not all(s.strip() for s in args.subscription):
        return "--subscription must not be empty"
    if args.watch is not None and not args.watch >= MIN_WATCH_INTERVAL:
        return f"--watch must be at least {MIN_WATCH_INTERVAL:g} s (Resource Graph allows about 15 queries per 5 s)"
    for name in ("timeout", "finished_hours"):
        value = getattr(args, name)
        if value is not None and not value > 0:
            return f"--{name.replace('_', '-')} must be positive"
    return None


def endpoints(args: argparse.Namespace, settings: Settings, timeout: float) -> tuple[str, TokenSource, str]:
    """ARM's URL, where the token comes from, and who that is (for messages): the options, else the azure-lb
    action of the configuration, else the agent's IMDS and the defaults."""
    from coordinator.config import AzureLbActionConfig

    action = next((a for a in settings.actions if isinstance(a, AzureLbActionConfig)), None)
    arm_url = args.arm_url or (action.arm_url if action is not None else DEFAULT_ARM_URL)
    if args.auth == "cli":
        return arm_url, CliToken(), "the Azure CLI's signed-in account"
    imds_url = args.imds_url or (action.imds_url if action is not None else settings.imds.url)
    client_id = args.client_id or (action.client_id if action is not None else None)
    who = f"the user-assigned identity {client_id}" if client_id else "this VM's system-assigned identity"
    return arm_url, ManagedIdentity(imds_url, client_id=client_id, timeout=timeout), who


def _run(args: argparse.Namespace, settings: Settings) -> int:
    from coordinator.runtime import policy_from

    timeout = args.timeout if args.timeout is not None else settings.zookeeper.operation_timeout
    source = str(args.config) if args.config is not None else "defaults (no --config)"
    arm_url, tokens, who = endpoints(args, settings, timeout)
    graph = ResourceGraphClient(tokens, arm_url=arm_url, who=who, timeout=max(timeout, 10.0))
    groups = Groups(settings.zookeeper.client_options(), settings.zookeeper.root, policy_from(settings), source,
                    timeout=timeout)
    subscriptions = [s.strip() for s in args.subscription]

    def build() -> FleetStatus:
        result = graph.scheduled_events(subscriptions, hours=args.finished_hours)
        clusters = groups.read()
        return build_fleet(result.events, clusters, read_at=result.read_at, subscriptions=subscriptions,
                           zookeeper=settings.zookeeper.hosts, root=settings.zookeeper.root,
                           finished_hours=args.finished_hours, policy=source, skipped_rows=result.skipped)

    try:
        groups.open()
    except GroupStatusError as exc:
        print(f"coordinator: fleet: {exc}", file=sys.stderr)
        graph.close()
        return 1
    try:
        if args.watch is not None:
            return _watch(build, graph, args.watch, as_json=args.json)
        try:
            fleet = build()
        except (GraphError, GroupStatusError) as exc:
            print(f"coordinator: fleet: {exc}", file=sys.stderr)
            return 1
    finally:
        groups.close()
        graph.close()
        if isinstance(tokens, ManagedIdentity):
            tokens.close()
    if args.json:
        print(fleet.to_json())
    else:
        status_console().print(render(fleet))
    return 0


def _watch(build: Callable[[], FleetStatus], graph: ResourceGraphClient, interval: float, *, as_json: bool) -> int:
    """Read and show every ``interval`` seconds (later when Resource Graph's quota is used up) until Ctrl-C or
    SIGTERM; on a terminal redrawn in place, elsewhere one frame after the other, each headed by its time."""
    console = status_console()
    last: FleetStatus | None = None
    in_place = not as_json and console.is_terminal
    live, show = frames(console, in_place)
    never = threading.Event()

    try:
        with sigterm_as_ctrl_c(), live if in_place else contextlib.nullcontext():
            while True:
                began = time.monotonic()
                try:
                    fleet = build()
                except (GraphError, GroupStatusError) as exc:
                    if as_json:
                        print(json.dumps({"error": str(exc)}), flush=True)
                    else:
                        show(render_error(str(exc), last))
                else:
                    last = fleet
                    if as_json:
                        print(fleet.model_dump_json(), flush=True)
                    else:
                        show(render(fleet))
                wait_or_stop(never, began + max(interval, graph.quota_wait()))
    except KeyboardInterrupt:
        return 0
