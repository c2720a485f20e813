"""``coordinator status --config FILE`` / ``--zookeeper HOSTS --cluster NAME``: the whole group, read
from ZooKeeper (read-only) and from each member's admin ``/status``, once or live (``--watch``); with
``--history``, once, the finished events the store keeps (ZooKeeper only: the agents are not asked).

Exit status: 0 once shown (and on Ctrl-C or SIGTERM under ``--watch``), 1 when ZooKeeper cannot be reached
or the cluster does not exist (a one-line message on stderr), 2 for bad arguments or configuration.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from types import FrameType

from rich.console import Console, RenderableType
from rich.live import Live

from coordinator.config import Settings
from coordinator.decide import Policy
from coordinator.errors import ConfigError
from coordinator.groupstatus.analyse import build_status
from coordinator.groupstatus.history import build_history
from coordinator.groupstatus.model import GroupStatus
from coordinator.groupstatus.options import group_settings, history_refusal
from coordinator.groupstatus.read import GroupRead, GroupReader, GroupStatusError
from coordinator.groupstatus.render import render, render_error, render_history

__all__ = ["frames", "quiet_logging", "run", "sigterm_as_ctrl_c", "status_console", "wait_or_stop"]

_MIN_GAP = 0.5  # under --watch, at most two reads a second however many watches fire
# The longest the main thread blocks in one wait under --watch. Python runs a signal's handler (Ctrl-C's
# KeyboardInterrupt) on the main thread only, and the kernel may deliver the signal to another thread
# (kazoo's): a wait of the whole interval (30 s by default) would then hold Ctrl-C back until it ends.
_SIGNAL_CHECK = 0.2


def status_console() -> Console:
    console = Console()
    if not console.is_terminal and "COLUMNS" not in os.environ:
        console = Console(width=160)  # piped or redirected: wide enough for the tables, never 80 columns
    return console


def run(args: argparse.Namespace) -> int:
    if args.url is not None:
        print("coordinator: status: --url reads one agent; do not combine it with --config, --zookeeper, "
              "--cluster or --root", file=sys.stderr)
        return 2
    if (refused := history_refusal(args)) is not None:
        print(f"coordinator: status: {refused}", file=sys.stderr)
        return 2
    try:
        settings = group_settings(args, "status")
    except ConfigError as exc:
        print(f"coordinator: {exc}", file=sys.stderr)
        return 2
    for name in ("watch", "timeout", "http_timeout"):
        value = getattr(args, name)
        if value is not None and not value > 0:
            print(f"coordinator: status: --{name.replace('_', '-')} must be positive", file=sys.stderr)
            return 2
    with quiet_logging(args.verbose):
        if args.watch is None:
            return _run(args, settings)
        # Under --watch, SIGTERM ends the command as Ctrl-C does from its start to its end: a supervisor or
        # ``timeout`` may stop it while it connects or closes, not only between two frames.
        with sigterm_as_ctrl_c():
            try:
                return _run(args, settings)
            except KeyboardInterrupt:
                return 0


def _run(args: argparse.Namespace, settings: Settings) -> int:
    from coordinator.runtime import policy_from

    policy = policy_from(settings)
    source = str(args.config) if args.config is not None else "defaults (no --config)"
    timeout = args.timeout if args.timeout is not None else settings.zookeeper.operation_timeout
    history = bool(getattr(args, "history", False))
    try:
        zk = settings.zookeeper.client_options()
        reader = GroupReader(zk.hosts, settings.zookeeper.root, settings.cluster, timeout=timeout,
                             http_timeout=args.http_timeout, ask_agents_too=not (args.no_agents or history),
                             auth_data=zk.auth_data, tls=zk.tls)
        reader.open()
    except GroupStatusError as exc:
        print(f"coordinator: {exc}", file=sys.stderr)
        return 1
    if history:
        return _history(reader, policy, source, as_json=args.json)

    def build(read: GroupRead) -> GroupStatus:
        return build_status(read, policy, source)

    try:
        if args.watch is not None:
            return _watch(reader, build, args.watch, as_json=args.json)
        try:
            status = build(reader.read())
        except GroupStatusError as exc:
            print(f"coordinator: {exc}", file=sys.stderr)
            return 1
    finally:
        _close(reader)
    if args.json:
        print(status.to_json())
    else:
        status_console().print(render(status))
    return 0


def _history(reader: GroupReader, policy: Policy, source: str, *, as_json: bool) -> int:
    """``--history``: one read, the finished events the store keeps."""
    try:
        history = build_history(reader.read(), policy, source)
    except GroupStatusError as exc:
        print(f"coordinator: {exc}", file=sys.stderr)
        return 1
    finally:
        _close(reader)
    if as_json:
        print(history.to_json())
    else:
        status_console().print(render_history(history))
    return 0


def _close(reader: GroupReader, timeout: float = 5.0) -> None:
    """Close the reader, waiting for it at most ``timeout`` seconds: kazoo's close waits for its writer up
    to the session timeout (10 s at least) when the server does not answer. The session ends on the server
    anyway once it times out; the command's answer does not wait for that. kazoo's threads are daemons:
    they do not keep the process."""
    closing = threading.Thread(target=reader.close, name="status-close", daemon=True)
    closing.start()
    closing.join(timeout)


def wait_or_stop(event: threading.Event, until: float) -> None:
    """Until ``event`` is set or the monotonic time ``until``, in slices of ``_SIGNAL_CHECK`` seconds."""
    while not event.is_set():
        left = until - time.monotonic()
        if left <= 0:
            return
        event.wait(min(left, _SIGNAL_CHECK))


@contextlib.contextmanager
def sigterm_as_ctrl_c() -> Iterator[None]:
    """Within the block, SIGTERM (a supervisor stopping the command, ``timeout``, ``kill``) raises
    ``KeyboardInterrupt`` as Ctrl-C does, so that --watch ends the same way: the last table left on the
    terminal, or printed when the output is not one, and exit status 0. Python runs signal handlers on the
    main thread only: elsewhere the block runs with SIGTERM as it was. The previous handler is restored."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)


def frames(console: Console, in_place: bool) -> tuple[Live, Callable[[RenderableType], None]]:
    """How ``--watch`` shows each frame: redrawn in place on a terminal (through the ``Live`` returned, to be
    entered), else written after the last, headed by its time, and flushed at once (``| tee``, a file)."""
    live = Live(console=console, auto_refresh=False, redirect_stdout=False, redirect_stderr=False)

    def show(frame: RenderableType) -> None:
        if in_place:
            live.update(frame, refresh=True)
            return
        console.rule(time.strftime("%Y-%m-%dT%H:%M:%S%z"))
        console.print(frame)
        console.file.flush()

    return live, show


def _watch(reader: GroupReader, build: Callable[[GroupRead], GroupStatus], interval: float, *, as_json: bool) -> int:
    """Read and show until Ctrl-C or SIGTERM: at once when a watched node changes, at least every ``interval``.
    On a terminal the table is redrawn in place; written elsewhere (``| tee incident.log``, a file), each
    read is a frame of its own, headed by the time it was read, written as it is read."""
    changed = threading.Event()
    reader.set_wakeup(changed.set)
    console = status_console()
    last: GroupStatus | None = None
    in_place = not as_json and console.is_terminal
    live, show = frames(console, in_place)

    try:
        with sigterm_as_ctrl_c(), live if in_place else contextlib.nullcontext():
            while True:
                began = time.monotonic()
                changed.clear()
                try:
                    status = build(reader.read())
                except GroupStatusError as exc:
                    if as_json:
                        print(f'{{"error": {json.dumps(str(exc))}}}', flush=True)
                    else:
                        show(render_error(str(exc), last))
                else:
                    last = status
                    if as_json:
                        print(status.model_dump_json(), flush=True)
                    else:
                        show(render(status))
                wait_or_stop(changed, began + interval)
                wait_or_stop(threading.Event(), began + _MIN_GAP)
    except KeyboardInterrupt:
        return 0


@contextlib.contextmanager
def quiet_logging(verbose: bool) -> Iterator[None]:
    """Nothing but the command's own output: kazoo's and the store's warnings (a refused connection,
    a retry) would break the one-line error of an unreachable ZooKeeper. ``--verbose`` shows them on
    stderr. The logging configuration is restored afterwards."""
    root = logging.getLogger()
    level = root.level
    handler: logging.Handler = logging.StreamHandler(sys.stderr) if verbose else logging.NullHandler()
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root.addHandler(handler)
    root.setLevel(logging.INFO if verbose else logging.CRITICAL + 1)
    try:
        yield
    finally:
        root.removeHandler(handler)
        root.setLevel(level)
