"""The faults a run injected, as the harness's log and the simulator's say: what each hit, when, and how
long its effects may last. The liveness judgement (``checks_liveness``) names them to explain a miss.

``faults(ctx)`` lists every ``Fault``: an agent killed (by the harness, or by an impact of an event:
either way its ZooKeeper session outlives the process), an agent stopped (SIGSTOP), a ZooKeeper server
down (quorum lost while another is down too), a ZooKeeper link of one agent cut, lossy one way or
delayed, each IMDS fault the simulator served to a VM, and each fault queued on the simulated ARM (or its
token endpoint), from the harness's ``arm_fault`` to its ``arm_fault_heal``: on every event's path, since
any drain through the load balancer's admin state may meet it. Each has the window it was on (``start`` to
``end``) and ``settle``: the latest its effects may still hold an approval back, by an explicit
allowance per kind (``allowance``). ``Leaders`` says which VM led the group at a time, from the leader
node's owner and the member nodes.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from dataclasses import dataclass

from tests.oracle.context import Context, pause_windows
from tests.oracle.records import OracleSettings

__all__ = ["ARM_FAULT", "Fault", "Leaders", "allowance", "faults", "on_path"]

ARM_FAULT = "ARM fault"

_LINK = {"zk_link_cut": "ZooKeeper link cut", "zk_link_oneway": "ZooKeeper link one-way loss",
         "zk_link_delay": "ZooKeeper link delayed"}
_RECONNECT_SECONDS = 1.0  # the agents' kazoo retries a lost connection at most a second apart


@dataclass(frozen=True)
class Fault:
    """One fault: ``kind`` (the cause a miss is counted under), what it hit (a VM, ``zk1``), when."""

    kind: str
    target: str
    start: float
    end: float  # healed (the agent a member again, the server back, the link whole), or the run's end
    settle: float  # the latest its effects may last
    detail: str = ""

    @property
    def on_zookeeper(self) -> bool:
        """A ZooKeeper server fault: on every event's path."""
        return self.kind.startswith("ZooKeeper server") or self.kind == "ZooKeeper quorum lost"

    @property
    def on_every_path(self) -> bool:
        """On the path of every event: ZooKeeper itself, or ARM (every drain through admin state uses it)."""
        return self.on_zookeeper or self.kind == ARM_FAULT

    def describe(self, origin: float) -> str:
        what = f"{self.kind} on {self.target}" + (f" ({self.detail})" if self.detail else "")
        return (f"{what} from t={self.start - origin:.2f}s to t={self.end - origin:.2f}s, its effects until "
                f"t={self.settle - origin:.2f}s")


def allowance(kind: str, settings: OracleSettings) -> float:
    """How long after a fault of ``kind`` ended its effects may still hold an approval back.

    * A few cycles for everything: the agent resumes, asks its peers' probes, and its approval waits for
      a document requested after the event became approvable (two cycles and a probe round).
    * ZooKeeper: a lost connection is retried within a second. A server restarted may make a new
      ZooKeeper leader, which gives every session a fresh timeout: a killed agent's session (its
      ``/leader``, its acks) may outlive it by a whole session from then.
    * IMDS: a failed read is retried after the agents' backoff.
    * ARM: a drain that met the fault retries until its deadline (then falls back to the probe alone),
      sleeping a Retry-After or a doubling back-off between tries: once the fault is cleared, its next
      try, the write's asynchronous operation and the drain are all within that deadline.
    """
    cycles = 2 * settings.poll_interval_seconds + settings.peer_probe_timeout_seconds
    if kind.startswith("ZooKeeper server") or kind == "ZooKeeper quorum lost":
        return settings.session_lapse_seconds + cycles
    if kind in _LINK.values():
        return _RECONNECT_SECONDS + cycles
    if kind == "IMDS fault":
        return settings.imds_backoff_seconds + cycles
    if kind == ARM_FAULT:
        return settings.arm_deadline_seconds + cycles
    return cycles


def _member_again(ctx: Context, vm: str, after: float) -> float | None:
    """When ``vm``'s agent was a member again (a member node created) after ``after``."""
    times = [n.ctime for n in ctx.obs.nodes if n.kind == "member" and (n.vm or "").lower() == vm and n.ctime > after]
    return min(times) if times else None


def _kills(ctx: Context) -> list[Fault]:
    """Agents killed: by the harness, or by the impact of an event (a Reboot, a Redeploy). Either way the
    process's session, with its acks and ``/leader`` if it led, lives on until the servers expire it."""
    settings, found = ctx.settings, []
    kills = [(r.t, r.target.lower(), "the harness") for r in ctx.obs.harness if r.kind == "sigkill"]
    kills += [(float(e["t"]), str(e["vm"]).lower(), f"the impact of {e.get('event_id')}") for e in ctx.obs.sim_log
              if e.get("kind") == "signal" and e.get("signal") == "SIGKILL" and e.get("result") == "sent"]
    done: set[tuple[str, int]] = set()
    for t, vm, by in sorted(kills):
        if (vm, round(t)) in done:  # an impact signals the agent and the app server: one kill of the VM
            continue
        done.add((vm, round(t)))
        back = _member_again(ctx, vm, t)
        end = back if back is not None else ctx.obs.ended_at
        settle = max(end, t + settings.session_lapse_seconds) + allowance("agent killed", settings)
        found.append(Fault("agent killed", vm, t, end, settle, f"by {by}"))
    return found


def _pauses(ctx: Context) -> list[Fault]:
    found = []
    for pid, windows in pause_windows(ctx).items():
        vm = ctx.pid_vm.get(pid)
        for start, end, who in windows:
            if vm is not None:
                found.append(Fault("agent stopped (SIGSTOP)", vm, start, end,
                                   end + allowance("agent stopped (SIGSTOP)", ctx.settings), f"by {who}"))
    return found


def _zookeeper(ctx: Context) -> list[Fault]:
    """Servers down, from the harness's ``zk_down`` to its ``zk_up``; where two were down at once, the
    ensemble had no quorum."""
    down: dict[str, float] = {}
    spans: list[tuple[float, float, str]] = []
    for record in sorted(ctx.obs.harness, key=lambda r: r.t):
        if record.kind == "zk_down":
            down.setdefault(record.target, record.t)
        elif record.kind == "zk_up" and record.target in down:
            spans.append((down.pop(record.target), record.t, record.target))
    spans += [(start, ctx.obs.ended_at, server) for server, start in down.items()]
    found = []
    for start, end, server in spans:
        quorum = any(s < end and start < e for s, e, other in spans if other != server)
        kind = "ZooKeeper quorum lost" if quorum else "ZooKeeper server down"
        found.append(Fault(kind, server, start, end, end + allowance(kind, ctx.settings)))
    return found


def _links(ctx: Context) -> list[Fault]:
    began: dict[str, tuple[float, str, str]] = {}
    found = []
    for record in sorted(ctx.obs.harness, key=lambda r: r.t):
        vm = record.target.lower()
        if record.kind in _LINK:
            began.setdefault(vm, (record.t, _LINK[record.kind], record.detail))
        elif record.kind == "zk_link_heal" and vm in began:
            start, kind, detail = began.pop(vm)
            found.append(Fault(kind, vm, start, record.t, record.t + allowance(kind, ctx.settings), detail))
    for vm, (start, kind, detail) in began.items():
        found.append(Fault(kind, vm, start, ctx.obs.ended_at, ctx.obs.ended_at, detail))
    return found


def _imds(ctx: Context) -> list[Fault]:
    """Each IMDS fault the simulator served to a VM (a status, a garbage body, a dropped or refused
    connection, a delayed answer; on a read or on an approval POST), when it served it."""
    found = []
    for entry in ctx.obs.sim_log:
        if entry.get("kind") != "fault" or not entry.get("vm") or entry.get("fault") == "refuse_ended":
            continue
        t = float(entry["t"])
        end = t + float(entry.get("seconds") or 0.0)
        what = f"{entry.get('fault')}" + (f" {entry['status']}" if entry.get("status") else "")
        found.append(Fault("IMDS fault", str(entry["vm"]).lower(), t, end,
                           end + allowance("IMDS fault", ctx.settings),
                           f"{what} on {entry.get('method') or 'its port'}"))
    return found


def _arm(ctx: Context) -> list[Fault]:
    """Each fault the harness queued on the simulated ARM or its token endpoint (``arm_fault``), until it
    cleared them (``arm_fault_heal``; the run's end if it never did). One at a time: a clearing ends every
    fault queued before it."""
    found = []
    open_faults: list[tuple[float, str, str]] = []
    for record in sorted(ctx.obs.harness, key=lambda r: r.t):
        if record.kind == "arm_fault":
            open_faults.append((record.t, record.target or "arm", record.detail))
        elif record.kind == "arm_fault_heal":
            for start, target, detail in open_faults:
                found.append(Fault(ARM_FAULT, target, start, record.t,
                                   record.t + allowance(ARM_FAULT, ctx.settings), detail))
            open_faults = []
    for start, target, detail in open_faults:
        found.append(Fault(ARM_FAULT, target, start, ctx.obs.ended_at, ctx.obs.ended_at, detail))
    return found


def faults(ctx: Context) -> list[Fault]:
    """Every fault of the run, by start."""
    return sorted([*_kills(ctx), *_pauses(ctx), *_zookeeper(ctx), *_links(ctx), *_imds(ctx), *_arm(ctx)],
                  key=lambda f: (f.start, f.kind, f.target))


class Leaders:
    """Which VM led the group when: the ``/leader`` node's owner session is a member node's."""

    def __init__(self, ctx: Context) -> None:
        owners = {}
        for node in ctx.obs.nodes:
            if node.kind == "member" and node.vm:
                owners[node.owner] = node.vm.lower()
        spans = sorted((n.ctime, n.gone_seen if n.gone_seen is not None else float("inf"), owners.get(n.owner))
                       for n in ctx.obs.nodes if n.kind == "leader")
        self._spans = [(start, end, vm) for start, end, vm in spans if vm is not None]
        self._starts = [start for start, _, _ in self._spans]
        self.seen = bool(self._spans)  # whether any VM was ever seen leading

    def at(self, t: float) -> str | None:
        index = bisect.bisect_right(self._starts, t) - 1
        while index >= 0:
            start, end, vm = self._spans[index]
            if start <= t < end:
                return vm
            index -= 1
        return None

    def during(self, lo: float, hi: float) -> set[str]:
        """Every VM that led at some moment of [lo, hi]."""
        return {vm for start, end, vm in self._spans if start <= hi and end >= lo}


def on_path(fault: Fault, vms: Iterable[str], leaders: Leaders) -> bool:
    """Whether ``fault`` hit the path of an approval that needs ``vms``: one of them, the VM that led
    the group while it lasted (the leader admits, and closes records), ZooKeeper itself, or ARM (any drain
    through admin state)."""
    return (fault.on_every_path or fault.target in set(vms)
            or fault.target in leaders.during(fault.start, fault.end))
