"""What a chaos run observes from outside the agents, each observer on a thread of its own.

``ZooKeeperRecorder`` polls the group's nodes with a ZooKeeper session of its own and records only
ZooKeeper's metadata of each node (ctime, owner, first and last sighting), and the intervals in which it
could read nothing (servers down, no quorum): a node that lived only within one was never seen, and the
oracle does not take its absence for a fact there. It also tells which VM leads.
``Sampler`` calls a sampling function at a fixed interval (the run samples the agents' probes, HAProxy's
server states, the agents' ``/status`` and the simulator's log with it). ``LoadGenerator`` sends a
steady load through HAProxy and records every request.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
from kazoo.client import KazooClient
from kazoo.exceptions import KazooException, NoNodeError

from tests.oracle import NodeSighting, RequestSample

__all__ = ["LoadGenerator", "Sampler", "ZooKeeperRecorder"]


class ZooKeeperRecorder:
    """Polls the group's nodes with a session of its own; records each node's ctime, owner, first and last
    sighting: members, the leader, the operator's pause, ``/out`` nodes, each event's record and its acks,
    approval and admission. It decodes no payload: only ZooKeeper's own metadata (so not whether a record
    is marked done)."""

    BLIND_AFTER = 1.0  # seconds between two complete polls beyond which the time between them is blind

    def __init__(self, hosts: str, chroot: str, interval: float = 0.1) -> None:
        quiet = logging.getLogger("tests.chaos.zookeeper")
        quiet.setLevel(logging.CRITICAL)  # its connection drops are expected: ZooKeeper servers are killed
        quiet.propagate = False
        # Reconnect within half a second of a server coming back (kazoo's default backoff doubles up to an
        # hour while the ensemble has no quorum, and every second of it is a second the run is not seen).
        retry = {"max_tries": -1, "delay": 0.1, "backoff": 2, "max_delay": 0.5}  # kazoo builds a KazooRetry
        self._client = KazooClient(hosts=f"{hosts}{chroot}", timeout=10.0, logger=quiet, connection_retry=retry)
        self._interval = interval
        self._last_poll: float | None = None  # when the last complete poll began (wall clock)
        self._blind: list[tuple[float, float]] = []
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._nodes: dict[tuple[str, int], dict[str, Any]] = {}  # (path, czxid) -> sighting
        self._thread = threading.Thread(target=self._run, name="zk-recorder", daemon=True)

    def start(self) -> None:
        self._client.start(timeout=15)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)
        with self._lock:
            if self._last_poll is not None and time.time() - self._last_poll > self.BLIND_AFTER:
                self._note_blind(self._last_poll, time.time())
        with contextlib.suppress(Exception):
            self._client.stop()
            self._client.close()

    def sightings(self) -> list[NodeSighting]:
        with self._lock:
            return [NodeSighting(n["kind"], n["event_id"], n["vm"], n["ctime"], n["owner"], n["first_seen"],
                                 n["gone_seen"]) for n in self._nodes.values()]

    def blind(self) -> list[tuple[float, float]]:
        """Wall-clock intervals from the start of a complete poll to the end of the next, where these are
        more than ``BLIND_AFTER`` apart: what happened only within one may be unseen."""
        with self._lock:
            return list(self._blind)

    def _note_blind(self, start: float, end: float) -> None:
        """Add a blind interval (the lock held), merged with the last one where they overlap."""
        if self._blind and start <= self._blind[-1][1]:
            start = min(start, self._blind[-1][0])
            end = max(end, self._blind.pop()[1])
        self._blind.append((start, end))

    def leader_vm(self) -> str | None:
        with self._lock:
            live = [n for n in self._nodes.values() if n["gone_seen"] is None]
        leader = next((n for n in live if n["kind"] == "leader"), None)
        if leader is None:
            return None
        member = next((n for n in live if n["kind"] == "member" and n["owner"] == leader["owner"]), None)
        return member["vm"] if member else None

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            began = time.time()
            try:
                self._poll()
            except KazooException:
                continue  # a server down, the session moving: the next poll looks again
            except Exception:
                continue
            # A poll reads somewhere between its start and its end (a request made while the server is
            # away waits for the reconnection), so between two polls only the span from the start of
            # the one before to the end of this one is sure to have been looked at.
            finished = time.time()
            with self._lock:
                if self._last_poll is not None and finished - self._last_poll > self.BLIND_AFTER:
                    self._note_blind(self._last_poll, finished)
                self._last_poll = began

    def _children(self, parent: str, kind: str, event_id: str | None = None) -> None:
        try:
            names = self._client.get_children(parent)
        except NoNodeError:
            names = []
        seen = set()
        for name in names:
            path = f"{parent}/{name}"
            stat = self._client.exists(path)
            if stat is not None:
                seen.add(self._saw(path, stat, kind, event_id, name))
        self._gone(parent + "/", seen)

    def _single(self, path: str, kind: str, event_id: str | None = None) -> None:
        stat = self._client.exists(path)
        seen = {self._saw(path, stat, kind, event_id, None)} if stat is not None else set()
        self._gone(path, seen, exact=True)

    def _poll(self) -> None:
        self._children("/members", "member")
        self._single("/leader", "leader")
        self._single("/pause", "pause")
        self._children("/out", "out")
        try:
            events = self._client.get_children("/events")
        except NoNodeError:
            events = []
        # Each event's record itself (when it was published, when purged), under its event id.
        seen = set()
        for event_id in events:
            stat = self._client.exists(f"/events/{event_id}")
            if stat is not None:
                seen.add(self._saw(f"/events/{event_id}", stat, "record", event_id, None))
        self._gone("/events/", seen)
        for event_id in events:
            self._children(f"/events/{event_id}/acks", "ack", event_id)
            self._single(f"/events/{event_id}/approval", "approval", event_id)
            self._single(f"/events/{event_id}/admitted", "admitted", event_id)

    def _saw(self, path: str, stat: Any, kind: str, event_id: str | None, vm: str | None) -> tuple[str, int]:
        key = (path, int(stat.czxid))
        with self._lock:
            if key not in self._nodes:
                self._nodes[key] = {"kind": kind, "event_id": event_id, "vm": vm, "ctime": stat.ctime / 1000.0,
                                    "owner": int(stat.ephemeralOwner), "first_seen": time.time(), "gone_seen": None}
        return key

    def _gone(self, prefix: str, seen: set[tuple[str, int]], exact: bool = False) -> None:
        now = time.time()
        with self._lock:
            for key, node in self._nodes.items():
                path = key[0]
                under = path == prefix if exact else (path.startswith(prefix) and "/" not in path[len(prefix):])
                if under and key not in seen and node["gone_seen"] is None:
                    node["gone_seen"] = now


class Sampler:
    """A thread calling ``sample`` every ``interval`` seconds until stopped."""

    def __init__(self, name: str, interval: float, sample: Callable[[], None]) -> None:
        self._interval = interval
        self._sample = sample
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)

    def _run(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            with contextlib.suppress(Exception):
                self._sample()
            self._stop.wait(max(0.0, self._interval - (time.monotonic() - started)))


class LoadGenerator:
    """``rate`` GET requests per second through HAProxy, each on a new connection; records each one's
    time, status and the server that answered (the app's ``X-Served-By`` header)."""

    def __init__(self, url: str, rate: float, timeout: float = 6.0) -> None:
        self._url = url
        self._interval = 1.0 / rate
        self._timeout = timeout
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self.samples: list[RequestSample] = []
        self._pool = ThreadPoolExecutor(max_workers=32, thread_name_prefix="load")
        # One client (building one per request costs a TLS context each), no connection kept alive: every
        # request is a new flow that HAProxy routes afresh.
        self._client = httpx.Client(timeout=timeout, trust_env=False, headers={"Connection": "close"},
                                    limits=httpx.Limits(max_connections=64, max_keepalive_connections=0))
        self._thread = threading.Thread(target=self._run, name="load", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self._pool.shutdown(wait=True, cancel_futures=True)
        self._client.close()

    def _run(self) -> None:
        next_at = time.monotonic()
        while not self._stop.is_set():
            self._pool.submit(self._one)
            next_at += self._interval
            self._stop.wait(max(0.0, next_at - time.monotonic()))

    def _one(self) -> None:
        sent = time.time()
        status: int | None = None
        server: str | None = None
        error: str | None = None
        try:
            response = self._client.get(self._url)
            status, server = response.status_code, response.headers.get("X-Served-By")
        except httpx.HTTPError as exc:
            error = type(exc).__name__
        with self._lock:
            self.samples.append(RequestSample(sent, time.time(), status, server, error))
