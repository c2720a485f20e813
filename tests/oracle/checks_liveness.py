"""The liveness judgement, from what was observed outside the agents only (``docs/reliability.md``,
"Liveness: what the oracle counts as a miss"): was every event the policy allowed to start early approved
in time (L1), and was every record whose event went closed in time (L2, as far as it is observable)?

L1, for each event with notice, on a grid of ``STEP`` seconds while it waits: ``_World.why_not`` says why
it is not allowable (never: its rule, a VM without an agent; a hold: an operator's pause, the budget,
``keep_one_serving``; its VMs: an agent not running, stopped or without a live session, named by the fault
that caused it). An allowable stretch starts the clock; each fault on the event's path overlapping the
clock's window (``faults.on_path``) pushes it to the end of that fault's effects. An approval by the clock
plus ``OracleSettings.l1_bound`` is in time; a stretch that outlasts it without one is an unexplained miss
(a violation). An event that waited the bound from its first allowable moment, never approved, its
stretches cut short by faults, is a miss explained by the last such fault; one held by policy is no miss.

L2: a record is seen open while its ``admitted`` or ``approval`` node stands (``mark_done`` removes both;
the recorder reads no payload, so not ``done_at``). Standing longer than ``OracleSettings.l2_bound`` after
its event left the simulator, with the clock pushed by faults on the leader's path, is a miss.

The delivery layout (``OracleSettings.units``, ``delivery``; ``docs/safety.md``, "Delivery units") decides
whose documents show an event. Where the leader's do not (another unit, or named-only delivery and the event
does not name it): the leader admits it from its record only once it has known the record for ``gone_after``
(``decide.events.events_from_store``), a hold until then (``_World._unseen_by_leader``); the leader, and the
event's approver, count it in the budget until its record is closed, not only while it is present
(``_World._record_holds``); and its record is closed by its closer, the first live member it names, so L2
starts the clock once one of its VMs runs a live agent, with faults on its VMs' paths as well as the
leader's; one none of whose VMs ran a live agent from its removal until its record closed is excused
(L2's excuse: nobody could see it go).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from tests.oracle.context import Context, SimEvent, pause_windows, recovery_grace
from tests.oracle.faults import Fault, Leaders, faults, on_path
from tests.oracle.report import Violation, timeline

__all__ = ["STEP", "Liveness", "Miss", "liveness"]

_SESSION_FAULTS = ("agent killed", "agent stopped (SIGSTOP)", "ZooKeeper link cut", "ZooKeeper link one-way loss",
                   "ZooKeeper link delayed", "ZooKeeper server down", "ZooKeeper quorum lost")
STEP = 0.1  # seconds between two instants the conditions are judged at (the probes' sampling interval)
_INF = float("inf")
Span = tuple[float, float]


@dataclass(frozen=True)
class Miss:
    """An event not approved in time (L1), or a record not closed in time (L2)."""

    law: str  # "L1" or "L2"
    event: SimEvent
    since: float  # allowable from (L1), gone from the simulator (L2)
    due: float
    cause: str  # a fault's kind, or "unexplained"
    detail: str
    fault: Fault | None = None

    @property
    def unexplained(self) -> bool:
        return self.fault is None


@dataclass
class Liveness:
    """What the judgement found: misses, per-event outcomes, and the times from allowable to approved."""

    misses: list[Miss] = field(default_factory=list)
    outcomes: Counter[str] = field(default_factory=Counter)
    held: Counter[str] = field(default_factory=Counter)
    events: list[dict[str, Any]] = field(default_factory=list)  # per event with notice: times and outcome
    clean: list[float] = field(default_factory=list)  # allowable to approved, no fault on the path between
    faulted: list[float] = field(default_factory=list)  # the same, with a fault on the path between

    def violations(self, ctx: Context) -> list[Violation]:
        found = []
        for miss in self.misses:
            if miss.unexplained:
                event = miss.event
                found.append(Violation("liveness", miss.due, f"{miss.law}: {miss.detail}", timeline(
                    ctx, miss.since - 3, miss.due + 2, set(event.resources) | Leaders(ctx).during(miss.since, miss.due),
                    [event.event_id])))
        return found

    def stats(self, ctx: Context) -> dict[str, Any]:
        origin = ctx.obs.started_at
        return {
            "outcomes": dict(self.outcomes),
            "held_by": dict(self.held),
            "allowable_to_approved": _percentiles(self.clean),
            "allowable_to_approved_seconds": [round(x, 2) for x in self.clean],
            "allowable_to_approved_with_faults": _percentiles(self.faulted),
            "allowable_to_approved_with_faults_seconds": [round(x, 2) for x in self.faulted],
            "misses_by_cause": dict(Counter(f"{m.law} {m.cause}" for m in self.misses)),
            "misses_unexplained": sum(1 for m in self.misses if m.unexplained),
            "events": self.events,
            "misses": [{"law": m.law, "event": m.event.event_id, "type": m.event.event_type,
                        "since": round(m.since - origin, 2), "due": round(m.due - origin, 2), "cause": m.cause,
                        "detail": m.detail} for m in self.misses],
        }


def _percentiles(values: Sequence[float]) -> dict[str, float | int | None]:
    ordered = sorted(values)
    if not ordered:
        return {"n": 0, "p50": None, "p99": None, "max": None}

    def rank(q: float) -> float:  # nearest rank
        return round(ordered[max(0, math.ceil(q * len(ordered)) - 1)], 2)

    return {"n": len(ordered), "p50": rank(0.5), "p99": rank(0.99), "max": round(ordered[-1], 2)}


def _within(spans: Sequence[Span], t: float) -> bool:
    return any(start <= t < end for start, end in spans)


class _World:
    """Indexes over the observations that the conditions read, on the run's grid."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.settings = ctx.settings
        self.faults = faults(ctx)
        self.leaders = Leaders(ctx)
        nodes = ctx.obs.nodes
        self.members: dict[str, list[Span]] = {}
        for n in nodes:
            if n.kind == "member" and n.vm:
                self.members.setdefault(n.vm.lower(), []).append((n.ctime, n.gone_seen or _INF))
        self.pauses = [(n.ctime, n.gone_seen or _INF) for n in nodes if n.kind == "pause"]
        self.out_nodes: dict[str, list[Span]] = {}  # a VM's own /out node (recorded by the chaos runs only)
        for n in nodes:
            if n.kind == "out" and n.vm:
                self.out_nodes.setdefault(n.vm.lower(), []).append((n.ctime, n.gone_seen or _INF))
        # When each event's record was first created (``/events/{id}``), and its admitted nodes, not cut at
        # the event's removal: a leader that does not see an event admits it from its record, and counts it
        # until its record is closed.
        self.records: dict[str, float] = {}
        self.admitted: dict[str, list[Span]] = {}
        for n in nodes:
            key = (n.event_id or "").upper()
            if n.kind == "record" and key:
                self.records[key] = min(self.records.get(key, _INF), n.ctime)
            elif n.kind == "admitted" and key:
                self.admitted.setdefault(key, []).append((n.ctime, n.gone_seen or _INF))
        self.grace = recovery_grace(self.settings)
        self.runs: dict[str, list[Span]] = {}
        for p in ctx.obs.processes:
            self.runs.setdefault(p.vm.lower(), []).append((p.started, p.exited if p.exited is not None else _INF))
        self.stopped: dict[str, list[Span]] = {}
        for pid, windows in pause_windows(ctx).items():
            vm = ctx.pid_vm.get(pid)
            if vm is not None:
                self.stopped.setdefault(vm, []).extend((a, b) for a, b, _ in windows)
        # When each event held the budget by itself: present and admitted, approved early or Started; and
        # while an ack of it stood (a VM drained for it counts until it serves again, present or not), with
        # the acknowledging VM.
        self.holding: dict[str, list[tuple[float, float, str, str | None]]] = {}
        for ev in ctx.events.values():
            end = ev.end(_INF)
            spans: list[tuple[float, float, str, str | None]] = [
                (max(n.ctime, ev.created), min(n.gone_seen or _INF, end), "admitted", None) for n in nodes
                if n.kind == "admitted" and (n.event_id or "").upper() == ev.event_id]
            if ev.early_approvals:
                spans.append((min(ev.early_approvals), end, "approved early", None))
            if ev.started is not None:
                spans.append((ev.started, end, "Started", None))
            spans += [(n.ctime, n.gone_seen or _INF, f"acknowledged by {n.vm}", (n.vm or "").lower()) for n in nodes
                      if n.kind == "ack" and (n.event_id or "").upper() == ev.event_id]
            self.holding[ev.event_id] = [s for s in spans if s[0] < s[1]]
        self.origin = ctx.obs.started_at
        count = int((ctx.obs.ended_at - self.origin) / STEP) + 2
        self.rot = {vm: [self._in_rotation(vm, self.at(i)) for i in range(count)] for vm in sorted(ctx.agent_vms)}
        self.out_since: dict[str, list[int]] = {}
        for vm, flags in self.rot.items():
            since, begun = [], 0
            for i, up in enumerate(flags):
                begun = i + 1 if up else begun
                since.append(begun)
            self.out_since[vm] = since

    def at(self, i: int) -> float:
        return self.origin + i * STEP

    def _in_rotation(self, vm: str, t: float) -> bool:
        """HAProxy's last sample shows ``vm`` UP (in a run with HAProxy), and its probe has answered 200
        for the return wait: what the agents' budget counts as serving again."""
        probe = self.ctx.probe(vm)
        last = probe.before(t)
        if last is None or last.code != 200:
            return False
        if any(s.code != 200 for s in probe.between(t - self.settings.return_wait(), t)):
            return False
        server = self.ctx.servers.get(vm)
        if self.ctx.servers and server is not None:
            sample = server.before(t)
            return sample is not None and sample.up
        return True

    def member(self, vm: str, t: float) -> bool:
        """Whether the agent process running on ``vm`` at ``t`` has a live session: a member node created
        since it started (an older one is a dead process's session, not yet expired)."""
        started = [a for a, b in self.runs.get(vm, []) if a <= t < b]
        return bool(started) and any(max(started) <= a <= t < b for a, b in self.members.get(vm, []))

    def live(self, vm: str, t: float) -> bool:
        return (_within(self.runs.get(vm, []), t) and not _within(self.stopped.get(vm, []), t)
                and self.member(vm, t))

    def _in_maintenance(self, ev: SimEvent, other: SimEvent, i: int, t: float) -> str | None:
        """Why ``other`` holds a slot of the budget at ``t`` as ``ev`` sees it (None: it does not)."""
        # Once ``ev`` is admitted (or acknowledged), a VM of its own out of rotation, or acknowledging
        # ``other`` too, is filed under ``ev`` (``decide.budget.in_flight``): ``other`` holds no slot by it.
        own = any(start <= t < end for start, end, _, _ in self.holding[ev.event_id])
        for start, end, label, by in self.holding[other.event_id]:
            if start <= t < end and not (own and by in ev.resources):
                return label
        for vm in other.resources:
            if vm not in self.rot or self.rot[vm][i] or (own and vm in ev.resources):
                continue
            # Out of rotation since ``other`` held the budget: drained for it, until it serves again (S4);
            # not a VM down for no event, nor one whose agent is gone past the recovery grace (L4).
            out_from = self.at(self.out_since[vm][i])
            if (any(start <= t and end > out_from for start, end, _, _ in self.holding[other.event_id])
                    and not self._gone_past_grace(vm, t) and not self._down(vm, other, out_from, t)):
                return f"{vm} not back in rotation since"
            # Gone out by its agent's own decision (running, a member, not stopped) while ``other`` names
            # it: drained for it (admitted, or forced before its NotBefore, which the simulator's log does
            # not carry). A VM restarting or stopped is out for no event: not an event in maintenance.
            if vm not in ev.resources and other.present(t) and self.live(vm, out_from) and self.live(vm, t):
                return f"{vm} out of rotation while it names it"
        return self._record_holds(ev, other, t)

    def _record_holds(self, ev: SimEvent, other: SimEvent, t: float) -> str | None:
        """Whether ``other``, gone from the simulator, still holds a slot at ``t`` because whoever weighs ``ev``
        (the leader admitting it, its approver approving it) does not see ``other`` in its own documents: it
        knows ``other`` from its record (``decide.events.events_from_store``), admitted until the record is closed."""
        if other.present(t) or not any(a <= t < b for a, b in self.admitted.get(other.event_id, ())):
            return None
        judges = [self.leaders.at(t), self.approver(ev, t)]
        blind = sorted({vm for vm in judges if vm is not None and not self.settings.sees(vm, other.resources)})
        if not blind:
            return None
        return f"admitted, its record still open (not in the documents of {','.join(blind)})"

    def approver(self, ev: SimEvent, t: float) -> str | None:
        """The approver of ``ev`` at ``t`` (first-resource, the chaos runs' policy): the first VM it names whose
        agent is live, else the first it names."""
        return next((vm for vm in ev.resources if self.live(vm, t)), ev.resources[0] if ev.resources else None)

    def _unseen_by_leader(self, ev: SimEvent, t: float) -> tuple[str, str, Fault | None] | None:
        """Why the leader at ``t``, whose documents do not show ``ev``, cannot admit it yet: it admits an event
        known only from its record once it has known the record for ``gone_after`` (from the record's creation,
        or from its own start if later: a restarted agent hears of every record anew), on its next cycle
        (``decide.events.events_from_store``). A restart made by a fault is that fault's. None: it can."""
        leader = self.leaders.at(t)
        if leader is None or self.settings.sees(leader, ev.resources):
            return None
        published = self.records.get(ev.event_id)
        if published is None:
            return None  # never published: nobody's documents showed it, which is no hold
        started = [a for a, b in self.runs.get(leader, []) if a <= t < b]
        known = max([published, *started])
        ready = known + self.settings.gone_after_seconds + self.settings.poll_interval_seconds
        if t >= ready:
            return None
        text = (f"the leader does not see it ({leader}: admitted from its record once known for "
                f"{self.settings.gone_after_seconds:g} s, at t={ready - self.origin:.2f}s)")
        restarted = [f for f in self.faults if f.kind == "agent killed" and f.target == leader
                     and f.start <= known <= f.settle] if known > published else []
        if restarted:
            return "fault", text, max(restarted, key=lambda f: f.start)
        return "hold", text, None

    def _gone_past_grace(self, vm: str, t: float) -> bool:
        """Whether ``vm``'s agent has been gone (no member node) for ``recovery_grace`` at ``t``: the agents'
        budget no longer counts it out of rotation for anything (``decide.budget.out_vms``). Gone since its
        last member node was seen gone; never seen a member before ``t``: not known gone."""
        spans = self.members.get(vm, [])
        ended = [b for a, b in spans if b <= t]
        return bool(ended) and not _within(spans, t) and t - max(ended) >= self.grace

    def _down(self, vm: str, other: SimEvent, out_from: float, t: float) -> bool:
        """Whether ``vm``, out of rotation since ``out_from``, is down rather than in maintenance for
        ``other`` at ``t`` (L4): its agent is not running, it went out of rotation without its agent's
        doing (not live then: stopped without draining), it never acknowledged ``other`` and has no ``/out``
        node. The agents' budget counts a VM out only by its ``/out`` node or its acks, and a VM stopped
        without draining has neither. One drained by its agent and then killed keeps the old rule."""
        return (not _within(self.runs.get(vm, []), t) and not self.live(vm, out_from)
                and not any(by == vm for _, _, _, by in self.holding[other.event_id])
                and not any(a <= t and b > out_from for a, b in self.out_nodes.get(vm, [])))

    def why_not(self, ev: SimEvent, i: int, t: float) -> tuple[str, str, Fault | None] | None:
        """Why ``ev`` is not allowable at ``t``: (``never``, ``hold`` or ``fault``, the reason, the fault
        that caused it); None: allowable."""
        settings = self.settings
        rule = settings.approval_rules.get(ev.event_type, "after-drain")
        if rule != "after-drain":
            return "never", f"its rule is {rule}", None
        absent = [vm for vm in ev.resources if vm not in self.ctx.agent_vms]
        if absent:
            return "never", f"{','.join(absent)} run(s) no agent", None
        if _within(self.pauses, t):
            return "hold", "an operator's pause", None
        if settings.max_events_in_maintenance is not None:
            unit = settings.budget_units.get(ev.event_id)
            busy = [(o, why) for o in self.ctx.events.values() if o.event_id != ev.event_id and o.created <= t
                    and (unit is None or settings.budget_units.get(o.event_id) != unit)
                    and (why := self._in_maintenance(ev, o, i, t)) is not None]
            if len(busy) >= settings.max_events_in_maintenance:
                return "hold", "the budget: " + "; ".join(f"{o.event_type} {o.event_id[:8]} {w}" for o, w in busy), None
        if settings.keep_one_serving and not any(
                self.rot[vm][i] and self.live(vm, t) for vm in self.rot if vm not in ev.resources):
            return "hold", "keep_one_serving: no VM outside its Resources in rotation", None
        kinds: tuple[str, ...]
        for vm in ev.resources:
            if not _within(self.runs.get(vm, []), t):
                what, kinds = "not running", ("agent killed",)
            elif _within(self.stopped.get(vm, []), t):
                what, kinds = "stopped", ("agent stopped (SIGSTOP)",)
            elif not self.member(vm, t):
                # A session lapses when the agent is killed or stopped, or cut off from ZooKeeper.
                what, kinds = "without a ZooKeeper session", _SESSION_FAULTS
            else:
                continue
            cause = [f for f in self.faults if f.start <= t <= f.settle and f.kind in kinds
                     and (f.target == vm or f.on_zookeeper)]
            text = f"the agent of {vm} {what}"
            if cause:
                return "fault", text, max(cause, key=lambda f: f.start)
            return "hold", f"{text} (no fault found)", None
        return self._unseen_by_leader(ev, t)


def _judge_event(world: _World, ev: SimEvent, found: Liveness) -> None:
    """L1 for one event with notice: its allowable stretches, the clock in each, and the outcome."""
    ctx, origin = world.ctx, world.origin
    bound = world.settings.l1_bound(ev.event_type)
    path = [f for f in world.faults if on_path(f, ev.resources, world.leaders)]
    waiting_end = min(x for x in (ev.started, ev.removed, ctx.obs.ended_at) if x is not None)
    approved = min(ev.early_approvals) if ev.early_approvals else None
    stretches: list[tuple[float, float, tuple[str, str, Fault | None] | None]] = []
    start: float | None = None
    i = max(0, math.ceil((ev.created - origin) / STEP))
    reasons: list[tuple[str, str, Fault | None]] = []
    while world.at(i) < waiting_end:
        why = world.why_not(ev, i, world.at(i))
        if why is None and start is None:
            start = max(world.at(i), ev.created)
        elif why is not None:
            reasons.append(why)
            if start is not None:
                stretches.append((start, world.at(i), why))
                start = None
        i += 1
    if start is not None:
        stretches.append((start, waiting_end, None))

    def done(outcome: str, why: str = "") -> None:
        found.outcomes[outcome] += 1
        found.events.append({
            "event": ev.event_id, "type": ev.event_type, "created": round(ev.created - origin, 2),
            "allowable_from": round(stretches[0][0] - origin, 2) if stretches else None,
            "approved": round(approved - origin, 2) if approved is not None else None,
            "started_at_not_before": round(ev.started - origin, 2) if ev.start_reason == "not_before"
            and ev.started is not None else None,
            "outcome": outcome, "why": why})

    if not stretches:
        common = Counter(_kind(r[1]) for r in reasons).most_common(1)
        if approved is not None:
            return done("approved while not judged allowable", common[0][0] if common else "")
        found.held[common[0][0] if common else "not present"] += 1
        return done("never allowable", common[0][0] if common else "not present")
    found.outcomes["allowable"] += 1
    cut_by: Fault | None = None
    for a, b, why in stretches:
        clock, pushed = _clock(path, a, b, bound)
        due = clock + bound
        if approved is not None and a - STEP <= approved <= b + STEP:
            between = any(f.start < approved and f.settle > a for f in path)
            if approved <= due:
                (found.faulted if between else found.clean).append(approved - a)
                return done("approved in time", f"{approved - a:.2f} s after it became allowable"
                            + (", a fault on its path between" if between else ""))
            _miss(found, ev, a, due, f"approved at t={approved - origin:.2f}s", clock, bound, origin)
            return done("miss", "unexplained")
        if b >= due:
            _miss(found, ev, a, due, _ending(ev, waiting_end, origin), clock, bound, origin)
            return done("miss", "unexplained")
        # Cut short: by a fault that pushed the clock past the stretch's end (without it, it was due), or by
        # a condition a fault caused; a stretch too short anyway that ended on a hold is the policy's.
        if pushed is not None and b - a >= bound:
            cut_by = pushed
        elif why is not None and why[2] is not None:
            cut_by = why[2]
    if approved is not None:
        return done("approved while not judged allowable", "approved outside its allowable stretches")
    first = stretches[0][0]
    if cut_by is not None and waiting_end - first >= bound:
        detail = (f"{ev.event_type} {ev.event_id} ({','.join(ev.resources)}) allowable from t={first - origin:.2f}s, "
                  f"{_ending(ev, waiting_end, origin)}: its window was cut by {cut_by.describe(origin)}")
        found.misses.append(Miss("L1", ev, first, first + bound, cut_by.kind, detail, cut_by))
        return done("miss", cut_by.kind)
    held = [r for r in reasons if r[0] == "hold"]
    reason = _kind(held[-1][1]) if held else "no full window before it stopped waiting"
    found.held[reason] += 1
    return done("held", reason)


def _kind(reason: str) -> str:
    """A reason without its particulars, to count by: "the budget", "keep_one_serving", ..."""
    return reason.split(":")[0].split(" (")[0]


def _ending(ev: SimEvent, end: float, origin: float) -> str:
    if ev.started is not None and ev.started <= end:
        return f"started at its NotBefore at t={ev.started - origin:.2f}s"
    if ev.removed is not None and ev.removed <= end:
        return f"{ev.removal_reason or 'removed'} at t={ev.removed - origin:.2f}s"
    return "still waiting when the run ended"


def _miss(found: Liveness, ev: SimEvent, since: float, due: float, ending: str, clock: float, bound: float,
          origin: float) -> None:
    """An unexplained L1 miss: allowable from ``since``, the clock (pushed to ``clock`` by faults) ran out."""
    pushed = f" (the clock from t={clock - origin:.2f}s, after the faults on its path)" if clock > since else ""
    detail = (f"{ev.event_type} {ev.event_id} ({','.join(ev.resources)}) allowable from t={since - origin:.2f}s"
              f"{pushed}, not approved by t={due - origin:.2f}s (bound {bound:.1f} s): {ending}; no fault on its path "
              "explains it")
    found.misses.append(Miss("L1", ev, since, due, "unexplained", detail))


def _clock(path: Sequence[Fault], start: float, end: float, bound: float) -> tuple[float, Fault | None]:
    """When the clock of a window opening at ``start`` (and closing at ``end`` at the latest) starts: after
    the effects of every fault on the path that overlaps it, each pushing it to its ``settle``; with the
    last fault that pushed it."""
    clock, pushed = start, None
    while hits := [f for f in path if f.start < min(end, clock + bound) and f.settle > clock]:
        pushed = max(hits, key=lambda f: f.settle)
        clock = pushed.settle
    return clock, pushed


def _judge_record(world: _World, ev: SimEvent, found: Liveness) -> None:
    """L2 as far as it is observable: the record's ``admitted`` or ``approval`` node, standing after the
    event left the simulator, goes within the bound unless a fault on the leader's path pushed it."""
    ctx, origin = world.ctx, world.origin
    if ev.removed is None or not world.leaders.seen:
        return  # no leader ever seen: the record of ZooKeeper's nodes says too little to judge by
    nodes = [n for n in ctx.obs.nodes if n.kind in ("admitted", "approval") and (n.event_id or "").upper()
             == ev.event_id and n.ctime <= ev.removed and (n.gone_seen is None or n.gone_seen > ev.removed)]
    if not nodes:
        return
    gone = max(n.gone_seen if n.gone_seen is not None else ctx.obs.ended_at for n in nodes)
    bound = world.settings.l2_bound()
    if gone - ev.removed <= bound:
        return
    leaders = world.leaders.during(ev.removed, gone)
    what = (f"the record of {ev.event_type} {ev.event_id} ({','.join(ev.resources)}) stood open (its "
            f"{'/'.join(sorted({n.kind for n in nodes}))} node) until t={gone - origin:.2f}s, "
            f"{gone - ev.removed:.1f} s after the event left the simulator at t={ev.removed - origin:.2f}s "
            f"(bound {bound:.1f} s)")
    blind = [Fault("ZooKeeper recorder blind", "the recorder", a, b, b) for a, b in ctx.obs.zk_blind]
    if leaders and all(world.settings.sees(vm, ev.resources) for vm in leaders):
        # The leader's own documents show the event: it closes the record once they miss it.
        path = [f for f in world.faults if f.on_zookeeper or f.target in leaders]
        whose = "the leader's path"
    else:
        # A leader whose documents do not show it (or none) leaves the record to its closer, the first live member it
        # names (``decide.records.closing``): the clock starts once one of its VMs runs a live agent. None did
        # until the record closed: nobody could see the event go, and the record waits for nobody to hold it
        # and for its release (``decide.records.record_over``), which the recorder cannot see (node payloads): excused.
        path = [f for f in world.faults if f.on_zookeeper or f.target in leaders or f.target in ev.resources]
        whose = "the path of its VMs or the leader's"
        live = next((t for t in _grid(world, ev.removed, gone) if any(world.live(vm, t) for vm in ev.resources)),
                    None)
        if live is None:
            none = Fault("no live agent among its VMs", ",".join(ev.resources), ev.removed, gone, gone,
                         "nobody could see it go: excused by L2")
            found.misses.append(Miss("L2", ev, ev.removed, ev.removed + bound, none.kind,
                                     f"{what}: {none.describe(origin)}", none))
            return
        if live > ev.removed:
            path.append(Fault("no live agent among its VMs", ",".join(ev.resources), ev.removed, live, live,
                              "its closer could not see it go"))
    clock, pushed = _clock(path + blind, ev.removed, gone, bound)
    if gone > clock + bound:
        found.misses.append(Miss("L2", ev, ev.removed, clock + bound, "unexplained",
                                 f"{what}; no fault on {whose} explains it"))
    elif pushed is not None:
        found.misses.append(Miss("L2", ev, ev.removed, clock + bound, pushed.kind,
                                 f"{what}: {pushed.describe(origin)}", pushed))


def _grid(world: _World, start: float, end: float) -> list[float]:
    """The instants of the run's grid from ``start`` (included) to ``end`` (excluded)."""
    i = max(0, math.ceil((start - world.origin) / STEP - 1e-9))
    times = []
    while world.at(i) < end:
        times.append(world.at(i))
        i += 1
    return times


def liveness(ctx: Context) -> Liveness:
    """Judge L1 for every event with notice and L2 for every record seen open. Pure: reads ``ctx`` only."""
    found = Liveness()
    if not ctx.events:
        return found
    world = _World(ctx)
    for ev in sorted(ctx.events.values(), key=lambda e: e.created):
        if not ev.without_notice:
            _judge_event(world, ev, found)
        _judge_record(world, ev, found)
    found.misses.sort(key=lambda m: m.due)
    return found
