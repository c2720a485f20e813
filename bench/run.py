"""Benchmarks of the coordinator: measured here, kept in bench/results.json, written to docs/benchmarks.md.

    .venv/bin/python bench/run.py                       # every section (about 40 minutes on 2 cores)
    .venv/bin/python bench/run.py --only group          # one section again; the others are kept
    .venv/bin/python bench/run.py --quick               # fewer repetitions, to try the harness

Sections:
* ``decide``: the decision function (pure), small and large groups;
* ``cycle``: one agent cycle against a real ZooKeeper, IMDS answered in process;
* ``group``: three agent processes, the simulator and ZooKeeper: the approval gate's latency over
  hundreds of events, IMDS requests per VM, ZooKeeper writes per event, a watch storm, and an idle
  window beside Microsoft's sample loop (CPU, memory, ZooKeeper requests);
* ``detection``: from an event appearing to the affected VMs' probes failing, staggered or not, for
  3, 10 and 30 agents;
* ``footprint``: the idle footprint of ``coordinator run``: three agent processes beside Microsoft's sample
  loop (resident memory, CPU, wake-ups), and what the agent's imports alone hold;
* ``ceiling``: the throughput of a three-node ZooKeeper ensemble for the agents' request mix, raised in
  steps until p99 latency bends (``bench/zk_ceiling.py``, its load generated in Java by
  ``bench/zkload/ZkLoad.java``, which needs ``javac``); the fleet model divides by it;
* ``headline``: one maintenance story (a Freeze, a rolling Reboot, a Redeploy, a Preempt) under load
  through HAProxy, under four strategies (coordinated, admin-state, self-approve, wait), ``--headline-runs``
  times each;
* ``groups``: groups of ``--groups-sizes`` agent processes (default 10, 30, 100, 200), one simulator and
  one ZooKeeper, each through a story of 30-odd events judged by the chaos oracle (``bench/groups.py``;
  a 200-agent group takes about 20 minutes). Sizes measured before are kept. With ``--groups-hung K``,
  K agents of each group are hung (SIGSTOP) for the whole story and the peers' probe timeout is
  ``--groups-probe-timeout`` (5 s unless given): those runs are kept apart, by size and K
  (``results["groups"]["result"]["hung"]``), and leave the groups' table and its stamp as they were;
* ``several``: ``--several-groups`` groups of ``--several-size`` agent processes (default 10 of 10), each
  with its own simulator, on one three-server ensemble, their stories played together and each group
  judged by the chaos oracle, with what the ensemble served them all (``bench/several.py``);
* ``demo``: ``make demo``'s story ``--demo-runs`` times in a row (about 50 s each), each judged as the demo
  judges it (``bench/demo_runs.py``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import platform
import shlex
import signal
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.arm_writers import bench_arm_writers, render_arm_writers  # noqa: E402
from bench.demo_runs import bench_demo_runs, render_demo_runs  # noqa: E402
from bench.detection import bench_detection  # noqa: E402
from bench.event_cost import bench_event_cost, render_event_cost  # noqa: E402
from bench.fleet import SESSION_TIMEOUT, FleetRow, fleet_inputs, fleet_model  # noqa: E402
from bench.footprint import MEASURED_BEFORE, bench_footprint, render_footprint  # noqa: E402
from bench.group import bench_group, percentiles  # noqa: E402
from bench.groups import HUNG_PROBE_TIMEOUT, GroupConfig, config_summary, hung_key, render_groups, run_group  # noqa: E402
from bench.headline import bench_headline, render_headline  # noqa: E402
from bench.scale import bench_scale  # noqa: E402
from bench.several import render_several, run_several  # noqa: E402
from bench.zk_ceiling import bench_ceiling, passes  # noqa: E402
from coordinator.actions import ProbeAction, ProbeState  # noqa: E402
from coordinator.agent import Agent  # noqa: E402
from coordinator.decide import LocalState, Phase, Policy, Snapshot, decide  # noqa: E402
from coordinator.metrics import Metrics  # noqa: E402
from coordinator.models import Document, parse_document  # noqa: E402
from coordinator.store.base import ClusterView, ConnectionState, EventRecord  # noqa: E402
from coordinator.store.zookeeper import ZooKeeperStore  # noqa: E402
from coordinator.testbed.story import STEPS, STRATEGIES, StoryConfig  # noqa: E402
from coordinator.testbed.zookeeper import LocalEnsemble, LocalZooKeeper  # noqa: E402


def _document(vms: int, events: int) -> Document:
    return parse_document({"DocumentIncarnation": 9, "Events": [
        {"EventId": f"{i:08X}-0000-0000-0000-000000000000", "EventType": "Reboot", "EventStatus": "Scheduled",
         "Resources": [f"vm{(i * 2 + k) % vms}" for k in range(2)], "NotBefore": "Mon, 11 Apr 2039 22:26:58 GMT"}
        for i in range(events)]})


def bench_decide(repeat: int) -> list[dict[str, object]]:
    rows = []
    for vms, events in ((3, 1), (100, 20), (1000, 100)):
        document = _document(vms, events)
        members = frozenset(f"vm{i}" for i in range(vms))
        records = {e.event_id: EventRecord(e.event_id, "Reboot", tuple(e.resources), None, "vm0", 0.0,
                                           {r: 0.0 for r in e.resources}, None, None, 1.0)
                   for e in document.events}
        cluster = ClusterView(members, "vm0", True, records, ConnectionState.CONNECTED, members)
        snap = Snapshot("vm0", 1e9, 100.0, document, document, cluster)
        local = LocalState(phase=Phase.DRAINED)
        samples = []
        for _ in range(repeat):
            started = time.perf_counter()
            decide(snap, local, Policy())
            samples.append((time.perf_counter() - started) * 1e6)
        rows.append({"group": f"{vms} VMs, {events} events", **percentiles(samples)})
    return rows


class _Imds:
    def __init__(self, document: Document) -> None:
        self.document = document

    def get_document(self) -> Document:
        return self.document

    def approve(self, event_ids: Sequence[str], *, fence: Any = None) -> None:
        return None


def bench_cycle(zk: LocalZooKeeper, repeat: int) -> list[dict[str, object]]:
    rows: list[dict[str, object]] = []
    for events in (0, 1, 20):
        store = ZooKeeperStore(zk.hosts, "/bench", f"c{uuid.uuid4().hex[:8]}", session_timeout=10,
                               operation_timeout=5)
        store.start()
        agent = Agent(vm="vm0", imds=_Imds(_document(3, events)), store=store, actions=[ProbeAction(ProbeState())],
                      policy=Policy(drain_wait=0, max_events=None), metrics=Metrics(CollectorRegistry()))
        for _ in range(5):
            agent.cycle()  # publish records, settle the phase
        samples = []
        for _ in range(repeat):
            started = time.perf_counter()
            agent.cycle()
            samples.append((time.perf_counter() - started) * 1e3)
        store.stop()
        rows.append({"events in the document": events, **percentiles(samples)})
    return rows


# -- results and the document ---------------------------------------------------------------------------

RESULTS = ROOT / "bench" / "results.json"
SECTIONS = ("decide", "cycle", "group", "footprint", "detection", "scale", "headline", "ceiling", "groups", "several",
            "demo", "arm", "cost")


def _machine() -> str:
    cores = Path("/proc/cpuinfo").read_text().count("processor\t")
    model = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                  if line.startswith("model name")), platform.machine())
    mem = int(next(line.split()[1] for line in Path("/proc/meminfo").read_text().splitlines()
                   if line.startswith("MemTotal"))) / 1024 / 1024
    return f"{model}, {cores} cores, {mem:.0f} GiB, {platform.python_implementation()} {platform.python_version()}"


def _table(rows: list[dict[str, object]], unit: str) -> str:
    keys = list(rows[0])
    head = "| " + " | ".join(f"{k} ({unit})" if k in ("p50", "p90", "p99", "max") else k for k in keys) + " |"
    lines = [head, "|" + "---|" * len(keys)]
    for row in rows:
        lines.append("| " + " | ".join(f"{v:.1f}" if isinstance(v, float) else str(v) for v in row.values()) + " |")
    return "\n".join(lines)


def _stamp(entry: dict[str, Any]) -> str:
    return f"Measured {entry['date']} with `{entry['command']}` on {entry['machine']}."


def render(results: dict[str, Any]) -> str:
    parts = ["""# Benchmarks

Every number below was measured on the machine named in its section, with the command given there; the
raw results are in `bench/results.json`. `.venv/bin/python bench/run.py` measures every section again
(`--only SECTION` one of them) and rewrites this file. Targets are those the project set itself; each is
stated next to what was measured, met or not.
"""]
    if "headline" in results:
        parts.append(render_headline(results["headline"]))
    if "decide" in results:
        entry = results["decide"]
        parts.append(f"""## Decision function

`decide()` for one snapshot, microseconds, {entry['repeat']} repetitions (pure Python, no I/O). {_stamp(entry)}

{_table(entry['rows'], 'µs')}
""")
    if "cycle" in results:
        entry = results["cycle"]
        parts.append(f"""## One agent cycle against a real ZooKeeper

Observe + decide + act, IMDS answered in process, milliseconds, {entry['repeat']} cycles, ZooKeeper on
loopback. Nothing changes between these cycles, so the cluster view is served from the watched cache:
this is the cost of a cycle woken by a reading that brings nothing new. {_stamp(entry)}

{_table(entry['rows'], 'ms')}
""")
    if "group" in results:
        parts.append(_render_group(results["group"]))
    if "ceiling" in results:
        parts.append(_render_ceiling(results["ceiling"]))
    if "group" in results or "ceiling" in results:
        parts.append(_render_fleet(results))
    if "footprint" in results:
        parts.append(render_footprint(results["footprint"], _stamp(results["footprint"])))
    if "detection" in results:
        parts.append(_render_detection(results["detection"]))
    if "scale" in results:
        parts.append(_render_scale(results["scale"]))
    if "several" in results:
        parts.append(render_several(results["several"]))
    if "groups" in results:
        parts.append(render_groups(results["groups"]))
    if "demo" in results:
        parts.append(render_demo_runs(results["demo"], _stamp(results["demo"])))
    if "arm" in results:
        parts.append(render_arm_writers(results["arm"], _stamp(results["arm"])))
    if "cost" in results:
        parts.append(render_event_cost(results["cost"], _stamp(results["cost"])))
    return "\n".join(parts)


def _render_fleet(results: dict[str, Any]) -> str:
    """What a fleet of 10,000 VMs would ask of one ensemble in its busiest hour (``bench/fleet.py``): the
    measured cost of an event per group size (``results["cost"]``), the ceiling from ``results["ceiling"]``."""
    ceiling_entry = (results.get("ceiling") or {}).get("result") or {}
    ceiling = ceiling_entry.get("ceiling")
    rows = fleet_model(ceiling, fleet_inputs(results))
    lines = [_fleet_line(row) for row in rows] or ["| - | - | not measured (`bench/run.py --only cost`) |"
                                                   + " |" * 9]
    if ceiling:
        where = (f"the ceiling measured above, {ceiling:.0f} requests/s ({_generator(ceiling_entry)} on the same 2 "
                 "cores as the ensemble, shared with other work: a lower bound)")
    else:
        where = "no ceiling measured (`bench/run.py --only ceiling`): the fraction is left out"
    cost = results.get("cost") or {}
    stamp = _stamp(cost) if cost else ""
    measured = f" The event costs were {stamp[0].lower()}{stamp[1:]}" if stamp else ""
    pings = ""
    if rows and ceiling:
        per_s = rows[0].pings_per_s_fleet
        share = 100 * per_s / ceiling
        pings = (f"\n\nThe fleet's pings, listed apart: {per_s:.0f}/s, {share:.0f} % of the ceiling were "
                 "each as costly as a request of the measured mix. A ping writes nothing and sets no watch, but "
                 "what it costs a server was not measured: the model says nothing of it.")
    return f"""## What 10,000 VMs would cost one ensemble (a model from the numbers above)

`fleet_model` in `bench/fleet.py`, a pure function of the ceiling and of measured inputs only: per group
size and VMs per event, what one event cost the whole group in ZooKeeper requests, counted by the server
(the largest of the events measured in "What one event costs the group in ZooKeeper requests" below:
every request of every agent's session, writes included, pings excluded), and the group's idle cost. A
size not measured has no row. The busiest hour: every VM of the fleet in maintenance once, in events of
two VMs, and again in Freezes of 10 VMs: a group of N VMs has N / k events in the hour. Each event is
counted as it cost played alone; where events of one group overlap, each VM an event names also reads
the other's record (about five requests each, not measured apart). Sessions ping after a third of the
session timeout without traffic, {SESSION_TIMEOUT / 3:.1f} s with the product's default of {SESSION_TIMEOUT:g} s
(the model's `SESSION_TIMEOUT`): listed apart, as pings are not in the measured mix; what 10,000 sessions'
pings cost an ensemble is neither measured here (2 cores do not hold 10,000 sessions beside the servers)
nor sourced. Ceiling: {where}.{measured} Not measured: a fleet of this size.

{_FLEET_HEAD}
{chr(10).join(lines)}{pings}
"""


_FLEET_HEAD = (
    "| VMs per event | VMs per group | requests per event (measured) | idle requests/s per group | groups | "
    "events/s per group | requests/s per group | requests/s, fleet | pings/s, fleet | fraction of the ceiling | "
    "target: under 10 % | ceiling that would meet it |\n" + "|---" * 12 + "|")
_CEILING_HEAD = (
    "| offered (requests/s) | sent (requests/s) | achieved (requests/s) | p50 (ms) | p99 (ms) | writes p50 (ms) | "
    "writes p99 (ms) | "
    "watch notifications received/s | CPU cores: ZooKeeper servers 1, 2, 3 (* leader) | CPU cores: ZooKeeper, "
    "together | CPU cores: {generator} | CPU cores: machine, every process | CPU cores: others | "
    "CPU µs per answer: ZooKeeper | CPU µs per answer: generator | load average (1 min), read during the step | "
    "meets the ceiling's conditions |\n" + "|---" * 17 + "|")


def _generator(r: dict[str, Any], *, bold: bool = False) -> str:
    """Who generated the ceiling's load, as the report says it (results without ``generator``: Python)."""
    b = "**" if bold else ""
    if r.get("generator", "python") == "java":
        return (f"{b}{r['sessions']} sessions of ZooKeeper's Java client in one JVM{b} (`bench/zkload/ZkLoad.java`, "
                "asynchronous calls)")
    return f"{b}{r['sessions']} kazoo sessions in {r['workers']} worker processes{b}"


def _fleet_line(row: FleetRow) -> str:
    c = row.cost
    if row.fraction_of_ceiling is None:
        fraction, target = "-", "not measured"
    else:
        fraction = f"{100 * row.fraction_of_ceiling:.1f} %"
        target = _met(row.fraction_of_ceiling < 0.10)
    return (f"| {c.event_vms} | {c.size} | {c.requests_per_event:.0f} (largest of {c.events}) | "
            f"{c.idle_requests_per_s:.1f} | {row.groups} | {row.events_per_s_group:.4f} | "
            f"{row.requests_per_s_group:.1f} | {row.requests_per_s_fleet:.0f} | {row.pings_per_s_fleet:.0f} | "
            f"{fraction} | {target} | {10 * row.requests_per_s_fleet:.0f} |")


def _ceiling_sessions(r: dict[str, Any]) -> str:
    """The session timeout the ceiling's sessions had (results that do not say: 30 s, the default then);
    pings are not in the mix, so the ceiling does not rest on it."""
    if "session_timeout" not in r:
        return (f"sessions of {MEASURED_BEFORE:g} s, the product's default when measured ({SESSION_TIMEOUT:g} s "
                "now; pings are not in the mix)")
    measured = float(r["session_timeout"])
    if measured == SESSION_TIMEOUT:
        return f"sessions of {measured:g} s, the product's default"
    return f"sessions of {measured:g} s (the product's default is {SESSION_TIMEOUT:g} s; pings are not in the mix)"


def _render_ceiling(entry: dict[str, Any]) -> str:
    r = entry["result"]
    java = r.get("generator", "python") == "java"
    lines = []
    for step in r["steps"]:
        cpu = step["cpu_cores"]
        servers = sorted((k, v) for k, v in cpu.items() if k.startswith("zookeeper"))
        zk = sum(v for _, v in servers)
        each = ", ".join(f"{v:.2f}{'*' if k.endswith('(leader)') else ''}" for k, v in servers)
        generator = sum(v for k, v in cpu.items() if k.startswith(("worker", "generator")))
        machine = cpu.get("machine (every process)", float("nan"))
        achieved = step["achieved"] or float("nan")
        ok = passes(step, p99_limit_ms=r["p99_limit_ms"], tolerance=r["tolerance"])
        lines.append(
            f"| {step['offered']:.0f} | {sum(step['sent'].values()) / r['step_seconds']:.0f} | "
            f"{step['achieved']:.0f} | {step['p50_ms']:.1f} | {step['p99_ms']:.1f} | "
            f"{step['write_p50_ms']:.1f} | {step['write_p99_ms']:.1f} | {step['watch_events_per_s']:.0f} | "
            f"{each} | {zk:.2f} | {generator:.2f} | {machine:.2f} | {machine - zk - generator:.2f} | "
            f"{1e6 * zk / achieved:.0f} | {1e6 * generator / achieved:.0f} | "
            f"{', '.join(step['loadavg_1min'])} | {'yes' if ok else 'no'} |")
    sent = r["mix_sent"]
    total = sum(sent.values()) or 1
    mix = "\n".join(f"| {kind} | {r['mix'][kind] / 10:.1f} % | {100 * sent.get(kind, 0) / total:.1f} % |"
                    for kind in r["mix"])
    ratio = r["mix_ratio"]
    ceiling = r["ceiling"]
    said = (f"**{ceiling:.0f} requests/s**" if ceiling is not None else "**not reached**: no step met both conditions")
    stopped = f" The ramp stopped {r['stopped']}." if r.get("stopped") else ""
    notes = "".join(f"\n- {note}" for note in entry.get("notes", []))
    if java:
        driven = (f"{_generator(r, bold=True)}, one session per VM, compiled with `javac` by the benchmark against "
                  "the jars the servers run from; open loop: one thread sends the offered rate on a fixed schedule "
                  "whatever the answers")
        latency = "the call handed to the client to its completion callback (so the client's own queueing is in it)"
        generator_head = "generator (one JVM)"
    else:
        driven = (f"{_generator(r, bold=True)} (one session per VM, each group's sessions spread over every worker), "
                  "open loop: each worker sends its share of the offered rate on a fixed schedule whatever the "
                  "answers")
        latency = ("the request handed to kazoo to its completion callback in the worker (so the generator's own "
                   "queueing is in it)")
        generator_head = f"{r['workers']} workers"
    return f"""## The ceiling of a three-node ensemble for the agents' request mix

A three-node ZooKeeper ensemble on loopback (`LocalEnsemble`, ZooKeeper's defaults, each JVM
`-Xmx256m -XX:+UseSerialGC`), {r['groups']} groups of {r['group_size']} VMs laid out as the product lays them
out ({r['events_per_group']} event records per group, with `acks`, `admitted` and `approval`), driven by
{driven}; {_ceiling_sessions(r)}. Warm-up {r['warmup_seconds']:.0f} s, then steps of
{r['step_seconds']:.0f} s. Latency: from {latency}. The ceiling is the highest offered rate of a step
whose p99 is at most {r['p99_limit_ms']:.0f} ms and whose achieved rate (answers received within the step
/ its length) is within {100 * r['tolerance']:.0f} % of the offered rate: {said}.{stopped} {_stamp(entry)}

CPU per process over each step (`/proc/PID/stat`), in cores; 'others' is the busy CPU of the whole machine
(`/proc/stat`) minus the servers and the generator; CPU per answer is those cores divided by the achieved rate.
'sent' is what the generator managed to send: below the offered rate, its schedule fell behind.

{_CEILING_HEAD.format(generator=generator_head)}
{chr(10).join(lines)}

The mix, as configured (`MIX` in `bench/zk_ceiling.py`) and as sent over the steps: reads with a watch
{100 * ratio['reads']:.1f} %, writes {100 * ratio['writes']:.1f} %.

| request | configured | sent |
|---|---|---|
{mix}
{notes}
"""


def _render_scale(entry: dict[str, Any]) -> str:
    if entry.get("stopped") or "gate_ms" not in entry:  # a run that had to be stopped: what its rounds showed
        rounds = ", ".join(f"{n}/{entry['groups']}" for n in entry["approved_per_round"])
        title = f"{entry['groups']} groups of {entry['size']} agents on one ZooKeeper {_servers(entry)}"
        return f"""## Scale: {title}: not met

{entry['groups'] * entry['size']} agents in {entry['workers']} processes, {_simulators(entry)},
{_servers(entry, long=True)}, on this 2-core machine. {_stamp(entry)} Events approved within a minute, round by
round: {rounds}; the run was stopped after round {len(entry['approved_per_round'])} of {entry['rounds']}, the
group no longer keeping up. {entry.get('why', '')}
"""
    gate = percentiles(entry["gate_ms"])
    events = entry["groups"] * entry["rounds"]
    return f"""## Scale: {entry['groups']} groups of {entry['size']} agents on one ZooKeeper {_servers(entry)}

{entry['groups'] * entry['size']} agents in {entry['workers']} processes (each agent with its own IMDS client,
poller, ZooKeeper session, loop and executor; no HTTP surface and no peer probes, so the budget counts
VMs by their `/out` nodes), {_simulators(entry)}, {_servers(entry, long=True)}. {entry['rounds']} rounds; in
each, every group gets a Freeze on two of its VMs at once. Not judged by the chaos oracle: an event counts
as approved when the simulator logs its POST, as missed when it is not approved within a minute.
{_stamp(entry)}

| measure | p50 | p90 | p99 | max | n | target |
|---|---|---|---|---|---|---|
| gate: last ack's ZooKeeper ctime -> approval POST (ms) | {_fmt(gate)} | p99 < 100 ms: {_met(gate['p99'] < 100)} |

Events: {events}; missed (not approved within a minute): {len(entry['missed'])} (target 0: \
{_met(not entry['missed'])}); approved but not timed (the acks came and went between two looks of the
harness): {entry['unmeasured']}.
"""


def _servers(entry: dict[str, Any], *, long: bool = False) -> str:
    n = entry.get("ensemble", 1)
    if n > 1:
        return f"ensemble of {n} servers on this machine" if long else "ensemble"
    return "ZooKeeper server" if long else "server"


def _simulators(entry: dict[str, Any]) -> str:
    if entry.get("one_simulator"):
        return "one IMDS simulator in which each group is a delivery unit of its own (`--unit-size`)"
    return "one IMDS simulator per group"


def _fmt(stats: dict[str, float], digits: int = 1) -> str:
    return " | ".join(f"{stats[k]:.{digits}f}" for k in ("p50", "p90", "p99", "max")) + f" | {int(stats['n'])}"


def _met(ok: bool) -> str:
    return "met" if ok else "not met"


def _per_vm(values: dict[str, Any], fmt: str = "{}") -> str:
    return ", ".join(f"{vm} {fmt.format(v)}" for vm, v in sorted(values.items()))


def _render_group(entry: dict[str, Any]) -> str:
    r = entry["result"]
    gate = percentiles(r["gate_ms"])
    start = percentiles(r["schedule_to_start_s"])
    writes_target = 3 + 2 * r["event_resources"]
    cpu = dict(r["idle_cpu_s_per_hour"])
    reference = cpu.pop("reference", float("nan"))
    ratio = max(cpu.values()) / reference if reference else float("nan")
    rss = dict(r["idle_rss_mib"])
    reference_rss = rss.pop("reference", float("nan"))
    idle_reads = list(r["idle_zk_requests"].values())
    storm_rate = {vm: n / r["storm_seconds"] for vm, n in r["storm_reads"].items()}
    floor = r["rss_floor_mib"]
    rows = [
        ("ZooKeeper writes per event (zxid advance over the run / events; "
         f"{r['event_resources']} VMs per event)", f"{r['zk_writes_per_event']:.1f}",
         f"at most {writes_target}: {_met(r['zk_writes_per_event'] <= writes_target)}"),
        ("IMDS requests per VM, most in any 1 s window, during the events (GET and POST)",
         _per_vm(r["imds_max_per_window"]), "at most the cap (5)"),
        ("IMDS requests per VM per second, mean over the events", _per_vm(r["imds_rate"], "{:.2f}"), "about 1"),
        ("approval POSTs", str(r["imds_posts"]), f"one per event: {r['events']}"),
        (f"watch storm: {r['storm_watch_events']} node changes in {r['storm_seconds']:.0f} s; IMDS requests per "
         "VM per second", _per_vm(storm_rate, "{:.2f}"),
         f"at most 1: {_met(max(storm_rate.values()) <= 1 + 1 / r['storm_seconds'])}"),
        ("watch storm: closest two IMDS requests of a VM (s)", _per_vm(r["storm_min_gap_s"], "{:.3f}"), ""),
        ("ZooKeeper requests per agent per event (`cons` lcxid advance over the events / events)",
         ", ".join(f"{v:.1f}" for v in r["zk_requests_per_agent_per_event"].values()), ""),
        (f"idle: ZooKeeper requests per agent session over {r['idle_seconds']:.0f} s (`cons` lcxid advance)",
         ", ".join(str(v) for v in idle_reads), f"0: {_met(not any(idle_reads))}"),
        ("idle: CPU seconds per hour, agents", _per_vm(cpu, "{:.1f}"), ""),
        ("idle: CPU seconds per hour, Microsoft's sample loop (`bench/ms_sample.py`), same window",
         f"{reference:.1f}", ""),
        ("idle: CPU ratio, busiest agent / sample loop", f"{ratio:.2f}", f"at most 1: {_met(ratio <= 1)}"),
        ("idle: resident memory (VmRSS, MiB), agents; sample loop",
         f"{_per_vm(rss, '{:.1f}')}; {reference_rss:.1f}", f"under 40: {_met(max(rss.values()) < 40)}"),
        ("resident memory of an interpreter that only imports (MiB): " + ", ".join(floor),
         ", ".join(f"{v:.1f}" for v in floor.values()), ""),
    ]
    table = "\n".join(f"| {m} | {v} | {t} |" for m, v, t in rows)
    hops = r.get("gate_hops_ms") or {}
    if hops:
        table += "\n\nThe gate in hops (ms), from the approver's log lines and the simulator's log (`gate_hops` in " \
                 "`bench/group.py`); the hops do not add up to the gate exactly, each has its own events:\n\n" \
                 "| hop | p50 | p90 | p99 | max | n |\n|---|---|---|---|---|---|\n" + \
                 "\n".join(f"| {name} | {_fmt(percentiles(samples))} |" for name, samples in hops.items())
    notes = "".join(f"\n- {note}" for note in entry.get("notes", []))
    gates = r["gate_ms"]
    if len(gates) >= 40:
        first, last = percentiles(gates[:20]), percentiles(gates[-20:])
        grows = last["p50"] > 1.5 * first["p50"]
        notes += (f"\n- The gate {'grows' if grows else 'does not grow'} with the event records the group keeps "
                  f"(done records stay for `done_retention_seconds`, 7 days): p50 {first['p50']:.0f} ms over the "
                  f"first 20 events, {last['p50']:.0f} ms over the last 20. A change an agent is told of makes it "
                  "read again only the lists and the records whose watches fired.")
    busy_idle = {sid: n for sid, n in r["idle_zk_requests"].items() if n}
    if busy_idle:
        notes += (f"\n- Idle requests: {', '.join(str(n) for n in busy_idle.values())} from one session over the "
                  "idle window: the leader's sweep for done records to purge, every 5 minutes, reads every "
                  "record the group keeps (and then the view again), whether or not one is old enough. The "
                  "other agents sent none.")
    notes += (f"\n- Writes per event: {r['zk_writes_per_event']:.1f} for events on {r['event_resources']} VMs. The "
              "protocol records four moments per VM that the others must see, each before the next step: out of "
              "rotation (before the drain), drained (the ack), no longer drained (the ack withdrawn, before "
              "recovery) and back in rotation (after the return wait); and four per event: the record, the "
              "admission, the approval, done. The target of 3 + 2 per VM would need two of those moments merged.")
    notes += ("\n- Memory: an interpreter that only imports the four core dependencies and defines one pydantic model "
              f"is already at {floor.get('core dependencies', float('nan')):.1f} MiB here, one that imports the "
              f"agent's modules at {floor.get('agent modules', float('nan')):.1f} MiB; the threads and buffers of "
              "a running agent add the rest. Under 40 MiB is out of reach without dropping one of them.")
    return f"""## A group of three agents: the gate, IMDS, ZooKeeper, the idle footprint

Three agent processes (poll interval 1 s, drain wait 0.2 s), the IMDS simulator and one ZooKeeper server
on loopback; {r['events']} Freezes on two of the three VMs, one after the other (each approved, started,
gone and both VMs serving again before the next). {_stamp(entry)}

| measure | p50 | p90 | p99 | max | n | target |
|---|---|---|---|---|---|---|
| gate: last ack's ZooKeeper ctime -> approval POST in the simulator's log (ms) | {_fmt(gate)} | p99 < 20 ms: \
{_met(gate['p99'] < 20)} |
| event created -> Started (s) | {_fmt(start, 2)} | |

| measure | result | target |
|---|---|---|
{table}
{notes}
"""


def _render_detection(entry: dict[str, Any]) -> str:
    rows = []
    for row in entry["rows"]:
        n = row["agents"]
        target = 1000 / n + 50
        met = "" if not row["stagger"] else (" met" if row["p50"] <= target else " not met")
        goal = f"p50 <= {target:.0f} ms:{met}" if row["stagger"] else "baseline"
        rows.append(f"| {n} | {'on' if row['stagger'] else 'off'} | {row['p50']:.0f} | {row['p90']:.0f} | "
                    f"{row['max']:.0f} | {row['n']} | {goal} |")
    return f"""## Detection: an event appears -> every affected VM's probe fails

Each event names two VMs; the time runs from the simulator's log entry creating it to the later of the
two probes failing, asked from outside every 2 ms. Stagger on: polls spread over the second by rank, and
a VM reads at once when a peer publishes an event its own document does not show yet. Stagger off: every
agent reads only on its own polls (the loop before staggering). Events land at random points of the
second. {_stamp(entry)}

| agents | stagger | p50 (ms) | p90 (ms) | max (ms) | n | target |
|---|---|---|---|---|---|---|
{chr(10).join(rows)}

Each event is scheduled once every VM says `serving` again (its return wait over), so the budget is free
and what is measured is detection alone. With the default budget (`policy.keep_one_serving`) a VM drains
early only once the leader has admitted the event, so the path after the first poll that sees it is:
publish the record, the leader reads IMDS early and probes its peers, admits, and each named VM marks
itself out of rotation and fails its probe. Each of those hops is a watch, a ZooKeeper write or an HTTP
request; with 10 and 30 agent processes on 2 cores they queue behind each other. Not traced hop by hop.
"""


def groups_config(args: argparse.Namespace) -> GroupConfig:
    """The groups section's configuration from the command line: with ``--groups-hung`` K > 0, K hung
    agents and the peers' probe timeout ``--groups-probe-timeout``, 5 s unless given (long enough that
    waiting out a hung peer's probe shows in an approval's time)."""
    timeout = args.groups_probe_timeout
    if timeout is None and args.groups_hung > 0:
        timeout = HUNG_PROBE_TIMEOUT
    return GroupConfig(freezes=args.groups_freezes, idle_seconds=args.groups_idle, start_batch=args.groups_batch,
                       hung=args.groups_hung, peer_probe_timeout=timeout)


def _interrupted(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main() -> int:
    # SIGTERM stops a run like Ctrl-C does: every section stops what it started on its way out.
    signal.signal(signal.SIGTERM, _interrupted)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer repetitions and events (to try the harness)")
    parser.add_argument("--only", choices=SECTIONS, action="append", help="measure only this section (repeatable)")
    parser.add_argument("--events", type=int, default=200, help="events of the group section (default 200)")
    parser.add_argument("--idle", type=float, default=600.0, help="seconds of the idle window (default 600)")
    parser.add_argument("--footprint-idle", type=float, default=300.0,
                        help="seconds of the footprint section's idle window (default 300)")
    parser.add_argument("--sizes", default="3,10,30", help="group sizes of the detection section")
    parser.add_argument("--detection-events", type=int, default=20, help="events per detection group")
    parser.add_argument("--groups", type=int, default=20, help="groups of the scale section (default 20)")
    parser.add_argument("--size", type=int, default=10, help="agents per group in the scale section (default 10)")
    parser.add_argument("--workers", type=int, default=4, help="processes running the scale section's agents")
    parser.add_argument("--rounds", type=int, default=10, help="rounds of events in the scale section")
    parser.add_argument("--scale-ensemble", type=int, default=1,
                        help="ZooKeeper servers of the scale section: 1 (the shared server) or an ensemble of N")
    parser.add_argument("--scale-one-simulator", action="store_true",
                        help="the scale section's groups in one IMDS simulator, each group a delivery unit")
    parser.add_argument("--headline-runs", type=int, default=5,
                        help="repetitions of the headline story per strategy (default 5)")
    parser.add_argument("--headline-time-scale", type=float, default=60.0,
                        help="time scale of the headline story's notices (default 60)")
    parser.add_argument("--headline-steps", default=",".join(STEPS), help="the headline story's steps")
    parser.add_argument("--ceiling-generator", choices=("java", "python"), default="java",
                        help="the ceiling's load generator: one JVM (default) or kazoo in worker processes")
    parser.add_argument("--ceiling-workers", type=int, default=4,
                        help="processes of the ceiling's sessions (Python generator only)")
    parser.add_argument("--ceiling-sessions", type=int, default=200, help="sessions of the ceiling section")
    parser.add_argument("--ceiling-group-size", type=int, default=100, help="VMs (sessions) per group, ceiling")
    parser.add_argument("--ceiling-rates", default="500,1000,2000,3000,4000,5000,6000,8000,10000,12000,15000",
                        help="offered requests/s of the ceiling's steps")
    parser.add_argument("--ceiling-step-seconds", type=float, default=15.0, help="seconds per ceiling step")
    parser.add_argument("--ceiling-p99-ms", type=float, default=100.0, help="p99 limit of a step under the ceiling")
    parser.add_argument("--groups-sizes", default="10,30,100,200", help="agents per group of the groups section")
    parser.add_argument("--groups-freezes", type=int, default=22, help="Freezes in the groups story (default 22)")
    parser.add_argument("--groups-idle", type=float, default=60.0, help="idle seconds after each groups story")
    parser.add_argument("--groups-batch", type=int, default=20, help="agents the groups section starts at once")
    parser.add_argument("--groups-keep", type=Path, help="keep each group's files (logs, verdict) under this directory")
    parser.add_argument("--groups-note", default="", help="a note printed with the sizes measured in this run")
    parser.add_argument("--groups-hung", type=int, default=0,
                        help="agents of each group hung (SIGSTOP) for the whole story, on VMs no event names")
    parser.add_argument("--groups-probe-timeout", type=float,
                        help="the agents' policy.peer_probe_timeout_seconds (default: 5 with --groups-hung, "
                             "else the product's default)")
    parser.add_argument("--several-groups", type=int, default=10, help="groups of the several section (default 10)")
    parser.add_argument("--several-size", type=int, default=10, help="agents per group of the several section")
    parser.add_argument("--demo-runs", type=int, default=10, help="runs of the demo section (about 50 s each)")
    parser.add_argument("--cost-sizes", default="10,30,100,200", help="agents per group of the cost section")
    parser.add_argument("--cost-vms", default="2,10", help="VMs per event of the cost section")
    parser.add_argument("--cost-events", type=int, default=2, help="events per size and VMs of the cost section")
    parser.add_argument("--output", type=Path, default=ROOT / "docs" / "benchmarks.md")
    args = parser.parse_args()
    if args.quick:
        args.events, args.idle, args.detection_events, args.headline_runs = 10, 30.0, 4, 1
        args.footprint_idle = 30.0
        if args.groups_sizes == parser.get_default("groups_sizes"):
            args.groups_sizes, args.groups_idle = "10", 10.0
    repeat = 200 if args.quick else 2000
    sections = args.only or list(SECTIONS)
    command = shlex.join(["bench/run.py", *sys.argv[1:]])  # quoted as typed: the stamp can be run again as is
    results: dict[str, Any] = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    stamp = {"date": f"{datetime.now(UTC):%Y-%m-%d}", "command": f".venv/bin/python {command}",
             "machine": _machine()}

    def save() -> None:
        RESULTS.write_text(json.dumps(results, indent=1) + "\n")
        args.output.write_text(render(results))

    if "ceiling" in sections:
        print("bench: the ceiling of a three-node ensemble ...", flush=True)
        with tempfile.TemporaryDirectory(prefix="coordinator-bench-ceiling-") as work:
            rates = tuple(float(x) for x in args.ceiling_rates.split(",") if x)
            if args.quick:
                rates, args.ceiling_step_seconds = rates[:3], 5.0
            ceiling = bench_ceiling(Path(work), generator=args.ceiling_generator, workers=args.ceiling_workers,
                                   sessions=args.ceiling_sessions,
                                   group_size=args.ceiling_group_size, rates=rates,
                                   step_seconds=args.ceiling_step_seconds, p99_limit_ms=args.ceiling_p99_ms)
        results["ceiling"] = {**stamp, "result": ceiling, "notes": results.get("ceiling", {}).get("notes", [])}
        save()
    if "decide" in sections:
        print("bench: decision function ...", flush=True)
        results["decide"] = {**stamp, "repeat": repeat, "rows": bench_decide(repeat)}
        save()
    with tempfile.TemporaryDirectory(prefix="coordinator-bench-zk-") as tmp:
        zk = LocalZooKeeper(Path(tmp))
        zk.start()
        try:
            if "cycle" in sections:
                print("bench: agent cycle against ZooKeeper ...", flush=True)
                results["cycle"] = {**stamp, "repeat": repeat // 10, "rows": bench_cycle(zk, repeat // 10)}
                save()
            if "group" in sections:
                print(f"bench: a group of three, {args.events} events, then {args.idle:.0f} s idle ...", flush=True)
                result = bench_group(zk, events=args.events, idle_seconds=args.idle)
                results["group"] = {**stamp, "result": asdict(result), "notes": result.notes}
                save()
            if "footprint" in sections:
                print(f"bench: idle footprint, {args.footprint_idle:.0f} s ...", flush=True)
                results["footprint"] = {**stamp, **bench_footprint(zk, idle_seconds=args.footprint_idle)}
                save()
            if "scale" in sections:
                with tempfile.TemporaryDirectory(prefix="coordinator-bench-scale-") as work, \
                        contextlib.ExitStack() as servers:
                    target: LocalZooKeeper | LocalEnsemble = zk
                    if args.scale_ensemble > 1:
                        target = servers.enter_context(LocalEnsemble(Path(work) / "ensemble", args.scale_ensemble,
                                                                     tick_time_ms=2000))
                    results["scale"] = {**stamp, **bench_scale(target, Path(work), groups=args.groups, size=args.size,
                                                               workers=args.workers, rounds=args.rounds,
                                                               one_simulator=args.scale_one_simulator)}
                save()
            if "headline" in sections:
                config = StoryConfig(time_scale=args.headline_time_scale,
                                     steps=tuple(x for x in args.headline_steps.split(",") if x))
                print(f"bench: the headline story, {args.headline_runs} x {len(STRATEGIES)} strategies ...",
                      flush=True)
                began = time.monotonic()
                runs = bench_headline(zk, runs=args.headline_runs, config=config)
                results["headline"] = {**stamp, "repetitions": args.headline_runs, "config": asdict(config),
                                       "seconds": time.monotonic() - began, "runs": runs}
                save()
            if "detection" in sections:
                sizes = tuple(int(x) for x in args.sizes.split(","))
                results["detection"] = {**stamp, "rows": bench_detection(zk, sizes=sizes,
                                                                         events=args.detection_events)}
                save()
        finally:
            zk.stop()
    if "groups" in sections:
        group_config = groups_config(args)
        entry = results.setdefault("groups", {"result": {"sizes": {}}})
        if not group_config.hung:
            entry.update({**stamp, "config": config_summary(group_config)})
        for n in (int(x) for x in args.groups_sizes.split(",") if x):
            hung = f", {group_config.hung} of them hung" if group_config.hung else ""
            print(f"bench: a group of {n} agents{hung} through the story ...", flush=True)
            with tempfile.TemporaryDirectory(prefix=f"coordinator-bench-groups-{n}-") as tmp:
                name = f"group-{n}" + (f"-hung-{group_config.hung}" if group_config.hung else "")
                workdir = args.groups_keep / name if args.groups_keep else Path(tmp)
                workdir.mkdir(parents=True, exist_ok=True)
                figures = run_group(n, group_config, workdir=workdir)
            measured = {**stamp, "note": args.groups_note, **figures}
            if group_config.hung:
                entry["result"].setdefault("hung", {})[hung_key(n, group_config.hung)] = {
                    **measured, "config": config_summary(group_config)}
            else:
                entry["result"]["sizes"][str(n)] = measured
            save()
    if "several" in sections:
        print(f"bench: {args.several_groups} groups of {args.several_size} agents on one ensemble, the stories "
              "together ...", flush=True)
        with tempfile.TemporaryDirectory(prefix="coordinator-bench-several-") as tmp:
            workdir = args.groups_keep / "several" if args.groups_keep else Path(tmp)
            workdir.mkdir(parents=True, exist_ok=True)
            figures = run_several(args.several_groups, args.several_size, groups_config(args), workdir=workdir)
        results["several"] = {**stamp, "config": config_summary(groups_config(args)), "result": figures}
        save()
    if "demo" in sections:
        print(f"bench: the demo's story, {args.demo_runs} times in a row ...", flush=True)
        results["demo"] = {**stamp, **bench_demo_runs(args.demo_runs)}
        save()
    if "arm" in sections:
        with tempfile.TemporaryDirectory(prefix="coordinator-bench-arm-") as work:
            results["arm"] = {**stamp, **bench_arm_writers(Path(work))}
        save()
    if "cost" in sections:
        print("bench: what one event costs the group in ZooKeeper requests ...", flush=True)
        with tempfile.TemporaryDirectory(prefix="coordinator-bench-cost-") as work, \
                LocalZooKeeper(Path(work) / "zk", tick_time_ms=2000) as zk:
            measured = bench_event_cost(zk, Path(work), sizes=[int(x) for x in args.cost_sizes.split(",") if x],
                                        vms_per_event=[int(x) for x in args.cost_vms.split(",") if x],
                                        events=args.cost_events)
        # What the code before measured stays beside it (it is measured on that code, not here).
        results["cost"] = {**stamp, **measured, "before": results.get("cost", {}).get("before", {})}
        save()
    print(f"bench: wrote {RESULTS.relative_to(ROOT)} and {args.output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
