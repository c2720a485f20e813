"""The pure parts of coordinator.testbed.zookeeper: zoo.cfg rendering, the class path check and the
parsing of ``cons``."""

from __future__ import annotations

from pathlib import Path

import pytest

from coordinator.testbed.zookeeper import (
    ConnectionStats,
    LocalZooKeeper,
    QuorumPeer,
    find_classpath,
    parse_cons,
    render_zoo_cfg,
)


def parse(cfg: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in cfg.splitlines())


def test_standalone_config_listens_on_loopback_without_admin_server() -> None:
    cfg = parse(
        render_zoo_cfg(
            data_dir=Path("/srv/zk/data"), client_port=21810, tick_time_ms=500, max_session_timeout_ms=60_000
        )
    )
    assert cfg["dataDir"] == "/srv/zk/data"
    assert cfg["clientPort"] == "21810"
    assert cfg["clientPortAddress"] == "127.0.0.1"
    assert cfg["admin.enableServer"] == "false"
    assert cfg["4lw.commands.whitelist"] == "ruok,srvr,stat,mntr,cons"
    assert (cfg["tickTime"], cfg["minSessionTimeout"], cfg["maxSessionTimeout"]) == ("500", "1000", "60000")
    assert not any(key.startswith("server.") for key in cfg)


def test_ensemble_config_lists_every_peer_on_loopback() -> None:
    peers = [QuorumPeer(1, 2181, 2888, 3888), QuorumPeer(2, 2182, 2889, 3889), QuorumPeer(3, 2183, 2890, 3890)]
    cfg = parse(
        render_zoo_cfg(
            data_dir=Path("/d"), client_port=2182, tick_time_ms=200, max_session_timeout_ms=20_000, peers=peers
        )
    )
    assert cfg["server.1"] == "127.0.0.1:2888:3888"
    assert cfg["server.2"] == "127.0.0.1:2889:3889"
    assert cfg["server.3"] == "127.0.0.1:2890:3890"
    assert cfg["clientPort"] == "2182"


@pytest.mark.parametrize(("tick", "max_session"), [(0, 60_000), (500, 999)])
def test_impossible_timings_are_refused(tick: int, max_session: int) -> None:
    with pytest.raises(ValueError):
        render_zoo_cfg(data_dir=Path("/d"), client_port=1, tick_time_ms=tick, max_session_timeout_ms=max_session)


def test_missing_jar_is_named_with_the_install_command(tmp_path: Path) -> None:
    (tmp_path / "zookeeper.jar").write_bytes(b"")
    with pytest.raises(RuntimeError) as error:
        find_classpath(tmp_path)
    assert "zookeeper-jute.jar" in str(error.value)
    assert "apt-get install zookeeper" in str(error.value)


def test_classpath_lists_the_jars_the_manifest_does_not_pull_in(tmp_path: Path) -> None:
    for jar in (
        "zookeeper.jar",
        "zookeeper-jute.jar",
        "netty-codec.jar",
        "netty-resolver.jar",
        "slf4j-api.jar",
        "slf4j-log4j12.jar",
        "log4j-1.2.jar",
    ):
        (tmp_path / jar).write_bytes(b"")
    entries = find_classpath(tmp_path).split(":")
    assert entries[0] == str(tmp_path / "zookeeper.jar")
    assert {Path(e).name for e in entries} >= {"netty-codec.jar", "netty-resolver.jar", "slf4j-log4j12.jar"}


def test_start_without_jars_fails_before_launching_anything(tmp_path: Path) -> None:
    server = LocalZooKeeper(tmp_path / "zk", jar_dir=tmp_path / "no-jars")
    with pytest.raises(RuntimeError, match="apt-get install zookeeper"):
        server.start(timeout=1)
    assert server.pid is None
    assert not server.running


def test_hosts_is_unknown_before_start_when_the_port_is_picked(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="start"):
        _ = LocalZooKeeper(tmp_path).hosts
    assert LocalZooKeeper(tmp_path, 2181).hosts == "127.0.0.1:2181"


CONS = """\
 /127.0.0.1:50732[1](queued=0,recved=8,sent=8,sid=0x1000167e6d80000,lop=PING,est=1795467797507,to=4000,\
lcxid=0x1f,lzxid=0x1,lresp=23586931,llat=12,minlat=0,avglat=12,maxlat=12)
 /127.0.0.1:50740[1](queued=0,recved=3,sent=3,sid=0x1000167e6d80001,lop=GETD,est=1795467797600,to=4000,\
lcxid=0x2,lzxid=0xffffffffffffffff,lresp=23586990,llat=1,minlat=0,avglat=1,maxlat=1)
 /127.0.0.1:50738[0](queued=0,recved=1,sent=0)

"""


def test_cons_is_parsed_by_session_with_hex_fields_as_integers() -> None:
    stats = parse_cons(CONS)
    assert stats == {
        0x1000167E6D80000: ConnectionStats(0x1000167E6D80000, recved=8, sent=8, lcxid=0x1F, lop="PING"),
        0x1000167E6D80001: ConnectionStats(0x1000167E6D80001, recved=3, sent=3, lcxid=2, lop="GETD"),
    }


def test_cons_lines_without_a_session_and_other_text_are_skipped() -> None:
    assert parse_cons(" /127.0.0.1:50738[0](queued=0,recved=1,sent=0)\n\nThis ZooKeeper instance is not currently "
                      "serving requests\n") == {}
