"""The ``coordinator`` command."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from coordinator import __version__

if TYPE_CHECKING:
    from coordinator.config import Settings
    from coordinator.control import GroupAddress

__all__ = ["main"]

DEFAULT_ADMIN_URL = "http://127.0.0.1:9110"


def _load(path: Path | None) -> Settings | None:
    """The settings of ``path``; None once the error is said on stderr, with the misnamed overrides (a
    misnamed override may be what the file lacks)."""
    from coordinator.config import environment_warnings, load_settings
    from coordinator.errors import ConfigError

    try:
        return load_settings(path)
    except ConfigError as exc:
        print(f"coordinator: {exc}", file=sys.stderr)
        for warning in environment_warnings():
            print(f"coordinator: warning: {warning}", file=sys.stderr)
        return None


def _cmd_run(args: argparse.Namespace) -> int:
    from coordinator.config import config_warnings, environment_warnings, host_problems
    from coordinator.logsetup import configure_logging
    from coordinator.runtime import run_agent
    from coordinator.support.memory import limit_malloc_arenas

    limit_malloc_arenas()
    settings = _load(args.config)
    if settings is None:
        return 2
    problems, _ = host_problems(settings, at_start=True)
    if problems:
        print(f"coordinator: {args.config}: " + "; ".join(problems), file=sys.stderr)
        return 2
    configure_logging(settings.logging.level, settings.logging.format)
    # What check-config warns about, said where the agent runs too: a misnamed override is otherwise silent.
    for warning in [*environment_warnings(), *config_warnings(settings)]:
        logging.getLogger("coordinator.runtime").warning("configuration: %s", warning)
    return run_agent(settings, dry_run=args.dry_run, admin_listen=args.admin_listen)


def _cmd_check_config(args: argparse.Namespace) -> int:
    from coordinator.config import config_warnings, host_problems, redacted
    from coordinator.config.advice import delivery_said

    settings = _load(args.config)
    if settings is None:
        return 2
    problems, warnings = host_problems(settings, at_start=False)
    if problems:
        print(f"coordinator: {args.config}: invalid on this machine:\n  " + "\n  ".join(problems), file=sys.stderr)
        return 2
    # Valid, but perhaps not what was meant: said, and still exit 0 (the agent would run with it).
    for warning in [*config_warnings(settings), *warnings]:
        print(f"coordinator: {args.config}: warning: {warning}", file=sys.stderr)
    print(json.dumps(redacted(settings), indent=2))
    print(f"coordinator: {args.config}: delivery: {delivery_said(settings)}", file=sys.stderr)
    print(f"coordinator: {args.config}: configuration is valid", file=sys.stderr)
    return 0


def _cmd_status(args: argparse.Namespace) -> int:
    from coordinator.groupstatus.options import group_mode, history_refusal

    if (refused := history_refusal(args)) is not None:
        print(f"coordinator: status: {refused}", file=sys.stderr)
        return 2
    if group_mode(args):
        from coordinator.groupstatus.command import run

        return run(args)
    if args.watch is not None:
        print("coordinator: status: --watch needs --config, or --zookeeper and --cluster", file=sys.stderr)
        return 2
    import httpx

    url = args.url or DEFAULT_ADMIN_URL
    try:
        response = httpx.get(url.rstrip("/") + "/status", timeout=5, trust_env=False)
        response.raise_for_status()
    except httpx.HTTPError as exc:
        print(f"coordinator: cannot read {url}/status: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}",
              file=sys.stderr)
        return 1
    try:
        status = response.json()
    except ValueError:
        status = None
    if not isinstance(status, dict) or not {"vm", "phase", "events"} <= status.keys() \
            or not isinstance(status["events"], list):
        kind = response.headers.get("content-type", "no content type").split(";")[0]
        print(f"coordinator: {url}/status is not a coordinator agent's status (HTTP {response.status_code}, {kind}); "
              f"--url takes an agent's http.listen address (default {DEFAULT_ADMIN_URL})", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(status, indent=2))
        return 0
    _print_agent_status(status)
    return 0


def _print_agent_status(status: dict[str, Any]) -> None:
    """One agent's ``/status`` as lines; what points at trouble (a failed action, a drain held by a fallback,
    why the VM stays out of rotation, the last IMDS error) only when set, under its ``/status`` name."""
    cluster = status.get("cluster") or {}
    print(f"vm {status.get('vm')}: {status.get('phase')}  (last cycle: {status.get('last_cycle')})")
    if status.get("duplicate"):
        print(f"DUPLICATE: {status['duplicate']}")
    for field in ("action_error", "action_fallback", "stays_out"):
        if status.get(field):
            print(f"{field}: {status[field]}")
    if cluster:
        members = ", ".join(cluster["members"])
        print(f"zookeeper: {cluster['connection']}  leader: {cluster['leader']}  members: {members}")
    else:
        outage = status.get("cluster_unavailable") or {}
        why = f" for {outage.get('for_seconds')} s: {outage.get('why')}" if outage else ""
        print(f"zookeeper: cluster view unavailable{why} (nothing is approved until it is back)")
    imds = status.get("imds") or {}
    age = imds.get("reading_age_seconds")
    print(f"imds: incarnation {imds.get('incarnation')}  fresh: {imds.get('fresh')}"
          + (f"  last reading {age} s ago" if age is not None else ""))
    if imds.get("last_error"):
        print(f"imds.last_error: {imds['last_error']}")
    for event in status.get("events", []):
        print(f"- {event['event_id']} {event['type']} {event['status']} on {', '.join(event['resources'])}")
        acks = "not read here" if event["acks"] is None else ", ".join(event["acks"]) or "none"
        approver = event["approver"] or ("unknown without the cluster view" if not cluster else "none yet")
        approved = f"  approved by {event['approved_by']}" if event["approved_by"] else "  not approved"
        print(f"    approver {approver}  acks {acks}{approved}")
        for reason in event["waiting_for"]:
            print(f"    waiting: {reason}")


def _group_address(args: argparse.Namespace) -> GroupAddress | int:
    """The group a control command acts on, found as ``status`` finds it (``group_settings``), with
    ``--timeout`` bounding the connection and each request. Returns a ``GroupAddress``, or an exit code
    after a message."""
    from dataclasses import replace

    from coordinator.control import GroupAddress
    from coordinator.errors import ConfigError
    from coordinator.groupstatus.options import group_settings

    try:
        settings = group_settings(args, args.command)
    except ConfigError as exc:
        print(f"coordinator: {exc}", file=sys.stderr)
        return 2
    if args.timeout is not None and not 0 < args.timeout <= 600:
        print(f"coordinator: {args.command}: --timeout must be between 0 and 600 seconds", file=sys.stderr)
        return 2
    timeout = args.timeout if args.timeout is not None else settings.zookeeper.operation_timeout
    return replace(GroupAddress.of(settings), timeout=timeout)


def _same_group_options(args: argparse.Namespace) -> str:
    """The options that named the group, to repeat in a hint: ``--config FILE`` or ``--zookeeper ...``."""
    import shlex

    words: list[str] = []
    for option in ("config", "zookeeper", "cluster", "root"):
        value = getattr(args, option, None)
        if value is not None:
            words += [f"--{option}", shlex.quote(str(value))]
    return " ".join(words)


def _cmd_pause(args: argparse.Namespace) -> int:
    import time

    from coordinator.control import ControlError, pause
    from coordinator.errors import ConfigError
    from coordinator.groupstatus.command import quiet_logging

    group = _group_address(args)
    if isinstance(group, int):
        return group
    try:
        with quiet_logging(args.verbose):
            found, created = pause(group, args.reason)
    except (ControlError, ConfigError) as exc:
        print(f"coordinator: {exc}", file=sys.stderr)
        return 1
    since = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(found.at))
    if created:
        print(f"group {group.cluster}: early approvals paused ({found.reason}); drains go on. "
              f"Lift with: coordinator resume {_same_group_options(args)}")
    else:
        print(f"group {group.cluster}: already paused since {since} by {found.by} ({found.reason}); kept as it is")
    return 0


def _cmd_resume(args: argparse.Namespace) -> int:
    from coordinator.control import ControlError, resume
    from coordinator.errors import ConfigError
    from coordinator.groupstatus.command import quiet_logging

    group = _group_address(args)
    if isinstance(group, int):
        return group
    try:
        with quiet_logging(args.verbose):
            lifted = resume(group)
    except (ControlError, ConfigError) as exc:
        print(f"coordinator: {exc}", file=sys.stderr)
        return 1
    print(f"group {group.cluster}: " + ("pause lifted: early approvals resume" if lifted else "was not paused"))
    return 0


def _cmd_drain(args: argparse.Namespace) -> int:
    import time

    from coordinator.control import ControlError, drain
    from coordinator.errors import ConfigError
    from coordinator.groupstatus.command import quiet_logging

    group = _group_address(args)
    if isinstance(group, int):
        return group
    if args.wait is not None and not 0 < args.wait <= 86400:
        print("coordinator: drain: --wait must be between 0 and 86400 seconds", file=sys.stderr)
        return 2
    try:
        with quiet_logging(args.verbose):
            found, created = drain(group, args.vm, args.reason)
    except (ControlError, ConfigError) as exc:
        print(f"coordinator: {exc}", file=sys.stderr)
        return 1
    vm = args.vm.lower()
    if created:
        print(f"group {group.cluster}: {vm} to be drained by hand ({found.reason}): its agent drains it once the "
              f"leader admits it into the maintenance budget, and keeps it out of rotation until: coordinator "
              f"undrain {vm} {_same_group_options(args)}")
        if args.wait is None:
            print(f"follow it with: coordinator status {_same_group_options(args)}")
    else:
        since = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(found.at))
        state = "admitted" if found.admitted_at is not None else "waiting for the maintenance budget"
        print(f"group {group.cluster}: {vm} already drained by hand since {since} by {found.by} ({found.reason}), "
              f"{state}; kept as it is")
    return _follow(args, vm, undo=False)


def _follow(args: argparse.Namespace, vm: str, *, undo: bool) -> int:
    """``--wait``: each change of the VM's state until it is drained (or back in rotation); exit 1 if it cannot
    get there, or is not there by the deadline."""
    if args.wait is None:
        return 0
    from coordinator.groupstatus.command import quiet_logging
    from coordinator.groupstatus.follow import Outcome, drain_state, follow, undrain_state
    from coordinator.groupstatus.options import group_settings
    from coordinator.groupstatus.read import GroupReader, GroupStatusError
    from coordinator.runtime import policy_from

    settings = group_settings(args, args.command)
    zk = settings.zookeeper.client_options()
    timeout = args.timeout if args.timeout is not None else settings.zookeeper.operation_timeout
    with quiet_logging(args.verbose):
        reader = GroupReader(zk.hosts, settings.zookeeper.root, settings.cluster, timeout=timeout,
                             auth_data=zk.auth_data, tls=zk.tls)
        try:
            reader.open()
        except GroupStatusError as exc:
            print(f"coordinator: {exc}", file=sys.stderr)
            return 1
        try:
            outcome = follow(reader, policy_from(settings), vm, undrain_state if undo else drain_state,
                             timeout=args.wait, say=lambda line: print(line, flush=True))
        finally:
            reader.close()
    if outcome is Outcome.WAIT:
        print(f"coordinator: {vm}: not {'back in rotation' if undo else 'drained'} within {args.wait:g} s "
              "(--wait); the request stands: coordinator status shows it", file=sys.stderr)
    return 0 if outcome is Outcome.DONE else 1


def _cmd_undrain(args: argparse.Namespace) -> int:
    from coordinator.control import ControlError, undrain
    from coordinator.errors import ConfigError
    from coordinator.groupstatus.command import quiet_logging

    group = _group_address(args)
    if isinstance(group, int):
        return group
    if args.wait is not None and not 0 < args.wait <= 86400:
        print("coordinator: undrain: --wait must be between 0 and 86400 seconds", file=sys.stderr)
        return 2
    try:
        with quiet_logging(args.verbose):
            undone = undrain(group, args.vm)
    except (ControlError, ConfigError) as exc:
        print(f"coordinator: {exc}", file=sys.stderr)
        return 1
    vm = args.vm.lower()
    print(f"group {group.cluster}: " + (f"drain by hand of {vm} undone: its agent puts it back in rotation unless "
                                       "an event holds it" if undone else f"{vm} was not drained by hand"))
    return _follow(args, vm, undo=True)


def _cmd_approve(args: argparse.Namespace) -> int:
    from coordinator.override import command

    return command(args)


def _cmd_zk_digest(args: argparse.Namespace) -> int:
    """Print the ACL identity of a digest user, reading the password from standard input (one line) or
    from a prompt, so that it never appears in the shell's history or the process list."""
    import getpass

    from coordinator.store.zk_security import digest_identity

    if ":" in args.username or not args.username.strip():
        print("coordinator: zk-digest: the user name must be non-empty and hold no colon", file=sys.stderr)
        return 2
    if sys.stdin.isatty():
        password = getpass.getpass(f"password of {args.username}: ")
    else:
        password = sys.stdin.readline().rstrip("\r\n")
    if not password:
        print("coordinator: zk-digest: empty password", file=sys.stderr)
        return 2
    identity = digest_identity(args.username, password)
    print(f"{identity.scheme}:{identity.id}")
    return 0


def _cmd_doctor(args: argparse.Namespace) -> int:
    from coordinator.doctor.command import run

    return run(args)


def _cmd_service(args: argparse.Namespace) -> int:
    from coordinator.winservice import command

    return command(args)


#: The simulator is a package of its own (``sim/`` of the repository), not part of the agent's wheel: the
#: commands that run it say what to install when it is missing.
SIMULATOR_MISSING = ("the Azure simulator (package azure-scheduled-events-sim, module azuresim) is not "
                     "installed: pip install ./sim (from a checkout of the repository)")


def _simulator_missing(command: str, exc: ModuleNotFoundError) -> NoReturn:
    if exc.name is None or exc.name.partition(".")[0] != "azuresim":
        raise exc
    print(f"coordinator {command}: error: {SIMULATOR_MISSING}", file=sys.stderr)
    raise SystemExit(2)


def _cmd_imds_sim(args: argparse.Namespace) -> int:
    try:
        from azuresim.cli import run
    except ModuleNotFoundError as exc:
        _simulator_missing("imds-sim", exc)

    return run(args)


def _cmd_demo(args: argparse.Namespace) -> int:
    try:
        from coordinator.testbed.demo import run
    except ModuleNotFoundError as exc:
        _simulator_missing("demo", exc)

    return run(args)


class _Subcommand(argparse.ArgumentParser):
    """A subcommand's parser whose arguments are added by ``arguments`` only when that subcommand is
    parsed or its help is shown: the options of ``status``, ``doctor``, ``service``, ``imds-sim`` and ``demo``
    live in their own modules (the group reader, the doctor, the simulator, the testbed), which
    ``coordinator run`` never loads."""

    def __init__(self, *args: Any, arguments: Callable[[argparse.ArgumentParser], None] | None = None,
                 **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._arguments = arguments

    def _complete(self) -> None:
        arguments, self._arguments = self._arguments, None
        if arguments is not None:
            arguments(self)

    def parse_known_args(self, args: Sequence[str] | None = None,  # type: ignore[override]
                         namespace: argparse.Namespace | None = None) -> tuple[argparse.Namespace, list[str]]:
        self._complete()
        return super().parse_known_args(args, namespace)

    def format_usage(self) -> str:
        self._complete()
        return super().format_usage()

    def format_help(self) -> str:
        self._complete()
        return super().format_help()


def _cmd_fleet(args: argparse.Namespace) -> int:
    from coordinator.fleet.command import run

    return run(args)


def _fleet_arguments(parser: argparse.ArgumentParser) -> None:
    from coordinator.fleet.options import add_arguments

    add_arguments(parser)


def _status_arguments(parser: argparse.ArgumentParser) -> None:
    from coordinator.groupstatus.options import add_arguments

    add_arguments(parser)


def _doctor_arguments(parser: argparse.ArgumentParser) -> None:
    from coordinator.doctor.options import add_arguments

    add_arguments(parser)


def _service_arguments(parser: argparse.ArgumentParser) -> None:
    from coordinator.winservice import add_arguments

    add_arguments(parser)


def _sim_arguments(parser: argparse.ArgumentParser) -> None:
    try:
        from azuresim.cli import add_arguments
    except ModuleNotFoundError as exc:
        _simulator_missing("imds-sim", exc)

    add_arguments(parser)


def _demo_arguments(parser: argparse.ArgumentParser) -> None:
    try:
        from coordinator.testbed.demo import add_arguments
    except ModuleNotFoundError as exc:
        _simulator_missing("demo", exc)

    add_arguments(parser)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="coordinator",
        description="Coordinated drain and approval of Azure Scheduled Events across a VM group.",
    )
    parser.add_argument("--version", action="version", version=f"coordinator {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=_Subcommand)

    run = sub.add_parser("run", help="run one agent (one per VM)", description="Run the agent of this VM.")
    run.add_argument("--config", type=Path, required=True, help="YAML configuration file")
    run.add_argument("--dry-run", action="store_true",
                     help="observe only: decide and log, but drain nothing, write nothing, approve nothing; "
                          "serves no health probe, so it runs beside the VM's real agent")
    run.add_argument("--admin-listen", metavar="HOST:PORT",
                     help="serve /status and /metrics here instead of http.listen (with --dry-run, by default "
                          "a free port of 127.0.0.1, logged at start)")
    run.set_defaults(func=_cmd_run)

    check = sub.add_parser("check-config", help="validate a configuration file and print it with defaults",
                           description="Validate a configuration file; exit 2 naming the bad field.")
    check.add_argument("--config", type=Path, required=True)
    check.set_defaults(func=_cmd_check_config)

    status = sub.add_parser(
        "status", arguments=_status_arguments, help="show the whole group (from ZooKeeper) or one agent's view",
        description="With --config or --zookeeper/--cluster: the whole group read from ZooKeeper (read-only) and "
        "from each member's /status: pause, leader, members, events, acks, approvals and what blocks them. "
        "Otherwise: one agent's /status (--url).")
    status.add_argument("--url", default=None, help=f"one agent's admin address (default {DEFAULT_ADMIN_URL})")
    status.add_argument("--json", action="store_true",
                        help="print JSON: the agent's raw /status, or the group's (schema in docs/status.md)")
    status.set_defaults(func=_cmd_status)

    fleet = sub.add_parser(
        "fleet", arguments=_fleet_arguments,
        help="every pending Scheduled Event of subscriptions (Azure Resource Graph), with the group holding it",
        description="Read the subscriptions' scheduled events from Azure Resource Graph and every group under the "
        "ZooKeeper root (read-only): for each pending event, its VMs, their agents and groups, the group's record "
        "and what holds it; the events no agent coordinates; those finished recently (docs/fleet.md).")
    fleet.set_defaults(func=_cmd_fleet)

    for name, func, summary in (
        ("pause", _cmd_pause, "stop early approvals for the whole group (drains go on)"),
        ("resume", _cmd_resume, "lift a pause: early approvals resume"),
        ("drain", _cmd_drain, "take a VM out of rotation by hand, through the group's maintenance budget"),
        ("undrain", _cmd_undrain, "undo a drain by hand: the VM's agent puts it back in rotation"),
    ):
        control = sub.add_parser(name, help=summary, description=summary[0].upper() + summary[1:] + ".")
        control.add_argument("--config", type=Path, help="an agent's configuration file: its zookeeper and cluster")
        control.add_argument("--zookeeper", metavar="HOSTS", help="the ensemble, host:port,host:port")
        control.add_argument("--cluster", metavar="NAME", help="the group's cluster name")
        control.add_argument("--root", metavar="PATH", help="zookeeper.root of the agents (default: the "
                             "configuration's, else /azure-maintenance)")
        control.add_argument("--timeout", type=float, metavar="SECONDS",
                             help="bound on connecting to ZooKeeper and on each request (default: the "
                             "configuration's zookeeper.operation_timeout, 5 s)")
        control.add_argument("-v", "--verbose", action="store_true",
                             help="log what the ZooKeeper client does to stderr")
        if name in ("drain", "undrain"):
            control.add_argument("vm", metavar="VM", help="the VM, as its agent's configuration names it")
            control.add_argument("--wait", type=float, nargs="?", const=600.0, metavar="SECONDS",
                                 help="then say each change until the VM is " + ("drained" if name == "drain" else
                                      "back in rotation") + " (exit 0), or SECONDS pass (default 600; exit 1)")
        if name in ("pause", "drain"):
            control.add_argument("--reason", required=True, help="why; shown in status and in the agents' logs")
        control.set_defaults(func=func)

    approve = sub.add_parser(
        "approve", help="vouch for the VMs an event names that run no agent, so that it is approved early",
        description="Write an operator's word for the VMs the event names that run no agent into its record: the "
        "group then admits it through its budget, drains and acknowledges on the other VMs, and approves it "
        "itself. When no VM it names runs an agent, approve it here through the approval gate and send it "
        "through this VM's IMDS, or through the Maintenance API from outside the group (--via maintenance). "
        "Needs an agent's configuration (its ZooKeeper identity).")
    approve.add_argument("event_id", metavar="EVENT_ID")
    approve.add_argument("--config", type=Path, required=True, help="an agent's configuration file")
    approve.add_argument("--reason", required=True, help="why the VMs vouched for may be hit; kept in the record")
    approve.add_argument("--via", choices=("imds", "maintenance"), default="imds",
                         help="when no VM it names runs an agent: send it through this VM's IMDS (default), or "
                         "the Maintenance API (--resource)")
    approve.add_argument("--resource", metavar="ID", help="with --via maintenance: the VM, scale set or "
                         "availability set the event is of (/subscriptions/...)")
    approve.add_argument("--auth", choices=("msi", "cli"), default="msi",
                         help="with --via maintenance: a managed-identity token (default) or the Azure CLI's")
    approve.add_argument("--arm-url", default="https://management.azure.com", help="Azure Resource Manager")
    approve.set_defaults(func=_cmd_approve, zookeeper=None, cluster=None, root=None)

    doctor = sub.add_parser(
        "doctor", arguments=_doctor_arguments,
        help="check what breaks coordination on this VM and in its group (PASS, WARN or FAIL, with the fix)",
        description="Run on a VM with its agent's configuration: IMDS without a proxy, the clock against IMDS, "
        "ZooKeeper and its ACLs as the agent connects, this VM's probe as peers reach it, the session timeout "
        "against notices and drain waits, and the group's members. Exit status: 0 all PASS, 1 a WARN, 2 a FAIL "
        "(docs/doctor.md).")
    doctor.set_defaults(func=_cmd_doctor)

    digest = sub.add_parser(
        "zk-digest", help="print the ZooKeeper ACL identity of a digest user (for zookeeper.acl)",
        description="Print digest:USER:HASH for zookeeper.acl.operators or readers. The password is read "
        "from standard input (one line) or prompted for; it is never an argument.")
    digest.add_argument("username")
    digest.set_defaults(func=_cmd_zk_digest)

    service = sub.add_parser(
        "service", arguments=_service_arguments,
        help="install, remove, start or stop the Windows service (Windows only)",
        description="Manage the Windows service that runs this agent (pywin32). Needs an elevated prompt. "
        "On other systems it exits 2: use the systemd unit there.")
    service.set_defaults(func=_cmd_service)

    sim = sub.add_parser("imds-sim", arguments=_sim_arguments, help="run the Azure IMDS simulator for several VMs",
                         description="Serve Scheduled Events for several simulated VMs (one port each).")
    sim.set_defaults(func=_cmd_imds_sim)

    demo = sub.add_parser("demo", arguments=_demo_arguments,
                          help="run a local group under load through one maintenance story",
                          description="Start the simulator, three VMs behind HAProxy and their agents (and "
                          "ZooKeeper), play a Freeze, a rolling Reboot, a Redeploy and a Preempt under one "
                          "strategy, and report requests failed and notice reclaimed.")
    demo.set_defaults(func=_cmd_demo)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args))
