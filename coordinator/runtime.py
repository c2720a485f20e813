"""Wiring: settings -> adapters -> agent, and the process lifecycle of ``coordinator run``."""

from __future__ import annotations

import json
import logging
import signal
import socket
import threading
from collections.abc import Callable, Mapping
from dataclasses import replace
from types import FrameType

from prometheus_client import CollectorRegistry

from coordinator import __version__
from coordinator.actions import Action, ProbeAction, ProbeState
from coordinator.agent import Agent
from coordinator.apphealth import AppHealth
from coordinator.config import (
    AzureLbActionConfig,
    CommandActionConfig,
    HAProxyActionConfig,
    Settings,
    WebhookActionConfig,
)
from coordinator.decide import Policy
from coordinator.delivery import Delivery
from coordinator.errors import ImdsError, InvalidName
from coordinator.httpserver import HttpSurface, ListenError, split_host_port
from coordinator.imds import ImdsClient
from coordinator.logsetup import set_log_defaults
from coordinator.metrics import Metrics
from coordinator.names import normalize_vm_name
from coordinator.peers import PeerProbes
from coordinator.poller import ImdsPoller, Reading
from coordinator.state import StateFile
from coordinator.store.base import Store
from coordinator.store.zookeeper import ZooKeeperStore
from coordinator.support.hostos import agent_identity
from coordinator.telemetry import Health

__all__ = ["Stopper", "advertised_probe_url", "build_actions", "build_azure_lb", "delivery_from", "policy_from",
           "run_agent", "startup_summary"]

log = logging.getLogger(__name__)


def _learn_identity(imds: ImdsClient, stop: threading.Event, retry: float) -> tuple[str, dict[str, object]] | None:
    """Ask IMDS for this VM's name as ``Resources`` spells it (a scale-set instance is
    ``{scaleSetName}_{instanceId}``), with its placement, until it answers or ``stop`` is set."""
    while not stop.is_set():
        try:
            compute = imds.get_instance_compute()
            name = normalize_vm_name(compute.scheduled_events_name)
            placement: dict[str, object] = {
                "scale_set": compute.vm_scale_set_name,
                "fault_domain": compute.platform_fault_domain,
                "update_domain": compute.platform_update_domain,
                "zone": compute.zone,
                "placement_group": compute.placement_group_id,
            }
            log.info("this VM is %s according to IMDS (%s)", name,
                     ", ".join(f"{k} {v}" for k, v in placement.items() if v != ""))
            return name, placement
        except (ImdsError, InvalidName) as exc:
            log.warning("cannot learn this VM's name from IMDS yet (set vm_name to override): %s", exc)
        stop.wait(retry)
    return None


def build_actions(settings: Settings, *,
                  on_admin_state_failure: Callable[[str], None] | None = None) -> list[Action]:
    """The configured actions after the health probe, in order. Each kind's module is loaded only when the
    configuration names one: an agent with the probe alone never imports the others. ``on_admin_state_failure``
    is each ``azure-lb`` action's ``on_failure`` (the agent's metrics)."""
    actions: list[Action] = []
    for item in settings.actions:
        if isinstance(item, HAProxyActionConfig):
            from coordinator.actions.haproxy import HAProxyAction, HAProxyRuntime

            actions.append(HAProxyAction(
                HAProxyRuntime(item.runtime, timeout=item.timeout_seconds), item.backend, item.server,
                drain_timeout=item.drain_timeout_seconds, use_maint=item.maint, fail_on_timeout=item.fail_on_timeout,
            ))
        elif isinstance(item, CommandActionConfig):
            from coordinator.actions.command import CommandHook

            actions.append(CommandHook(item.name, drain_argv=item.drain, recover_argv=item.recover,
                                       timeout=item.timeout_seconds, env=item.env))
        elif isinstance(item, WebhookActionConfig):
            from coordinator.actions.webhook import WebhookAction

            actions.append(WebhookAction(item.name, url=item.url, on=set(item.phases), body_template=item.body,
                                         headers=item.headers, timeout=item.timeout_seconds, retries=item.retries))
        elif isinstance(item, AzureLbActionConfig):
            actions.append(build_azure_lb(item, settings, on_failure=on_admin_state_failure))
        else:
            from coordinator.actions.connections import ConnectionsDrainedWait

            actions.append(ConnectionsDrainedWait(item.ports, deadline=item.deadline_seconds))
    return actions


def build_azure_lb(item: AzureLbActionConfig, settings: Settings, *,
                   on_failure: Callable[[str], None] | None = None) -> Action:
    """The azure-lb action of ``item``; its fallback wait defaults to the probe-based drain wait of ``settings``.
    ``on_failure`` is called with the cause of each drain that fell back and each failed recovery."""
    from coordinator.actions.azure_lb import ArmClient, AzureLbAction, ManagedIdentity
    from coordinator.actions.connections import probe_wait_seconds

    drain = settings.drain
    fallback = item.fallback_wait_seconds
    if fallback is None:
        fallback = probe_wait_seconds(drain.probe_interval_seconds, drain.probe_threshold, drain.grace_seconds)
    identity = ManagedIdentity(item.imds_url, client_id=item.client_id, timeout=item.timeout_seconds)
    client = ArmClient(item.arm_url, identity, api_version=item.api_version, timeout=item.timeout_seconds)
    return AzureLbAction(item.name, item.backend_pools, item.backend_address, client,
                         deadline=item.deadline_seconds, fallback_wait=fallback, on_failure=on_failure)


def _action_summary(item: object) -> str:
    """One drain action as the start-up line names it: its kind and what it acts on, never a secret (a
    webhook's URL may carry a token: only its name is shown)."""
    if isinstance(item, HAProxyActionConfig):
        return f"haproxy {item.backend}/{item.server}"
    if isinstance(item, CommandActionConfig | WebhookActionConfig):
        return f"{item.type} {item.name}"
    if isinstance(item, AzureLbActionConfig):
        return f"azure-lb {item.name} ({item.backend_address} in {len(item.backend_pools)} pool(s))"
    ports = getattr(item, "ports", [])
    return "connections on port " + ",".join(str(port) for port in ports)


def startup_summary(settings: Settings, *, dry_run: bool = False) -> str:
    """The start-up line: what an operator checks first (this VM, its group, where ZooKeeper and IMDS are,
    how it drains, where it listens). The whole effective configuration is logged at DEBUG, and printed by
    ``coordinator check-config``."""
    vm = settings.vm_name if settings.vm_name is not None else "(learned from IMDS)"
    drain = ", ".join(["probe", *(_action_summary(item) for item in settings.actions)])
    where = (f"probe on {settings.probe.listen}{settings.probe.path}, admin on {settings.http.listen}" if not dry_run
             else "no health probe (the load balancer keeps seeing what this VM's real agent answers, or no "
                  "answer if it runs none)")
    return (f"coordinator {__version__} starting{' in DRY-RUN mode (observe only)' if dry_run else ''}: "
            f"vm {vm}, cluster {settings.cluster}, zookeeper {settings.zookeeper.hosts} "
            f"(root {settings.zookeeper.root}), imds {settings.imds.url}, drain: {drain}; {where}")


def policy_from(settings: Settings) -> Policy:
    p, d = settings.policy, settings.drain
    return Policy(
        approver=p.approver,
        approval=dict(p.approval),
        freeze_immediately_below=p.freeze_immediately_below_seconds,
        unknown_peers=p.unknown_peers,
        absent_grace=p.absent_peer_grace_seconds,
        drain_wait=d.effective_wait,
        drain_wait_by_type=dict(d.wait_seconds_by_type),
        latest_start=d.latest_start_seconds,
        lead_time=d.lead_time_seconds,
        max_events=p.max_events_in_maintenance,
        max_vms=p.max_vms_in_maintenance,
        keep_one_serving=p.keep_one_serving,
        recovery_grace=p.recovery_grace_seconds,
        return_wait=d.return_wait_seconds,
        gone_after=d.gone_after_seconds,
        unapprovable_at_once=d.unapprovable == "at-once",
        session_timeout=settings.zookeeper.session_timeout,
        zk_tick=settings.zookeeper.tick_seconds,
        terminate_together=p.terminate_together,
        done_retention=settings.done_retention_seconds,
        windows=tuple(w.to_window() for w in p.maintenance_windows),
        # An answer counts for two probing rounds and a timeout: one lost answer does not flap the budget.
        peer_fresh=(2 * p.peer_probe_interval_seconds + p.peer_probe_timeout_seconds
                    if p.confirm_peers_by_probe else None),
    )


def delivery_from(settings: Settings, placement: Mapping[str, object]) -> Delivery:
    """This VM's delivery unit and mode: ``imds.unit`` if set, else the placement group IMDS gave with this
    VM's name (a scale-set instance's ``placementGroupId``), else unknown; the mode as configured."""
    unit = settings.imds.unit
    if unit is None:
        learnt = placement.get("placement_group")
        unit = learnt if isinstance(learnt, str) and learnt else None
    return Delivery(unit=unit, mode=settings.imds.delivery)


def advertised_probe_url(settings: Settings, bound: tuple[str, int]) -> str:
    """The URL at which the peers reach this VM's health probe: ``probe.advertise`` if set, else the
    address the probe is bound to, a wildcard host replaced by this VM's address toward ZooKeeper (the
    interface the group shares)."""
    if settings.probe.advertise is not None:
        host, port = split_host_port(settings.probe.advertise)
    else:
        host, port = bound
        if host in ("", "0.0.0.0", "::"):
            host = _address_toward(settings.zookeeper.hosts)
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{port}{settings.probe.path}"


def _address_toward(hosts: str) -> str:
    """This machine's source address toward the first ZooKeeper server (a UDP connect sends nothing;
    the kernel only picks the route). Falls back to the host name."""
    zk_host, zk_port = split_host_port(hosts.split(",")[0].strip())  # validated HOST:PORT
    try:
        family = socket.AF_INET6 if ":" in zk_host else socket.AF_INET
        with socket.socket(family, socket.SOCK_DGRAM) as sock:
            sock.connect((zk_host, zk_port))
            return str(sock.getsockname()[0])
    except (OSError, ValueError) as exc:
        name = socket.gethostname()
        log.warning("cannot tell this VM's address toward ZooKeeper (%s); peers will probe %s "
                    "(set probe.advertise to choose)", exc, name)
        return name


class _Unstaggered:
    """The poller's readings with every agent on its own schedule, reading only on its own polls
    (``imds.stagger: false``): neither spread over the interval nor read early for a peer's record."""

    def __init__(self, poller: ImdsPoller) -> None:
        self._poller = poller

    def latest(self) -> Reading:
        return self._poller.latest()

    def align(self, rank: int, members: int) -> None:
        return None

    def poll_soon(self) -> None:
        return None


class Stopper:
    """Asks a running ``run_agent`` to stop, from any thread: a signal handler, or a Windows service's
    control handler (``coordinator.winservice``), which cannot install signal handlers. ``stop`` only
    sets ``event`` and wakes the agent's loop; it never blocks."""

    def __init__(self) -> None:
        self.event = threading.Event()
        self._wake: Callable[[], None] | None = None

    def stop(self, why: str) -> None:
        log.info("%s: stopping", why)
        self.event.set()
        wake = self._wake
        if wake is not None:
            wake()

    @property
    def attached(self) -> bool:
        """Whether the agent's loop exists (``run_agent`` got that far)."""
        return self._wake is not None

    def attach(self, wake: Callable[[], None]) -> None:
        """Called by ``run_agent`` once the agent exists: ``stop`` then also wakes its loop."""
        self._wake = wake


def _install_signal_handlers(stopper: Stopper) -> None:
    """SIGTERM and SIGINT (and, on Windows, SIGBREAK: Ctrl+Break in a console) stop the agent.
    Must run on the main thread; a Windows service passes its own ``Stopper`` instead."""

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stopper.stop(f"signal {signal.Signals(signum).name} received")

    for name in ("SIGTERM", "SIGINT", "SIGBREAK"):
        number = getattr(signal, name, None)
        if number is not None:
            signal.signal(number, on_signal)


#: Where a dry run serves /status and /metrics unless told otherwise: a free port of loopback, so that it
#: runs beside the VM's real agent (which holds ``http.listen`` and ``probe.listen``) without a clash.
DRY_RUN_ADMIN_LISTEN = "127.0.0.1:0"


def run_agent(settings: Settings, *, dry_run: bool = False, stopper: Stopper | None = None,
              admin_listen: str | None = None) -> int:
    """Run one agent until SIGTERM or SIGINT, or, when ``stopper`` is given, until it is told to stop
    (no signal handler is installed then). Returns the process exit code.

    ``admin_listen`` replaces ``http.listen``. A dry run serves no health probe and no application health
    listener (the load balancer must keep seeing what the VM's real agent answers: a dry run that answered
    200 on a VM whose agent is stopped would put it back in rotation), and its admin surface listens on
    ``admin_listen`` or ``DRY_RUN_ADMIN_LISTEN``."""
    if stopper is None:
        stopper = Stopper()
        _install_signal_handlers(stopper)
    stop = stopper.event
    registry = CollectorRegistry()
    metrics = Metrics(registry)
    imds = ImdsClient(
        base_url=settings.imds.url,
        api_version=settings.imds.api_version,
        request_timeout=settings.imds.request_timeout,
        first_request_timeout=settings.imds.first_request_timeout,
        max_attempts=settings.imds.max_attempts,
        max_requests_per_second=settings.imds.max_requests_per_second,
        on_request=metrics.imds_request,
        on_latency=metrics.imds_request_time,
    )

    log.info("%s", startup_summary(settings, dry_run=dry_run))
    if log.isEnabledFor(logging.DEBUG):
        from coordinator.config import redacted

        log.debug("effective configuration: %s", json.dumps(redacted(settings)))
    probe = ProbeState(serving=False)  # a dry run's is served by no listener, and no action of it runs
    if dry_run:
        admin_listen = admin_listen or DRY_RUN_ADMIN_LISTEN
    state_file = StateFile(settings.state_file)  # a dry run reads it, and writes nothing
    agent_ref: list[Agent] = []
    app_health = AppHealth(lambda: agent_ref[0] if agent_ref else None,
                           stuck_after=settings.app_health.stuck_after_seconds,
                           recover_failing_after=settings.app_health.recover_failing_after_seconds)
    try:
        http = HttpSurface(
            probe_listen=None if dry_run else settings.probe.listen,
            probe_path=settings.probe.path,
            admin_listen=admin_listen or settings.http.listen,
            probe=probe,
            registry=registry,
            status=lambda: agent_ref[0].status() if agent_ref else {"phase": "starting"},
            phase=lambda: agent_ref[0].phase() if agent_ref else "starting",
            live=lambda: agent_ref[0].live() if agent_ref else Health(True, "starting: learning this VM's name"),
            ready=lambda: agent_ref[0].ready() if agent_ref else Health(False, "starting: no agent loop yet"),
            app_health=app_health.verdict,
            app_health_path=settings.app_health.path,
            app_health_listen=None if dry_run else settings.app_health.listen,
        )
    except ListenError as exc:
        option = {"probe": "probe.listen", "app_health": "app_health.listen"}.get(
            exc.which, "--admin-listen" if admin_listen else "http.listen")
        log.error("cannot listen on %s %s: %s", option, exc.address, exc.reason)
        imds.close()
        return 2
    http.start()
    metrics.http_closed.source = lambda: {"refused": http.connections_refused,
                                          "timed_out": http.requests_timed_out, "hung_up": http.clients_hung_up}
    admin = "{}:{}".format(*http.admin_address)
    if dry_run:
        log.info("dry-run: no health probe and no application health listener; admin (/status, /metrics) on %s",
                 admin)
    else:
        log.info("health probe on %s%s (503 until the first document clears this VM); admin on %s; application "
                 "health (Azure's Application Health extension) on %s", settings.probe.listen, settings.probe.path,
                 admin, " and ".join(f"{listen}{settings.app_health.path}" for listen in
                                     (admin, settings.app_health.listen) if listen))
    placement: dict[str, object] = {}
    vm = settings.vm_name
    if vm is None:
        identity = _learn_identity(imds, stop, settings.imds.poll_interval * 5)
        if identity is None:
            http.stop()
            return 0
        vm, placement = identity
    set_log_defaults(vm=vm)
    metrics.info.labels(vm, settings.cluster, __version__).set(1)
    zk = settings.zookeeper.client_options()
    store: Store = ZooKeeperStore(
        hosts=zk.hosts,
        root=settings.zookeeper.root,
        cluster=settings.cluster,
        session_timeout=zk.session_timeout,
        operation_timeout=settings.zookeeper.operation_timeout,
        auth_data=zk.auth_data,
        tls=zk.tls,
        acls=zk.acls,
        create_layout=not dry_run,
    )
    if zk.acls is None:
        log.warning("the group's ZooKeeper nodes are open: anyone who reaches %s can forge an "
                    "acknowledgement or an approval; set zookeeper.auth (see docs/security.md)", zk.hosts)
    if zk.tls is None:
        log.info("ZooKeeper traffic is not encrypted; set zookeeper.tls to use the servers' secure port")
    probe_url = advertised_probe_url(settings, http.probe_address or split_host_port(settings.probe.listen))
    peers: PeerProbes | None = None
    if settings.policy.confirm_peers_by_probe:
        peers = PeerProbes(interval=settings.policy.peer_probe_interval_seconds,
                           timeout=settings.policy.peer_probe_timeout_seconds,
                           on_change=lambda: agent_ref[0].wake() if agent_ref else None)
        peers.start()
        log.info("peers reach this VM's probe at %s; the budget counts a peer as serving only while "
                 "its probe says so", probe_url)
    if any(isinstance(item, AzureLbActionConfig) for item in settings.actions):
        metrics.admin_state_expected()
    actions: list[Action] = [ProbeAction(probe),
                             *build_actions(settings, on_admin_state_failure=metrics.admin_state_failed)]
    # Reads are the same in a dry run (its executor carries out nothing that changes anything, the approval
    # included, and its store refuses every write: ``coordinator.dryrun``).
    poller = ImdsPoller(
        lambda: imds.get_document(attempts=1),
        interval=settings.imds.poll_interval,
        backoff_max=settings.imds.backoff_max_seconds,
        on_reading=lambda: agent_ref[0].reading_arrived() if agent_ref else None,
    )
    delivery = delivery_from(settings, placement)
    log.info("delivery: %s (imds.delivery %s%s)", delivery.describe(), settings.imds.delivery.value,
             "" if settings.imds.unit is not None or not placement.get("placement_group")
             else ", unit from IMDS's placementGroupId")
    agent = Agent(
        vm=vm,
        imds=imds,
        store=store,
        actions=actions,
        policy=replace(policy_from(settings), delivery=delivery),
        metrics=metrics,
        poll_interval=settings.imds.poll_interval,
        # Who this process is: lets a restarted agent take its predecessor's member node, and no other.
        member_info={"admin": settings.http.listen, "probe": probe_url, **placement, **delivery.member_info(),
                     **agent_identity()},
        state_file=state_file,
        peers=peers,
        readings=poller if settings.imds.stagger else _Unstaggered(poller),
        idle_cycle=max(5.0, 2 * settings.imds.poll_interval),
        dry_run=dry_run,
    )
    agent_ref.append(agent)
    stopper.attach(agent.wake)
    poller.start()
    # The loop connects (and reconnects) by itself and keeps the VM on the safe side whether or not
    # ZooKeeper is reachable yet.
    log.info("agent for %s in cluster %s running (approver mode %s)", vm, settings.cluster,
             settings.policy.approver.value)
    try:
        agent.run(stop)
    finally:
        poller.stop(timeout=0)
        if peers is not None:
            peers.stop()
        store.stop()
        imds.close()
        http.stop()
        log.info("stopped")
    return 0
