"""An independent judge of the safety invariants S1-S5 (``docs/safety.md``), from what is seen outside.

The oracle trusts no agent's own account. Its input is a record of what could be observed from outside
the agents during a run (``Observations``):

* the simulator's log: approvals received (with the VM whose port they came to, and when), every event's
  lifecycle (created, Started, removed, with its Resources), impacts and the signals they sent, faults
  served, and every request (to know which documents a VM was served);
* ZooKeeper nodes as an observer with its own session saw them: creation time (the server's ctime),
  owner session, when they were first seen and when they were first found gone; or, where the run kept
  ZooKeeper's transaction log, as the log records them (``history.from_txn_log``: created and deleted at
  the server's times, every node, the observer's first sightings kept);
* probe samples of every agent (about every 100 ms), HAProxy server states (``show servers state``),
  and the load sent through HAProxy (time, status, the server that answered);
* the harness's own log of what it did (signals, restarts, ZooKeeper servers down, simulator faults),
  the agent processes it started and how they ended, ``/status`` samples and the agents' log lines.

``check(observations)`` is a pure function of that record and returns a ``Verdict``: every violation,
each with the timeline around it (log lines and samples, sorted by time), and the run's statistics. The
rules (see ``docs/reliability.md``):

* S1: an approval of event E received while a VM of E's Resources that runs an agent had no ack node
  created before it, or had answered its probe 200 less than the drain wait before it.
* S2: a VM answered 200 while an event it had drained for was still present in the simulator (drained
  for E: its ack of E exists, or it was served a document showing E Started and naming it); and at the
  end, once every fault is healed and no event is left, every VM serves and is UP in HAProxy within a
  bound.
* S3: an approval received from a VM whose agent process was stopped (SIGSTOP) at that moment, or whose
  ZooKeeper session had lapsed (expired during the pause, or expired by the harness) and had not been
  re-established (no new member node yet).
* S4: an approval received while no VM was UP in HAProxy, or an admission made while no VM outside the
  event's Resources was; with ``max_events_in_maintenance: 1``, an early approval of an event while
  another event approved early is still present with a VM out of rotation.
* S5: an agent process that exited without being killed, a traceback in an agent log, an agent that did
  not stop cleanly when asked, or an agent whose completed cycles did not move for longer than the stall
  limit while it ran and was not paused.

An event that starts at its NotBefore without an approval is never a violation of S1-S5 by itself (Azure
starts it whatever the agents do), and a Started event created without notice (a hardware failure) is
counted apart.

Beside safety, liveness (``checks_liveness``, the class ``liveness``): an event with notice that stayed
allowable (its VMs' agents running and members, the budget with room, no operator's pause) for the L1
bound without an approval, no fault on its path explaining it, is an unexplained miss and a violation; so
is a record seen open (its admission or approval node) past the L2 bound after its event was gone. Misses
that a fault explains (``faults``) are counted by cause in the statistics, with the times from allowable
to approved. Liveness follows the run's delivery layout (``OracleSettings.units``, ``delivery``): whose
documents show an event decides when the leader may admit it, what holds the budget once it is gone, and
who closes its record; safety reads no layout.

The package's parts: ``records`` (the observations and their JSON form), ``history`` (the node history
from ZooKeeper's transaction log, in place of the observer's sightings), ``context`` (the ground truth
from the simulator's log and indexes over the samples), ``checks_s1_s3`` and ``checks_s4_s5`` (the
rules), ``faults`` (what the harness injected, and for how long its effects last), ``checks_liveness``
(L1, L2), ``stats`` (the run's statistics) and ``report`` (the verdict, its violations and their
timelines). This module holds ``check`` and re-exports what other code uses.
"""

from __future__ import annotations

from tests.oracle.checks_liveness import liveness
from tests.oracle.checks_s1_s3 import s1, s2, s3
from tests.oracle.checks_s4_s5 import s4, s5
from tests.oracle.context import Context
from tests.oracle.records import (
    HarnessRecord,
    LogLine,
    NodeSighting,
    Observations,
    OracleSettings,
    ProbeSample,
    ProcessRecord,
    RequestSample,
    ServerSample,
    StatusSample,
    dump,
    load,
)
from tests.oracle.report import TimelineEntry, Verdict, Violation
from tests.oracle.stats import statistics

__all__ = [
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
    "TimelineEntry",
    "Verdict",
    "Violation",
    "check",
    "dump",
    "load",
]


def check(observations: Observations) -> Verdict:
    """Judge one run's observations against S1-S5 and liveness (L1, L2 as observable). Pure: reads
    ``observations`` only. The statistics carry the liveness judgement under ``liveness``."""
    ctx = Context(observations)
    judged = liveness(ctx)
    violations = [*s1(ctx), *s2(ctx), *s3(ctx), *s4(ctx), *s5(ctx), *judged.violations(ctx)]
    violations.sort(key=lambda v: (v.t, v.invariant))
    stats = statistics(ctx)
    stats["liveness"] = judged.stats(ctx)
    stats["nodes_from"] = observations.nodes_from
    if observations.nodes_from_counts:
        stats["nodes_from_log"] = dict(observations.nodes_from_counts)
    return Verdict(tuple(violations), stats)
