"""Many writers on one pool: K VMs of an N-VM backend address pool drain through admin state at once,
then recover, against the simulator's ARM (a real process, over HTTP).

Each writer is the product's own ``azure-lb`` action (``coordinator.runtime.build_azure_lb``: its own
managed identity from its VM's IMDS port, its own ARM client, the action's default deadline of 60 s and
client timeout of 10 s), on a thread of this process, released together by a barrier. All of them
read-modify-write the same pool, so every write but one of a round meets 412 (the etag moved) or, while
an operation on the load balancer runs, 409 ``AnotherOperationInProgress``.

What is judged, from the simulator's log of effective admin states (the data plane), never from the
action's own word: each address became effectively ``Down`` before its drain returned (before the VM
would acknowledge), and effectively ``None`` before its recovery returned; no drain fell back; at the end
every address of the pool is ``None``. Measured: each drain's and recovery's time, and ARM's answers by
kind and status (PUTs applied, 412s, 409s, 429s, reads, operation polls) as the simulator counted them.
"""

from __future__ import annotations

import statistics
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from azuresim.client import SimControl
from bench.simulator import start_simulator
from coordinator.actions.base import ActionContext
from coordinator.config import AzureLbActionConfig, Settings
from coordinator.runtime import build_azure_lb

__all__ = ["SETUPS", "WritersSetup", "bench_arm_writers", "render_arm_writers", "run_writers"]

POOL = ("/subscriptions/00000000-0000-0000-0000-000000000001/resourceGroups/rg-app/providers/Microsoft.Network/"
        "loadBalancers/lb-app/backendAddressPools/pool-web")


@dataclass(frozen=True)
class WritersSetup:
    """One measurement: ``writers`` of a ``pool_size`` pool; ARM's operations take ``async_seconds`` and
    ask for ``retry_after`` s between polls; ``conflict_while_updating``: 409 while an operation on the
    load balancer runs; ``throttling``: the simulator's token buckets (None: off)."""

    label: str
    pool_size: int = 100
    writers: int = 10
    async_seconds: float = 1.0
    retry_after: int = 1
    conflict_while_updating: bool = True
    throttling: dict[str, Any] | None = None


@dataclass
class _Writer:
    vm: str
    drain_s: float = 0.0
    recover_s: float = 0.0
    drain_returned: float = 0.0  # wall clock
    recover_returned: float = 0.0
    fallback: str | None = None
    error: str | None = None
    conflicts: int = 0
    extra: dict[str, Any] = field(default_factory=dict)


def _action(vm: str, urls: dict[str, str], arm_url: str) -> Any:
    settings = Settings.model_validate({"cluster": "bench", "vm_name": vm, "state_file": None, "actions": [{
        "type": "azure-lb", "backend_pools": [POOL], "backend_address": vm, "arm_url": arm_url,
        "imds_url": urls[vm], "fallback_wait_seconds": 0}]})
    item = settings.actions[0]
    assert isinstance(item, AzureLbActionConfig)
    return build_azure_lb(item, settings, on_failure=lambda cause: None)


def _together(writers: list[_Writer], actions: dict[str, Any], step: Callable[[_Writer, Any], None]) -> float:
    """Run ``step`` for every writer on its own thread, released at once; returns the wall time taken."""
    barrier = threading.Barrier(len(writers) + 1)

    def run(writer: _Writer) -> None:
        barrier.wait()
        try:
            step(writer, actions[writer.vm])
        except Exception as exc:  # reported per writer, judged below
            writer.error = f"{type(exc).__name__}: {exc}"

    threads = [threading.Thread(target=run, args=(w,), name=f"writer-{w.vm}") for w in writers]
    for thread in threads:
        thread.start()
    began = time.monotonic()
    barrier.wait()
    for thread in threads:
        thread.join()
    return time.monotonic() - began


def _drain(writer: _Writer, action: Any) -> None:
    began = time.monotonic()
    writer.fallback = action.drain(ActionContext(writer.vm, ()))
    writer.drain_returned = time.time()
    writer.drain_s = time.monotonic() - began


def _recover(writer: _Writer, action: Any) -> None:
    began = time.monotonic()
    action.recover(ActionContext(writer.vm, ()))
    writer.recover_returned = time.time()
    writer.recover_s = time.monotonic() - began


def _changed_at(log: list[dict[str, Any]], vm: str, after: str) -> float | None:
    """When the simulator's data plane made ``vm``'s address ``after`` (the last such change), or None."""
    times = [float(e["changed_t"]) for e in log if e.get("address") == vm and e.get("after") == after]
    return max(times) if times else None


def run_writers(workdir: Path, setup: WritersSetup) -> dict[str, Any]:
    """One measurement (see the module documentation); the figures and the verdict as a dict."""
    workdir.mkdir(parents=True, exist_ok=True)
    process, ready = start_simulator(
        workdir, [f"vm{i}" for i in range(setup.pool_size)],
        ["--rate-limit", "0", "--arm", "127.0.0.1:0", "--arm-async-seconds", f"{setup.async_seconds:g}",
         "--arm-retry-after", str(setup.retry_after)])
    control = SimControl(ready["control"])
    try:
        control.add_pool(POOL, [{"name": f"vm{i}", "ip_address": f"10.0.{i // 250}.{i % 250 + 4}"}
                                for i in range(setup.pool_size)])
        control.arm_settings(conflict_while_updating=setup.conflict_while_updating)
        if setup.throttling is not None:
            control.set_throttling(**setup.throttling)
        step = max(1, setup.pool_size // setup.writers)  # spread over the pool, as a Freeze's VMs would be
        writers = [_Writer(f"vm{i * step}") for i in range(setup.writers)]
        actions = {w.vm: _action(w.vm, ready["vms"], ready["arm"]) for w in writers}
        drain_wall = _together(writers, actions, _drain)
        after_drain = control.arm_calls()
        recover_wall = _together(writers, actions, _recover)
        calls = control.arm_calls()
        log = control.log(kind="admin_state")
        effective = control.pools()[POOL]["effective"]
        for w in writers:
            w.conflicts = actions[w.vm].conflicts
            down = _changed_at(log, w.vm, "Down")
            back = _changed_at(log, w.vm, "None")
            w.extra = {"down_before_return": down is not None and down <= w.drain_returned,
                       "none_before_return": back is not None and back <= w.recover_returned,
                       "down_lead_ms": None if down is None else round((w.drain_returned - down) * 1000),
                       "none_lead_ms": None if back is None else round((w.recover_returned - back) * 1000)}
    finally:
        control.close()
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    statuses = calls["statuses"]
    failures = [f"{w.vm}: {w.error}" for w in writers if w.error] + \
               [f"{w.vm}: drain fell back: {w.fallback}" for w in writers if w.fallback]
    failures += [f"{w.vm}: returned from its drain before the address was effectively Down"
                 for w in writers if not w.error and not w.fallback and not w.extra["down_before_return"]]
    failures += [f"{w.vm}: returned from its recovery before the address was effectively None"
                 for w in writers if not w.error and not w.extra["none_before_return"]]
    failures += [f"{vm}: {state} at the end" for vm, state in sorted(effective.items()) if state != "None"]

    def count(prefix: str, code: str, source: dict[str, int] = statuses) -> int:
        return int(source.get(f"{prefix} {code}", 0))

    def figures(values: list[float]) -> dict[str, float]:
        return {"p50": round(statistics.median(values), 2), "max": round(max(values), 2)}

    return {
        "setup": {"label": setup.label, "pool_size": setup.pool_size, "writers": setup.writers,
                  "async_seconds": setup.async_seconds, "retry_after": setup.retry_after,
                  "conflict_while_updating": setup.conflict_while_updating, "throttling": setup.throttling},
        "ok": not failures,
        "failures": failures,
        "drain_s": figures([w.drain_s for w in writers]),
        "recover_s": figures([w.recover_s for w in writers]),
        "drain_wall_s": round(drain_wall, 2),
        "recover_wall_s": round(recover_wall, 2),
        "down_lead_ms": figures([float(w.extra["down_lead_ms"]) for w in writers
                                 if w.extra["down_lead_ms"] is not None] or [0.0]),
        "puts_applied": count("pool_put", "200"),
        "puts_412": count("pool_put", "412"),
        "puts_409": count("pool_put", "409"),
        "answers_429": sum(n for k, n in statuses.items() if k.endswith(" 429")),
        "puts_applied_draining": count("pool_put", "200", after_drain["statuses"]),
        "pool_gets": int(calls["calls"].get("pool_get", 0)),
        "operation_gets": int(calls["calls"].get("operation_get", 0)),
        "arm_requests": int(calls["total_arm"]),
        "tokens": int(calls["calls"].get("token", 0)),
    }


SETUPS = (
    WritersSetup("10 of 100, ARM as documented (409 while an operation runs)"),
    WritersSetup("the same, throttled at Azure's documented bucket sizes",
                 throttling={"enabled": True}),
    WritersSetup("the same, throttled with small buckets (writes 3 + 1/s, reads 20 + 5/s)",
                 throttling={"enabled": True, "write_capacity": 3, "write_refill": 1.0,
                             "read_capacity": 20, "read_refill": 5.0}),
)


def bench_arm_writers(workdir: Path, setups: tuple[WritersSetup, ...] = SETUPS) -> dict[str, Any]:
    rows = []
    for n, setup in enumerate(setups):
        print(f"bench: many writers on one pool: {setup.label} ...", flush=True)
        rows.append(run_writers(workdir / f"setup{n}", setup))
    return {"rows": rows}


_HEAD = ("| setup | verdict | drain p50 / max (s) | recovery p50 / max (s) | PUTs applied | 412 | 409 | 429 | "
         "pool reads | operation polls | Down before the drain returned, p50 / max (ms) |")


def render_arm_writers(entry: dict[str, Any], stamp: str) -> str:
    """The section of docs/benchmarks.md: one row per setup."""
    rows = []
    for r in entry["rows"]:
        s = r["setup"]
        verdict = "ok" if r["ok"] else "FAILED: " + "; ".join(r["failures"][:3])
        rows.append(
            f"| {s['label']} | {verdict} | {r['drain_s']['p50']:.1f} / {r['drain_s']['max']:.1f} | "
            f"{r['recover_s']['p50']:.1f} / {r['recover_s']['max']:.1f} | {r['puts_applied']} | {r['puts_412']} | "
            f"{r['puts_409']} | {r['answers_429']} | {r['pool_gets']} | {r['operation_gets']} | "
            f"{r['down_lead_ms']['p50']:.0f} / {r['down_lead_ms']['max']:.0f} |")
    table = "\n".join(rows)
    first = entry["rows"][0]["setup"] if entry["rows"] else {}
    return f"""## Many writers on one pool (admin state)

{first.get('writers', '?')} VMs of a {first.get('pool_size', '?')}-VM backend address pool drain through admin
state at the same moment (a Freeze of ten VMs), then recover at the same moment: each the product's own
`azure-lb` action (its own identity and ARM client, deadline 60 s), all against one pool of the
simulator's ARM (a process of its own, over HTTP; operations take {first.get('async_seconds', 1):g} s,
`Retry-After: {first.get('retry_after', 1)}`). Every write but one of a round meets 412 or 409, re-reads the
pool after a jittered pause that grows with its conflicts, and writes again. Judged from the simulator's
log of effective admin states: each address effectively `Down` before its drain returned (when its VM
would acknowledge), `None` before its recovery returned, no drain fell back, every address `None` at the
end. ARM's answers as the simulator counted them, over the drain and the recovery together.
`bench/arm_writers.py`. {stamp}

{_HEAD}
|---|---|---|---|---|---|---|---|---|---|---|
{table}
"""
