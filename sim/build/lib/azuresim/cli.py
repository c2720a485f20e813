"""``coordinator imds-sim``: run the IMDS simulator until SIGTERM or SIGINT.

Exit status: 0 after a clean shutdown, 1 if a port cannot be bound, 2 for invalid arguments.
"""

from __future__ import annotations

import argparse
import json
import logging
import re
import signal
import sys
import threading
from pathlib import Path
from types import FrameType
from typing import Any

from azuresim.azure import AzureModel
from azuresim.catalogue import DELIVERIES
from azuresim.errors import InvalidRequest
from azuresim.files import atomic_write
from azuresim.group import SimulatedGroup
from azuresim.haproxy_runtime import HAProxyRuntime
from azuresim.layout import parse_units, vm_infos
from azuresim.lb_haproxy import HAProxyDataPlane
from azuresim.replay import parse_replay
from azuresim.server import DEFAULT_RATE_LIMIT, SimulatorServer

__all__ = ["add_arguments", "run"]

log = logging.getLogger("azuresim")

_DEFAULT_VMS = ("vm0", "vm1", "vm2")


# Azure's VM names: 1-64 letters, digits, '.', '_' or '-', starting with a letter or digit, not ending with '.'.
_VM_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


def _vm_name(text: str) -> str:
    if not _VM_NAME.fullmatch(text) or text.endswith("."):
        raise argparse.ArgumentTypeError(
            f"invalid VM name {text[:80]!r}: expected 1-64 letters, digits, '.', '_' or '-', "
            "starting with a letter or digit and not ending with '.'")
    return text


def _address(text: str) -> tuple[str, int]:
    host, sep, port_text = text.rpartition(":")
    if not sep or not host:
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {text!r}")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    return host, _port(port_text)


def _port(text: str) -> int:
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid port {text!r}") from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"port {port} out of range 0-65535")
    return port


def _vm_binding(text: str) -> tuple[str, tuple[str, int]]:
    name, sep, address = text.partition("=")
    if not sep:
        raise argparse.ArgumentTypeError(f"expected NAME=HOST:PORT, got {text!r}")
    return _vm_name(name), _address(address)


def _vm_list(text: str) -> list[str]:
    names = [part.strip() for part in text.split(",") if part.strip()]
    if not names:
        raise argparse.ArgumentTypeError("expected a comma-separated list of VM names")
    return [_vm_name(name) for name in names]


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid number of seconds {text!r}") from None
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"seconds must be a finite number >= 0, got {text!r}")
    return value


def _skew(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid number of seconds {text!r}") from None
    if not abs(value) <= 10 * 365 * 86400:
        raise argparse.ArgumentTypeError(f"a clock skew is a finite number of seconds, within ten years: {text!r}")
    return value


def _scale(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid time scale {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"the time scale must be a finite number > 0, got {text!r}")
    return value


def _terminate_notice(text: str) -> float:
    value = _seconds(text)
    if not 300 <= value <= 900:
        raise argparse.ArgumentTypeError(f"a Terminate notice is 300 to 900 seconds (5 to 15 minutes), got {text!r}")
    return value


def _positive_seconds(text: str) -> float:
    value = _seconds(text)
    if value == 0:
        raise argparse.ArgumentTypeError("expected a number of seconds > 0")
    return value


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid integer {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {value}")
    return value


def _non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid integer {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {value}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the simulator's options to ``parser``."""
    vms = parser.add_argument_group("VMs (default: --vms vm0,vm1,vm2)")
    vms.add_argument(
        "--vm",
        action="append",
        type=_vm_binding,
        default=[],
        metavar="NAME=HOST:PORT",
        help="a VM and the address of its IMDS (repeatable; port 0 picks a free port)",
    )
    vms.add_argument(
        "--vms",
        type=_vm_list,
        metavar="NAME,NAME,...",
        help="VMs served on --host at consecutive ports from --base-port",
    )
    vms.add_argument("--host", default="127.0.0.1", help="address for --vms (default: %(default)s)")
    vms.add_argument(
        "--base-port",
        type=_port,
        default=18100,
        metavar="N",
        help="first port for --vms; 0 picks a free port for each VM (default: %(default)s)",
    )
    vms.add_argument(
        "--scale-set", default="", metavar="NAME", help="vmScaleSetName of every VM (default: none)"
    )
    vms.add_argument(
        "--fault-domains",
        type=_positive_int,
        default=2,
        metavar="N",
        help="VM i is in platform fault domain i %% N (default: %(default)s)",
    )
    vms.add_argument(
        "--update-domains",
        type=_positive_int,
        default=5,
        metavar="N",
        help="VM i is in platform update domain i %% N (default: %(default)s)",
    )
    vms.add_argument(
        "--zones", default="", metavar="Z,Z,...", help="zones given to the VMs in turn (default: none)"
    )
    layout = vms.add_mutually_exclusive_group()
    layout.add_argument(
        "--units",
        type=lambda text: parse_units(text, _vm_name),
        metavar="[NAME=]VM,VM/...",
        help="delivery units (availability sets, scale-set placement groups): '/' separates units, each a "
        "list of VMs, named NAME or pg0, pg1, ... in turn; VMs left out are in the default unit "
        "(default: one unit of every VM)",
    )
    layout.add_argument(
        "--unit-size",
        type=_positive_int,
        metavar="N",
        help="split the VMs, in their order, into delivery units pg0, pg1, ... of N VMs each",
    )
    vms.add_argument(
        "--delivery",
        choices=DELIVERIES,
        default="unit",
        help="who sees an event: every VM of its unit, or only the VMs it names (GPU VMs of a one-fault-domain "
        "scale set) (default: %(default)s)",
    )
    parser.add_argument(
        "--control",
        type=_address,
        default=("127.0.0.1", 18099),
        metavar="HOST:PORT",
        help="address of the control API; port 0 picks a free port (default: 127.0.0.1:18099)",
    )
    parser.add_argument(
        "--ready-file",
        type=Path,
        metavar="PATH",
        help='once listening, write {"control": URL, "vms": {NAME: URL}} to PATH (atomically)',
    )
    timing = parser.add_argument_group(
        "time (every duration below is in simulated seconds; see --time-scale)"
    )
    timing.add_argument(
        "--time-scale",
        type=_scale,
        default=1.0,
        metavar="F",
        help="simulated seconds per real second: the simulator's clock starts at the real time and runs F "
        "times faster; NotBefore, notices, Started times and impacts follow it (default: %(default)s)",
    )
    timing.add_argument(
        "--not-before-clock",
        choices=("simulated", "real"),
        default="simulated",
        help="with a time scale, render NotBefore in the simulated clock, or as the real time the event "
        "will start (for agents that compare NotBefore with their own clock) (default: %(default)s)",
    )
    timing.add_argument(
        "--terminate-notice",
        type=_terminate_notice,
        default=300.0,
        metavar="S",
        help="notice of Terminate events, 300-900 as configured on a scale set (default: %(default)s)",
    )
    timing.add_argument(
        "--first-call-delay",
        type=_seconds,
        default=0.0,
        metavar="S",
        help="hold each VM's first Scheduled Events answer S seconds (the first call enables the service; "
        "IMDS may take up to 120) (default: %(default)s)",
    )
    timing.add_argument(
        "--idle-reset-after",
        type=_positive_seconds,
        default=None,
        metavar="S",
        help="a VM that sends no request for S seconds has its service switched off: its next request is "
        "a first call again and its DocumentIncarnation starts again from 1 (IMDS: 86400) (default: never)",
    )
    timing.add_argument(
        "--replay",
        type=Path,
        metavar="FILE",
        help="serve recorded documents (a *.sequence.json list, or one document) instead of the model, or "
        "run a timeline (a JSON/YAML list of {at: S, ACTION: ARGS})",
    )
    timing.add_argument(
        "--replay-interval",
        type=_seconds,
        default=0.0,
        metavar="S",
        help="with recorded documents: move to the next one every S seconds; 0: only on POST /replay/next "
        "(default: %(default)s)",
    )
    timing.add_argument(
        "--approval-delay",
        type=_seconds,
        default=0.0,
        metavar="S",
        help="seconds from the first approval to Started (default: %(default)s)",
    )
    timing.add_argument(
        "--started-for",
        type=_seconds,
        default=5.0,
        metavar="S",
        help="default seconds an event stays Started before removal, at least its DurationInSeconds "
        "(default: %(default)s)",
    )
    parser.add_argument(
        "--rate-limit",
        type=_non_negative_int,
        default=DEFAULT_RATE_LIMIT,
        metavar="N",
        help="requests per second per VM before 429; 0 disables (default: %(default)s)",
    )
    parser.add_argument(
        "--unknown-approval-status",
        type=int,
        choices=(200, 400, 404),
        default=200,
        help="answer to an approval naming an unknown event id (undocumented in IMDS; default: %(default)s)",
    )
    azure = parser.add_argument_group(
        "managed identity and ARM (see docs/simulator.md)",
        "every VM's IMDS port serves /metadata/identity/oauth2/token; --arm also serves a simulated Azure "
        "Resource Manager for load balancer backend address pools",
    )
    azure.add_argument(
        "--arm", type=_address, metavar="HOST:PORT", help="serve the simulated ARM there; port 0 picks a free port"
    )
    azure.add_argument(
        "--token-lifetime", type=_positive_seconds, default=86399.0, metavar="S",
        help="real seconds a managed-identity token lasts (default: %(default)s, about IMDS's 24 hours)",
    )
    azure.add_argument(
        "--arm-async-seconds", type=_seconds, default=1.0, metavar="S",
        help="real seconds an ARM write stays InProgress before it succeeds (default: %(default)s)",
    )
    azure.add_argument(
        "--arm-retry-after", type=_non_negative_int, default=1, metavar="N",
        help="Retry-After (seconds) on ARM's asynchronous answers (default: %(default)s; ARM often says 10)",
    )
    azure.add_argument(
        "--lb-haproxy", metavar="SOCKET", default=None,
        help="apply every effective admin state change to this HAProxy's runtime API (a UNIX socket path or "
        "HOST:PORT): Down drains the server named like the backend address (its VM), None makes it ready again",
    )
    azure.add_argument(
        "--lb-haproxy-backend", metavar="NAME", default="be_app",
        help="the HAProxy backend holding one server per VM, for --lb-haproxy (default: %(default)s)",
    )
    azure.add_argument(
        "--lb-haproxy-timeout", type=_positive_seconds, default=1.0, metavar="S",
        help="real seconds one runtime API command may take before it counts as failed (default: %(default)s)",
    )
    azure.add_argument(
        "--graph-page-size", type=_positive_int, default=1000, metavar="N",
        help="rows per page of the Resource Graph query on the --arm port (default: %(default)s, as Azure's)",
    )
    azure.add_argument(
        "--no-system-identity", action="store_true",
        help="VMs have no system-assigned identity (user-assigned ones are added through the control API)",
    )
    parser.add_argument(
        "--date-skew",
        type=_skew,
        default=0.0,
        metavar="S",
        help="add S seconds (negative: subtract) to the real clock in the Date header of every VM port's "
        "answers, as a VM whose clock drifted would see it (default: %(default)s)",
    )
    parser.add_argument(
        "--log-level",
        type=str.upper,
        choices=("DEBUG", "INFO", "WARNING", "ERROR"),
        default="INFO",
        help="DEBUG also logs every request (default: %(default)s)",
    )


def run(args: argparse.Namespace) -> int:
    """Run the simulator described by ``args`` until SIGTERM or SIGINT; returns the exit status."""
    _setup_logging(args.log_level)
    try:
        addresses = _vm_addresses(args)
    except ValueError as exc:
        print(f"coordinator imds-sim: error: {exc}", file=sys.stderr)
        return 2
    try:
        infos = vm_infos(args, list(addresses))
    except ValueError as exc:
        print(f"coordinator imds-sim: error: {exc}", file=sys.stderr)
        return 2
    try:
        group = SimulatedGroup(
            infos,
            time_scale=args.time_scale,
            approval_delay=args.approval_delay,
            started_for=args.started_for,
            unknown_approval_status=args.unknown_approval_status,
            terminate_notice=args.terminate_notice,
            first_call_delay=args.first_call_delay,
            idle_reset_after=args.idle_reset_after,
            not_before_clock=args.not_before_clock,
            delivery=args.delivery,
            on_record=_log_entry,
        )
        if args.replay is not None:
            _load_replay(group, args.replay, args.replay_interval)
    except (InvalidRequest, OSError) as exc:
        print(f"coordinator imds-sim: error: {exc}", file=sys.stderr)
        return 2
    try:
        azure = AzureModel(list(addresses), system_identity=not args.no_system_identity,
                           token_lifetime=args.token_lifetime, async_seconds=args.arm_async_seconds,
                           retry_after=args.arm_retry_after)
    except InvalidRequest as exc:
        print(f"coordinator imds-sim: error: {exc}", file=sys.stderr)
        return 2
    try:
        plane = _data_plane(args)
    except ValueError as exc:
        print(f"coordinator imds-sim: error: --lb-haproxy: {exc}", file=sys.stderr)
        return 2
    server = SimulatorServer(group, addresses, args.control, rate_limit=args.rate_limit, azure=azure,
                             arm_address=args.arm, date_skew=args.date_skew, data_plane=plane,
                             graph_page_size=args.graph_page_size)
    try:
        server.start()
    except OSError as exc:
        print(f"coordinator imds-sim: error: cannot listen: {exc}", file=sys.stderr)
        return 1

    stop = threading.Event()
    previous = _install_signal_handlers(stop)
    try:
        urls = server.urls
        if args.ready_file is not None:
            ready: dict[str, Any] = {"control": server.control_url, "vms": urls}
            if server.arm_url:
                ready["arm"] = server.arm_url
            _write_ready_file(args.ready_file, ready)
        log.info(
            "IMDS simulator ready: control %s, %s",
            server.control_url,
            ", ".join([*(f"{vm} {url}" for vm, url in urls.items()),
                       *([f"arm {server.arm_url}"] if server.arm_url else [])]),
        )
        while not stop.wait(0.5):
            pass
        log.info("IMDS simulator stopping")
    finally:
        server.stop()
        _restore_signal_handlers(previous)
        if args.ready_file is not None:
            args.ready_file.unlink(missing_ok=True)
    return 0


def _data_plane(args: argparse.Namespace) -> HAProxyDataPlane | None:
    """The HAProxy that plays the load balancer's data plane, if ``--lb-haproxy`` names one. HAProxy need
    not be running yet: each change opens its own connection. Raises ValueError for a malformed address."""
    if args.lb_haproxy is None:
        return None
    runtime = HAProxyRuntime(args.lb_haproxy, timeout=args.lb_haproxy_timeout)
    return HAProxyDataPlane(runtime, args.lb_haproxy_backend)


def _load_replay(group: SimulatedGroup, path: Path, interval: float) -> None:
    kind, items = parse_replay(path.read_text(encoding="utf-8"), str(path))
    if kind == "timeline":
        if interval:
            raise InvalidRequest("--replay-interval is for recorded documents, not timelines")
        group.load_timeline(items)
        log.info("timeline of %d steps loaded from %s", len(items), path)
    else:
        group.load_documents(items, interval)
        log.info("replaying %d recorded documents from %s", len(items), path)


def _vm_addresses(args: argparse.Namespace) -> dict[str, tuple[str, int]]:
    addresses: dict[str, tuple[str, int]] = {}
    seen: set[str] = set()

    def add(name: str, address: tuple[str, int]) -> None:
        if name.lower() in seen:
            raise ValueError(f"VM {name!r} is given twice")
        seen.add(name.lower())
        addresses[name] = address

    for name, address in args.vm:
        add(name, address)
    names = args.vms if args.vms is not None else ([] if args.vm else list(_DEFAULT_VMS))
    for index, name in enumerate(names):
        port = 0 if args.base_port == 0 else args.base_port + index
        if port > 65535:
            raise ValueError(f"--base-port {args.base_port} leaves no port for VM {name!r}")
        add(name, (args.host, port))
    fixed = [a for a in addresses.values() if a[1] != 0]
    if len(set(fixed)) != len(fixed):
        raise ValueError("two VMs share one HOST:PORT")
    if args.control[1] != 0 and args.control in fixed:
        raise ValueError("the control address is also a VM's address")
    return addresses


def _write_ready_file(path: Path, data: dict[str, Any]) -> None:
    # Written atomically: whoever waits for the file never reads half of it.
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, json.dumps(data) + "\n")


def _install_signal_handlers(stop: threading.Event) -> dict[int, Any]:
    def handler(signum: int, frame: FrameType | None) -> None:
        stop.set()

    previous: dict[int, Any] = {}
    if threading.current_thread() is not threading.main_thread():
        return previous
    for signum in (signal.SIGTERM, signal.SIGINT):
        previous[signum] = signal.signal(signum, handler)
    return previous


def _restore_signal_handlers(previous: dict[int, Any]) -> None:
    for signum, handler in previous.items():
        signal.signal(signum, handler)


def _setup_logging(level: str) -> None:
    logging.basicConfig(stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("azuresim").setLevel(level)


def _log_entry(entry: dict[str, Any]) -> None:
    kind = entry["kind"]
    if kind == "transition":
        log.info(
            "event %s %s %s -> %s (%s) resources=%s incarnation=%d",
            entry["event_id"],
            entry["event_type"],
            entry["from"] or "-",
            entry["to"] or "removed",
            entry["reason"],
            ",".join(entry["resources"]),
            entry["incarnation"],
        )
    elif kind == "approval":
        log.info(
            "approval from vm %s for %s: %s (status %d)",
            entry["vm"],
            ",".join(entry["event_ids"]) or "-",
            entry.get("error") or entry["results"],
            entry["status"],
        )
    elif kind == "fault":
        log.info(
            "fault %s served to vm %s on %s (remaining %s)",
            entry["fault"],
            entry["vm"],
            entry["method"] or "its port",
            "until cleared" if entry["remaining"] is None else entry["remaining"],
        )
    elif kind == "signal":
        log.info(
            "signal %s to pid %d of vm %s for event %s (%s): %s",
            entry["signal"],
            entry["pid"],
            entry["vm"],
            entry["event_id"] or "-",
            entry["reason"],
            entry["result"],
        )
    elif kind != "request":
        shown = {k: v for k, v in entry.items() if k not in ("seq", "t", "sim_t", "kind")}
        log.info("%s %s", kind, json.dumps(shown, sort_keys=True))
    else:
        log.debug(
            "vm %s %s %s?%s -> %s",
            entry["vm"],
            entry["method"],
            entry["path"],
            entry["query"],
            entry["status"],
        )
