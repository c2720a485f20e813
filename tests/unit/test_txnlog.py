"""The reader of ZooKeeper's transaction logs (``tests.oracle.txnlog``), on logs this test
writes in ZooKeeper's own binary format: file header, then (Adler-32, length, TxnHeader + body + digest,
``B``) records, then the zero padding of a preallocated file."""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

import pytest

from tests.oracle.txnlog import (
    CONTAINER_OWNER,
    NodeChange,
    TxnLogError,
    read_history,
    read_log,
    server_logs,
)

S1, S2 = 0x10000B88CBA0001, 0x10000B88CBA0002
T0 = 1_795_798_234_000  # ms


# -- jute's binary archive ------------------------------------------------------------------------------------


def _int(value: int) -> bytes:
    return struct.pack(">i", value)


def _long(value: int) -> bytes:
    return struct.pack(">q", value)


def _buffer(data: bytes | None) -> bytes:
    return _int(-1) if data is None else _int(len(data)) + data


def _string(text: str) -> bytes:
    return _buffer(text.encode())


_ACL = _int(1) + _int(31) + _string("world") + _string("anyone")


def create(path: str, ephemeral: bool = False, data: bytes = b'{"vm":"vm1"}') -> tuple[int, bytes]:
    return 1, _string(path) + _buffer(data) + _ACL + (b"\x01" if ephemeral else b"\x00") + _int(3)


def create2(path: str, ephemeral: bool = False) -> tuple[int, bytes]:
    return 15, create(path, ephemeral)[1]


def container(path: str) -> tuple[int, bytes]:
    return 19, _string(path) + _buffer(b"") + _ACL + _int(0)


def ttl(path: str, millis: int) -> tuple[int, bytes]:
    return 21, _string(path) + _buffer(b"") + _ACL + _int(0) + _long(millis)


def delete(path: str) -> tuple[int, bytes]:
    return 2, _string(path)


def set_data(path: str) -> tuple[int, bytes]:
    return 5, _string(path) + _buffer(b"x") + _int(1)


def error(code: int = -110) -> tuple[int, bytes]:
    return -1, _int(code)


def multi(*ops: tuple[int, bytes]) -> tuple[int, bytes]:
    return 14, _int(len(ops)) + b"".join(_int(kind) + _buffer(body) for kind, body in ops)


def create_session(timeout_ms: int = 15000) -> tuple[int, bytes]:
    return -10, _int(timeout_ms)


def close_session(*paths: str, body: bool = True) -> tuple[int, bytes]:
    if not body:
        return -11, b""
    return -11, _int(len(paths)) + b"".join(_string(p) for p in paths)


def record(session: int, cxid: int, zxid: int, time_ms: int, op: tuple[int, bytes], digest: bool = True) -> bytes:
    kind, body = op
    entry = _long(session) + _int(cxid) + _long(zxid) + _long(time_ms) + _int(kind) + body
    if digest:
        entry += _int(2) + _long(0x51C6D660)  # TxnDigest: version, tree digest
    return _long(zlib.adler32(entry)) + _int(len(entry)) + entry + b"B"


def write_log(path: Path, records: list[bytes], padding: int = 4096) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(struct.pack(">iiq", 0x5A4B4C47, 2, 0) + b"".join(records) + b"\0" * padding)
    return path


def story() -> list[bytes]:
    """A group's first seconds: sessions, its parents, a member, a multi, an ack made and deleted, a failed
    create, a failed multi, a close and an expiry."""
    return [
        record(S1, 0, 1, T0, create_session()),
        record(S1, 1, 2, T0 + 10, create("/g")),
        record(S1, 2, 3, T0 + 11, create2("/g/members")),
        record(S1, 3, 4, T0 + 12, create("/g/members/vm1", ephemeral=True)),
        record(S2, 0, 5, T0 + 20, create_session(6000)),
        record(S2, 1, 6, T0 + 21, create("/g/members/vm2", ephemeral=True)),
        record(S1, 4, 7, T0 + 30, multi(create("/g/events/E1"), set_data("/g"), create("/g/events/E1/acks"))),
        record(S2, 2, 8, T0 + 1234, create("/g/events/E1/acks/vm2", ephemeral=True)),
        record(S2, 3, 9, T0 + 1240, error()),  # a create of an existing node: nothing changed
        record(S1, 5, 10, T0 + 1300, multi(error(0), error(-101))),  # a failed multi: nothing changed
        record(S2, 4, 11, T0 + 2001, delete("/g/events/E1/acks/vm2")),
        record(S2, 5, 12, T0 + 2500, create("/g/leader", ephemeral=True)),
        record(S2, 6, 13, T0 + 3000, close_session("/g/members/vm2", "/g/leader")),
        record(S1, 0, 14, T0 + 9000, close_session("/g/members/vm1")),  # cxid 0: the server expired it
    ]


def test_a_log_reads_back_every_record_with_its_header_and_changes(tmp_path: Path) -> None:
    txns = list(read_log(write_log(tmp_path / "log.1", story())))
    assert [t.zxid for t in txns] == list(range(1, 15))
    first = txns[0]
    assert (first.session, first.cxid, first.time_ms, first.type) == (S1, 0, T0, -10)
    assert first.ops[0].timeout_ms == 15000
    assert txns[3].ops[0].path == "/g/members/vm1" and txns[3].ops[0].ephemeral and txns[3].ops[0].owner == S1
    assert [(op.type, op.path) for op in txns[6].ops] == [(1, "/g/events/E1"), (5, ""), (1, "/g/events/E1/acks")]
    assert txns[8].ops == () and txns[9].ops == ()  # an error, a failed multi
    assert txns[12].ops[0].paths == ("/g/members/vm2", "/g/leader")


def test_the_history_has_every_creation_and_deletion_with_the_servers_times(tmp_path: Path) -> None:
    write_log(tmp_path / "version-2" / "log.1", story())
    history = read_history(tmp_path)
    changes = [(c.op, c.path, c.zxid, c.time_ms - T0) for c in history.nodes]
    assert changes == [
        ("create", "/g", 2, 10),
        ("create", "/g/members", 3, 11),
        ("create", "/g/members/vm1", 4, 12),
        ("create", "/g/members/vm2", 6, 21),
        ("create", "/g/events/E1", 7, 30),
        ("create", "/g/events/E1/acks", 7, 30),
        ("create", "/g/events/E1/acks/vm2", 8, 1234),
        ("delete", "/g/events/E1/acks/vm2", 11, 2001),
        ("create", "/g/leader", 12, 2500),
        ("delete", "/g/members/vm2", 13, 3000),
        ("delete", "/g/leader", 13, 3000),
        ("delete", "/g/members/vm1", 14, 9000),
    ]
    ack = history.nodes[6]
    assert ack == NodeChange("create", "/g/events/E1/acks/vm2", 8, S2, T0 + 1234, True, S2)
    assert history.nodes[7].ephemeral and history.nodes[7].owner == S2 and not history.nodes[7].by_close
    closed = history.nodes[9:]
    assert all(c.by_close and c.ephemeral for c in closed)
    assert [c.session for c in closed] == [S2, S2, S1]
    assert [(s.op, s.session, s.timeout_ms, s.expired) for s in history.sessions] == [
        ("create", S1, 15000, False), ("create", S2, 6000, False), ("close", S2, 0, False), ("close", S1, 0, True)]
    assert history.last_zxid == 14 and history.last_time_ms == T0 + 9000 and history.servers == 1


def test_a_close_without_its_paths_still_deletes_the_sessions_ephemeral_nodes(tmp_path: Path) -> None:
    # Before ZooKeeper 3.6 (or with zookeeper.closeSessionTxn.enabled=false) a closeSession names no path.
    write_log(tmp_path / "log.1", [
        record(S1, 1, 1, T0, create("/m", ephemeral=True), digest=False),
        record(S1, 2, 2, T0 + 1, create("/p"), digest=False),
        record(S1, 3, 3, T0 + 2, close_session(body=False), digest=False),
    ])
    history = read_history(tmp_path)
    assert [(c.op, c.path, c.by_close) for c in history.nodes] == [
        ("create", "/m", False), ("create", "/p", False), ("delete", "/m", True)]


def test_an_ephemeral_node_deleted_before_the_close_is_not_deleted_twice(tmp_path: Path) -> None:
    write_log(tmp_path / "log.1", [
        record(S1, 1, 1, T0, create("/m", ephemeral=True)),
        record(S1, 2, 2, T0 + 1, delete("/m")),
        record(S2, 1, 3, T0 + 2, create("/m", ephemeral=True)),  # the same path, another session's now
        record(S1, 3, 4, T0 + 3, close_session()),
    ])
    assert [(c.op, c.session, c.by_close) for c in read_history(tmp_path).nodes] == [
        ("create", S1, False), ("delete", S1, False), ("create", S2, False)]


def test_containers_and_ttl_nodes_carry_zookeepers_special_owners(tmp_path: Path) -> None:
    write_log(tmp_path / "log.1", [
        record(S1, 1, 1, T0, container("/c")),
        record(S1, 2, 2, T0 + 1, ttl("/t", 5000)),
        record(S1, 3, 3, T0 + 2, multi(create2("/c/x", ephemeral=True), delete("/t"))),
        record(0, 0, 4, T0 + 3, (20, _string("/c/x"))),  # deleteContainer, as the container manager issues it
    ])
    nodes = read_history(tmp_path).nodes
    assert nodes[0].owner == CONTAINER_OWNER and not nodes[0].ephemeral
    assert nodes[1].owner == (0xFF00000000000000 | 5000) - (1 << 64)
    assert [(c.op, c.path, c.owner) for c in nodes[2:]] == [
        ("create", "/c/x", S1), ("delete", "/t", nodes[1].owner), ("delete", "/c/x", S1)]


@pytest.mark.parametrize("cut", ["checksum", "short", "no end byte"])
def test_reading_stops_at_the_end_of_what_the_server_wrote(tmp_path: Path, cut: str) -> None:
    good = [record(S1, 1, 1, T0, create("/a")), record(S1, 2, 2, T0 + 1, create("/b"))]
    last = record(S1, 3, 3, T0 + 2, create("/c"))
    if cut == "checksum":
        last = _long(12345) + last[8:]
    elif cut == "short":
        last = last[:-10]
    else:
        last = last[:-1] + b"X"
    path = tmp_path / "log.1"
    path.write_bytes(struct.pack(">iiq", 0x5A4B4C47, 2, 0) + b"".join(good) + last)
    assert [t.zxid for t in read_log(path)] == [1, 2]


def test_an_empty_or_foreign_file(tmp_path: Path) -> None:
    (tmp_path / "log.1").write_bytes(b"")
    assert list(read_log(tmp_path / "log.1")) == []
    (tmp_path / "log.2").write_bytes(b"PK\x03\x04" + b"\0" * 40)
    with pytest.raises(TxnLogError):
        list(read_log(tmp_path / "log.2"))


def test_the_log_files_of_a_server_are_read_in_zxid_order(tmp_path: Path) -> None:
    data = tmp_path / "zookeeper" / "data" / "version-2"
    write_log(data / "log.a", [record(S1, 2, 10, T0 + 10, delete("/a"))])
    write_log(data / "log.1", [record(S1, 1, 1, T0, create("/a"))])
    (data / "snapshot.0").write_bytes(b"not read")
    assert server_logs(tmp_path / "zookeeper") == [[data / "log.1", data / "log.a"]]
    assert server_logs(data) == server_logs(data.parent) == server_logs(tmp_path / "zookeeper")
    assert server_logs(tmp_path / "nowhere") == []
    assert [c.op for c in read_history(tmp_path / "zookeeper").nodes] == ["create", "delete"]


def test_an_ensembles_transaction_counts_once_a_majority_of_its_servers_logged_it(tmp_path: Path) -> None:
    # node0 was down for zxid 3; node2 logged zxid 4, proposed and never committed, and did not come back.
    committed = [record(S1, 1, 1, T0, create("/a")), record(S1, 2, 2, T0 + 1, create("/b")),
                 record(S1, 3, 3, T0 + 2, delete("/a"))]
    write_log(tmp_path / "node0" / "data" / "version-2" / "log.1", committed[:2])
    write_log(tmp_path / "node1" / "data" / "version-2" / "log.1", committed)
    write_log(tmp_path / "node2" / "data" / "version-2" / "log.1",
              [*committed, record(S1, 4, 4, T0 + 3, create("/phantom"))])
    history = read_history(tmp_path)
    assert history.servers == 3 and len(history.files) == 3
    assert [(c.op, c.path) for c in history.nodes] == [("create", "/a"), ("create", "/b"), ("delete", "/a")]
