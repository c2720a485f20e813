"""Playing a chaos run's plan: the story of events and the fault steps, then healing every fault.

``FaultSteps`` plays each ``Step`` of the plan on a thread of its own at its time: it schedules and
cancels events in the IMDS simulator, kills an agent (a VM, the leader now, or a drained VM now) and
restarts it, pauses one with SIGSTOP, takes ZooKeeper servers down and back, adds IMDS faults, cuts,
delays or makes lossy one way the link between one agent and ZooKeeper (its proxy; IMDS stays reachable),
and (with ``admin_state``) queues a fault on the simulated ARM, its body as the plan has it (a fault on the
token endpoint followed by expiring every token issued so far), or turns a stretch of ARM behaving worse on and
off (409 while a write is in progress, small throttling buckets). Each ARM fault or stretch is recorded as
``arm_fault`` when it begins and ``arm_fault_heal`` once it and its effects are over (a slow operation's
after its ``seconds``), the way the oracle reads ARM faults, with what ARM answered meanwhile (``GET
/arm/calls``: whether any agent met it).
A VM a kill or pause holds is left alone by the other kills and pauses and by the supervisor; a link
fault holds the links (one at a time) but not the agent, which may still be killed or paused behind it.
Each fault is healed (an ARM fault cleared) at the end of its own window; at the end of the run's fault
window everything is healed, and the run waits until every event is gone and every VM is back.
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import threading
import time
from typing import Any

import httpx

from tests.chaos.observers import ZooKeeperRecorder
from tests.chaos.planning import (
    ARM_STRETCHES,
    LINK_FAULTS,
    Step,
    arm_linger_seconds,
    describe_arm_fault,
    describe_arm_stretch,
)
from tests.chaos.processes import RunProcesses
from tests.chaos.state import Abort

__all__ = ["FaultSteps", "arm_fault_count_kind"]


def arm_fault_count_kind(body: dict[str, Any]) -> str:
    """The name an ARM fault is counted under in a run's result: where, what, and its status or end
    (``arm_status_503``, ``token_unreachable``, ``arm_operation_end_Canceled``)."""
    where = "token" if body.get("target") == "token" else "arm"
    kind = f"{where}_{body.get('kind', 'status')}"
    for extra in ("status", "end"):
        if body.get(extra) is not None:
            kind += f"_{body[extra]}"
    return kind


class FaultSteps(RunProcesses):
    """The plan played on the run's processes, and every fault healed at the end."""

    # -- playing the plan ------------------------------------------------------------------------------------

    def _play(self, zk_recorder: ZooKeeperRecorder) -> None:
        for step in self.steps:
            delay = self.clock.origin + step.at - time.time()
            if delay > 0:
                time.sleep(delay)
            if self._errors:
                raise Abort(self._errors[0])
            thread = threading.Thread(target=self._run_step, args=(step, zk_recorder), name=f"step-{step.kind}",
                                      daemon=True)
            thread.start()
            self._step_threads.append(thread)
        remaining = self.config.duration - self.clock.rel()
        if remaining > 0:
            time.sleep(remaining)
        for thread in self._step_threads:
            thread.join(120)
        if self._errors:
            raise Abort(self._errors[0])

    def _run_step(self, step: Step, zk_recorder: ZooKeeperRecorder) -> None:
        try:
            if step.kind == "event":
                self._schedule(step)
            elif step.kind == "cancel_event":
                self._cancel(self._labels.get(step.label), step.label)
            elif step.kind == "agent_kill":
                self._kill(step, zk_recorder)
            elif step.kind == "agent_pause":
                self._pause(step)
            elif step.kind == "zk_down":
                self._zk_down(step)
            elif step.kind == "imds":
                self._imds(step)
            elif step.kind in LINK_FAULTS:
                self._link_fault(step)
            elif step.kind == "arm_fault":
                self._arm_fault(step)
            elif step.kind == "arm_stretch":
                self._arm_stretch(step)
            elif step.kind == "cancel":
                label = f"extra-{step.at:.1f}"
                self._schedule(Step(step.at, "event", label=label, params=step.params))
                self.count("cancel")
                self._stopping.wait(step.seconds)
                self._cancel(self._labels.get(label), label)
        except Exception as exc:
            self.say(f"step failed: {step.describe()}: {type(exc).__name__}: {exc}")
            self.record("step_failed", step.target, detail=f"{step.describe()}: {exc}")

    def _schedule(self, step: Step) -> None:
        sim = self._cluster().sim
        assert sim is not None
        fields = {k: v for k, v in step.params.items() if k not in ("event_type", "resources")}
        view = sim.schedule(step.params["event_type"], step.params["resources"], **fields)
        self._labels[step.label] = view["event_id"]
        self.record("schedule", ",".join(step.params["resources"]), detail=f"{step.label} {view['event_id']} "
                    f"{view['event_type']} NotBefore {view.get('not_before_text') or '-'}")
        self.say(f"event: {step.describe()} -> {view['event_id']}, NotBefore {view.get('not_before_text') or '-'}")

    def _cancel(self, event_id: str | None, label: str) -> None:
        sim = self._cluster().sim
        assert sim is not None
        if event_id is None or sim.event(event_id) is None:
            self.say(f"cancel {label}: already gone")
            return
        sim.cancel(event_id)
        self.record("cancel", detail=f"{label} {event_id}")
        self.say(f"fault: cancel {label} ({event_id})")

    def _resolve(self, step: Step, zk_recorder: ZooKeeperRecorder) -> str | None:
        """The VM a step hits: its target, the leader now, or a drained VM now; else its fallback."""
        candidates: list[str] = []
        if step.target == "leader":
            leader = zk_recorder.leader_vm()
            candidates = [leader] if leader else []
        elif step.target == "drained":
            deadline = time.monotonic() + 3.0
            while time.monotonic() < deadline and not candidates:
                candidates = self._drained_vms()
                if not candidates:
                    time.sleep(0.2)
        else:
            candidates = [step.target]
        if step.fallback:
            candidates.append(step.fallback)
        with self._lock:
            free = [vm for vm in candidates if vm not in self._busy]
        return free[0] if free else None

    def _drained_vms(self) -> list[str]:
        sim = self._cluster().sim
        assert sim is not None
        named = {r.lower() for e in sim.events().get("events", []) for r in e["resources"]}
        with self._lock:
            latest: dict[str, int | None] = {}
            for sample in self.probes[-80:]:
                latest[sample.vm] = sample.code
        return sorted(vm for vm, code in latest.items() if code == 503 and vm in named)

    def _kill(self, step: Step, zk_recorder: ZooKeeperRecorder) -> None:
        vm = self._resolve(step, zk_recorder)
        if vm is None:
            self.say(f"fault skipped (its target is held by another fault): {step.describe()}")
            self.record("skipped", step.target, detail=step.describe())
            self.count(step.kind, skipped=True)
            return
        cluster = self._cluster()
        with self._vm_locks[vm]:
            self._busy.add(vm)
            proc = cluster.agents[vm].proc
            if proc is None or proc.poll() is not None:
                self._busy.discard(vm)
                self.say(f"fault skipped ({vm}'s agent is not running): {step.describe()}")
                self.count(step.kind, skipped=True)
                return
            why = {"leader": " (the leader)", "drained": " (drained)"}.get(step.target, "")
            self.count(step.kind)
            self.record("sigkill", vm, proc.pid, f"restart after {step.seconds:.1f}s{why}")
            proc.send_signal(signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(5)
            self._register(vm)  # after the wait: a PID registered past its process's end may be reused
            self._note_exit(vm, proc)
        self.say(f"fault: SIGKILL {vm}{why} (pid {proc.pid}), restart in {step.seconds:.1f}s")
        self._stopping.wait(step.seconds)
        try:
            with self._vm_locks[vm]:
                self._start_agent(vm)
            self.say(f"heal: {vm}'s agent restarted (pid {cluster.agents[vm].pid})")
        finally:
            with self._lock:
                self._busy.discard(vm)

    def _pause(self, step: Step) -> None:
        vm = step.target
        cluster = self._cluster()
        with self._vm_locks[vm]:
            if vm in self._busy:
                self.say(f"fault skipped (its target is held by another fault): {step.describe()}")
                self.count(step.kind, skipped=True)
                return
            proc = cluster.agents[vm].proc
            if proc is None or proc.poll() is not None:
                self.say(f"fault skipped ({vm}'s agent is not running): {step.describe()}")
                self.count(step.kind, skipped=True)
                return
            self._busy.add(vm)
            self.count(step.kind)
            self.record("sigstop", vm, proc.pid, f"for {step.seconds:.1f}s")
            proc.send_signal(signal.SIGSTOP)
        longer = " (longer than its session timeout)" if step.seconds > self.config.session_timeout else ""
        self.say(f"fault: SIGSTOP {vm} for {step.seconds:.1f}s{longer}")
        try:
            self._stopping.wait(step.seconds)
        finally:
            with self._vm_locks[vm]:
                if proc.poll() is None:
                    self.record("sigcont", vm, proc.pid)
                    proc.send_signal(signal.SIGCONT)
                with self._lock:
                    self._busy.discard(vm)
            self.say(f"heal: SIGCONT {vm}")

    def _zk_down(self, step: Step) -> None:
        with self._zk_lock:
            spec = step.target.removeprefix("zk:")
            if spec == "leader":
                leader = self.ensemble.leader_index()
                indexes = [leader if leader is not None else 0]
            else:
                indexes = [int(i) for i in spec.split(",")]
            self.count("zk_down" if len(indexes) == 1 else "zk_down_no_quorum")
            for index in indexes:
                self.record("zk_down", f"zk{index}", self.ensemble.server(index).pid)
                self.ensemble.kill(index)
            self.say(f"fault: ZooKeeper server(s) {','.join(map(str, indexes))} down for {step.seconds:.1f}s"
                     + (" (no quorum)" if len(indexes) > 1 else ""))
            self._stopping.wait(step.seconds)
            for index in indexes:
                self._zk_restart(index)

    def _zk_restart(self, index: int) -> None:
        if self._stopping.is_set():
            return  # the run is ending: every server is stopped (or, for a shared ensemble, restarted) there
        for attempt in range(3):
            try:
                self.ensemble.restart(index, timeout=45)
                self.record("zk_up", f"zk{index}", self.ensemble.server(index).pid)
                self.say(f"heal: ZooKeeper server {index} back")
                return
            except RuntimeError as exc:
                self.say(f"ZooKeeper server {index} did not come back (attempt {attempt + 1}): {exc}")
        self._errors.append(f"ZooKeeper server {index} could not be restarted")

    def _imds(self, step: Step) -> None:
        sim = self._cluster().sim
        assert sim is not None
        p = step.params
        fault = p["fault"]
        if fault == "refuse":
            sim.refuse(p["vm"], p["seconds"])
        elif fault == "post":
            sim.add_fault("status", p["vm"], p["count"], status=p["status"], methods=("POST",))
        else:
            sim.add_fault(fault, p["vm"], p.get("count", 1), status=p.get("status"), seconds=p.get("seconds"),
                          field=p.get("field"))
        self.record("imds_fault", p["vm"] or "all", detail=step.describe())
        self.count(f"imds_{fault}")
        self.say(f"fault: {step.describe()}")

    def _named_vms(self) -> list[str]:
        sim = self._cluster().sim
        assert sim is not None
        return sorted({r.lower() for e in sim.events().get("events", []) for r in e["resources"]}
                      & set(self.config.vms))

    def _link_fault(self, step: Step) -> None:
        """Cut, delay or make lossy one way the link of one agent to ZooKeeper for ``step.seconds``, then heal
        it. The agent keeps running and keeps reaching IMDS; the harness's own ZooKeeper recorder has a
        direct link and sees what the servers see."""
        if not self.links:
            return
        vm = step.target
        if step.target == "named":
            named = self._named_vms()
            vm = named[int(step.params.get("pick", 0.0) * len(named)) % len(named)] if named else step.fallback
        if not self._link_lock.acquire(blocking=False):
            self.say(f"fault skipped (another link fault is still on): {step.describe()}")
            self.record("skipped", vm, detail=step.describe())
            self.count(step.kind, skipped=True)
            return
        try:
            link = self.links[vm]
            p = step.params
            named_now = vm in self._named_vms()
            if step.kind == "zk_link_cut":
                link.cut()
                what = "cut"
            elif step.kind == "zk_link_delay":
                link.delay(int(p["delay_ms"]))
                what = f"delay {p['delay_ms']} ms each way"
            elif p["direction"] == "up":
                link.loss_up()
                what = "one-way loss up (agent to ZooKeeper)"
            else:
                link.loss_down()
                what = "one-way loss down (ZooKeeper to agent)"
            past = step.kind != "zk_link_delay" and step.seconds > self.session_granted_ms / 1000.0
            detail = (f"{what} for {step.seconds:.1f}s"
                      + (f" (longer than the {self.session_granted_ms} ms session granted)" if past else "")
                      + (" while an event names it" if named_now else ""))
            self.record(step.kind, vm, detail=detail)
            self.count(step.kind)
            with self._lock:
                self.link_faults.append({"at": round(self.clock.rel(), 2), "kind": step.kind, "vm": vm,
                                         "seconds": round(step.seconds, 2), "how": what,
                                         "longer_than_session": past, "named_by_an_event": named_now})
            self.say(f"fault: ZooKeeper link of {vm}: {detail}")
            try:
                self._stopping.wait(step.seconds)
            finally:
                link.heal()
                stats = link.stats()
                self.record("zk_link_heal", vm, detail=f"after {what}")
                self.say(f"heal: ZooKeeper link of {vm} whole again (connections through it so far: "
                         f"{stats.accepted}, parked while cut {stats.parked}, of which gave up {stats.dropped_parked})")
        finally:
            self._link_lock.release()

    def _arm_fault(self, step: Step) -> None:
        """Queue ``step.params["body"]`` on the simulated ARM (``POST /arm/faults``, the body as the plan has
        it; then expiring every token issued so far when the step says ``expire_tokens``), leave it for
        ``step.seconds``, then clear every ARM fault (``DELETE /arm/faults``), whether or not it was met.
        Recorded as ``arm_fault`` and ``arm_fault_heal`` for the oracle: the heal once its effects are over
        (``arm_linger_seconds`` after the clearing), with what ARM answered since the fault was queued."""
        sim = self._cluster().sim
        assert sim is not None
        body = step.params["body"]
        target = str(body.get("target", "arm"))
        what = describe_arm_fault(body)
        linger = arm_linger_seconds(body)
        with self._arm_lock:
            before = self._arm_answers()
            response = self._arm_http.post(f"{sim.url}/arm/faults", json=body)
            if response.is_error:
                self.say(f"fault refused by the simulator ({response.status_code} {response.text[:200]}): "
                         f"{step.describe()}")
                self.record("skipped", target, detail=f"{step.describe()}: {response.status_code}")
                self.count("arm_fault", skipped=True)
                return
            expired = None
            if step.params.get("expire_tokens"):
                # The agents cache their tokens: expired once the fault is queued, the next ARM request of each
                # needs a new one, and meets the fault.
                answer = self._arm_http.post(f"{sim.url}/identities/expire-tokens")
                expired = answer.json().get("expired") if answer.status_code == 200 else None
            detail = what + (f", then every token expired ({expired})" if expired is not None else "")
            self.record("arm_fault", target, detail=f"{detail} for {step.seconds:.1f}s")
            self.count(arm_fault_count_kind(body))
            entry: dict[str, Any] = {"at": round(self.clock.rel(), 2), "seconds": round(step.seconds, 2),
                                     "body": dict(body)}
            if expired is not None:
                entry["tokens_expired"] = expired
            if linger:
                entry["linger_seconds"] = linger
            with self._lock:
                self.arm_faults.append(entry)
            self.say(f"fault: ARM {detail} for {step.seconds:.1f}s")
            try:
                self._stopping.wait(step.seconds)
            finally:
                if not linger:
                    self._clear_arm_faults("at the end of its window", answered=self._answered_since(before, entry))
                else:
                    cleared = self._clear_arm_faults("at the end of its window", record=False)
                    # An operation it slowed goes on, and later writes of the pool end behind it: ARM is not
                    # itself again until it is over.
                    self._stopping.wait(linger)
                    answered = self._answered_since(before, entry)
                    self.record("arm_fault_heal", "arm", detail=f"cleared at the end of its window ({cleared} "
                                f"still queued); the operations it slowed are over {linger:g}s later; {answered}")
                    self.say(f"heal: the ARM operations slowed by {what} are over ({answered})")

    def _arm_stretch(self, step: Step) -> None:
        """Turn a stretch of ARM behaving worse on (``POST`` of the stretch's ``on`` to its ``path``), leave it
        for ``step.seconds``, then undo it (its ``off``). Recorded as ``arm_fault`` and ``arm_fault_heal``,
        like an ARM fault."""
        sim = self._cluster().sim
        assert sim is not None
        stretch = step.params["stretch"]
        what = describe_arm_stretch(stretch)
        with self._arm_lock:
            before = self._arm_answers()
            response = self._arm_http.post(f"{sim.url}{stretch['path']}", json=stretch["on"])
            if response.is_error:
                self.say(f"stretch refused by the simulator ({response.status_code} {response.text[:200]}): "
                         f"{step.describe()}")
                self.record("skipped", "arm", detail=f"{step.describe()}: {response.status_code}")
                self.count(f"arm_{stretch['name']}", skipped=True)
                return
            self.record("arm_fault", "arm", detail=f"{what} for {step.seconds:.1f}s")
            self.count(f"arm_{stretch['name']}")
            entry = {"at": round(self.clock.rel(), 2), "seconds": round(step.seconds, 2), "stretch": stretch["name"],
                     "on": dict(stretch["on"])}
            with self._lock:
                self.arm_faults.append(entry)
            self.say(f"fault: ARM {what} for {step.seconds:.1f}s")
            try:
                self._stopping.wait(step.seconds)
            finally:
                answered = self._answered_since(before, entry)
                self._undo_arm_stretch(stretch, "at the end of its window", answered=answered)

    def _undo_arm_stretch(self, stretch: dict[str, Any], why: str, *, record: bool = True, answered: str = "") -> None:
        sim = self._cluster().sim
        assert sim is not None
        response = self._arm_http.post(f"{sim.url}{stretch['path']}", json=stretch["off"])
        done = "undone" if response.status_code == 200 else f"NOT undone ({response.status_code})"
        if record:
            self.record("arm_fault_heal", "arm", detail=f"{stretch['name']} {done} {why}" + (f"; {answered}"
                                                                                               if answered else ""))
        self.say(f"heal: ARM {stretch['name']} {done} {why}" + (f" ({answered})" if answered else ""))
        if response.status_code != 200:
            self._errors.append(f"ARM {stretch['name']} could not be undone: {response.status_code}")

    def _clear_arm_faults(self, why: str, *, record: bool = True, answered: str = "") -> int | None:
        sim = self._cluster().sim
        assert sim is not None
        response = self._arm_http.delete(f"{sim.url}/arm/faults")
        cleared: int | None = response.json().get("cleared") if response.status_code == 200 else None
        if record:
            self.record("arm_fault_heal", "arm", detail=f"{why}; {cleared} still queued, cleared"
                        + (f"; {answered}" if answered else ""))
        self.say(f"heal: ARM faults cleared {why} ({cleared} still queued" + (f"; {answered})" if answered else ")"))
        return cleared

    def _arm_answers(self) -> dict[str, int]:
        """How many answers of each kind and status the simulated ARM and its token endpoint gave so far (``GET
        /arm/calls``: ``pool_put 502``, ``token dropped``, ``operation Failed``...); {} if it cannot tell."""
        sim = self._cluster().sim
        assert sim is not None
        try:
            response = self._arm_http.get(f"{sim.url}/arm/calls")
            statuses = response.json().get("statuses") if response.status_code == 200 else None
        except (httpx.HTTPError, ValueError):
            return {}
        return {str(k): int(v) for k, v in (statuses or {}).items()}

    def _answered_since(self, before: dict[str, int], entry: dict[str, Any]) -> str:
        """What ARM answered since ``before`` (whoever asked: the agents met the fault or stretch if any of it
        shows), kept in the run's ``arm_faults`` entry and said in a few words for the heal record."""
        now = self._arm_answers()
        answered = {k: n - before.get(k, 0) for k, n in sorted(now.items()) if n - before.get(k, 0) > 0}
        with self._lock:
            entry["answered"] = answered
        return "ARM answered meanwhile: " + (", ".join(f"{k} x{n}" for k, n in answered.items()) or "nothing")

    # -- healing ---------------------------------------------------------------------------------------------

    def _heal_and_settle(self) -> float | None:
        cluster = self._cluster()
        sim = cluster.sim
        assert sim is not None
        sim.clear_faults()
        if self.config.admin_state:
            with self._arm_lock:
                self._clear_arm_faults("at the end of the fault window")
                for stretch in ARM_STRETCHES:  # each undone at the end of its own window already: a safeguard
                    self._undo_arm_stretch(stretch, "at the end of the fault window", record=False)
        for vm, link in self.links.items():
            if link.state.describe() != "whole":
                link.heal()
                self.record("zk_link_heal", vm, detail="at the end of the fault window")
        for index, server in enumerate(self.ensemble.servers):
            if not server.running:
                self._zk_restart(index)
        self._wait(lambda: all(a.alive() for a in cluster.agents.values())
                   and all(app.poll() is None for app in cluster.apps.values()), 30, "every agent and app running")
        self.record("heal", detail="every fault healed")
        self.say("every fault healed; waiting for the events to end")
        if not self._wait(lambda: not sim.events().get("events"), 150, "every event to end", fail=False):
            return None
        healed = time.time()
        self.record("healed", detail="every fault healed and no event left")
        self.say("no event left; waiting for every VM to serve and be UP in HAProxy")
        self._wait(self._all_back, self.config.recovery_bound + 2, "every VM back", fail=False)
        time.sleep(1.5)
        return healed
