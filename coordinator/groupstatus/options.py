"""The options of ``coordinator status`` for the whole group, and how the commands that act on a group
(``status``, ``pause``, ``resume``) find it. Kept apart from ``command`` so that building the command
line imports nothing heavy."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from coordinator.config import Settings

__all__ = ["DEFAULT_WATCH_INTERVAL", "add_arguments", "group_mode", "group_settings", "history_refusal"]

DEFAULT_WATCH_INTERVAL = 2.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The group options of ``coordinator status`` (``--url`` and ``--json`` are the command's own)."""
    group = parser.add_argument_group("whole group, read from ZooKeeper (instead of --url)")
    group.add_argument("--config", type=Path, help="an agent's configuration file: ZooKeeper, root, cluster and "
                       "the policy used to work out what blocks each event")
    group.add_argument("--zookeeper", metavar="HOSTS", help="ensemble as host:port[,host:port] (overrides --config)")
    group.add_argument("--cluster", metavar="NAME", help="the group's cluster name (overrides --config)")
    group.add_argument("--root", metavar="PATH", help="ZooKeeper root of the clusters (default: the configuration's, "
                       "else /azure-maintenance)")
    group.add_argument("--watch", nargs="?", type=float, const=DEFAULT_WATCH_INTERVAL, metavar="SECONDS",
                       help=f"re-read and re-render until Ctrl-C or SIGTERM: on every ZooKeeper change and at "
                       f"least every SECONDS (default {DEFAULT_WATCH_INTERVAL:g}); with --json, one JSON object per "
                       "line")
    group.add_argument("--history", action="store_true",
                       help="every finished event the store still keeps, newest first, each with its timeline "
                       "(announced, admitted, approved: by whom and on which acks, started, gone); kept as long "
                       "as the records are (done_retention_seconds); not with --watch")
    group.add_argument("--timeout", type=float, metavar="SECONDS",
                       help="bound on connecting to ZooKeeper and on each read (default: the configuration's "
                       "zookeeper.operation_timeout, 5 s)")
    group.add_argument("--http-timeout", type=float, default=1.0, metavar="SECONDS",
                       help="bound on each agent's /status request (default 1 s)")
    group.add_argument("--no-agents", action="store_true", help="do not ask the agents' admin /status")
    group.add_argument("-v", "--verbose", action="store_true", help="log what the ZooKeeper client does to stderr")


def group_mode(args: argparse.Namespace) -> bool:
    """Whether the arguments ask for the whole group rather than one agent's ``--url``."""
    return any(getattr(args, name, None) is not None for name in ("config", "zookeeper", "cluster", "root"))


def history_refusal(args: argparse.Namespace) -> str | None:
    """Why ``--history`` cannot run with these arguments (None: it can, or it was not asked for): it reads
    the group from ZooKeeper once, so neither ``--watch`` nor one agent's ``--url``."""
    if not getattr(args, "history", False):
        return None
    if args.watch is not None:
        return "--history shows what the store keeps, once: it does not combine with --watch"
    if args.url is not None or not group_mode(args):
        return "--history reads the group from ZooKeeper: give --config, or --zookeeper and --cluster (not --url)"
    return None


def group_settings(args: argparse.Namespace, command: str) -> Settings:
    """The settings a group command works with: ``--config``'s file, with ``--zookeeper``, ``--cluster``
    and ``--root`` overriding it; without a file, those options and the defaults. Raises ``ConfigError``
    (its message starts with ``command``)."""
    from pydantic import ValidationError

    from coordinator.config import Settings, apply_env, load_settings
    from coordinator.errors import ConfigError

    if args.config is not None:
        # Python mode keeps secrets as secrets (JSON mode would mask them) for the validation below.
        base: dict[str, Any] = load_settings(args.config).model_dump()
    elif args.zookeeper is None or args.cluster is None:
        raise ConfigError(f"{command}: give --config FILE, or --zookeeper HOSTS and --cluster NAME")
    else:
        # Credentials can come from the environment (COORDINATOR__ZOOKEEPER__AUTH__USERNAME, ...).
        base = apply_env({"cluster": args.cluster}, os.environ)
    zookeeper = dict(base.get("zookeeper") or {})
    if args.zookeeper is not None:
        zookeeper["hosts"] = args.zookeeper
    if args.root is not None:
        zookeeper["root"] = args.root
    if args.cluster is not None:
        base["cluster"] = args.cluster
    base["zookeeper"] = zookeeper
    try:
        return Settings.model_validate(base)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise ConfigError(f"{command}: {where}: {first['msg'].removeprefix('Value error, ')}") from None
