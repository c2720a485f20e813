"""The seeded plan of a chaos run: what happens, to whom, when and for how long, from the seed alone.

``ChaosConfig`` is what every run uses. ``plan(seed, config)`` draws from ``random.Random(seed)`` a story
of maintenance events (overlapping events on different VMs, one event cancelled, a hardware failure
without notice) and a schedule of faults (agents killed or paused, ZooKeeper servers down, IMDS faults,
events scheduled then cancelled, one VM's network link to ZooKeeper cut, delayed or lossy in one
direction while IMDS stays reachable), each one a ``Step``. Targets such as "the leader", "a drained VM"
or "a VM an event names" are named in the plan and resolved only when the step fires.

With ``admin_state`` (the agents drain through the load balancer's admin state, not their own HAProxy
action), the plan adds faults of the simulated ARM, one at a time, on a timeline of their own drawn from a
stream of their own (the rest of the plan is the plan without admin state): each an ``arm_fault`` step
carrying the body of one ``POST /arm/faults`` of the simulator's control API, drawn from ``ARM_FAULTS``
(the one list of them: statuses, throttling, another writer, answers lost or late after the write applied,
5xx after applying, operations slower than the agents' deadline or ending Failed or Canceled, ARM or the
token endpoint unreachable), queued for its window and then cleared; or an ``arm_stretch`` step, a stretch
of ARM behaving worse (``ARM_STRETCHES``: 409 while a write is in progress, small throttling buckets),
turned on for its window and then undone. Without it the plan is the one it always was for the seed.

The ensemble's tickTime is drawn from the seed too (``tick_time_ms``): at 2000 or 3000 ms ZooKeeper
grants the agents a session longer than the 4 s they ask for (at least 2 x tickTime), and expires
sessions only on tick boundaries; the link cuts meant to outlast a session are sized for what the
server grants (``session_lapse_seconds``).

The delivery layout (``ChaosConfig.layout``, resolved for a seed by ``delivery_layout``) says which events
IMDS shows each VM: ``one-unit`` (one delivery unit, every VM sees every event: the runs as they always
were), ``named`` (each VM sees only the events naming it), ``two-units`` (the VMs split in two placement
groups, pg0 and pg1: vm0,vm1 | vm2,vm3 with four VMs; each VM sees every event of its own unit and none of
the other's), or ``mixed`` (one of the three drawn from the seed). Whether the agents are told their unit
and the delivery (``imds.unit`` and ``imds.delivery``) or left at the default (``auto``, unit unknown) is
``ChaosConfig.tell_unit``, or drawn from the seed. Both are drawn from a stream of their own: the plan of a
seed is the same in every layout, but where the VMs of an event would span two units (the simulator refuses
such an event), as in ``two-units``, the story names VMs of one unit instead (``_one_unit``): the same
draws, a VM of the other unit swapped for one of the first's. The times, faults and their targets do not
change; targets resolved when a step fires (``named``: a VM an event names) are resolved against the
events the simulator holds, whatever the layout.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

__all__ = [
    "ARM_FAULTS",
    "ARM_FAULT_SECONDS",
    "ARM_STRETCHES",
    "ARM_STRETCH_SECONDS",
    "IMDS_FAULTS",
    "LAYOUTS",
    "LINK_DELAYS_MS",
    "LINK_FAULTS",
    "WRONG_TYPE_FIELDS",
    "ChaosConfig",
    "DeliveryLayout",
    "Step",
    "arm_linger_seconds",
    "delivery_layout",
    "describe_arm_fault",
    "describe_arm_stretch",
    "granted_session_ms",
    "plan",
    "session_lapse_seconds",
    "tick_time_ms",
]

IMDS_FAULTS = ("status", "delay", "malformed", "wrong_type", "drop", "refuse", "post")
WRONG_TYPE_FIELDS = ("DocumentIncarnation", "Events", "EventId", "Resources", "NotBefore", "DurationInSeconds")
LINK_FAULTS = ("zk_link_cut", "zk_link_delay", "zk_link_oneway")
LINK_DELAYS_MS = (100, 300, 800, 1500)  # each way: the last two make a round trip near or past kazoo's read timeout
# The ARM faults an ``--admin-state`` plan draws from: each the body of one ``POST /arm/faults`` of the simulator's
# control API (``sim/azuresim/azure/faults.py``), queued when its step fires and cleared (``DELETE
# /arm/faults``) at the end of the step's window, whether or not it was met. A ``count`` answers that many
# requests; ``None`` every request of the window (the kinds that hit a write wait for a PUT that applies).
# The testbed's agents give ARM 2 s per request and 10 s per drain or recovery (``AdminStateDrain``): a late
# answer comes after the first, a slow operation ends after the second. Once a fault on the token endpoint is
# queued, every token issued so far is expired, so that the next ARM request of every agent needs a new one.
# New kinds of the simulator are added here, and nowhere else.
ARM_FAULTS: tuple[dict[str, Any], ...] = (
    {"target": "arm", "kind": "status", "status": 429, "retry_after": 1, "count": 3},  # throttled, briefly
    {"target": "arm", "kind": "status", "status": 429, "retry_after": 2, "count": None},  # throttled, the window
    {"target": "arm", "kind": "status", "status": 500, "count": 2},
    {"target": "arm", "kind": "status", "status": 503, "count": None},  # ARM unavailable for the window
    {"target": "arm", "kind": "status", "status": 503, "count": None, "methods": ["PUT"]},  # reads work, writes fail
    {"target": "arm", "kind": "concurrent_write", "count": 3},  # another writer before each of the next PUTs (412)
    {"target": "token", "kind": "status", "status": 500, "count": 2},  # the managed identity's token endpoint
    # ARM at its worst: the write applies, and the client cannot tell from the answer.
    {"target": "arm", "kind": "lost_answer", "count": 2},  # the connection closed without an answer
    {"target": "arm", "kind": "lost_answer", "delay_seconds": 4, "count": 1},  # answered after the client's 2 s
    {"target": "arm", "kind": "status_after_apply", "status": 502, "count": 2},
    {"target": "arm", "kind": "status_after_apply", "status": 504, "count": None},
    {"target": "arm", "kind": "slow_operation", "seconds": 12, "count": 1},  # past the action's 10 s deadline
    # Every PUT of the window held on its way past the action's deadline, landing after the action gave up.
    {"target": "arm", "kind": "stalled_write", "seconds": 14, "count": None},
    {"target": "arm", "kind": "operation_end", "end": "Failed", "count": 1},  # not applied, the pool left Failed
    {"target": "arm", "kind": "operation_end", "end": "Canceled", "count": 1},
    {"target": "arm", "kind": "unreachable", "count": None},  # every connection closed unanswered, the window
    {"target": "token", "kind": "unreachable", "count": 3},
)
ARM_FAULT_SECONDS = (1.5, 8.0)  # an ARM fault's window: the longest outlasts the azure-lb action's back-off
# Stretches of ARM behaving worse, each a plan item of its own (``arm_stretch``): ``on`` is posted to the control
# API's ``path`` when the stretch begins, ``off`` (the simulator's default) when it ends.
ARM_STRETCHES: tuple[dict[str, Any], ...] = (
    # 409 AnotherOperationInProgress to a PUT while another write of the load balancer is in progress.
    {"name": "conflict_while_updating", "path": "/arm/settings", "on": {"conflict_while_updating": True},
     "off": {"conflict_while_updating": False}},
    # Per-subscription token buckets small enough for a group of four to empty with one event's drains
    # (buckets of 3 writes refilled 1/s and 20 reads refilled 5/s never did): 429 with Retry-After.
    {"name": "throttling", "path": "/arm/throttling",
     "on": {"write_capacity": 1, "write_refill": 0.2, "read_capacity": 4, "read_refill": 1.0},
     "off": {"enabled": False}},
)
ARM_STRETCH_SECONDS = (3.0, 10.0)  # a stretch's window: the longest outlasts the azure-lb action's deadline
# The delivery layouts a run plays (``ChaosConfig.layout``; ``mixed`` draws one of these from the seed).
LAYOUTS = ("one-unit", "named", "two-units")


@dataclass(frozen=True)
class ChaosConfig:
    """What every run uses. Times are real seconds unless said otherwise."""

    vms: tuple[str, ...] = ("vm0", "vm1", "vm2", "vm3")
    duration: float = 30.0  # the fault window; the run goes on until every event is gone and every VM back
    time_scale: float = 40.0  # simulated seconds per real second: a 15-minute notice lasts 22.5 s
    drain_wait: float = 1.5  # the agents' drain.wait_seconds (HAProxy notices a probe change within ~1 s)
    poll_interval: float = 0.5
    session_timeout: float = 4.0
    latest_start: float = 6.0  # drain.latest_start_seconds, in real seconds (NotBefore is rendered in real time)
    started_for_sim: float = 120.0  # simulated seconds an event stays Started (3 s at the default scale)
    reboot_seconds: float = 1.0  # how long a VM killed by an impact takes to come back
    rate: float = 20.0  # requests per second through HAProxy
    recovery_bound: float = 20.0
    tick_time_ms: int | None = None  # None: drawn from the seed among tick_choices_ms
    tick_choices_ms: tuple[int, ...] = (500, 2000, 3000)
    max_session_timeout_ms: int = 60_000  # the servers' maxSessionTimeout (at least 2 x the largest tick)
    link_faults: bool = True  # each agent reaches ZooKeeper through a proxy of its own, and the plan cuts it
    # The agents drain through the load balancer's admin state and their probe, without an HAProxy action
    # (``LocalCluster(admin_state=..., haproxy_action=False)``): the run samples every VM's effective admin state,
    # and the plan adds ARM faults (``ARM_FAULTS``) and stretches (``ARM_STRETCHES``).
    admin_state: bool = False
    # Which events IMDS shows each VM: one of ``LAYOUTS``, or ``mixed`` (drawn from the seed). The CLI's default
    # is ``mixed``; ``ChaosConfig()`` is the run as it always was (one unit, agents at their default delivery).
    layout: str = "one-unit"
    # Whether the agents are told their delivery unit and the delivery (``imds.unit``, ``imds.delivery``): True,
    # False (the default ``auto``, unit unknown), or None (drawn from the seed).
    tell_unit: bool | None = False

    def __post_init__(self) -> None:
        if self.layout not in (*LAYOUTS, "mixed"):
            raise ValueError(f"layout must be one of {', '.join((*LAYOUTS, 'mixed'))}, not {self.layout!r}")


@dataclass(frozen=True)
class DeliveryLayout:
    """A run's delivery layout, resolved for its seed: ``name`` one of ``LAYOUTS``; ``units`` each unit's
    name and VMs, in the group's order; ``delivery`` the simulator's (``unit``: a VM sees every event of its
    unit; ``named``: only the events naming it); ``told`` whether each agent's configuration says its unit and
    the delivery (``imds.unit``, ``imds.delivery``), else it runs with the default (``auto``, unit unknown)."""

    name: str
    units: tuple[tuple[str, tuple[str, ...]], ...]
    delivery: str
    told: bool

    def unit_of(self, vm: str) -> str:
        return next(unit for unit, vms in self.units if vm in vms)

    def vm_units(self) -> dict[str, str]:
        return {vm: unit for unit, vms in self.units for vm in vms}

    def sim_args(self) -> list[str]:
        """The simulator's options for this layout (``--units``, ``--delivery``)."""
        return ["--units", "/".join(f"{unit}={','.join(vms)}" for unit, vms in self.units),
                "--delivery", self.delivery]

    def agent_config(self, vm: str) -> dict[str, Any]:
        """What ``vm``'s agent is told of its delivery (a section of its configuration); {} when not told."""
        if not self.told:
            return {}
        return {"imds": {"unit": self.unit_of(vm), "delivery": self.delivery}}

    def describe(self) -> str:
        units = " | ".join(f"{unit}: {','.join(vms)}" for unit, vms in self.units)
        how = "each VM sees only the events naming it" if self.delivery == "named" else (
            "each VM sees every event of its unit")
        told = ("agents told their unit and delivery" if self.told
                else "agents at the default delivery (auto, unit unknown)")
        return f"{self.name} ({units}; {how}; {told})"

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "units": {unit: list(vms) for unit, vms in self.units},
                "delivery": self.delivery, "told": self.told}


def delivery_layout(seed: int, config: ChaosConfig = ChaosConfig()) -> DeliveryLayout:
    """The layout of ``seed``'s run: ``config.layout``, or with ``mixed`` one of ``LAYOUTS`` drawn from the seed;
    the agents told their unit as ``config.tell_unit`` says, or as drawn. Both draws come from a stream of their
    own, made whatever the configuration, so that neither the rest of the plan nor the other draw depends on
    them. Two units: the first half of the VMs (rounded up) in pg0, the others in pg1."""
    rng = random.Random(f"layout:{seed}")
    drawn_layout = rng.choice(LAYOUTS)
    drawn_told = rng.random() < 0.5
    name = drawn_layout if config.layout == "mixed" else config.layout
    told = drawn_told if config.tell_unit is None else config.tell_unit
    vms = tuple(config.vms)
    if name == "two-units":
        half = (len(vms) + 1) // 2
        units: tuple[tuple[str, tuple[str, ...]], ...] = (("pg0", vms[:half]), ("pg1", vms[half:]))
    else:
        units = (("pg0", vms),)
    return DeliveryLayout(name, units, "named" if name == "named" else "unit", told)


def _one_unit(picked: Sequence[str], layout: DeliveryLayout) -> list[str]:
    """The VMs ``picked`` for one event, all of one unit (the simulator refuses an event naming VMs of two): the
    unit of the first VM picked whose unit holds as many VMs (else the first such unit of the group), keeping
    the VMs picked in it and, in place of each other one, the next VM of that unit not picked yet. Identity
    where every VM is of one unit."""
    units = layout.vm_units()
    sizes = {unit: len(vms) for unit, vms in layout.units}
    unit = next((units[vm] for vm in picked if sizes[units[vm]] >= len(picked)),
                next((u for u, vms in layout.units if len(vms) >= len(picked)), units[picked[0]]))
    members = dict(layout.units)[unit]
    spare = [vm for vm in members if vm not in picked]
    return [vm if units[vm] == unit else spare.pop(0) for vm in picked]


@dataclass(frozen=True)
class Step:
    """One thing the harness does ``at`` seconds after the story began.

    ``target`` is a VM, ``leader``, ``drained`` or ``named`` (a VM an event names; resolved when the step
    fires, ``fallback`` if that cannot be done), ``zk`` indexes (``zk:0,2``; ``zk:leader``), or empty.
    ``seconds`` is how long the fault lasts (or, for a kill, how long until the restart)."""

    at: float
    kind: str
    target: str = ""
    seconds: float = 0.0
    params: dict[str, Any] = field(default_factory=dict, compare=False)
    fallback: str = ""
    label: str = ""

    def describe(self) -> str:
        p = self.params
        if self.kind == "event":
            extra = " (hardware failure: Started, no notice)" if p.get("status") == "Started" else ""
            return f"{self.label}: {p['event_type']} on {','.join(p['resources'])}{extra}"
        if self.kind == "cancel_event":
            return f"cancel {self.label}"
        target = f"{self.target} (else {self.fallback})" if self.fallback else self.target
        if self.kind == "agent_kill":
            return f"SIGKILL the agent of {target}, restart after {self.seconds:.1f}s"
        if self.kind == "agent_pause":
            return f"SIGSTOP the agent of {target} for {self.seconds:.1f}s"
        if self.kind == "zk_down":
            return f"ZooKeeper {self.target} down for {self.seconds:.1f}s"
        if self.kind == "imds":
            where = p.get("vm") or "every VM"
            what = {k: v for k, v in p.items() if k not in ("vm", "fault")}
            return f"IMDS fault {p['fault']} on {where} {what}"
        if self.kind == "cancel":
            return f"schedule {p['event_type']} on {','.join(p['resources'])}, cancel it after {self.seconds:.1f}s"
        if self.kind == "arm_fault":
            expired = " (then every token expired)" if p.get("expire_tokens") else ""
            return f"ARM fault {describe_arm_fault(p['body'])}{expired} for {self.seconds:.1f}s, then cleared"
        if self.kind == "arm_stretch":
            return f"ARM {describe_arm_stretch(p['stretch'])} for {self.seconds:.1f}s, then undone"
        if self.kind in LINK_FAULTS:
            who = {"named": "a VM an event names"}.get(self.target, self.target)
            who = f"{who} (else {self.fallback})" if self.fallback else who
            longer = " (longer than the session)" if p.get("past_session") else ""
            if self.kind == "zk_link_cut":
                action = "cut"
            elif self.kind == "zk_link_delay":
                action = f"delay {p['delay_ms']} ms each way on"
            else:
                action = {"up": "one-way loss (agent to ZooKeeper) on",
                        "down": "one-way loss (ZooKeeper to agent) on"}[p["direction"]]
            return f"{action} the ZooKeeper link of {who} for {self.seconds:.1f}s{longer}"
        return f"{self.kind} {self.target}"


def tick_time_ms(seed: int, config: ChaosConfig = ChaosConfig()) -> int:
    """The ensemble's tickTime for this seed: ``config.tick_time_ms`` if set, else drawn from the seed (from
    a stream of its own, so that the plan's other draws do not depend on it)."""
    if config.tick_time_ms is not None:
        return config.tick_time_ms
    return random.Random(f"tick-time:{seed}").choice(config.tick_choices_ms)


def granted_session_ms(config: ChaosConfig, tick_ms: int) -> int:
    """The session timeout ZooKeeper grants an agent asking for ``config.session_timeout``: what it asked,
    raised to the minimum 2 x tickTime, lowered to maxSessionTimeout."""
    asked = int(config.session_timeout * 1000)
    return min(max(asked, 2 * tick_ms), config.max_session_timeout_ms)


def session_lapse_seconds(config: ChaosConfig, tick_ms: int) -> float:
    """The longest a server may take to expire the session of an agent it no longer hears from: the granted
    timeout, plus up to one tick (sessions expire on tick boundaries)."""
    return (granted_session_ms(config, tick_ms) + tick_ms) / 1000.0


def plan(seed: int, config: ChaosConfig = ChaosConfig()) -> list[Step]:
    """The run's story of events and its faults, in time order: a function of the seed alone."""
    rng = random.Random(seed)
    vms = list(config.vms)
    layout = delivery_layout(seed, config)
    k = config.duration / 30.0
    order = rng.sample(vms, len(vms))
    # The Freeze of two VMs names VMs of one unit; the Reboot and the cancelled event take the next ones drawn.
    a, b = _one_unit(order[:2], layout)
    rest = [vm for vm in order if vm not in (a, b)]
    c = rest[0]
    d = rest[1] if len(rest) > 1 else rng.choice(vms)
    # Overlapping events on different VMs: a Freeze of two VMs and a Reboot of a third.
    steps: list[Step] = [
        Step(rng.uniform(0.5, 2.5) * k, "event", label="freeze-two",
             params={"event_type": "Freeze", "resources": [a, b], "duration_in_seconds": rng.choice([30, 60, 90])}),
        Step(rng.uniform(1.5, 4.0) * k, "event", label="reboot", params={"event_type": "Reboot", "resources": [c]}),
    ]
    cancelled_at = rng.uniform(5.0, 10.0) * k
    steps.append(Step(cancelled_at, "event", label="cancelled",
                      params={"event_type": rng.choice(["Redeploy", "Reboot"]), "resources": [d]}))
    steps.append(Step(cancelled_at + rng.uniform(1.0, 8.0) * k, "cancel_event", label="cancelled"))
    steps.append(Step(rng.uniform(10.0, 16.0) * k, "event", label="hardware",
                      params={"event_type": "Reboot", "resources": [rng.choice(vms)], "status": "Started",
                              "started_for": config.started_for_sim}))
    steps.append(Step(rng.uniform(14.0, 20.0) * k, "event", label="freeze-late",
                      params={"event_type": "Freeze", "resources": sorted(_one_unit(rng.sample(vms, 2), layout)),
                              "duration_in_seconds": rng.choice([30, 60])}))

    kinds = ["leader_kill", "drained_kill", "pause_long", "zk_one", "zk_two", "imds", "imds", "agent_kill", "cancel"]
    extra = ["agent_kill", "pause_long", "pause_short", "imds", "imds", "zk_one", "cancel", "drained_kill"]
    if config.link_faults:
        kinds += ["link_cut_long", "link_oneway", "link_cut_short", "link_delay"]
        extra += ["link_cut_short", "link_oneway", "link_delay"]
    rng.shuffle(kinds)
    tick = tick_time_ms(seed, config)
    lapse = session_lapse_seconds(config, tick)
    read_timeout = granted_session_ms(config, tick) * 2 / 3 / 1000.0
    t = rng.uniform(1.5, 3.0) * k
    zk_free = 0.0
    link_free = 0.0
    busy: dict[str, float] = {}
    while t < config.duration:
        kind = kinds.pop(0) if kinds else rng.choice(extra)
        if kind.startswith("link_"):
            # One link fault at a time; one that could not begin within the window is left out.
            link_step = _link_fault(rng, kind, max(t, link_free), vms, lapse, read_timeout)
            if link_step.target == "named":  # not before an event can name the VM
                link_step = replace(link_step, at=max(link_step.at, steps[0].at + 0.5))
            past_session = bool(link_step.params["past_session"])
            if past_session:
                # A new ZooKeeper leader gives every session a fresh timeout: no server fault from a little
                # before the cut (a restarted server's election) until the session has had time to expire.
                link_step = replace(link_step, at=max(link_step.at, zk_free + 2.0))
            if link_step.at < config.duration:
                steps.append(link_step)
                link_free = link_step.at + link_step.seconds + 1.0
                if past_session:
                    zk_free = max(zk_free, link_step.at + float(link_step.params["lapse"]) + 0.5)
            t += rng.uniform(1.2, 3.0) * k
            continue
        fallback = rng.choice(vms)
        free = [vm for vm in vms if busy.get(vm, 0.0) <= t] or vms
        vm = rng.choice(free)
        step: Step
        if kind in ("agent_kill", "leader_kill", "drained_kill"):
            target = {"agent_kill": vm, "leader_kill": "leader", "drained_kill": "drained"}[kind]
            step = Step(t, "agent_kill", target, rng.uniform(0.5, 3.0),
                        fallback="" if kind == "agent_kill" else fallback)
            if kind == "agent_kill":
                busy[vm] = t + step.seconds + 1.0
        elif kind in ("pause_long", "pause_short"):
            long = kind == "pause_long"
            seconds = config.session_timeout + rng.uniform(1.0, 4.0) if long else rng.uniform(0.5, 3.0)
            step = Step(t, "agent_pause", vm, seconds)
            busy[vm] = t + seconds + 1.0
        elif kind in ("zk_one", "zk_two"):
            start = max(t, zk_free)
            if kind == "zk_one":
                target = "zk:leader" if rng.random() < 0.5 else f"zk:{rng.randrange(3)}"
            else:
                target = "zk:" + ",".join(str(i) for i in sorted(rng.sample(range(3), 2)))
            step = Step(start, "zk_down", target, rng.uniform(2.0, 5.0))
            zk_free = start + step.seconds + 4.0  # a restarted server takes a few seconds to rejoin
        elif kind == "imds":
            step = Step(t, "imds", params=_imds_fault(rng, vms))
        else:
            step = Step(t, "cancel", seconds=rng.uniform(0.5, 6.0) * k,
                        params={"event_type": rng.choice(["Freeze", "Redeploy"]), "resources": [vm]})
        steps.append(step)
        t += rng.uniform(1.2, 3.0) * k
    if config.admin_state:
        steps += _arm_items(seed, config)
    return sorted(steps, key=lambda s: s.at)


def _arm_items(seed: int, config: ChaosConfig) -> list[Step]:
    """The ARM faults and stretches of an ``--admin-state`` plan, on a timeline of their own drawn from a stream
    of its own: the rest of the plan is the plan without admin state. One at a time (clearing one fault clears
    every fault queued on ARM; a fault whose effects outlast its clearing, a slow operation, holds ARM until
    they are over), 1-5 s apart; the first two are a fault and a stretch in a drawn order, the third a fault."""
    rng = random.Random(f"arm:{seed}")
    k = config.duration / 30.0
    kinds = ["arm", "arm_stretch"]
    rng.shuffle(kinds)
    kinds.append("arm")
    steps: list[Step] = []
    t = rng.uniform(1.5, 4.0) * k
    while t < config.duration:
        kind = kinds.pop(0) if kinds else rng.choice(["arm", "arm", "arm_stretch"])
        linger = 0.0
        if kind == "arm":
            body = dict(ARM_FAULTS[rng.randrange(len(ARM_FAULTS))])
            params: dict[str, Any] = {"body": body}
            if body["target"] == "token":
                params["expire_tokens"] = True
            step = Step(t, "arm_fault", str(body["target"]), rng.uniform(*ARM_FAULT_SECONDS), params=params)
            linger = arm_linger_seconds(body)
        else:
            stretch = dict(ARM_STRETCHES[rng.randrange(len(ARM_STRETCHES))])
            step = Step(t, "arm_stretch", "arm", rng.uniform(*ARM_STRETCH_SECONDS), params={"stretch": stretch})
        steps.append(step)
        t = step.at + step.seconds + linger + rng.uniform(1.0, 5.0) * k
    return steps


def arm_linger_seconds(body: dict[str, Any]) -> float:
    """How long the effects of the ARM fault ``body`` may outlast its clearing: a slow operation accepted in
    its window goes on (and a later write of the pool ends behind it) for its ``seconds``, and a write held in
    its window lands that long after it was sent; nothing else."""
    return float(body.get("seconds") or 0.0) if body.get("kind") in ("slow_operation", "stalled_write") else 0.0


def describe_arm_stretch(stretch: dict[str, Any]) -> str:
    """One stretch in a few words: ``throttling on (POST /arm/throttling write_capacity=3 ...)``."""
    fields = " ".join(f"{k}={v}" for k, v in stretch["on"].items())
    return f"{stretch['name']} on (POST {stretch['path']} {fields})"


def describe_arm_fault(body: dict[str, Any]) -> str:
    """One ARM fault's body in a few words: ``on arm: status 503 Retry-After 2 (every request, PUT)``."""
    what = [str(body.get("kind", "status"))]
    if body.get("status") is not None:
        what.append(str(body["status"]))
    if body.get("retry_after") is not None:
        what.append(f"Retry-After {body['retry_after']}")
    others = {k: v for k, v in body.items() if k not in ("target", "kind", "status", "retry_after", "count", "methods")}
    what.extend(f"{k}={v}" for k, v in sorted(others.items()))
    count = body.get("count", 1)
    scope = "every request" if count is None else f"{count} request(s)"
    if body.get("methods"):
        scope += ", " + "/".join(body["methods"])
    return f"on {body.get('target', 'arm')}: {' '.join(what)} ({scope})"


def _link_fault(rng: random.Random, kind: str, at: float, vms: Sequence[str], lapse: float,
                read_timeout: float) -> Step:
    """One VM's link to ZooKeeper cut, delayed, or lossy one way. A cut meant to outlast the session lasts
    ``lapse`` (the latest the server expires the session) plus 1-4 s, and hits a VM an event names at that
    moment when there is one; a short fault lasts 0.5-3 s, less than any session the agents get."""
    fallback = rng.choice(vms)
    past_session = kind == "link_cut_long" or (kind == "link_oneway" and rng.random() < 0.5)
    seconds = lapse + rng.uniform(1.0, 4.0) if past_session else rng.uniform(0.5, 3.0)
    target = "named" if past_session or rng.random() < 0.5 else fallback
    params: dict[str, Any] = {"past_session": past_session, "pick": round(rng.random(), 4)}
    if past_session:
        params["lapse"] = round(lapse, 2)  # by when the server has expired the session, from the fault's start
    if kind in ("link_cut_long", "link_cut_short"):
        return Step(at, "zk_link_cut", target, seconds, params=params, fallback=fallback if target == "named" else "")
    if kind == "link_delay":
        params["delay_ms"] = rng.choice(LINK_DELAYS_MS)
        seconds = rng.uniform(2.0, 8.0)
        return Step(at, "zk_link_delay", target, seconds, params=params, fallback=fallback if target == "named" else "")
    params["direction"] = rng.choice(["up", "down"])
    if past_session and params["direction"] == "down":
        # The agent's pings still reach the servers until kazoo gives the silent connection up, after its read
        # timeout (two thirds of the session): the session's timer starts only then.
        params["lapse"] = round(lapse + read_timeout, 2)
        seconds += read_timeout
    return Step(at, "zk_link_oneway", target, seconds, params=params, fallback=fallback if target == "named" else "")


def _imds_fault(rng: random.Random, vms: Sequence[str]) -> dict[str, Any]:
    fault = rng.choice(IMDS_FAULTS)
    vm = rng.choice([*vms, None])
    if fault == "status":
        return {"fault": fault, "vm": vm, "status": rng.choice([410, 429, 500, 503]), "count": rng.randint(2, 10)}
    if fault == "delay":
        return {"fault": fault, "vm": vm, "seconds": round(rng.uniform(2.5, 4.0), 2), "count": rng.randint(1, 3)}
    if fault in ("malformed", "drop"):
        return {"fault": fault, "vm": vm, "count": rng.randint(1, 3)}
    if fault == "wrong_type":
        return {"fault": fault, "vm": vm, "field": rng.choice(WRONG_TYPE_FIELDS), "count": rng.randint(1, 2)}
    if fault == "refuse":
        return {"fault": fault, "vm": vm, "seconds": round(rng.uniform(1.0, 4.0), 2)}
    return {"fault": fault, "vm": vm, "status": rng.choice([500, 503]), "count": rng.randint(1, 2)}
