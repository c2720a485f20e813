"""Hostile input at the product's edges, many examples, counted: for a longer run than the tests make.

    python scripts/hostile.py --imds 2000 --zookeeper 300 [--seed N] [--zk-hosts HOST:PORT] [--json FILE]

Edges (the generators and judges are those of ``tests/hostile``, used by the tests with few examples):

* ``imds-client``: a generated answer of the Scheduled Events endpoint (document and body), served over
  HTTP by the simulator's ``body`` fault, read by the real ``ImdsClient``; a crash is any exception other
  than an ``ImdsError``;
* ``imds-agent``: the same answer fed to a real agent of vm0, drained for an event nobody may approve; a
  crash is a cycle that raises, an unsafe approval any POST the document does not allow, and "undrained"
  counts vm0 back in rotation after answers that never parsed;
* ``zookeeper``: garbage in the group's nodes on a real ZooKeeper (started here in a temporary directory
  unless ``--zk-hosts`` names one; everything is written under ``/hostile-{pid}`` and removed), read by a
  real agent; an unsafe approval is any POST (the other VM never drained), "outside" any change to the
  server's tree outside the trial's root.

Prints one line per edge and exits 1 if any crash or unsafe approval was seen. Traffic goes to 127.0.0.1
only. The simulator's HTTP server may print connection resets (clients that hang up on a body cut short)
on stderr; they are not failures.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from hypothesis import HealthCheck, Phase, given, seed, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from tests.hostile.imds_bench import ImdsBench, valid_not_before  # noqa: E402
from tests.hostile.inputs import HostileBody, bodies, payloads  # noqa: E402
from tests.hostile.zk_bench import TARGETS, Garbage, ZkBench  # noqa: E402


@dataclass
class Tally:
    edge: str
    inputs: int = 0
    crashes: int = 0
    unsafe_approvals: int = 0
    undrained: int = 0
    outside: int = 0
    seconds: float = 0.0
    outcomes: dict[str, int] = field(default_factory=dict)
    examples: list[str] = field(default_factory=list)

    def note(self, what: str) -> None:
        if len(self.examples) < 5:
            self.examples.append(what[:400])

    def line(self) -> str:
        return (f"{self.edge:12} inputs tried {self.inputs:6}  crashes {self.crashes:3}  "
                f"unsafe approvals {self.unsafe_approvals:3}  undrained {self.undrained:3}  "
                f"outside writes {self.outside:3}  ({self.seconds:.0f} s)")


def _settings(examples: int) -> settings:
    return settings(max_examples=examples, database=None, deadline=None, phases=[Phase.generate],
                    suppress_health_check=list(HealthCheck))


def run_imds(examples: int, run_seed: int) -> tuple[Tally, Tally]:
    client, agent = Tally("imds-client"), Tally("imds-agent")
    started = time.monotonic()
    with ImdsBench() as bench:

        @seed(run_seed)
        @_settings(examples)
        @given(body=bodies(valid_not_before()))
        def one(body: HostileBody) -> None:
            client.inputs += 1
            agent.inputs += 1
            try:
                trial = bench.trial(body)
            except Exception as exc:  # the bench itself failed: count it, show it
                agent.crashes += 1
                agent.note(f"bench failed on {body.encoding} {body.body[:120]!r}: {exc!r}")
                return
            client.outcomes[trial.client_outcome] = client.outcomes.get(trial.client_outcome, 0) + 1
            for crash in trial.crashes:
                tally = client if crash.startswith("client") else agent
                tally.crashes += 1
                tally.note(f"{crash} on {body.encoding} {body.body[:200]!r}")
            for problem in trial.unsafe:
                if problem.startswith("POST"):
                    agent.unsafe_approvals += 1
                else:
                    agent.undrained += 1
                agent.note(f"{problem} on {body.encoding} {body.body[:200]!r}")

        one()
    client.seconds = agent.seconds = time.monotonic() - started
    return client, agent


def run_zookeeper(examples: int, run_seed: int, hosts: str | None) -> Tally:
    tally = Tally("zookeeper")
    started = time.monotonic()
    server = None
    if hosts is None:
        from coordinator.testbed.zookeeper import LocalZooKeeper

        server = LocalZooKeeper(Path(tempfile.mkdtemp(prefix="hostile-zk-")), tick_time_ms=500,
                                max_session_timeout_ms=60_000)
        server.start(timeout=60)
        hosts = server.hosts
    prefix = f"/hostile-{os.getpid()}"
    try:
        with ImdsBench() as imds:
            bench = ZkBench(hosts, prefix, imds)
            try:

                @seed(run_seed)
                @_settings(examples)
                @given(data=st.data())
                def one(data: st.DataObject) -> None:
                    targets = data.draw(st.lists(st.sampled_from(sorted(TARGETS)), min_size=1, max_size=4,
                                                 unique=True))
                    garbage = [Garbage(t, data.draw(payloads(TARGETS[t][2]))) for t in targets]
                    tally.inputs += 1
                    try:
                        trial = bench.trial(garbage)
                    except Exception as exc:
                        tally.crashes += 1
                        tally.note(f"bench failed on {targets}: {exc!r}")
                        return
                    for key in targets:
                        tally.outcomes[key] = tally.outcomes.get(key, 0) + 1
                    tally.crashes += len(trial.crashes)
                    tally.unsafe_approvals += sum(p.startswith("POST") for p in trial.unsafe)
                    tally.undrained += sum(not p.startswith("POST") for p in trial.unsafe)
                    tally.outside += len(trial.outside)
                    for problem in trial.crashes + trial.unsafe + trial.outside:
                        tally.note(f"{problem} with {[(g.target, g.data[:60]) for g in garbage]}")

                one()
            finally:
                bench.client.delete(prefix, recursive=True)
                bench.close()
    finally:
        if server is not None:
            server.stop()
    tally.seconds = time.monotonic() - started
    return tally


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--imds", type=int, default=200, metavar="N", help="IMDS answers to try (default 200)")
    parser.add_argument("--zookeeper", type=int, default=50, metavar="M",
                        help="sets of garbage ZooKeeper nodes to try (default 50)")
    parser.add_argument("--seed", type=int, default=0, help="hypothesis seed (default 0)")
    parser.add_argument("--zk-hosts", help="use this ZooKeeper (127.0.0.1:PORT) instead of starting one")
    parser.add_argument("--json", type=Path, help="also write the counts to this file")
    args = parser.parse_args()
    logging.disable(logging.CRITICAL)  # the agent logs every ignored document and node: millions of lines

    started = time.monotonic()
    tallies: list[Tally] = []
    if args.imds > 0:
        tallies.extend(run_imds(args.imds, args.seed))
    if args.zookeeper > 0:
        tallies.append(run_zookeeper(args.zookeeper, args.seed, args.zk_hosts))
    print(f"hostile input, seed {args.seed}, {time.monotonic() - started:.0f} s in all")
    for tally in tallies:
        print(tally.line())
        if tally.outcomes:
            print(f"{'':12} outcomes: {json.dumps(dict(sorted(tally.outcomes.items())))}")
        for example in tally.examples:
            print(f"{'':12} ! {example}")
    if args.json is not None:
        args.json.write_text(json.dumps([asdict(t) for t in tallies], indent=2) + "\n")
    failed = sum(t.crashes + t.unsafe_approvals + t.undrained + t.outside for t in tallies)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
