"""HAProxy action and runtime client without HAProxy: canned answers (captured from HAProxy 2.6) and a
fake clock. The real thing is exercised in tests/integration/test_haproxy_action.py."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from coordinator.actions.base import ActionContext
from coordinator.actions.haproxy import HAProxyAction, HAProxyRuntime, ServerState
from coordinator.errors import ActionError
from coordinator.models import ScheduledEvent

CTX = ActionContext(vm="vm0", events=(ScheduledEvent(event_id="E-1", event_type="Reboot", event_status="Scheduled"),))

STAT_HEADER = (
    "# pxname,svname,qcur,qmax,scur,smax,slim,stot,bin,bout,dreq,dresp,ereq,econ,eresp,wretr,wredis,status,"
    "weight,act,bck,chkfail,chkdown,lastchg,downtime,qlimit,pid,iid,sid,throttle,lbtot,tracked,type,rate,"
)
SHOW_STAT = (
    STAT_HEADER
    + "\nbe_app,web0,0,0,3,5,,12,0,0,,0,,0,0,0,0,DRAIN,1,1,0,0,0,64,0,,1,3,1,,12,,2,0,"
    + "\nbe_app,web1,0,0,0,1,,9,0,0,,0,,0,0,0,0,UP,1,1,0,0,0,64,0,,1,3,2,,9,,2,0,"
    + "\n\n"
)
SERVERS_STATE = (
    "1\n"
    "# be_id be_name srv_id srv_name srv_addr srv_op_state srv_admin_state srv_uweight srv_iweight "
    "srv_time_since_last_change srv_check_status srv_check_result srv_check_health srv_check_state\n"
    "3 be_app 1 web0 127.0.0.1 2 8 1 1 0 8 2 0 6\n"
    "3 be_app 2 web1 127.0.0.1 0 1 1 1 64 8 2 0 14\n"
    "3 be_app 3 web2 127.0.0.1 2 0 100 100 64 8 2 0 6\n"
    "3 be_app 4 web3 127.0.0.1 2 2 1 1 64 8 2 0 6\n\n"
)


class CannedRuntime(HAProxyRuntime):
    """The real client with its one I/O method replaced by a table of answers."""

    def __init__(self, answers: dict[str, str]) -> None:
        super().__init__("/nonexistent/admin.sock")
        self.answers = answers
        self.sent: list[str] = []

    def execute(self, command: str) -> str:
        self.sent.append(command)
        return self.answers[command]


# -- addresses and names ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("address", "shown"),
    [
        ("/run/haproxy/admin.sock", "unix:/run/haproxy/admin.sock"),
        ("unix:/run/a:b.sock", "unix:/run/a:b.sock"),
        ("admin.sock", "unix:admin.sock"),
        (Path("/tmp/x.sock"), "unix:/tmp/x.sock"),
        ("127.0.0.1:9999", "127.0.0.1:9999"),
        ("tcp:localhost:9999", "localhost:9999"),
        ("[::1]:9999", "[::1]:9999"),
    ],
)
def test_address_forms(address: str | Path, shown: str) -> None:
    assert HAProxyRuntime(address).address == shown


@pytest.mark.parametrize("address", ["", "127.0.0.1:", "127.0.0.1:http", "host:70000", "tcp:nohost", "unix:"])
def test_bad_addresses_are_rejected(address: str) -> None:
    with pytest.raises(ValueError):
        HAProxyRuntime(address)


@pytest.mark.parametrize("name", ["be app", "be;show info", "be\nx", "", "be/x"])
def test_names_that_could_smuggle_commands_are_rejected(name: str) -> None:
    runtime = CannedRuntime({})
    with pytest.raises(ValueError):
        runtime.set_state(name, "web0", "drain")
    with pytest.raises(ValueError):
        HAProxyAction(runtime, "be_app", name, drain_timeout=1)
    assert runtime.sent == []


def test_execute_refuses_multi_line_commands() -> None:
    with pytest.raises(ValueError, match="one non-empty line"):
        HAProxyRuntime("/x.sock").execute("show info\nshow stat")


# -- parsing answers -------------------------------------------------------------------------------------


def test_set_state_sends_the_command_and_accepts_an_empty_answer() -> None:
    runtime = CannedRuntime({"set server be_app/web0 state drain": "\n"})
    runtime.set_state("be_app", "web0", "drain")
    assert runtime.sent == ["set server be_app/web0 state drain"]


def test_set_state_raises_with_haproxys_answer() -> None:
    runtime = CannedRuntime({"set server be_app/nosuch state maint": "No such server.\n\n"})
    with pytest.raises(ActionError, match=r"refused 'set server be_app/nosuch state maint': No such server\.$"):
        runtime.set_state("be_app", "nosuch", "maint")


def test_set_state_rejects_unknown_states() -> None:
    with pytest.raises(ValueError, match="state must be one of"):
        CannedRuntime({}).set_state("be_app", "web0", "up")  # type: ignore[arg-type]


def test_current_sessions_reads_scur_of_the_right_row() -> None:
    runtime = CannedRuntime({"show stat be_app 4 -1": SHOW_STAT})
    assert runtime.current_sessions("be_app", "web0") == 3
    assert runtime.current_sessions("be_app", "web1") == 0
    assert runtime.server_stats("be_app", "web0")["status"] == "DRAIN"


def test_show_stat_errors_quote_haproxy() -> None:
    runtime = CannedRuntime({"show stat be_x 4 -1": "No such proxy.\n", "get weight be_x/web0": "No such backend.\n"})
    with pytest.raises(ActionError, match=r"No such proxy\."):
        runtime.current_sessions("be_x", "web0")


def test_missing_server_row_is_explained_in_haproxys_words() -> None:
    runtime = CannedRuntime(
        {
            "show stat be_app 4 -1": SHOW_STAT,
            "show servers state be_app": SERVERS_STATE,
            "get weight be_app/web9": "No such server.\n",
        }
    )
    with pytest.raises(ActionError, match=r"has no server be_app/web9: No such server\."):
        runtime.current_sessions("be_app", "web9")
    with pytest.raises(ActionError, match=r"has no server be_app/web9: No such server\."):
        runtime.server_state("be_app", "web9")


def test_non_numeric_scur_is_an_error() -> None:
    runtime = CannedRuntime({"show stat be_app 4 -1": STAT_HEADER + "\nbe_app,web0,0,0,,0,\n"})
    with pytest.raises(ActionError, match="non-numeric scur"):
        runtime.current_sessions("be_app", "web0")


def test_server_state_decodes_admin_and_operational_states() -> None:
    runtime = CannedRuntime({"show servers state be_app": SERVERS_STATE})
    assert runtime.server_state("be_app", "web0") == ServerState("be_app", "web0", "drain", "running", 8, 1)
    assert runtime.server_state("be_app", "web1") == ServerState("be_app", "web1", "maint", "stopped", 1, 1)
    assert runtime.server_state("be_app", "web2") == ServerState("be_app", "web2", "ready", "running", 0, 100)
    assert runtime.server_state("be_app", "web3").admin == "maint"  # inherited maintenance (IMAINT)


def test_server_state_errors_quote_haproxy() -> None:
    runtime = CannedRuntime({"show servers state be_x": "Can't find backend.\n"})
    with pytest.raises(ActionError, match=r"Can't find backend\."):
        runtime.server_state("be_x", "web0")


# -- the action, with a fake HAProxy and a fake clock ----------------------------------------------------


class FakeHAProxy(HAProxyRuntime):
    """Answers the three typed operations from a script of session counts."""

    def __init__(self, sessions: list[int], admin: str = "ready") -> None:
        super().__init__("/nonexistent/admin.sock")
        self.sessions = sessions
        self.admin = admin
        self.calls: list[str] = []

    def set_state(self, backend: str, server: str, state: str) -> None:
        self.calls.append(f"set {state}")
        self.admin = state

    def current_sessions(self, backend: str, server: str) -> int:
        self.calls.append("sessions")
        return self.sessions.pop(0) if len(self.sessions) > 1 else self.sessions[0]

    def server_state(self, backend: str, server: str) -> ServerState:
        self.calls.append("state")
        return ServerState(backend, server, self.admin, "running", 0, 1)  # type: ignore[arg-type]


class FakeTime:
    def __init__(self) -> None:
        self.now = 100.0
        self.sleeps: list[float] = []

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        assert seconds > 0
        self.sleeps.append(seconds)
        self.now += seconds


def action(fake: FakeHAProxy, clock: FakeTime, **kwargs: object) -> HAProxyAction:
    options: dict[str, object] = {"drain_timeout": 10.0, "poll_interval": 2.0}
    options.update(kwargs)
    return HAProxyAction(fake, "be_app", "web0", clock=clock.clock, sleep=clock.sleep, **options)  # type: ignore[arg-type]


def test_drain_waits_until_sessions_reach_zero() -> None:
    fake, clock = FakeHAProxy([3, 2, 0]), FakeTime()
    action(fake, clock).drain(CTX)
    assert fake.calls == ["state", "set drain", "sessions", "sessions", "sessions"]
    assert clock.sleeps == [2.0, 2.0]
    assert fake.admin == "drain"


def test_drain_with_maint_sets_maint_after_waiting() -> None:
    fake, clock = FakeHAProxy([1, 0]), FakeTime()
    action(fake, clock, use_maint=True).drain(CTX)
    assert fake.calls == ["state", "set drain", "sessions", "sessions", "set maint"]


def test_drain_timeout_logs_and_continues(caplog: pytest.LogCaptureFixture) -> None:
    fake, clock = FakeHAProxy([4]), FakeTime()
    with caplog.at_level(logging.WARNING, logger="coordinator.actions.haproxy"):
        action(fake, clock, drain_timeout=5.0, use_maint=True).drain(CTX)
    assert clock.sleeps == [2.0, 2.0, 1.0]  # never sleeps past the timeout
    assert clock.now == 105.0
    assert fake.calls[-1] == "set maint"
    assert "be_app/web0 still has 4 session(s) after the drain timeout of 5 s; continuing" in caplog.text
    assert "vm=vm0 events=E-1" in caplog.text


def test_drain_timeout_fails_when_asked_and_skips_maint() -> None:
    fake, clock = FakeHAProxy([4]), FakeTime()
    with pytest.raises(ActionError, match="still has 4 session"):
        action(fake, clock, drain_timeout=3.0, use_maint=True, fail_on_timeout=True).drain(CTX)
    assert "set maint" not in fake.calls
    assert fake.admin == "drain"


def test_zero_drain_timeout_checks_once() -> None:
    fake, clock = FakeHAProxy([1]), FakeTime()
    action(fake, clock, drain_timeout=0.0).drain(CTX)
    assert fake.calls.count("sessions") == 1
    assert clock.sleeps == []


def test_drain_of_a_server_in_maintenance_does_not_reopen_it() -> None:
    fake, clock = FakeHAProxy([0], admin="maint"), FakeTime()
    action(fake, clock).drain(CTX)
    action(fake, clock, use_maint=True).drain(CTX)
    assert "set drain" not in fake.calls
    assert "set maint" not in fake.calls
    assert fake.admin == "maint"


def test_drain_is_idempotent() -> None:
    fake, clock = FakeHAProxy([0]), FakeTime()
    drain = action(fake, clock, use_maint=True)
    drain.drain(CTX)
    drain.drain(CTX)
    assert fake.calls == ["state", "set drain", "sessions", "set maint", "state", "sessions"]


class Checks(FakeHAProxy):
    """HAProxy whose health checks of the server report it down for the first ``down`` reads of its stats."""

    def __init__(self, down: int, admin: str) -> None:
        super().__init__([0], admin=admin)
        self.down = down

    def server_stats(self, backend: str, server: str) -> dict[str, str]:
        self.calls.append("stats")
        up = self.down <= 0
        self.down -= 1
        return {"status": ("DRAIN" if up else "DOWN") if self.admin == "drain" else "MAINT"}


def test_recover_from_maint_drains_first_and_sets_ready_once_the_checks_pass(caplog: pytest.LogCaptureFixture) -> None:
    fake, clock = Checks(down=3, admin="maint"), FakeTime()
    with caplog.at_level(logging.INFO, logger="coordinator.actions.haproxy"):
        action(fake, clock, poll_interval=0.5).recover(ActionContext(vm="vm0", events=()))
    # Out of maintenance (checks run again), wait for them, and only then ready.
    assert fake.calls == ["state", "set drain", "stats", "stats", "stats", "stats", "set ready"]
    assert clock.sleeps == [0.5, 0.5, 0.5]
    assert fake.admin == "ready"
    assert "WARNING" not in caplog.text


def test_recover_of_a_ready_server_sets_ready_without_waiting() -> None:
    fake, clock = Checks(down=5, admin="ready"), FakeTime()
    action(fake, clock).recover(ActionContext(vm="vm0", events=()))
    assert fake.calls == ["state", "set ready"]
    assert clock.sleeps == []


def test_recover_is_bounded_and_never_leaves_the_server_draining(caplog: pytest.LogCaptureFixture) -> None:
    fake, clock = Checks(down=1000, admin="drain"), FakeTime()
    with caplog.at_level(logging.WARNING, logger="coordinator.actions.haproxy"):
        action(fake, clock, poll_interval=2.0, recover_timeout=7.0).recover(ActionContext(vm="vm0", events=()))
    assert sum(clock.sleeps) == pytest.approx(7.0)
    assert fake.calls[-1] == "set ready" and fake.admin == "ready"
    assert "still report it DOWN after 7 s" in caplog.text


def test_the_agent_recovers_haproxy_after_the_probe() -> None:
    from coordinator.actions.base import run_recover
    from coordinator.actions.probe import ProbeAction, ProbeState

    probe = ProbeState(serving=False)
    seen: list[bool] = []

    class Recording(Checks):
        def set_state(self, backend: str, server: str, state: str) -> None:
            seen.append(probe.serving)
            super().set_state(backend, server, state)

    fake = Recording(down=0, admin="drain")

    class Hook:
        name = "hook"
        always_recover = False

        def drain(self, ctx: ActionContext) -> None:
            return None

        def recover(self, ctx: ActionContext) -> None:
            seen.append(probe.serving)

    run_recover([ProbeAction(probe), action(fake, FakeTime()), Hook()], ActionContext(vm="vm0", events=()))
    # The hook recovers first (reverse order), then the probe, then HAProxy once the probe serves.
    assert seen == [False, True]
    assert fake.calls == ["state", "stats", "set ready"]


def test_runtime_errors_propagate() -> None:
    class Broken(FakeHAProxy):
        def current_sessions(self, backend: str, server: str) -> int:
            raise ActionError("HAProxy runtime API at unix:/x unreachable")

    with pytest.raises(ActionError, match="unreachable"):
        action(Broken([0]), FakeTime()).drain(CTX)


@pytest.mark.parametrize("kwargs", [{"drain_timeout": -1.0}, {"drain_timeout": float("inf")}, {"poll_interval": 0.0},
                                    {"recover_timeout": -1.0}, {"recover_timeout": float("nan")}])
def test_bad_timing_is_rejected(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        action(FakeHAProxy([0]), FakeTime(), **kwargs)
