"""Whether the peers are in their load balancer's rotation, seen the way the load balancer sees it.

The budget (``policy.keep_one_serving``, ``max_vms_in_maintenance``) must count a VM as serving only
while the load balancer routes to it. ZooKeeper alone cannot say so: an agent killed a moment ago still
has a live session (for up to the session timeout) and no ``/out`` node, yet its health probe died with
it and the load balancer has taken the VM out. So the agents that may admit or approve (the leader while
any event is known, and each event's approver) ask each peer's health probe, as the load balancer does,
and count a peer as in rotation only on a recent answer of 200 whose ``X-Coordinator-Phase`` header says
``serving``: the agent's own account that its return wait (the load balancer's rise time) is over.

Probing runs on a thread of its own, never in the agent loop: the loop reads the last results, each
stamped with the monotonic time its request was sent, and ``coordinator.decide`` treats an old result as
none. A round asks every peer at once (``coordinator.support.probes.ask_all``: one selector, no thread
per peer), so it lasts as long as the slowest answer, bounded by the timeout, in a group of any size; each
answer is taken as it comes, so a hung peer delays only its own.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Collection, Mapping

from coordinator.errors import StoreError
from coordinator.snapshot import PeerSeen
from coordinator.store.base import Store
from coordinator.support.probes import AskAll, ProbeAnswer, ask_all

__all__ = ["PHASE_HEADER", "PeerProbes", "PeerSeen", "judge"]

log = logging.getLogger(__name__)

PHASE_HEADER = "X-Coordinator-Phase"


def judge(answer: ProbeAnswer) -> PeerSeen:
    """In rotation only on 200 with phase ``serving`` (a probe answering 200 without the header is not an
    agent of this product, or an older one: it is not counted)."""
    if answer.status is None:
        return PeerSeen(False, answer.asked, f"no answer: {answer.error}", answered=False)
    phase = (answer.headers or {}).get(PHASE_HEADER.lower(), "")
    if answer.status == 200 and phase == "serving":
        return PeerSeen(True, answer.asked, "serving")
    return PeerSeen(False, answer.asked, f"{answer.status} {phase or 'no phase header'}")


class PeerProbes:
    """Probes the targets it is given (vm -> probe URL) every ``interval`` seconds, all at once, each
    with ``timeout``. ``want`` sets the targets (an empty mapping pauses probing), ``follow`` derives them
    from a cluster view; ``seen`` returns the last answer of each target. Thread-safe."""

    REFRESH = 30.0  # seconds between two reads of the peers' probe addresses

    def __init__(
        self,
        *,
        interval: float = 1.0,
        timeout: float = 0.5,
        clock: Callable[[], float] = time.monotonic,
        on_change: Callable[[], None] | None = None,
        ask: AskAll = ask_all,
    ) -> None:
        """``on_change`` is called (from the probing thread, or the caller of ``confirm``; it must not block)
        as soon as an answer shows a target for the first time, or entering or leaving rotation: the agent's
        ``wake``. ``ask`` asks a round's probes (``coordinator.support.probes.ask_all``; tests give their
        own)."""
        self._interval = interval
        self._timeout = timeout
        self._on_change = on_change
        self._clock = clock
        self._ask = ask
        self._lock = threading.Lock()
        self._targets: dict[str, str] = {}
        self._seen: dict[str, PeerSeen] = {}
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.rounds = 0  # completed probing rounds (tests wait on it)
        self._members: frozenset[str] = frozenset()
        self._urls: dict[str, str] = {}
        self._urls_at = float("-inf")
        self._no_url: frozenset[str] = frozenset()

    def want(self, targets: Mapping[str, str]) -> None:
        with self._lock:
            changed = dict(targets) != self._targets
            self._targets = dict(targets)
            for vm in [vm for vm in self._seen if vm not in self._targets]:
                del self._seen[vm]
        if changed and targets:
            self._wake.set()

    def follow(self, store: Store, members: Collection[str], me: str, wanted: bool) -> None:
        """Called by the agent loop after each cycle with the view it read: probe the other live members
        while ``wanted`` (this agent leads, or an event names its VM), at the probe URL each one joined
        with. Member info is read again only when the membership changes, or every ``REFRESH`` seconds:
        an agent that restarts on another port is found by the next refresh at the latest."""
        if not wanted:
            self.want({})
            return
        members = frozenset(members) - {me}
        now = self._clock()
        if members != self._members or now - self._urls_at >= self.REFRESH:
            try:
                info = store.member_info(members)
            except StoreError as exc:
                log.warning("cannot read the peers' probe addresses: %s", exc)
                return
            urls = {vm: str(i["probe"]) for vm, i in info.items() if isinstance(i.get("probe"), str)}
            for vm in sorted(members - set(urls) - self._no_url):
                log.warning("peer %s published no probe address (an older agent?): it never counts as "
                            "in rotation for the budget", vm)
            self._no_url = members - set(urls)
            self._members, self._urls, self._urls_at = members, urls, now
        self.want({vm: url for vm, url in self._urls.items() if vm in members})

    def confirm(self) -> dict[str, PeerSeen]:
        """Probe again now, on the caller's thread (bounded by the timeout), every target that the last
        answers count as in rotation, and return what is seen: the agent does so right before it approves,
        so that a peer killed since the last round is not counted as serving. Any other target (out of
        rotation, or not answered yet) is not asked here: it already counts as not serving, the safe side,
        and a hung VM (its kernel takes the connection, nothing answers) would hold the agent's loop for
        the whole timeout, although its answer could only let the budget do more. The background rounds
        ask it, and take each answer as it comes."""
        with self._lock:
            serving = [vm for vm, seen in self._seen.items() if seen.in_rotation and vm in self._targets]
        self.probe_once(serving)
        return self.seen()

    def seen(self) -> dict[str, PeerSeen]:
        with self._lock:
            return dict(self._seen)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="peer-probes", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def probe_once(self, only: Collection[str] | None = None) -> None:
        """One round over the current targets, or those of them in ``only`` (the thread's body; tests call
        it directly). Each answer is taken as it comes: a peer that never answers costs its own result the
        timeout, not the others'."""
        with self._lock:
            targets = {vm: url for vm, url in self._targets.items() if only is None or vm in only}
        if not targets:
            return
        # Each answer is stamped with the time its request was about to be sent, never later: an answer
        # is no younger than the moment it was asked for.
        try:
            answers = self._ask(targets, self._timeout, self._clock, self._take)
        except Exception as exc:  # a bug in a round never leaves old answers standing as new ones
            log.warning("probing the peers failed: %r", exc)
            answers = {}
        asked = self._clock()
        for vm in targets:  # each answer was taken as it came; taking it again changes nothing
            answer = answers.get(vm)
            self._record(vm, judge(answer) if answer is not None
                         else PeerSeen(False, asked, "no answer: not asked", answered=False))
        with self._lock:
            self.rounds += 1

    def _take(self, vm: str, answer: ProbeAnswer) -> None:
        """One answer of a round, as it comes (on the probing thread)."""
        self._record(vm, judge(answer))

    def _record(self, vm: str, seen: PeerSeen) -> None:
        with self._lock:
            if vm not in self._targets:
                return
            before = self._seen.get(vm)
            if before is not None and before.at > seen.at:
                return  # a round that began later has already answered
            if before is not None and before.in_rotation != seen.in_rotation:
                log.info("peer %s %s rotation (%s)", vm, "back in" if seen.in_rotation else "out of", seen.detail)
            changed = before is None or before.in_rotation != seen.in_rotation
            self._seen[vm] = seen
        if changed and self._on_change is not None:
            self._on_change()  # the agent's wake: it decides on this answer without waiting for the others

    def _run(self) -> None:
        while not self._stop.is_set():
            started = self._clock()
            try:
                self.probe_once()
            except Exception:
                log.exception("peer probing round failed")
            with self._lock:
                idle = not self._targets
            # No target: nothing to probe until ``want`` gives some (it sets ``_wake``), so no timeout:
            # an idle group's agents do not wake once a second for nothing.
            self._wake.wait(None if idle else max(self._interval - (self._clock() - started), 0.05))
            self._wake.clear()
