"""The HAProxy action against a real HAProxy (``haproxy`` fixture): what the load balancer routes."""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from coordinator.actions.base import ActionContext
from coordinator.actions.haproxy import HAProxyAction, HAProxyRuntime
from coordinator.errors import ActionError
from coordinator.models import ScheduledEvent
from tests.plugins.haproxy import RunningHAProxy
from tests.plugins.zookeeper import wait_until

EVENT = ScheduledEvent(event_id="E-1", event_type="Freeze", event_status="Scheduled", resources=("vm0",))
CTX = ActionContext(vm="vm0", events=(EVENT,))


def make_action(runtime: HAProxyRuntime, server: str = "web0", **kwargs: Any) -> HAProxyAction:
    options: dict[str, Any] = {"drain_timeout": 10.0, "poll_interval": 0.05}
    options.update(kwargs)
    return HAProxyAction(runtime, "be_app", server, **options)


@pytest.fixture
def runtime(haproxy: RunningHAProxy) -> HAProxyRuntime:
    return HAProxyRuntime(haproxy.socket_path, timeout=5.0)


class SlowRequest:
    """A request held open on one server: a long-lived session HAProxy counts in ``scur``."""

    def __init__(self, proxy: RunningHAProxy, server: str) -> None:
        self.proxy = proxy
        self.server = server
        self.served_by: str | None = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        try:
            self.served_by = self.proxy.request("/slow", timeout=30)
        except BaseException as exc:
            self.error = exc

    def start(self) -> SlowRequest:
        # Keep every other server out of rotation so that the request can only land on ours.
        others = [s for s in self.proxy.servers if s != self.server]
        for other in others:
            assert self.proxy.command(f"set server be_app/{other} state maint").strip() == ""
        self.thread.start()
        backend = self.proxy.backends[self.server]
        wait_until(lambda: backend.in_flight() == 1, timeout=10, message=f"slow request held on {self.server}")
        for other in others:
            assert self.proxy.command(f"set server be_app/{other} state ready").strip() == ""
        return self

    def finish(self) -> str | None:
        self.proxy.backends[self.server].release.set()
        self.thread.join(timeout=10)
        assert not self.thread.is_alive()
        if self.error is not None:
            raise self.error
        return self.served_by


@pytest.fixture
def hold(haproxy: RunningHAProxy) -> Iterator[Callable[[str], SlowRequest]]:
    started: list[SlowRequest] = []

    def start(server: str) -> SlowRequest:
        request = SlowRequest(haproxy, server).start()
        started.append(request)
        return request

    yield start
    for request in started:
        request.proxy.backends[request.server].release.set()
        request.thread.join(timeout=10)


class CountingSleep:
    """Real sleep that counts its calls, so a test can wait until the action has polled a few times."""

    def __init__(self) -> None:
        self.calls = 0
        self._lock = threading.Lock()

    def __call__(self, seconds: float) -> None:
        with self._lock:
            self.calls += 1
        time.sleep(seconds)

    def count(self) -> int:
        with self._lock:
            return self.calls


def test_runtime_reads_sessions_and_state(haproxy: RunningHAProxy, runtime: HAProxyRuntime) -> None:
    assert runtime.current_sessions("be_app", "web0") == 0
    state = runtime.server_state("be_app", "web0")
    assert (state.admin, state.operational) == ("ready", "running")
    assert runtime.server_stats("be_app", "web1")["status"] == "UP"


def test_drain_sends_new_requests_only_to_the_other_server(
    haproxy: RunningHAProxy,
    runtime: HAProxyRuntime,
) -> None:
    assert set(haproxy.served_by(10)) == {"web0", "web1"}  # round robin over both before the drain

    make_action(runtime).drain(CTX)

    assert haproxy.status("web0") == "DRAIN"
    assert runtime.server_state("be_app", "web0").admin == "drain"
    hits_before = haproxy.backends["web0"].hits
    assert set(haproxy.served_by(20)) == {"web1"}
    assert haproxy.backends["web0"].hits == hits_before


def test_open_session_keeps_drain_waiting_until_it_closes(
    haproxy: RunningHAProxy,
    runtime: HAProxyRuntime,
    hold: Callable[[str], SlowRequest],
) -> None:
    slow = hold("web0")
    assert runtime.current_sessions("be_app", "web0") == 1
    sleep = CountingSleep()
    action = make_action(runtime, drain_timeout=30.0, sleep=sleep)
    errors: list[BaseException] = []

    def drain() -> None:
        try:
            action.drain(CTX)
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=drain, daemon=True)
    thread.start()
    wait_until(lambda: sleep.count() >= 3, timeout=10, message="drain polled the open session three times")
    assert thread.is_alive()  # still waiting: the session is open
    assert haproxy.status("web0") == "DRAIN"
    assert set(haproxy.served_by(6)) == {"web1"}  # new requests avoid web0 meanwhile

    assert slow.finish() == "web0"  # the existing session was allowed to finish on web0
    thread.join(timeout=10)
    assert not thread.is_alive()
    assert errors == []
    assert runtime.current_sessions("be_app", "web0") == 0


def test_drain_timeout_is_respected_and_not_a_failure(
    haproxy: RunningHAProxy,
    runtime: HAProxyRuntime,
    hold: Callable[[str], SlowRequest],
) -> None:
    slow = hold("web0")
    started = time.monotonic()
    make_action(runtime, drain_timeout=0.5, use_maint=True).drain(CTX)
    elapsed = time.monotonic() - started

    assert 0.5 <= elapsed < 5.0
    assert runtime.current_sessions("be_app", "web0") == 1  # still open: the timeout ended the wait
    assert runtime.server_state("be_app", "web0").admin == "maint"
    assert haproxy.status("web0") == "MAINT"
    assert slow.finish() == "web0"


def test_drain_timeout_fails_when_asked_to(
    haproxy: RunningHAProxy,
    runtime: HAProxyRuntime,
    hold: Callable[[str], SlowRequest],
) -> None:
    hold("web0")
    action = make_action(runtime, drain_timeout=0.3, use_maint=True, fail_on_timeout=True)
    with pytest.raises(ActionError, match=r"be_app/web0 still has 1 session\(s\) after the drain timeout"):
        action.drain(CTX)
    assert haproxy.status("web0") == "DRAIN"  # not put in maintenance after a failed drain


def test_maint_then_recover_brings_traffic_back(haproxy: RunningHAProxy, runtime: HAProxyRuntime) -> None:
    action = make_action(runtime, use_maint=True)
    action.drain(CTX)
    assert haproxy.status("web0") == "MAINT"
    assert set(haproxy.served_by(10)) == {"web1"}

    action.drain(CTX)  # idempotent: stays in maintenance, not moved back to drain
    assert haproxy.status("web0") == "MAINT"

    action.recover(ActionContext(vm="vm0", events=()))
    assert runtime.server_state("be_app", "web0").admin == "ready"
    served: list[str] = []

    def web0_served() -> bool:
        served.append(haproxy.request())
        return "web0" in served

    wait_until(web0_served, timeout=10, message="a request reaches web0 again")
    assert len(served) <= 3  # round robin over two servers: web0 within the first few requests

    action.recover(ActionContext(vm="vm0", events=()))  # idempotent
    assert runtime.server_state("be_app", "web0").admin == "ready"
    wait_until(lambda: haproxy.status("web0") == "UP", timeout=10, message="web0 UP again after its checks")


def test_unknown_server_and_backend_report_haproxys_answer(runtime: HAProxyRuntime) -> None:
    with pytest.raises(ActionError, match=r"No such server\."):
        make_action(runtime, server="nosuch").drain(CTX)
    with pytest.raises(ActionError, match=r"No such server\."):
        make_action(runtime, server="nosuch").recover(CTX)
    with pytest.raises(ActionError, match=r"No such backend\."):
        runtime.set_state("be_nosuch", "web0", "drain")
    with pytest.raises(ActionError, match=r"No such proxy\."):
        runtime.current_sessions("be_nosuch", "web0")
    with pytest.raises(ActionError, match=r"Can't find backend\."):
        runtime.server_state("be_nosuch", "web0")


def test_tcp_runtime_address(haproxy: RunningHAProxy) -> None:
    runtime = HAProxyRuntime(haproxy.stats_address, timeout=5.0)
    assert runtime.address == haproxy.stats_address
    action = make_action(runtime, server="web1")
    action.drain(CTX)
    assert haproxy.status("web1") == "DRAIN"
    assert set(haproxy.served_by(6)) == {"web0"}
    action.recover(CTX)
    assert runtime.server_state("be_app", "web1").admin == "ready"
    assert "web1" in haproxy.served_by(4)


def test_unreachable_runtime_is_an_action_error(tmp_path: Path) -> None:
    runtime = HAProxyRuntime(f"unix:{tmp_path}/missing.sock", timeout=1.0)
    with pytest.raises(ActionError, match=r"unreachable"):
        make_action(runtime).recover(CTX)


def test_a_silent_runtime_socket_times_out(tmp_path: Path) -> None:
    path = f"{tmp_path}/silent.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as server:
        server.bind(path)
        server.listen(1)  # accepts into the backlog, never answers
        runtime = HAProxyRuntime(path, timeout=0.3)
        started = time.monotonic()
        with pytest.raises(ActionError, match=r"did not answer 'show servers state be_app' within 0.3 s"):
            runtime.server_state("be_app", "web0")
        assert time.monotonic() - started < 3.0


# -- recovery behind a health check that is the VM's own probe -----------------------------------------


class ProbeServer:
    """The VM's health probe as HAProxy checks it: 200 while the ``ProbeState`` serves, else 503."""

    def __init__(self, state: Any) -> None:
        from http.server import BaseHTTPRequestHandler

        from coordinator.support.quiethttp import QuietThreadingHTTPServer

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                code = 200 if state.serving else 503
                self.send_response(code)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: object) -> None:
                return None

        self.httpd = QuietThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port: int = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def probed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, Any, RunningHAProxy]]:
    """HAProxy in front of web0 and web1, whose health check of web0 is web0's probe (as in the demo)."""
    from coordinator.actions.probe import ProbeState
    from coordinator.testbed.haproxy import BackendTarget, LocalHAProxy
    from tests.plugins.haproxy import BackendServer

    directory = tmp_path_factory.mktemp("haproxy")
    state = ProbeState(serving=True)
    probe = ProbeServer(state)
    backends = {name: BackendServer(name) for name in ("web0", "web1")}
    proxy: LocalHAProxy | None = None
    try:
        for backend in backends.values():
            backend.start()
        targets = {"web0": BackendTarget(backends["web0"].port, check_port=probe.port),
                   "web1": BackendTarget(backends["web1"].port)}
        proxy = LocalHAProxy(directory, targets, backend="be_app")
        proxy.start()
        instance = RunningHAProxy(proxy, backends)
        wait_until(lambda: all(instance.status(s) == "UP" for s in ("web0", "web1")), timeout=15,
                   message="both servers UP")
        yield state, probe, instance
    finally:
        if proxy is not None:
            proxy.stop()
        for backend in backends.values():
            backend.stop()
        probe.stop()


@pytest.mark.parametrize("use_maint", [False, True], ids=["drain", "maint"])
def test_recovery_behind_the_probe_sets_ready_only_once_haproxy_sees_the_server_up(
    probed: tuple[Any, Any, RunningHAProxy], use_maint: bool, caplog: pytest.LogCaptureFixture,
) -> None:
    from coordinator.actions.base import run_drain, run_recover
    from coordinator.actions.probe import ProbeAction

    state, _, proxy = probed
    runtime = HAProxyRuntime(proxy.socket_path, timeout=5.0)
    actions = [ProbeAction(state), make_action(runtime, use_maint=use_maint, recover_timeout=15.0)]
    run_drain(actions, CTX)
    assert not state.serving
    wait_until(lambda: proxy.status("web0").startswith(("DOWN", "MAINT")), timeout=10,
               message="HAProxy's check sees web0's probe failing")
    with caplog.at_level(logging.INFO, logger="coordinator.actions.haproxy"):
        started = time.monotonic()
        run_recover(actions, ActionContext(vm="vm0", events=()))
        took = time.monotonic() - started
    assert "report it down" not in caplog.text  # ready only once HAProxy's checks pass
    assert "health checks report it up" in caplog.text
    assert took < 10.0  # rise 2 checks 0.5 s apart, not the bound
    # UP at once, not DOWN until the next checks: HAProxy routes to it again.
    assert proxy.status("web0") == "UP"
    assert runtime.server_state("be_app", "web0").admin == "ready"
    assert "web0" in proxy.served_by(4)
    assert "health checks report it down" not in proxy.log()


def test_recovery_is_bounded_when_haproxy_never_sees_the_server_up(
    probed: tuple[Any, Any, RunningHAProxy], caplog: pytest.LogCaptureFixture,
) -> None:
    _, probe, proxy = probed
    runtime = HAProxyRuntime(proxy.socket_path, timeout=5.0)
    action = make_action(runtime, use_maint=True, recover_timeout=2.0)
    action.drain(CTX)
    probe.stop()  # the probe never answers again: HAProxy's checks never pass
    with caplog.at_level(logging.WARNING, logger="coordinator.actions.haproxy"):
        started = time.monotonic()
        action.recover(ActionContext(vm="vm0", events=()))
        took = time.monotonic() - started
    assert 2.0 <= took < 5.0
    assert "still report it DOWN after 2 s" in caplog.text
    server = runtime.server_state("be_app", "web0")
    assert (server.admin, server.operational) == ("ready", "stopped")  # never left in maint or drain
