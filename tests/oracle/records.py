"""What the oracle reads: the record of one run as seen from outside the agents, and its JSON form.

``Observations`` holds the run's settings (``OracleSettings``) and one list per source: probe samples,
HAProxy server states, the simulated load balancer's effective admin states (a run whose agents drain
through admin state), ZooKeeper node sightings (the observer's, or ZooKeeper's transaction log's:
``history``), the load's requests, the harness's own log, the agent processes, ``/status`` samples and
agent log lines. ``dump`` writes a record as JSON (a failing run's
record is kept) and ``load`` reads it back, so a kept run can be judged again.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = [
    "AdminStateSample",
    "HarnessRecord",
    "LogLine",
    "NodeSighting",
    "Observations",
    "OracleSettings",
    "ProbeSample",
    "ProcessRecord",
    "RequestSample",
    "ServerSample",
    "StatusSample",
    "dump",
    "load",
]

# HAProxy's srv_admin_state bits (``show servers state``): forced, inherited, configuration, resolver
# and health maintenance; forced and inherited drain.
_ADMIN_MAINT = 0x01 | 0x02 | 0x04 | 0x20 | 0x40
_ADMIN_DRAIN = 0x08 | 0x10
_OP_RUNNING = 2


@dataclass(frozen=True)
class ProbeSample:
    """One GET of an agent's health probe: sent at ``t``, answered (or failed) at ``t_end``."""

    vm: str
    t: float
    t_end: float
    code: int | None  # None: no answer (process stopped or gone, port closed, timeout)


@dataclass(frozen=True)
class ServerSample:
    """One server's line of ``show servers state`` at ``t``."""

    t: float
    server: str
    op_state: int  # 0 stopped, 1 starting, 2 running, 3 stopping
    admin_state: int  # bit field (maintenance, drain)
    weight: int = 1

    @property
    def up(self) -> bool:
        """Taking new requests: running, neither in maintenance nor draining, with a weight."""
        return self.op_state == _OP_RUNNING and not self.admin_state & (_ADMIN_MAINT | _ADMIN_DRAIN) and self.weight > 0

    @property
    def label(self) -> str:
        if self.admin_state & _ADMIN_MAINT:
            return "MAINT"
        if self.admin_state & _ADMIN_DRAIN:
            return "DRAIN" if self.op_state == _OP_RUNNING else "DRAIN(down)"
        return {0: "DOWN", 1: "STARTING", 2: "UP", 3: "STOPPING"}.get(self.op_state, f"op {self.op_state}")


@dataclass(frozen=True)
class AdminStateSample:
    """One backend address's *effective* admin state in the simulated load balancer at ``t`` (``GET
    /arm/pools`` of the simulator's control API: what its data plane applies, not what ARM was last told).

    ``vm`` is the address's name (the testbed names each address after its VM). ``state``: ``None`` (the
    probe decides), ``Down`` (no new flows whatever the probe says) or ``Up`` (new flows whatever the probe
    says)."""

    t: float
    vm: str
    state: str

    @property
    def down(self) -> bool:
        return self.state == "Down"


@dataclass(frozen=True)
class NodeSighting:
    """One ZooKeeper node (one creation of it) as the observer saw it, or as ZooKeeper's transaction log
    records it (``Observations.nodes_from``, ``history.from_txn_log``).

    ``kind``: member, leader, ack, approval, admitted, out, record (an event's record ``/events/{id}``) or
    pause (an operator's pause of early approvals). ``ctime`` is the server's creation time. ``gone_seen``
    is the first poll that no longer found it, or from the log its deletion's server time (None: still there
    when the record ended). ``first_seen``: the observer's first sighting (None: a node known from the log
    only, which the observer never saw).
    """

    kind: str
    event_id: str | None
    vm: str | None
    ctime: float
    owner: int
    first_seen: float | None
    gone_seen: float | None = None


@dataclass(frozen=True)
class RequestSample:
    """One request of the load sent through HAProxy; ``server`` is who answered, when known."""

    t: float
    t_end: float
    status: int | None
    server: str | None = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.status == 200


@dataclass(frozen=True)
class HarnessRecord:
    """Something the harness did or saw, at ``t``.

    Kinds the oracle reads: ``sigstop``, ``sigcont``, ``sigkill`` and ``sigterm`` (``pid`` of the agent
    of ``target``), ``session_expired`` (the harness expired the ZooKeeper session of ``target``'s
    agent), ``arm_fault`` and ``arm_fault_heal`` (a fault queued on the simulated ARM or its token
    endpoint, ``target`` ``arm`` or ``token``, then cleared). Every other kind (``zk_down``, ``zk_up``,
    ``imds_fault``, ``schedule``, ``cancel``, ``restart``, ``heal``, ...) only appears in timelines.
    """

    t: float
    kind: str
    target: str = ""
    pid: int | None = None
    detail: str = ""


@dataclass(frozen=True)
class ProcessRecord:
    """An agent process the harness started, and how it ended (``exited`` None: still running)."""

    vm: str
    pid: int
    started: float
    exited: float | None = None
    returncode: int | None = None


@dataclass(frozen=True)
class StatusSample:
    """``/status`` of the agent process ``pid`` at ``t``: its count of completed cycles (None: no answer)."""

    t: float
    vm: str
    pid: int
    cycles: int | None
    phase: str | None = None


@dataclass(frozen=True)
class LogLine:
    """A line of an agent's log; ``t`` when it carries a readable time. ``stderr``: written outside the
    agent's logging (by the interpreter, for a thread's uncaught exception), one physical line."""

    t: float | None
    vm: str
    text: str
    stderr: bool = False


@dataclass(frozen=True)
class OracleSettings:
    """What the run was configured with, and the oracle's tolerances (seconds)."""

    agent_vms: tuple[str, ...]
    drain_wait_seconds: float
    drain_wait_by_type: Mapping[str, float] = field(default_factory=dict)
    max_events_in_maintenance: int | None = 1
    # Events the budget counts as one, by event id (upper case) -> unit: a batch of Terminates sharing one
    # NotBefore, which Azure runs as one operation (``policy.terminate_together``). The simulator's log
    # does not carry NotBefore, so the harness that scheduled the batch says so.
    budget_units: Mapping[str, str] = field(default_factory=dict)
    # A probe sample is taken every ~100 ms: a change is seen up to two intervals late.
    probe_tolerance_seconds: float = 0.25
    # From a document served to a VM to its probe showing the decision taken on it.
    reaction_seconds: float = 2.0
    # From "every fault healed and no event left" to every VM serving and UP in HAProxy.
    recovery_bound_seconds: float = 20.0
    stall_seconds: float = 30.0
    # An approval already on its way when the harness stopped the process may be logged just after.
    signal_tolerance_seconds: float = 0.1
    # The longest gap between two HAProxy samples that still says what HAProxy did in between.
    server_sample_gap_seconds: float = 1.5
    # How late the observer may see a member node go once its session expired during a pause.
    session_seen_slack_seconds: float = 1.0
    # What the liveness judgement reads of the agents' configuration (``checks_liveness``); the defaults are
    # the chaos runs' (a record kept before these fields existed is judged with them).
    poll_interval_seconds: float = 0.5  # imds.poll_interval: one cycle
    peer_probe_timeout_seconds: float = 0.5  # policy.peer_probe_timeout_seconds: the probe round before a POST
    gone_after_seconds: float = 3.0  # drain.gone_after_seconds
    return_wait_seconds: float | None = None  # drain.return_wait_seconds (None: the drain wait)
    keep_one_serving: bool = True  # policy.keep_one_serving
    approval_rules: Mapping[str, str] = field(default_factory=dict)  # type -> rule; absent: after-drain
    imds_backoff_seconds: float = 2.0  # imds.backoff_max_seconds: the longest wait after a failed read
    # The longest a server takes to expire the session of an agent it no longer hears from: the granted
    # timeout plus a tick (the chaos runs pass theirs; the default is their worst, 6 s granted at a 3 s tick).
    session_lapse_seconds: float = 9.0
    # The azure-lb action's deadline (its ``deadline_seconds``): all the ARM work of one drain or recovery,
    # retries included, ends within it (then the drain falls back to the probe); how long an ARM fault may
    # still hold a drain once it was cleared.
    arm_deadline_seconds: float = 10.0
    # Added to every liveness bound: sampling (probes 100 ms, HAProxy 200 ms), HAProxy's two good checks
    # before UP against the agents' return wait, the drain actions themselves.
    liveness_slack_seconds: float = 2.0
    # The delivery layout (``docs/reliability.md``, "Delivery layouts"): its name, each VM's delivery unit by
    # lower-case name (empty: every VM in one unit), how IMDS delivers (``unit``: a VM sees every event of its
    # unit; ``named``: only the events naming it), and the VMs whose agents were told their unit and the
    # delivery (``imds.unit``, ``imds.delivery``; the others run with ``auto``, their unit unknown). The
    # defaults are the one-unit runs (a record kept before these fields existed was made so).
    layout: str = "one-unit"
    units: Mapping[str, str] = field(default_factory=dict)
    delivery: str = "unit"
    told_vms: tuple[str, ...] = ()

    def unit_of(self, vm: str) -> str:
        """``vm``'s delivery unit ("" for every VM of a one-unit record)."""
        return self.units.get(vm.lower(), "")

    def sees(self, vm: str, resources: Sequence[str]) -> bool:
        """Whether IMDS shows ``vm`` an event naming ``resources``: one naming it, always; with unit delivery,
        one of its unit too (an event is of the unit of the VMs it names, all of one unit)."""
        vm = vm.lower()
        named = [r.lower() for r in resources]
        if vm in named:
            return True
        if self.delivery == "named" or not named:
            return False
        return self.unit_of(vm) == self.unit_of(named[0])

    @property
    def every_vm_sees_every_event(self) -> bool:
        return self.delivery != "named" and len(set(self.units.values())) <= 1

    def drain_wait(self, event_type: str) -> float:
        return self.drain_wait_by_type.get(event_type, self.drain_wait_seconds)

    def return_wait(self, event_type: str | None = None) -> float:
        """How long a VM back from a drain answers 200 before it counts as serving (the agents' return wait)."""
        if self.return_wait_seconds is not None:
            return self.return_wait_seconds
        return self.drain_wait_seconds if event_type is None else self.drain_wait(event_type)

    def l1_bound(self, event_type: str) -> float:
        """L1: an allowable event is approved within its drain wait, about four cycles (five here) and a
        probe round of the peers, plus the slack."""
        return (self.drain_wait(event_type) + 5 * self.poll_interval_seconds + self.peer_probe_timeout_seconds
                + self.liveness_slack_seconds)

    def l2_bound(self) -> float:
        """L2: a record whose event is gone is closed within ``gone_after`` and four cycles, plus the slack."""
        return self.gone_after_seconds + 4 * self.poll_interval_seconds + self.liveness_slack_seconds


@dataclass
class Observations:
    """Everything recorded during one run; the oracle's only input."""

    settings: OracleSettings
    started_at: float
    ended_at: float
    healed_at: float | None = None  # every fault healed and no event left (None: never reached)
    sim_log: list[dict[str, Any]] = field(default_factory=list)
    nodes: list[NodeSighting] = field(default_factory=list)
    probes: list[ProbeSample] = field(default_factory=list)
    servers: list[ServerSample] = field(default_factory=list)
    requests: list[RequestSample] = field(default_factory=list)
    harness: list[HarnessRecord] = field(default_factory=list)
    processes: list[ProcessRecord] = field(default_factory=list)
    statuses: list[StatusSample] = field(default_factory=list)
    agent_logs: list[LogLine] = field(default_factory=list)
    # Wall-clock intervals in which the ZooKeeper recorder read nothing (servers down, no quorum): a node
    # that lived only within one was never seen.
    zk_blind: list[tuple[float, float]] = field(default_factory=list)
    # The load balancer's effective admin state of every VM, about every 150 ms; empty in a run whose agents
    # do not drain through admin state (and in a record kept before these samples existed).
    admin_states: list[AdminStateSample] = field(default_factory=list)
    # Where ``nodes`` come from: "observer" (its polls), or "txn log" (ZooKeeper's transaction log, the
    # observer's first sightings kept: ``history.from_txn_log``), with the counts of that merge.
    nodes_from: str = "observer"
    nodes_from_counts: dict[str, int] = field(default_factory=dict)


def dump(observations: Observations) -> str:
    """The observations as JSON (to keep a failing run's record); ``load`` reads it back."""
    body = asdict(observations)
    body["settings"]["drain_wait_by_type"] = dict(observations.settings.drain_wait_by_type)
    body["settings"]["budget_units"] = dict(observations.settings.budget_units)
    body["settings"]["approval_rules"] = dict(observations.settings.approval_rules)
    body["settings"]["units"] = dict(observations.settings.units)
    return json.dumps(body, default=str)


def load(text: str) -> Observations:
    """Observations written by ``dump``: a kept run can be judged again."""
    body = json.loads(text)
    settings = dict(body.pop("settings"))
    settings["agent_vms"] = tuple(settings["agent_vms"])
    settings["told_vms"] = tuple(settings.get("told_vms") or ())
    kinds: dict[str, type[Any]] = {
        "nodes": NodeSighting, "probes": ProbeSample, "servers": ServerSample, "requests": RequestSample,
        "harness": HarnessRecord, "processes": ProcessRecord, "statuses": StatusSample, "agent_logs": LogLine,
        "admin_states": AdminStateSample,
    }
    lists: dict[str, Any] = {name: [kind(**item) for item in body.pop(name, [])] for name, kind in kinds.items()}
    return Observations(settings=OracleSettings(**settings), started_at=body["started_at"], ended_at=body["ended_at"],
                        healed_at=body.get("healed_at"), sim_log=body.get("sim_log", []),
                        zk_blind=[(float(a), float(b)) for a, b in body.get("zk_blind", [])],
                        nodes_from=body.get("nodes_from", "observer"),
                        nodes_from_counts=dict(body.get("nodes_from_counts") or {}), **lists)
