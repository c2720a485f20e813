"""Seeded chaos on real processes, judged by an independent oracle (``tests.oracle``).

``python -m tests.chaos --seed N [--runs K] [--duration S] [--json out.json] [--admin-state]``

One run starts, on loopback: a three-server ZooKeeper ensemble (its tickTime drawn from the seed), the
IMDS simulator under a time scale (so that Azure's 15-minute notices last about 20 s), one agent per VM,
each reaching ZooKeeper through link proxies of its own (``tests.chaos.netproxy``: the plan cuts,
delays or makes lossy one way one agent's link at a time), one app server per VM behind a real HAProxy
whose health check of each server is that VM's agent probe, and a steady load through HAProxy. It plays
a story of maintenance events and a schedule of faults, both drawn from
``random.Random(seed)``; heals everything, waits until every event is gone and every VM is back, stops,
and hands what was recorded to the oracle. The plan (what happens, to whom, when and for how long) is
fully determined by the seed and printed first; real timing varies from run to run (process start-up,
scheduling on a busy machine), and so do the targets that are resolved when a fault fires ("the
leader", "a drained VM"): same seed, same plan, not the same interleaving.

With ``--admin-state`` the agents drain through the load balancer's admin state (the simulator's ARM, its
effective states applied to HAProxy) and their probe, without an HAProxy action of their own: the run
samples every VM's effective admin state, and the plan adds faults of the simulated ARM
(``planning.ARM_FAULTS``) and stretches of it behaving worse (``planning.ARM_STRETCHES``).

Every process a run starts is stopped by its PID when the run ends, whatever happens. Exit status: 1 if
any run found a violation, 2 if a run could not be carried out (a component would not start), else 0.

The package's parts: ``planning`` (the configuration and the plan drawn from the seed), ``observers``
(the ZooKeeper recorder, the samplers' thread and the load through HAProxy), the run in layers:
``state`` (what its parts share), ``processes`` (set-up, supervision and tear-down of the processes),
``faults`` (the plan's steps played and healed) and ``run`` (``ChaosRun.execute`` and ``run_chaos``);
``result`` (a run's outcome and the agents' logs read for the oracle), ``ledger`` (the file of a long
run made in parts, with the code that ran it) and ``cli`` (the command line, run by ``__main__``).
This module re-exports what other code uses.
"""

from __future__ import annotations

from tests.chaos.cli import main
from tests.chaos.planning import ChaosConfig, Step, plan
from tests.chaos.result import RunResult
from tests.chaos.run import run_chaos

__all__ = ["ChaosConfig", "RunResult", "Step", "main", "plan", "run_chaos"]
