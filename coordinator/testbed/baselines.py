"""Baseline agents: what a VM does without coordination, to measure the coordinator against.

``python -m coordinator.testbed.baselines --vm vm0 --imds URL --probe-port P --strategy self-approve``

One process per VM, like the agent. It polls its VM's Scheduled Events document and drains the same way
the agent does: as soon as an event names its VM, its health probe answers 503, and it counts the VM
drained once ``--drain-wait`` seconds have passed; it answers 200 again once no event names the VM. Until
its first document it answers 503, as the agent does. Strategies:

* ``wait``: never approves; every event starts at its NotBefore.
* ``self-approve``: approves the events that name its own VM as soon as it has drained (what several
  open-source handlers do), and a Freeze at once, without draining (what Microsoft's sample does). An
  approval releases the event for every VM it names, drained or not: that is the flaw it stands for.

It talks to IMDS exactly as the agent does (``Metadata: true``, api-version 2020-07-01, no proxy) and
logs one line per change to stderr. It has no ZooKeeper and knows nothing of its peers.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx

from coordinator.support.quiethttp import QuietThreadingHTTPServer

__all__ = ["STRATEGIES", "BaselineAgent", "main"]

STRATEGIES = ("self-approve", "wait")
_API = {"api-version": "2020-07-01"}
_HEADERS = {"Metadata": "true"}

log = logging.getLogger("coordinator.testbed.baselines")


class BaselineAgent:
    """The loop of one baseline VM; ``serving`` is what its probe answers (read by the probe thread)."""

    def __init__(self, vm: str, imds_url: str, strategy: str, drain_wait: float, poll_interval: float,
                 client: httpx.Client) -> None:
        if strategy not in STRATEGIES:
            raise ValueError(f"strategy must be one of {', '.join(STRATEGIES)}")
        self.vm = vm
        self._url = imds_url.rstrip("/") + "/metadata/scheduledevents"
        self.strategy = strategy
        self._drain_wait = drain_wait
        self._poll_interval = poll_interval
        self._http = client
        self.serving = False  # out of rotation until the first document says otherwise
        self._drained_since: float | None = None
        self._approved: set[str] = set()
        self.stopping = threading.Event()

    def run(self) -> None:
        while not self.stopping.is_set():
            try:
                self.cycle(time.monotonic())
            except (httpx.HTTPError, ValueError, KeyError, TypeError) as exc:
                log.warning("%s: IMDS read failed (%s); keeping the current state", self.vm, exc)
            self.stopping.wait(self._poll_interval)

    def cycle(self, now: float) -> None:
        response = self._http.get(self._url, params=_API, headers=_HEADERS)
        response.raise_for_status()
        events: list[dict[str, Any]] = response.json()["Events"]
        mine = [e for e in events if any(str(r).lower() == self.vm.lower() for r in e.get("Resources", []))]
        if not mine:
            if not self.serving:
                log.info("%s: no event names this VM: serving", self.vm)
            self.serving, self._drained_since = True, None
            return
        if self._drained_since is None:
            self._drained_since = now
            log.info("%s: events %s name this VM: probe fails, draining", self.vm, [e["EventId"] for e in mine])
        self.serving = False
        if self.strategy != "self-approve":
            return
        drained = now - self._drained_since >= self._drain_wait
        due = [e["EventId"] for e in mine if e.get("EventStatus") == "Scheduled" and e["EventId"] not in self._approved
               and (drained or e.get("EventType") == "Freeze")]
        if due:
            body = {"StartRequests": [{"EventId": eid} for eid in due]}
            answer = self._http.post(self._url, params=_API, headers=_HEADERS, json=body)
            log.info("%s: approved %s (%s)", self.vm, due, answer.status_code)
            if answer.status_code == 200:
                self._approved.update(due)


def _serve_probe(agent: BaselineAgent, port: int) -> ThreadingHTTPServer:
    class Probe(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            code = 200 if agent.serving else 503
            body = b"serving" if code == 200 else b"draining"
            self.send_response(code)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            return

    server = QuietThreadingHTTPServer(("127.0.0.1", port), Probe)
    threading.Thread(target=server.serve_forever, name="probe", daemon=True).start()
    return server


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="A baseline agent (no coordination), for comparisons.")
    parser.add_argument("--vm", required=True)
    parser.add_argument("--imds", required=True, help="the VM's IMDS base URL")
    parser.add_argument("--probe-port", type=int, required=True, help="health probe port on 127.0.0.1")
    parser.add_argument("--strategy", choices=STRATEGIES, required=True)
    parser.add_argument("--drain-wait", type=float, default=2.0)
    parser.add_argument("--poll-interval", type=float, default=0.5)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s", stream=sys.stderr)
    with httpx.Client(timeout=2.0, trust_env=False) as client:
        agent = BaselineAgent(args.vm, args.imds, args.strategy, args.drain_wait, args.poll_interval, client)
        signal.signal(signal.SIGTERM, lambda *_: agent.stopping.set())
        server = _serve_probe(agent, args.probe_port)
        try:
            agent.run()
        except KeyboardInterrupt:
            pass
        finally:
            server.shutdown()
            server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
