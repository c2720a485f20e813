"""The checks of S1-S3: drain before an approval, stay drained while the event is present, and no
approval from an agent that was paused or whose ZooKeeper session had lapsed.

* ``s1``: an approval of event E received while a VM of E's Resources that runs an agent had no ack
  node created before it, or had answered its probe 200 less than the drain wait before it. In a run
  whose agents drain through the load balancer's admin state (``Observations.admin_states``), the VM
  must be out of the load balancer at the approval: effective admin state ``Down`` across it takes it
  out whatever its probe says; otherwise (``None``, or not seen Down) it is still routed to if its
  probe passed as above, if its admin state was ``Up``, or if HAProxy had it UP on both sides of the
  approval.
* ``s2``: a VM answered 200 while an event it had drained for was still present; and, once every fault
  is healed and no event is left, every VM serves and is UP in HAProxy (in a run with HAProxy), and has
  its effective admin state back to ``None`` (in a run with admin state), within the recovery bound.
* ``s3``: an approval received from a VM whose agent process was stopped at that moment, or whose
  session had lapsed and had not been re-established.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import Any

from tests.oracle.context import (
    EARLY_RESULTS,
    Context,
    Series,
    approvals,
    clean_reads,
    pause_windows,
    zk_blind_at,
)
from tests.oracle.report import Violation, timeline

__all__ = ["s1", "s2", "s3"]


# -- S1 ---------------------------------------------------------------------------------------------------


def s1(ctx: Context) -> list[Violation]:
    found = []
    tol = ctx.settings.probe_tolerance_seconds
    for approval in approvals(ctx.obs.sim_log):
        t = float(approval["t"])
        for event_id, result in (approval.get("results") or {}).items():
            event = ctx.events.get(str(event_id).upper())
            if event is None or result not in EARLY_RESULTS:
                continue
            wait = ctx.settings.drain_wait(event.event_type)
            for vm in event.resources:
                if vm not in ctx.agent_vms:
                    continue
                problems = []
                acks = [n for n in ctx.obs.nodes if n.kind == "ack" and (n.event_id or "").upper() == event.event_id
                        and (n.vm or "").lower() == vm and n.ctime <= t + 0.001
                        and (n.gone_seen is None or n.gone_seen > t)]
                # No ack seen is a fact only where the recorder was reading: an ack made and removed
                # while it could not (ZooKeeper without quorum, its session moving) was never seen. The
                # statistics count such approvals (``approval_posts_while_zk_blind``).
                if not acks and not zk_blind_at(ctx.obs, t):
                    problems.append(f"{vm} had not acknowledged it (no ack node created before the approval)")
                problems.extend(_still_routed(ctx, vm, t, wait, tol))
                for problem in problems:
                    found.append(Violation(
                        "S1", t,
                        f"{event.event_type} {event.event_id} approved by {approval['vm']} while {problem}",
                        timeline(ctx, t - wait - 6, t + 2, set(event.resources) | {str(approval["vm"])},
                                  [event.event_id]),
                    ))
    return found


def _still_routed(ctx: Context, vm: str, t: float, wait: float, tol: float) -> list[str]:
    """Why the load balancer may still have sent ``vm`` new flows at the approval at ``t``: its probe passed
    less than the drain wait before (the probe's lag); with admin-state samples, unless it was ``Down``
    across the approval, also an admin state ``Up`` or HAProxy UP on both sides of it."""
    admin = bool(ctx.admin)
    state = ctx.admin_state(vm, t) if admin else None
    if state == "Down":
        return []  # out of the load balancer whatever the probe says
    said = f" (its effective admin state {state})" if state else " (its effective admin state not seen Down)"
    problems = []
    last_ok = None
    for sample in reversed(ctx.probe(vm).between(t - wait - 5, t)):
        if sample.code == 200:
            last_ok = sample
            break
    if last_ok is not None and t - last_ok.t < wait - tol:
        problems.append(f"{vm}'s probe still answered 200 {t - last_ok.t:.2f} s before the approval "
                        f"(drain wait {wait:g} s)" + (said if admin else ""))
    if not admin:
        return problems
    if state == "Up":
        problems.append(f"{vm} was still routed to by the load balancer: effective admin state Up (whatever "
                        "its probe says) across the approval")
    server = ctx.servers.get(vm, Series(()))
    before, after = server.before(t), server.after(t)
    if (before is not None and after is not None and after.t - before.t <= ctx.settings.server_sample_gap_seconds
            and before.up and after.up):
        problems.append(f"{vm} was still UP in HAProxy on both sides of the approval{said}")
    return problems


# -- S2 ---------------------------------------------------------------------------------------------------


def s2(ctx: Context) -> list[Violation]:
    found = []
    settings = ctx.settings
    tol = settings.probe_tolerance_seconds
    reads = clean_reads(ctx.obs.sim_log)
    for event in ctx.events.values():
        end = event.end(ctx.obs.ended_at)
        for vm in event.resources:
            if vm not in ctx.agent_vms:
                continue
            holds: list[tuple[float, str]] = []
            for node in ctx.obs.nodes:
                same = (node.event_id or "").upper() == event.event_id and (node.vm or "").lower() == vm
                if node.kind == "ack" and same:
                    holds.append((node.ctime, f"{vm} acknowledged it"))
            if event.started is not None:
                seen = [r for r in reads.get(vm, ()) if event.started + 0.2 <= r < end]
                if seen:
                    at = seen[0] - ctx.obs.started_at
                    holds.append((seen[0] + settings.reaction_seconds,
                                  f"{vm} was served a document showing it Started at t={at:.2f}s"))
            if not holds:
                continue
            since, why = min(holds)
            bad = [s for s in ctx.probe(vm).between(since + tol, end) if s.code == 200 and s.t_end < end - tol]
            if not bad:
                continue
            first = bad[0]
            found.append(Violation(
                "S2", first.t,
                f"{vm} answered its probe 200 while {event.event_type} {event.event_id} was still present "
                f"({len(bad)} sample(s), the event was removed "
                + (f"{end - first.t:.2f} s later" if event.removed is not None else "never") + f"); {why}",
                timeline(ctx, min(since, first.t) - 4, first.t + 3, {vm}, [event.event_id]),
            ))
    if ctx.obs.healed_at is not None:
        found.extend(_s2_recovery(ctx, ctx.obs.healed_at))
    return found


def _final_streak(samples: Sequence[Any], good: Any) -> float | None:
    """When the last unbroken run of good samples began (None: the last sample is not good)."""
    start = None
    for sample in samples:
        start = (sample.t if start is None else start) if good(sample) else None
    return start


def _s2_recovery(ctx: Context, healed: float) -> list[Violation]:
    found = []
    deadline = healed + ctx.settings.recovery_bound_seconds
    for vm in sorted(ctx.agent_vms):
        checks: list[tuple[str, list[Any], Callable[[Any], bool]]] = [
            ("serving (probe 200)", ctx.probe(vm).between(healed, ctx.obs.ended_at), lambda s: s.code == 200)]
        if ctx.servers:  # a run with HAProxy (a group without one is judged by its probes alone)
            checks.append(("UP in HAProxy", ctx.servers.get(vm, Series(())).between(healed, ctx.obs.ended_at),
                           lambda s: s.up))
        if ctx.admin:  # a run draining through admin state: every address back to None
            checks.append(("back to admin state None in the load balancer",
                           ctx.admin.get(vm, Series(())).between(healed, ctx.obs.ended_at),
                           lambda s: s.state == "None"))
        for what, samples, good in checks:
            if not samples:
                found.append(Violation("S2", healed, f"{vm}: no sample after every fault was healed to show it "
                                                     f"{what}", timeline(ctx, healed - 5, ctx.obs.ended_at, {vm})))
                continue
            back = _final_streak(samples, good)
            if back is None or back > deadline:
                late = "not at the end of the run" if back is None else f"only {back - healed:.1f} s after"
                found.append(Violation(
                    "S2", deadline,
                    f"{vm} was {what} {late} every fault was healed and no event was left "
                    f"(bound {ctx.settings.recovery_bound_seconds:g} s)",
                    timeline(ctx, healed - 5, ctx.obs.ended_at, {vm}),
                ))
    return found


# -- S3 ---------------------------------------------------------------------------------------------------


def _new_session_at(ctx: Context, vm: str, since: float, old_owner: int | None) -> float | None:
    """When ``vm``'s agent was a member again with a session other than ``old_owner``, after ``since``."""
    times = [n.ctime for n in ctx.obs.nodes if n.kind == "member" and (n.vm or "").lower() == vm
             and n.ctime > since and n.owner != old_owner]
    return min(times) if times else None


def _lapse_windows(ctx: Context) -> dict[int, list[tuple[float, float, str]]]:
    """Per PID, when it must not have sent an approval: paused, then (if its session lapsed meanwhile)
    until its member node came back under a new session."""
    settings = ctx.settings
    windows: dict[int, list[tuple[float, float, str]]] = defaultdict(list)
    for pid, pauses in pause_windows(ctx).items():
        vm = ctx.pid_vm.get(pid)
        for start, end, who in pauses:
            window_end, why = end, f"stopped by {who}"
            if vm is not None:
                members = [n for n in ctx.obs.nodes if n.kind == "member" and (n.vm or "").lower() == vm
                           and n.ctime <= start and (n.gone_seen is None or n.gone_seen > start)]
                if members:
                    old = max(members, key=lambda n: n.ctime)
                    # A node the session created after the pause proves it had not lapsed during it:
                    # ZooKeeper accepts no write from an expired session. Its leader may still expire it
                    # soon after (touches reach it late; expiry is on tick boundaries), within the slack.
                    alive_after = any(n.owner == old.owner and n.ctime > end for n in ctx.obs.nodes)
                    if (old.gone_seen is not None and not alive_after
                            and old.gone_seen <= end + settings.session_seen_slack_seconds):
                        back = _new_session_at(ctx, vm, start, old.owner)
                        if back is None or back > end:
                            window_end = back if back is not None else ctx.obs.ended_at
                            why += f"; its session 0x{old.owner:x} lapsed and no new session had joined yet"
            windows[pid].append((start + settings.signal_tolerance_seconds, window_end, why))
    for record in ctx.obs.harness:
        if record.kind != "session_expired":
            continue
        vm = record.target.lower()
        back = _new_session_at(ctx, vm, record.t, None)
        for process in ctx.obs.processes:
            if process.vm.lower() == vm and process.started <= record.t and (process.exited is None
                                                                               or process.exited > record.t):
                windows[process.pid].append((record.t + settings.signal_tolerance_seconds,
                                             back if back is not None else ctx.obs.ended_at,
                                             "its session was expired by the harness and not re-established"))
    return windows


def s3(ctx: Context) -> list[Violation]:
    found = []
    windows = _lapse_windows(ctx)
    for approval in approvals(ctx.obs.sim_log):
        t, vm = float(approval["t"]), str(approval["vm"]).lower()
        for process in ctx.obs.processes:
            if process.vm.lower() != vm or process.started > t or (process.exited is not None and process.exited < t):
                continue
            for start, end, why in windows.get(process.pid, ()):
                if start < t < end:
                    found.append(Violation(
                        "S3", t,
                        f"approval POST from {vm} (agent pid {process.pid}) for {','.join(approval['event_ids'])} "
                        f"while {why}",
                        timeline(ctx, start - 3, t + 2, {vm}, [str(e) for e in approval["event_ids"]]),
                    ))
    return found
