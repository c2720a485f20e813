"""Peers' probes on real sockets: what ``PeerProbes`` concludes from a real ``HttpSurface`` in each state
of its agent, how it follows the membership, and the address an agent advertises."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest
from prometheus_client import CollectorRegistry

from coordinator.actions.probe import ProbeState
from coordinator.config import Settings
from coordinator.httpserver import HttpSurface
from coordinator.peers import PHASE_HEADER, PeerProbes
from coordinator.runtime import advertised_probe_url
from coordinator.snapshot import PeerSeen
from coordinator.support.probes import ProbeAnswer, ask_all
from coordinator.testbed.waiting import wait_until
from tests.fakezk_group import FakeGroup


class Peer:
    """One peer's HTTP surface with a settable probe answer and agent phase."""

    def __init__(self) -> None:
        self.probe = ProbeState(serving=True)
        self.phase = "serving"
        self.surface = HttpSurface(probe_listen="127.0.0.1:0", probe_path="/health", admin_listen="127.0.0.1:0",
                                   probe=self.probe, registry=CollectorRegistry(), status=dict,
                                   phase=lambda: self.phase)
        self.surface.start()
        host, port = self.surface.probe_address
        self.url = f"http://{host}:{port}/health"


@pytest.fixture
def peer() -> Peer:
    return Peer()


def test_only_a_200_from_an_agent_saying_serving_counts_as_in_rotation(peer: Peer) -> None:
    probes = PeerProbes(interval=60, timeout=1.0)
    try:
        probes.want({"vm1": peer.url})

        def look() -> tuple[bool, str]:
            probes.probe_once()
            seen = probes.seen()["vm1"]
            return seen.in_rotation, seen.detail

        assert look() == (True, "serving")
        peer.phase = "recovering"  # the probe answers 200 again, but the load balancer's rise is not over
        assert look() == (False, "200 recovering")
        peer.probe.set(False)
        peer.phase = "draining"
        assert look() == (False, "503 draining")
        peer.probe.set(True)
        peer.phase = "serving"
        assert look() == (True, "serving")
        peer.surface.stop()  # the agent died: its probe went with it
        in_rotation, detail = look()
        assert not in_rotation and detail.startswith("no answer")
    finally:
        probes.stop()
        peer.surface.stop()


def test_a_probe_without_the_phase_header_is_not_counted(peer: Peer) -> None:
    peer.surface.stop()
    plain = HttpSurface(probe_listen="127.0.0.1:0", probe_path="/health", admin_listen="127.0.0.1:0",
                        probe=ProbeState(serving=True), registry=CollectorRegistry(), status=dict)
    plain.start()
    probes = PeerProbes(interval=60, timeout=1.0)
    try:
        host, port = plain.probe_address
        probes.want({"vm1": f"http://{host}:{port}/health"})
        probes.probe_once()
        seen = probes.seen()["vm1"]
        assert (seen.in_rotation, seen.detail) == (False, "200 no phase header")
    finally:
        probes.stop()
        plain.stop()


def test_the_probe_answer_carries_the_phase_for_the_load_balancer_and_the_peers(peer: Peer) -> None:
    try:
        peer.phase = "drained"
        peer.probe.set(False)
        answer = httpx.get(peer.url)
        assert answer.status_code == 503 and answer.headers[PHASE_HEADER] == "drained"
        assert answer.text == "drained\n"  # the body says what the header says
    finally:
        peer.surface.stop()


def test_follow_probes_the_live_members_while_wanted_and_stops_when_not(peer: Peer) -> None:
    cluster = FakeGroup(time.time)
    stores = {vm: cluster.store(time.time) for vm in ("vm0", "vm1", "vm2")}
    for store in stores.values():
        store.start()
    stores["vm0"].join("vm0", {"probe": "http://127.0.0.1:9/health"})
    stores["vm1"].join("vm1", {"probe": peer.url})
    stores["vm2"].join("vm2", {"version": "0.0.1"})  # an agent that publishes no probe address
    probes = PeerProbes(interval=60, timeout=1.0)
    try:
        view = stores["vm0"].read_view("vm0")
        probes.follow(stores["vm0"], view.members, "vm0", wanted=True)
        probes.probe_once()
        seen = probes.seen()
        assert set(seen) == {"vm1"}  # never itself; vm2 has no address and is never counted as serving
        assert seen["vm1"].in_rotation
        stores["vm1"].stop()  # vm1 leaves: no longer a member, no longer probed
        probes.follow(stores["vm0"], stores["vm0"].read_view("vm0").members, "vm0", wanted=True)
        probes.probe_once()
        assert probes.seen() == {}
        stores["vm1"] = cluster.store(time.time)
        stores["vm1"].start()
        stores["vm1"].join("vm1", {"probe": peer.url})
        probes.follow(stores["vm0"], stores["vm0"].read_view("vm0").members, "vm0", wanted=False)
        probes.probe_once()
        assert probes.seen() == {}  # not wanted: nobody is probed
        probes.follow(stores["vm0"], stores["vm0"].read_view("vm0").members, "vm0", wanted=True)
        probes.probe_once()
        assert probes.seen()["vm1"].in_rotation
    finally:
        probes.stop()
        peer.surface.stop()


def test_the_background_thread_probes_without_being_asked(peer: Peer) -> None:
    probes = PeerProbes(interval=0.1, timeout=1.0)
    probes.start()
    try:
        probes.want({"vm1": peer.url})
        assert wait_until(lambda: probes.rounds >= 3, 10)
        assert probes.seen()["vm1"].in_rotation
    finally:
        probes.stop()
        peer.surface.stop()


def test_a_first_answer_and_a_change_of_rotation_wake_the_agent(peer: Peer) -> None:
    woken: list[int] = []
    probes = PeerProbes(interval=5.0, timeout=1.0, on_change=lambda: woken.append(probes.rounds))
    probes.start()
    try:
        probes.want({"vm1": peer.url})  # becoming wanted starts a round at once, not after the interval
        # Woken as the answer comes, before its round has ended (``rounds`` counts ended rounds).
        assert wait_until(lambda: woken == [0], 2)
        probes.probe_once()
        assert woken == [0]  # the same answer again: nothing to wake for
        peer.probe.set(False)
        probes.probe_once()
        assert woken == [0, 2] and not probes.seen()["vm1"].in_rotation
    finally:
        probes.stop()
        peer.surface.stop()


@pytest.mark.parametrize(("probe", "zookeeper", "bound", "expected"), [
    ({"listen": "127.0.0.1:8090"}, "127.0.0.1:2181", ("127.0.0.1", 8090), "http://127.0.0.1:8090/health"),
    ({"listen": "0.0.0.0:8090"}, "127.0.0.1:2181", ("0.0.0.0", 8090), "http://127.0.0.1:8090/health"),
    ({"listen": "0.0.0.0:0"}, "127.0.0.1:2181,127.0.0.2:2181", ("0.0.0.0", 41234), "http://127.0.0.1:41234/health"),
    ({"listen": "0.0.0.0:8090", "advertise": "10.1.2.3:18090"}, "127.0.0.1:2181", ("0.0.0.0", 8090),
     "http://10.1.2.3:18090/health"),
    ({"listen": "[::1]:8090", "path": "/lb"}, "127.0.0.1:2181", ("::1", 8090), "http://[::1]:8090/lb"),
])
def test_the_advertised_probe_address(probe: dict[str, str], zookeeper: str, bound: tuple[str, int],
                                      expected: str) -> None:
    settings = Settings.model_validate({"cluster": "web", "probe": probe, "zookeeper": {"hosts": zookeeper}})
    assert advertised_probe_url(settings, bound) == expected


def test_a_broken_advertise_address_names_the_field() -> None:
    with pytest.raises(ValueError, match=r"advertise"):
        Settings.model_validate({"cluster": "web", "probe": {"advertise": "nohostport"}})


def test_the_address_toward_zookeeper_falls_back_to_the_host_name() -> None:
    settings = Settings.model_validate({"cluster": "web", "probe": {"listen": "0.0.0.0:8090"},
                                        "zookeeper": {"hosts": "zk.invalid.:2181"}})
    assert advertised_probe_url(settings, ("0.0.0.0", 8090)) == f"http://{socket.gethostname()}:8090/health"


def test_confirm_asks_now_and_stamps_the_answer_with_the_time_it_was_asked(peer: Peer) -> None:
    now = [100.0]
    probes = PeerProbes(interval=60, timeout=1.0, clock=lambda: now[0])
    try:
        probes.want({"vm1": peer.url})
        probes.probe_once()  # a background round: confirm asks again the peers it found in rotation
        now[0] = 100.5
        assert probes.confirm()["vm1"] == PeerSeen(True, 100.5, "serving")
        peer.surface.stop()
        now[0] = 101.0
        seen = probes.confirm()["vm1"]
        assert not seen.in_rotation and seen.at == 101.0
    finally:
        probes.stop()
        peer.surface.stop()


class BarrierServer:
    """A probe server on loopback that answers 200 "serving" to a GET only once ``parties`` requests are
    under way at once (a barrier; after 5 s every waiting request gets a 500), each after ``delay``."""

    def __init__(self, *, parties: int = 1, delay: float = 0.0) -> None:
        barrier = threading.Barrier(parties, timeout=5)

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                try:
                    if parties > 1:
                        barrier.wait()
                    time.sleep(delay)
                    self.send_response(200)
                except threading.BrokenBarrierError:
                    self.send_response(500)
                self.send_header(PHASE_HEADER, "serving")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: object) -> None:
                return None

        class Server(ThreadingHTTPServer):
            request_queue_size = 256  # every probe of a round connects at once
            daemon_threads = True

        self.server = Server(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def url(self, n: int) -> str:
        return f"http://127.0.0.1:{self.port}/health/{n}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_a_round_asks_every_peer_at_once() -> None:
    """199 peers that answer only once all of them have been asked: a round that asks fewer at once gets
    no 200 at all (found with 200 agents on 2 cores: asked 16 and then 64 at a time, a round outlasted
    the 2.5 s an answer counts for, and approvals stalled; the approvers' fence closed up to 7 times)."""
    server = BarrierServer(parties=199)
    probes = PeerProbes(interval=60, timeout=8.0)
    try:
        probes.want({f"vm{n}": server.url(n) for n in range(199)})
        probes.probe_once()
        seen = probes.seen()
        assert len(seen) == 199 and all(s.in_rotation for s in seen.values()), {
            s.detail for s in seen.values() if not s.in_rotation}
    finally:
        probes.stop()
        server.close()


def test_each_answer_is_stamped_with_the_time_its_own_request_was_sent() -> None:
    ticks = iter(range(1000))
    server = BarrierServer(delay=0.2)
    probes = PeerProbes(interval=60, timeout=2.0, clock=lambda: float(next(ticks)))
    try:
        probes.want({"vm1": server.url(1), "vm2": server.url(2)})
        probes.probe_once()
        seen = probes.seen()
        # asked at ticks 0 and 1, in the order given: each answer keeps its own request's time, not the
        # time it arrived (later ticks) nor the same time for both
        assert (seen["vm1"].at, seen["vm2"].at) == (0.0, 1.0) and seen["vm1"].in_rotation
    finally:
        probes.stop()
        server.close()


def test_a_peer_that_does_not_answer_in_time_is_not_in_rotation_and_the_others_are_not_held_up() -> None:
    """A listener that never answers (its backlog takes the connection, nobody reads it) costs the round
    the timeout, once, and the other peers' answers are not delayed by it."""
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    closed_port = closed.getsockname()[1]
    closed.close()  # nothing listens there: refused
    server = BarrierServer()
    try:
        answers = ask_all({"silent": f"http://127.0.0.1:{silent.getsockname()[1]}/health",
                           "refused": f"http://127.0.0.1:{closed_port}/health",
                           "bad": "https://127.0.0.1:1/health",
                           "ok": server.url(1)}, timeout=0.5)
        assert answers["silent"].error == "no answer within 0.5 s"
        assert answers["refused"].error == "ConnectionRefusedError"
        assert answers["bad"].error == "ValueError"
        assert answers["ok"].status == 200 and answers["ok"].headers == {
            "server": answers["ok"].headers["server"], "date": answers["ok"].headers["date"],
            PHASE_HEADER.lower(): "serving", "content-length": "0"}
    finally:
        silent.close()
        server.close()


def test_an_answer_cut_short_or_not_http_is_no_answer() -> None:
    def serve(reply: bytes) -> tuple[socket.socket, str]:
        listener = socket.socket()
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)

        def once() -> None:
            conn, _ = listener.accept()
            conn.recv(4096)
            conn.sendall(reply)
            conn.close()

        threading.Thread(target=once, daemon=True).start()
        return listener, f"http://127.0.0.1:{listener.getsockname()[1]}/health"

    half, half_url = serve(b"HTTP/1.1 200 OK\r\nX-Coordinator-Ph")
    junk, junk_url = serve(b"SSH-2.0-OpenSSH_9.2\r\n\r\n")
    try:
        answers = ask_all({"half": half_url, "junk": junk_url}, timeout=2.0)
        assert answers["half"].error == "RemoteProtocolError" and answers["half"].status is None
        assert answers["junk"].error == "RemoteProtocolError"
    finally:
        half.close()
        junk.close()


def _silent_listener() -> socket.socket:
    """A hung VM: its kernel completes the handshake (the backlog takes the connection), nothing answers."""
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)
    return silent


def test_each_answer_is_passed_on_as_it_comes_not_after_the_slowest() -> None:
    silent = _silent_listener()
    server = BarrierServer()
    heard: list[str] = []
    try:
        answers = ask_all({"silent": f"http://127.0.0.1:{silent.getsockname()[1]}/health", "ok": server.url(1)},
                          timeout=1.0, on_answer=lambda key, answer: heard.append(key))
        assert heard == ["ok", "silent"], "the healthy answer is heard first, before the hung one times out"
        assert set(answers) == {"ok", "silent"}
    finally:
        silent.close()
        server.close()


def test_a_hung_peer_holds_back_no_other_peers_answer_in_a_round() -> None:
    """The agent reads the healthy peers' answers while the round still waits on the hung one."""
    seen_meanwhile: dict[str, PeerSeen] = {}
    woken: list[int] = []

    def ask(urls: Mapping[str, str], timeout: float, clock: Callable[[], float] = time.monotonic,
            on_answer: Callable[[str, ProbeAnswer], None] | None = None) -> dict[str, ProbeAnswer]:
        assert on_answer is not None
        ok = ProbeAnswer(clock(), 200, {PHASE_HEADER.lower(): "serving"})
        on_answer("vm1", ok)
        seen_meanwhile.update(probes.seen())  # the hung vm2 has not answered yet
        hung = ProbeAnswer(clock(), error=f"no answer within {timeout:g} s")
        on_answer("vm2", hung)
        return {"vm1": ok, "vm2": hung}

    probes = PeerProbes(interval=60, timeout=10.0, ask=ask, on_change=lambda: woken.append(1))
    probes.want({"vm1": "http://vm1/health", "vm2": "http://vm2/health"})
    probes.probe_once()
    assert seen_meanwhile["vm1"].in_rotation and "vm2" not in seen_meanwhile
    assert not probes.seen()["vm2"].in_rotation
    assert len(woken) == 2  # each first answer wakes the agent as it comes


def test_confirm_asks_again_only_the_peers_that_count_as_serving() -> None:
    """Right before an approval, only the peers counted in rotation are asked again: one out of rotation, or
    not answered yet (a hung VM right after the approver began to probe), cannot make the budget stricter,
    and a hung one would hold the agent's loop for the whole timeout."""
    asked: list[set[str]] = []

    def ask(urls: Mapping[str, str], timeout: float, clock: Callable[[], float] = time.monotonic,
            on_answer: Callable[[str, ProbeAnswer], None] | None = None) -> dict[str, ProbeAnswer]:
        asked.append(set(urls))
        answers = {vm: ProbeAnswer(clock(), 200, {PHASE_HEADER.lower(): "serving"}) if vm == "vm1"
                   else ProbeAnswer(clock(), error="no answer within 10 s") for vm in urls}
        for vm, answer in answers.items():
            assert on_answer is not None
            on_answer(vm, answer)
        return answers

    probes = PeerProbes(interval=60, timeout=10.0, ask=ask)
    probes.want({"vm1": "http://vm1/health", "vm2": "http://vm2/health", "vm3": "http://vm3/health"})
    probes.probe_once()
    probes.want({"vm1": "http://vm1/health", "vm2": "http://vm2/health", "vm3": "http://vm3/health",
                 "vm4": "http://vm4/health"})  # a peer not answered yet: the background round asks it
    seen = probes.confirm()
    assert asked == [{"vm1", "vm2", "vm3"}, {"vm1"}]
    assert seen["vm1"].in_rotation and not seen["vm2"].in_rotation and not seen["vm3"].in_rotation
    assert "vm4" not in seen


def test_confirm_does_not_wait_out_a_hung_peer_on_real_sockets() -> None:
    silent = _silent_listener()
    server = BarrierServer()
    probes = PeerProbes(interval=60, timeout=5.0)
    try:
        probes.want({"hung": f"http://127.0.0.1:{silent.getsockname()[1]}/health", "ok": server.url(1)})
        probes.probe_once()  # the background round: the hung peer costs it the timeout, once
        assert not probes.seen()["hung"].in_rotation
        started = time.monotonic()
        seen = probes.confirm()
        assert time.monotonic() - started < 5.0, "the agent's loop did not wait out the hung peer again"
        assert seen["ok"].in_rotation and not seen["hung"].in_rotation
    finally:
        probes.stop()
        silent.close()
        server.close()
