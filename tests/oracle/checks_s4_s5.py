"""The checks of S4-S5: keep one serving and the events budget, and the agents' own health.

* ``s4``: an approval received while no VM was UP in HAProxy; an admission (the leader's ``admitted``
  node, which starts the early drains) while no VM outside the event's Resources was UP in HAProxy
  (``keep_one_serving``, the default); with ``max_events_in_maintenance: 1``, an early approval of an
  event while another event approved early is still present with a VM out of rotation (events of one
  budget unit, ``OracleSettings.budget_units``, count as one). In a run whose agents drain through the
  load balancer's admin state, a VM counts as in rotation (UP) only if its effective admin state is not
  ``Down`` either.
* ``s5``: an agent process that exited without being killed, a traceback in an agent log (or printed by
  one of its threads), an agent that did not stop cleanly when asked, or one whose completed cycles did
  not move for longer than the stall limit while it ran and was not paused.
"""

from __future__ import annotations

from collections import Counter, defaultdict

from tests.oracle.context import EARLY_RESULTS, Context, approvals, pause_windows
from tests.oracle.records import LogLine, ServerSample, StatusSample
from tests.oracle.report import FRAME, RAISED, Violation, timeline

__all__ = ["s4", "s5"]


# -- S4 ---------------------------------------------------------------------------------------------------


def _out_of_rotation(ctx: Context, vm: str, t: float) -> bool:
    sample = ctx.probe(vm).before(t)
    if sample is not None and sample.code != 200:
        return True
    if ctx.admin_down(vm, t):  # the load balancer sends it nothing new, whatever its probe and HAProxy say
        return True
    server = ctx.servers.get(vm)
    server_sample = server.before(t) if server is not None else None
    return server_sample is not None and not server_sample.up


Around = list[tuple[float, dict[str, ServerSample]]]


def _samples_around(ctx: Context, t: float) -> Around | None:
    """HAProxy's samples on both sides of ``t``, each with its time, if they are close enough to say what it
    did between."""
    around = ctx.servers_around(t)
    if len(around) < 2:
        return None
    (before_t, before), (after_t, after) = around
    if after_t - before_t > ctx.settings.server_sample_gap_seconds:
        return None
    return around if before and after else None


def _in_rotation(ctx: Context, name: str, sample: ServerSample, at: float) -> bool:
    """UP in HAProxy at ``at``, and (in a run with admin state) not Down in the load balancer then."""
    return sample.up and not ctx.admin_down(name, at)


def _labels(ctx: Context, around: Around) -> str:
    at, sample = around[0]
    return ", ".join(f"{n} {s.label}" + (" admin Down" if ctx.admin_down(n, at) else "")
                     for n, s in sorted(sample.items()))


def _admissions(ctx: Context) -> list[Violation]:
    """Keep one serving at admission: the samples on both sides of the leader's ``admitted`` node show no
    server UP outside the event's Resources, so the drains it starts would take out the last ones."""
    found = []
    for node in ctx.obs.nodes:
        event = ctx.events.get((node.event_id or "").upper())
        if node.kind != "admitted" or event is None:
            continue
        around = _samples_around(ctx, node.ctime)
        if around is None:
            continue
        if any(_in_rotation(ctx, name, s, at) and name not in event.resources
               for at, sample in around for name, s in sample.items()):
            continue
        found.append(Violation(
            "S4", node.ctime,
            f"admission of {event.event_type} {event.event_id} ({','.join(event.resources)}) while no VM outside "
            f"its Resources was UP in HAProxy{_admin_said(ctx)} ({_labels(ctx, around)})",
            timeline(ctx, node.ctime - 5, node.ctime + 2, set(ctx.servers), [event.event_id]),
        ))
    return found


def _admin_said(ctx: Context) -> str:
    return " and not Down in the load balancer" if ctx.admin else ""


def s4(ctx: Context) -> list[Violation]:
    found = _admissions(ctx)
    for approval in approvals(ctx.obs.sim_log):
        t = float(approval["t"])
        early = [str(e).upper() for e, r in (approval.get("results") or {}).items() if r in EARLY_RESULTS]
        if not early:
            continue
        # Keep one serving: the HAProxy samples on both sides of the approval show no server UP.
        around = _samples_around(ctx, t)
        if around is not None and not any(_in_rotation(ctx, name, s, at) for at, sample in around
                                          for name, s in sample.items()):
            found.append(Violation(
                "S4", t,
                f"approval of {','.join(early)} by {approval['vm']} while no VM was UP in HAProxy{_admin_said(ctx)} "
                f"({_labels(ctx, around)})",
                timeline(ctx, t - 5, t + 2, set(ctx.servers), early),
            ))
        # The events budget: two events approved early, both present with a VM out of rotation.
        if ctx.settings.max_events_in_maintenance != 1:
            continue
        units = ctx.settings.budget_units
        for event_id in early:
            for other in ctx.events.values():
                if other.event_id == event_id or not other.present(t):
                    continue
                if event_id in units and units.get(other.event_id) == units[event_id]:
                    continue  # one unit of the budget (a Terminate batch)
                if not any(a < t for a in other.early_approvals):
                    continue
                out = [vm for vm in other.resources if vm in ctx.agent_vms and _out_of_rotation(ctx, vm, t)]
                if not out:
                    continue
                event = ctx.events.get(event_id)
                vms = set(other.resources) | set(event.resources if event else ())
                found.append(Violation(
                    "S4", t,
                    f"{event_id} approved early by {approval['vm']} while {other.event_type} {other.event_id}, "
                    f"approved early, was still present with {','.join(out)} out of rotation "
                    "(max_events_in_maintenance: 1)",
                    timeline(ctx, min(other.early_approvals) - 2, t + 2, vms, [event_id, other.event_id]),
                ))
    return found


# -- S5 ---------------------------------------------------------------------------------------------------


def s5(ctx: Context) -> list[Violation]:
    found = []
    obs = ctx.obs
    kills: dict[int, list[float]] = defaultdict(list)
    terms: dict[int, list[float]] = defaultdict(list)
    for record in obs.harness:
        if record.pid is None:
            continue
        if record.kind == "sigkill":
            kills[record.pid].append(record.t)
        elif record.kind == "sigterm":
            terms[record.pid].append(record.t)
    for entry in obs.sim_log:
        if entry.get("kind") == "signal" and entry.get("signal") == "SIGKILL" and entry.get("result") == "sent":
            kills[int(entry["pid"])].append(float(entry["t"]))
    for process in obs.processes:
        if process.exited is None:
            continue
        # A signal counts for this process only within its life: its PID may have been another's before.
        killed = any(process.started - 0.5 <= k <= process.exited + 0.5 for k in kills.get(process.pid, ()))
        asked = any(process.started - 0.5 <= t <= process.exited + 0.5 for t in terms.get(process.pid, ()))
        if killed and process.returncode == -9:
            continue
        if asked and process.returncode == 0:
            continue
        if asked:
            problem = f"did not stop cleanly when asked (SIGTERM; exit status {process.returncode})"
        else:
            problem = f"exited unexpectedly with status {process.returncode}"
        found.append(Violation("S5", process.exited, f"agent of {process.vm} (pid {process.pid}) {problem}",
                               timeline(ctx, process.exited - 6, process.exited + 1, {process.vm})))
    found.extend(_stderr_tracebacks(ctx))
    # One violation per kind of logged traceback (where it was raised and what), with how often and where.
    tracebacks: dict[str, list[LogLine]] = defaultdict(list)
    for line in obs.agent_logs:
        if not line.stderr and ("Traceback" in line.text or "cycle failed unexpectedly" in line.text):
            tracebacks[_traceback_signature(line.text)].append(line)
    for signature, lines in tracebacks.items():
        first = min(lines, key=lambda line: line.t if line.t is not None else obs.ended_at)
        t = first.t if first.t is not None else obs.ended_at
        where = ", ".join(f"{vm} x{n}" for vm, n in sorted(Counter(line.vm for line in lines).items()))
        found.append(Violation("S5", t, f"traceback in agent logs ({where}): {signature}; first: {first.text[:1200]}",
                               timeline(ctx, t - 5, t + 1, {first.vm})))
    found.extend(_stalls(ctx))
    return found


def _stderr_tracebacks(ctx: Context) -> list[Violation]:
    """Tracebacks the interpreter printed to an agent's stderr (an uncaught exception in a thread). Lines
    of concurrent threads interleave, so they are counted, not reassembled: one violation for all, with
    how many per VM, what was raised and which of the project's frames were on the stack."""
    lines = [line for line in ctx.obs.agent_logs if line.stderr]
    starts = [line for line in lines if "Traceback (most recent call last)" in line.text]
    if not starts:
        return []
    raised: Counter[str] = Counter()
    frames: Counter[str] = Counter()
    for line in lines:
        if (frame := FRAME.search(line.text)) is not None:
            frames[f"{frame.group(1)} line {frame.group(2)} in {frame.group(3)}"] += 1
        elif not line.text.startswith("File ") and (exc := RAISED.search(line.text)) is not None:
            raised[exc.group(1)] += 1
    first = min(starts, key=lambda line: line.t if line.t is not None else ctx.obs.ended_at)
    t = first.t if first.t is not None else ctx.obs.ended_at
    where = ", ".join(f"{vm} x{n}" for vm, n in sorted(Counter(line.vm for line in starts).items()))
    summary = (f"{len(starts)} traceback(s) printed by agent threads ({where}); raised: "
               + (", ".join(f"{k} x{n}" for k, n in raised.most_common()) or "?")
               + "; in: " + (", ".join(f"{k} x{n}" for k, n in frames.most_common(4)) or "?"))
    return [Violation("S5", t, summary, timeline(ctx, t - 3, t + 1, {first.vm}))]


def _traceback_signature(text: str) -> str:
    """Where a traceback ends and what it raised: the same fault seen many times reads as one."""
    parts = [p.strip() for p in text.replace("\n", " | ").split(" | ") if p.strip()]
    frames = [p for p in parts if p.startswith("File ")]
    own = [p for p in frames if '"coordinator/' in p]
    frames = own or frames
    raised = [p for p in parts if not p.startswith(("File ", "Traceback", "-----", "Exception occurred"))
              and ("Error" in p or "Exception" in p)]
    return f"{frames[-1] if frames else '?'}: {raised[-1] if raised else parts[-1] if parts else '?'}"


def _stalls(ctx: Context) -> list[Violation]:
    found = []
    limit = ctx.settings.stall_seconds
    pauses = pause_windows(ctx)
    # By VM and PID: a PID is reused, and another VM's agent with an old one's PID is another process.
    by_pid: dict[tuple[str, int], list[StatusSample]] = defaultdict(list)
    for sample in ctx.obs.statuses:
        by_pid[(sample.vm, sample.pid)].append(sample)
    for (_, pid), samples in by_pid.items():
        samples.sort(key=lambda s: s.t)
        windows = [(a, b) for a, b, _ in pauses.get(pid, ())]
        progress_t: float | None = None  # the last time it was seen making progress (or resumed)
        known: int | None = None
        reported = False
        for sample in samples:
            if any(a <= sample.t <= b for a, b in windows):
                progress_t = None  # paused: no judgement
                continue
            if sample.cycles is not None and sample.cycles != known:
                known, progress_t, reported = sample.cycles, sample.t, False
                continue
            if progress_t is None:
                progress_t, reported = sample.t, False
                continue
            # A pause shorter than the sampling interval restarts the clock too.
            progress_t = max([progress_t] + [b for _, b in windows if progress_t <= b <= sample.t])
            if not reported and sample.t - progress_t > limit:
                reported = True
                found.append(Violation(
                    "S5", sample.t,
                    f"agent of {sample.vm} (pid {pid}) completed no cycle for {sample.t - progress_t:.1f} s "
                    f"while running and not paused (cycles stuck at {known})",
                    timeline(ctx, progress_t - 2, sample.t + 1, {sample.vm}),
                ))
    return found
