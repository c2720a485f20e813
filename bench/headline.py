"""The headline: one maintenance story under four strategies, repeated, measured in one run.

Each repetition plays the story of ``coordinator.testbed.story`` once per strategy (coordinated,
admin-state, self-approve, wait), in that order, each on a fresh group (this product's agents on the run's
ZooKeeper). Everything reported comes from the runs: the load generator's failures, the simulator's log,
and HAProxy's server states as a watcher polled them.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from coordinator.testbed.story import (
    AGENT_STRATEGIES,
    STRATEGIES,
    StoryConfig,
    drain_report,
    report,
    run_story,
    summarize,
)
from coordinator.testbed.zookeeper import LocalZooKeeper

__all__ = ["bench_headline", "render_headline"]


def bench_headline(zk: LocalZooKeeper, *, runs: int, config: StoryConfig,
                   progress: Callable[[str], None] = print) -> list[dict[str, Any]]:
    results: list[dict[str, Any]] = []
    for i in range(runs):
        for strategy in STRATEGIES:
            with tempfile.TemporaryDirectory(prefix="coordinator-headline-") as tmp:
                outcome = run_story(Path(tmp), strategy, config, zk_hosts=zk.hosts)
            view = outcome.view()
            results.append(view)
            progress(f"bench: headline {i + 1}/{runs} {strategy}: {view['sent']} requests, {view['failed']} failed, "
                     f"story {view['story_real_seconds']:.1f} s")
    return results


def render_headline(entry: dict[str, Any]) -> str:
    runs: list[dict[str, Any]] = entry["runs"]
    config = entry["config"]
    steps = tuple(config["steps"])
    summary = summarize(runs)
    scale = config["time_scale"]
    drain = config["drain_wait"]
    admin_wait = config.get("admin_drain_wait")
    arm_seconds = config.get("arm_async_seconds")
    notes = []
    coordinated = [r for r in runs if r["strategy"] == "coordinated"]
    if coordinated:
        drainable = [e for r in coordinated for e in r["events"] if r["drained_before_start"].get(e["event_id"])]
        lost = sum(e["failed"] for e in drainable)
        too_late = sorted({e["step"] for r in coordinated for e in r["events"]
                           if not r["drained_before_start"].get(e["event_id"])})
        notes.append(f"`coordinated` failed {lost} requests, over {len(coordinated)} runs, during the "
                     f"{len(drainable)} events whose notice left time to drain (notice / time scale >= the "
                     f"{drain:g} s drain wait)."
                     + (f" Events without that time: {', '.join(too_late)}: at a time scale of {scale:g} their "
                        "notice is shorter, in real seconds, than the drain, so every strategy loses the requests "
                        "HAProxy sends the VM before its checks mark it down." if too_late else ""))
    for strategy in ("coordinated", "self-approve"):
        if strategy in summary and "wait" in summary:
            factor = summary["wait"]["story_sim_seconds"]["median"] / summary[strategy]["story_sim_seconds"]["median"]
            notes.append(f"Story time, median: `wait` takes {factor:.1f} times as long as `{strategy}`.")
    self_runs = [r for r in runs if r["strategy"] == "self-approve"]
    if self_runs:
        freeze = [e["failed"] for r in self_runs for e in r["events"] if e["step"] == "freeze"]
        if freeze:
            notes.append(f"`self-approve` lost {min(freeze)} to {max(freeze)} requests per run on the Freeze: it "
                         "approves a Freeze at once, and the approval releases it for both VMs it names, neither "
                         "drained. Its events that name one VM each (the rollout, the Redeploy) it drains first, "
                         "and with no budget it does not wait for the previous VM to serve again, which is why "
                         "its story can end sooner than `coordinated`'s.")
    notes += _late_notes(runs, config)
    note_text = "\n".join(f"- {n}" for n in notes)
    return f"""## The headline: one maintenance story, {_count(summary)} strategies

Three VMs, each an app server behind a real HAProxy whose health check is that VM's probe (checks every
0.5 s, down after 2 failures, up after 2), {config['rate']:g} requests/s through HAProxy (a request not
answered 200 within {config['request_timeout']:g} s has failed), and the IMDS simulator with real impacts: a
Freeze pauses the VM's app server and agent for {config['freeze_seconds']:g} s, a Reboot, Redeploy or Preempt
kills them and the VM is back {config['down_seconds']:g} s later (its app and agent restarted). The story, each
step announced as the previous ends: {', '.join(steps)} (a Freeze on vm0 and vm1 with 15 minutes of notice;
a platform Reboot rolling through the three VMs, one fault domain each, 15 minutes each; a user Redeploy
of vm2, 10 minutes; a Preempt of vm1, 30 s). Notices run {scale:g} times faster than real time (the
simulator's clock); impacts, drains, the load balancer and the load run in real time. Every VM drains the
same way through its probe: it fails, then {drain:g} s pass (`admin-state` differs: see next).
Strategies: `coordinated` (this product's agents, default policy, probe only),
{_admin_text(summary, admin_wait, arm_seconds)}`self-approve` (each VM approves the
events naming it once drained, a Freeze at once), `wait` (never approves: events start at NotBefore).
Times are simulated seconds (real seconds x {scale:g}),
the story runs from the first notice to the last event gone and every VM back in rotation; notice
reclaimed is NotBefore minus the start, summed over the story. Medians, with (min-max) over the runs.
{entry['repetitions']} repetitions of the {_count(summary)} strategies, interleaved; the run took
{entry['seconds'] / 60:.0f} minutes. {_stamp(entry)} Other work shared the machine: timings are noisy.

{report(summary, steps)}

{note_text}
{_drain_section(summary)}"""


def _late_notes(runs: list[dict[str, Any]], config: dict[str, Any]) -> list[str]:
    """For this product's strategies: the events that started at NotBefore although their notice left time
    to drain (those are the ones the policy should have approved early), per step, in how many runs, and
    what held them as the agents recorded it (``EventOutcome.held_by``)."""
    notes = []
    for strategy in AGENT_STRATEGIES:
        mine = [r for r in runs if r["strategy"] == strategy]
        late: dict[str, int] = {}
        held: dict[str, list[str]] = {}
        for r in mine:
            waited = [e for e in r["events"] if e["start_reason"] == "not_before"
                      and r["drained_before_start"].get(e["event_id"])]
            for step in sorted({e["step"] for e in waited}):
                late[step] = late.get(step, 0) + 1
            for e in waited:
                why = e.get("held_by") or "nothing recorded"
                if why not in held.setdefault(e["step"], []):
                    held[e["step"]].append(why)
        if late:
            notes.append(f"`{strategy}`: events that started at NotBefore though their notice left time to "
                         f"drain: " + "; ".join(f"{step} in {n} of {len(mine)} runs (held by: "
                                                f"{' / '.join(held.get(step, [])) or 'nothing recorded'})"
                                                for step, n in late.items()) + ".")
    return notes


def _count(summary: dict[str, Any]) -> str:
    return {3: "three", 4: "four"}.get(len(summary), str(len(summary)))


def _admin_text(summary: dict[str, Any], wait: float | None, arm_seconds: float | None) -> str:
    if "admin-state" not in summary or wait is None or arm_seconds is None:
        return ""
    return (f"`admin-state` (the same agents with the `azure-lb` action beside the probe: each sets its VM's "
            f"address `Down` in one backend pool of the simulated ARM, which completes a write {arm_seconds:g} s "
            f"after the PUT and then drains the VM's HAProxy server, `set server ... state drain`; `None` on "
            f"recovery makes it ready again; drain wait {wait:g} s, counted from the start of the drain job, "
            f"which ends once ARM reports the write succeeded), ")


def _drain_section(summary: dict[str, Any]) -> str:
    """Notice to drained, as HAProxy showed it, for every strategy: admin state against the probe."""
    if not any(s["drained_events"] for s in summary.values()):
        return ""
    admin = summary.get("admin-state")
    probe = summary.get("coordinated")
    lines = ["", "### Draining: admin state against the probe", "",
             "When HAProxy stopped sending new requests to every VM an event names (a watcher polls each "
             "server's status every 0.05 s: `DOWN` is the probe's doing, after 2 failed checks 0.5 s apart; "
             "`DRAIN` is admin state `Down` applied by the simulated load balancer), counted only when that "
             "happened before the event started; real seconds from the notice, over every event of every run. "
             "A VM still out of rotation from the previous step when the notice came counts 0.", "",
             drain_report(summary), "",
             "What this comparison can show is bounded by the testbed: HAProxy checks the probe every 0.5 s "
             "(Azure's probe runs every 5 s at the least, 15 s by default) and the simulated ARM completes a "
             "write after a chosen delay, not a measured one; on Azure the probe's lag is longer and the "
             "write's time unknown here."]
    if admin is not None and probe is not None and admin["drained_events"] and probe["drained_events"]:
        lines += ["", f"Median notice -> drained: `admin-state` {admin['to_drained']['median']:.2f} s, "
                  f"`coordinated` {probe['to_drained']['median']:.2f} s; notice -> start "
                  f"{admin['to_start_real']['median']:.2f} s against {probe['to_start_real']['median']:.2f} s. "
                  f"Requests failed: {admin['failed']['median']:g} and {probe['failed']['median']:g} (median per "
                  f"run). Addresses left `Down` in the pool at the end of an `admin-state` run: "
                  f"{', '.join(admin['left_down']) or 'none'}; HAProxy commands of the simulator that failed: "
                  f"{admin['data_plane_failed']}."]
    return "\n".join(lines) + "\n"


def _stamp(entry: dict[str, Any]) -> str:
    return f"Measured {entry['date']} with `{entry['command']}` on {entry['machine']}."
