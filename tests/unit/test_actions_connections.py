"""/proc/net/tcp parsing on captured text, the psutil source with a fake psutil (the Windows path), and the
connection-drain wait with a fake clock and sleep."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import pytest

from coordinator.actions.base import ActionContext
from coordinator.actions.connections import (
    AZURE_LB_PROBE_INTERVAL,
    AZURE_LB_PROBE_THRESHOLD,
    ConnectionsDrainedWait,
    TcpSocket,
    count_established,
    established_ports_proc,
    established_ports_psutil,
    established_ports_source,
    parse_proc_net_tcp,
    probe_wait_seconds,
    read_proc_net_tcp,
)
from coordinator.errors import ActionError
from coordinator.models import ScheduledEvent

# Captured on Linux 6.x with a listener on 127.0.0.1:8443 (0x20FB) and one on [::]:8080 (0x1F90), one
# connection to the first and two (one IPv6, one IPv4-mapped) to the second, plus hand-added TIME_WAIT and
# CLOSE_WAIT rows. The client ends of those connections are there too: their local ports are ephemeral.
TCP = """\
  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   1: 0100007F:20FB 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 56820 1 00000000899ea534 100 0 0 10 0
   2: 0100007F:B532 0100007F:1F90 01 00000000:00000000 00:00000000 00000000     0        0 56826 2 000000004b530d06 20 0 0 10 -1
  11: 0100007F:D340 0100007F:20FB 01 00000000:00000000 00:00000000 00000000     0        0 56821 2 00000000a32584c0 20 0 0 10 -1
  19: 0100007F:20FB 0100007F:D340 01 00000000:00000000 00:00000000 00000000     0        0 56822 1 00000000be377fb4 20 0 0 10 -1
  20: 0100007F:20FB 0100007F:D342 06 00000000:00000000 03:00000F9A 00000000     0        0 0 3 0000000000000000
  21: 0100007F:20FB 0100007F:D344 08 00000000:00000001 00:00000000 00000000     0        0 56830 1 00000000be377fb5 20 0 0 10 -1
"""  # noqa: E501
TCP6 = """\
  sl  local_address                         remote_address                        st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 00000000000000000000000000000000:1F90 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 56823 1 000000003753b4c2 100 0 0 10 0
   2: 00000000000000000000000001000000:1F90 00000000000000000000000001000000:B41E 01 00000000:00000000 00:00000000 00000000     0        0 56825 1 00000000bbe6cf50 20 0 0 10 -1
  16: 0000000000000000FFFF00000100007F:1F90 0000000000000000FFFF00000100007F:B532 01 00000000:00000000 00:00000000 00000000     0        0 56827 1 0000000004086d4a 20 0 0 10 -1
  23: 00000000000000000000000001000000:B41E 00000000000000000000000001000000:1F90 01 00000000:00000000 00:00000000 00000000     0        0 56824 2 00000000fb0c22d6 20 0 0 10 -1
"""  # noqa: E501
HEADER = TCP.splitlines()[0] + "\n"

CTX = ActionContext(vm="vm0", events=(ScheduledEvent(event_id="E-1", event_type="Freeze", event_status="Scheduled"),))


# -- parsing ---------------------------------------------------------------------------------------------


def test_parse_ipv4_rows() -> None:
    sockets = parse_proc_net_tcp(TCP)
    assert len(sockets) == 6
    assert sockets[0] == TcpSocket("0100007F", 8443, "00000000", 0, 0x0A)
    assert sockets[3] == TcpSocket("0100007F", 8443, "0100007F", 0xD340, 0x01)
    assert [s.established for s in sockets] == [False, True, True, True, False, False]


def test_parse_ipv6_rows() -> None:
    sockets = parse_proc_net_tcp(TCP6)
    assert [(s.local_port, s.remote_port, s.state) for s in sockets] == [
        (8080, 0, 0x0A),
        (8080, 0xB41E, 0x01),
        (8080, 0xB532, 0x01),
        (0xB41E, 8080, 0x01),
    ]
    assert sockets[2].local_address == "0000000000000000FFFF00000100007F"


def test_count_uses_local_port_and_established_state_only() -> None:
    assert count_established([TCP, TCP6], {8443}) == 1  # not the listener, TIME_WAIT, CLOSE_WAIT or client end
    assert count_established([TCP, TCP6], {8080}) == 2  # IPv6 and IPv4-mapped, not the client ends
    assert count_established([TCP, TCP6], {8080, 8443}) == 3
    assert count_established([TCP, TCP6], {0xB532}) == 1  # a client's ephemeral port is a local port too
    assert count_established([TCP, TCP6], {9999}) == 0
    assert count_established([HEADER], {8443}) == 0
    assert count_established([], {8443}) == 0


def test_blank_lines_and_empty_text_are_fine() -> None:
    assert parse_proc_net_tcp("") == []
    assert parse_proc_net_tcp(HEADER + "\n   \n") == []


@pytest.mark.parametrize(
    "text",
    [
        "garbage\n",
        HEADER + "   0: 0100007F 00000000:0000 0A\n",
        HEADER + "   0: 0100007F:20FB 00000000:0000\n",
        HEADER + "   0: 0100007F:ZZZZ 00000000:0000 01\n",
        HEADER + "   0: 0100007F:20FB 00000000:0000 XY\n",
        HEADER + "   0: 01007F:20FB 00000000:0000 01\n",
        HEADER + "   0 0100007F:20FB 00000000:0000 01\n",
    ],
)
def test_malformed_text_raises(text: str) -> None:
    with pytest.raises(ValueError):
        parse_proc_net_tcp(text)


def test_default_reader_reads_this_kernels_tables() -> None:
    tables = read_proc_net_tcp()
    assert tables and all("local_address" in t.splitlines()[0] for t in tables)
    for table in tables:
        parse_proc_net_tcp(table)  # the real format parses


def test_proc_source_lists_the_local_port_of_each_established_socket() -> None:
    assert sorted(established_ports_proc(lambda: [TCP, TCP6])) == sorted([0xB532, 0xD340, 8443, 8080, 8080, 0xB41E])


# -- psutil (every system but Linux) ---------------------------------------------------------------------


@dataclass(frozen=True)
class Conn:
    laddr: tuple[str, int] | tuple[()]
    status: str


class FakePsutil:
    """The part of psutil the Windows path uses; rows shaped as psutil's ``sconn`` on Windows."""

    CONN_ESTABLISHED = "ESTABLISHED"

    class Error(Exception):
        pass

    class AccessDenied(Error):
        pass

    def __init__(self, rows: list[Conn] | None = None) -> None:
        self.rows = rows or []
        self.kinds: list[str] = []

    def net_connections(self, kind: str) -> list[Conn]:
        self.kinds.append(kind)
        if self.rows and self.rows[0].status == "DENY":
            raise self.AccessDenied("pid=4")
        return self.rows


WINDOWS_ROWS = [
    Conn(("0.0.0.0", 8443), "LISTEN"),
    Conn(("10.0.0.4", 8443), "ESTABLISHED"),
    Conn(("::", 8080), "LISTEN"),
    Conn(("fe80::1", 8080), "ESTABLISHED"),
    Conn(("10.0.0.4", 8443), "TIME_WAIT"),
    Conn(("10.0.0.4", 8443), "CLOSE_WAIT"),
    Conn(("10.0.0.4", 50123), "ESTABLISHED"),  # a client end: its local port is ephemeral
    Conn((), "NONE"),
]


def test_psutil_source_keeps_established_rows_and_asks_for_tcp_only() -> None:
    ps = FakePsutil(WINDOWS_ROWS)
    assert sorted(established_ports_psutil(ps)) == [8080, 8443, 50123]
    assert ps.kinds == ["tcp"]


def test_psutil_errors_become_action_errors() -> None:
    ps = FakePsutil([Conn((), "DENY")])
    with pytest.raises(ActionError, match=r"cannot count connections on ports \[443\]: .*AccessDenied"):
        ConnectionsDrainedWait([443], deadline=5, established=lambda: established_ports_psutil(ps)).drain(CTX)


def test_the_source_is_chosen_by_system() -> None:
    assert established_ports_source("linux") is established_ports_proc
    ps = FakePsutil(WINDOWS_ROWS)
    source = established_ports_source("win32", psutil=ps)
    assert sorted(source()) == [8080, 8443, 50123]
    assert ps.kinds == ["tcp"]


def test_the_wait_on_windows_counts_service_ports_only() -> None:
    ps = FakePsutil(WINDOWS_ROWS)
    action = ConnectionsDrainedWait([8443, 8080], deadline=0, established=established_ports_source("win32", ps))
    assert action.established() == 2


# -- probe timing ----------------------------------------------------------------------------------------


def test_probe_wait_seconds() -> None:
    assert (AZURE_LB_PROBE_INTERVAL, AZURE_LB_PROBE_THRESHOLD) == (15.0, 2)
    assert probe_wait_seconds() == 30.0
    assert probe_wait_seconds(5, 1) == 5.0
    assert probe_wait_seconds(15, 2, grace=5) == 35.0


@pytest.mark.parametrize(("args", "kwargs"), [((0, 2), {}), ((15, 0), {}), ((15, 2.5), {}), ((15, 2), {"grace": -1})])
def test_probe_wait_seconds_rejects_nonsense(args: tuple[float, int], kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        probe_wait_seconds(*args, **kwargs)


# -- the wait --------------------------------------------------------------------------------------------


class FakeTime:
    def __init__(self) -> None:
        self.now = 50.0
        self.sleeps: list[float] = []

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        assert seconds > 0
        self.sleeps.append(seconds)
        self.now += seconds


class ScriptedTables:
    """Returns one snapshot of the tables per read; the last one repeats."""

    def __init__(self, *snapshots: list[str]) -> None:
        self.snapshots = list(snapshots)
        self.reads = 0

    def __call__(self) -> Iterable[str]:
        self.reads += 1
        return self.snapshots.pop(0) if len(self.snapshots) > 1 else self.snapshots[0]


def wait(reader: ScriptedTables, time: FakeTime, **kwargs: float) -> ConnectionsDrainedWait:
    options: dict[str, Any] = {"deadline": 10.0, "poll_interval": 3.0}
    options.update(kwargs)
    return ConnectionsDrainedWait([8443, 8080], established=lambda: established_ports_proc(reader),
                                  clock=time.clock, sleep=time.sleep, **options)


def test_drain_returns_at_once_when_nothing_is_established() -> None:
    reader, time = ScriptedTables([HEADER]), FakeTime()
    wait(reader, time).drain(CTX)
    assert (reader.reads, time.sleeps) == (1, [])


def test_drain_waits_until_connections_end(caplog: pytest.LogCaptureFixture) -> None:
    reader, time = ScriptedTables([TCP, TCP6], [TCP], [HEADER]), FakeTime()
    with caplog.at_level(logging.INFO, logger="coordinator.actions.connections"):
        wait(reader, time).drain(CTX)
    assert reader.reads == 3
    assert time.sleeps == [3.0, 3.0]
    assert "no established connections on ports 8080,8443 after 6.0 s (vm=vm0 events=E-1)" in caplog.text


def test_deadline_is_logged_not_a_failure(caplog: pytest.LogCaptureFixture) -> None:
    reader, time = ScriptedTables([TCP, TCP6]), FakeTime()
    with caplog.at_level(logging.WARNING, logger="coordinator.actions.connections"):
        wait(reader, time, deadline=7.0).drain(CTX)
    assert time.sleeps == [3.0, 3.0, 1.0]  # never sleeps past the deadline
    assert time.now == 57.0
    assert "3 connection(s) still established on ports 8080,8443 after the 7.0 s deadline" in caplog.text
    assert "vm=vm0 events=E-1" in caplog.text


def test_zero_deadline_checks_once() -> None:
    reader, time = ScriptedTables([TCP]), FakeTime()
    wait(reader, time, deadline=0.0).drain(CTX)
    assert (reader.reads, time.sleeps) == (1, [])


def test_unreadable_or_unparsable_tables_are_action_errors() -> None:
    def broken() -> list[str]:
        raise PermissionError("/proc/net/tcp: permission denied")

    with pytest.raises(ActionError, match=r"cannot count connections on ports \[443\]: .*permission denied"):
        ConnectionsDrainedWait([443], deadline=5, established=lambda: established_ports_proc(broken)).drain(CTX)
    with pytest.raises(ActionError, match="not a /proc/net/tcp table"):
        ConnectionsDrainedWait([443], deadline=5, established=lambda: established_ports_proc(lambda: ["x"])).drain(CTX)


def test_recover_does_nothing() -> None:
    reader, time = ScriptedTables([TCP]), FakeTime()
    action = wait(reader, time)
    assert action.recover(CTX) is None  # type: ignore[func-returns-value]
    assert (reader.reads, time.sleeps) == (0, [])


@pytest.mark.parametrize(
    ("ports", "kwargs"),
    [([], {}), ([0], {}), ([70000], {}), ([True], {}), ([80], {"deadline": -1}), ([80], {"poll_interval": 0})],
)
def test_bad_settings_are_rejected(ports: list[int], kwargs: dict[str, float]) -> None:
    options: dict[str, Any] = {"deadline": 5.0}
    options.update(kwargs)
    with pytest.raises(ValueError):
        ConnectionsDrainedWait(ports, **options)
