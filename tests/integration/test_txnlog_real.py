"""The transaction log reader (``tests.oracle.txnlog``) on the log of a real ZooKeeper: the
creations and deletions a client made, a multi, an ephemeral node deleted by its client's close and one by
its session's expiry, each at the server's time in milliseconds (a node's ctime); and the oracle's node
history from that log (``oracle.history.from_txn_log``)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time

from kazoo.client import KazooClient
from kazoo.exceptions import NodeExistsError

from coordinator.testbed.zookeeper import LocalZooKeeper
from tests.oracle import NodeSighting, Observations, OracleSettings
from tests.oracle.history import KINDS, from_txn_log
from tests.oracle.txnlog import read_history
from tests.plugins.zookeeper import wait_until

EVENT = "0A0B0C0D-1111-2222-3333-444455556666"

# A client in a process of its own: its ephemeral ack, then nothing (killed, its session expires).
_HOLDER = textwrap.dedent("""
    import sys, time
    from kazoo.client import KazooClient
    client = KazooClient(hosts=sys.argv[1], timeout=1.0)
    client.start(timeout=15)
    client.create(sys.argv[2], b"{}", ephemeral=True)
    print(client.client_id[0], flush=True)
    time.sleep(120)
""")


def _client(hosts: str) -> KazooClient:
    client = KazooClient(hosts=hosts, timeout=10.0)
    client.start(timeout=15)
    return client


def test_the_log_of_a_real_server_has_every_creation_and_deletion_at_its_ctime(
        zk_server: LocalZooKeeper, zk_chroot: str) -> None:
    root = zk_chroot
    acks = f"{root}/events/{EVENT}/acks"
    writer = _client(zk_server.hosts)
    closer = _client(zk_server.hosts)
    holder: subprocess.Popen[str] | None = None
    try:
        writer.ensure_path(acks)
        writer.ensure_path(f"{root}/members")
        member = writer.create(f"{root}/members/vm0", b"{}", ephemeral=True)
        transaction = writer.transaction()
        transaction.create(f"{root}/events/{EVENT}/approval", b"{}")
        transaction.create(f"{root}/events/{EVENT}/admitted", b"{}")
        assert all(result is not False for result in transaction.commit())
        failed = writer.transaction()
        failed.create(f"{root}/out")
        failed.create(f"{root}/members/vm0")  # exists: the whole multi fails, /out is not made
        assert any(isinstance(result, NodeExistsError) for result in failed.commit())
        closer.create(f"{acks}/vm1", b"{}", ephemeral=True)
        closer_session = closer.client_id[0]
        stats = {path: writer.exists(path) for path in (
            f"{root}/members/vm0", f"{root}/events/{EVENT}/approval", f"{acks}/vm1")}
        closer.stop()  # an explicit close: its ack goes with it
        holder = subprocess.Popen([sys.executable, "-c", _HOLDER, zk_server.hosts, f"{acks}/vm2"],
                                  stdout=subprocess.PIPE, text=True)
        assert holder.stdout is not None
        holder_session = int(holder.stdout.readline())
        stats[f"{acks}/vm2"] = writer.exists(f"{acks}/vm2")
        holder.kill()  # no close: the server expires the session (1 s) and deletes its ack
        holder.wait(10)
        wait_until(lambda: writer.exists(f"{acks}/vm2") is None, timeout=20, message="the killed client's ack to go")
        writer.delete(f"{root}/events/{EVENT}/approval")
        time.sleep(0.1)
        writer_session = writer.client_id[0]
    finally:
        if holder is not None and holder.poll() is None:
            holder.kill()
            holder.wait(10)
        for client in (writer, closer):
            client.stop()
            client.close()

    history = read_history(zk_server.data_dir)
    assert history.servers == 1 and history.files
    mine = [c for c in history.nodes if c.path.startswith(root + "/")]
    made = {c.path: c for c in mine if c.op == "create"}
    gone = {c.path: c for c in mine if c.op == "delete"}
    for path, stat in stats.items():
        assert made[path].time_ms == stat.ctime and made[path].zxid == stat.czxid, path
        assert made[path].owner == stat.ephemeralOwner, path
    assert made[f"{root}/members/vm0"].ephemeral and made[f"{root}/members/vm0"].owner == writer_session
    assert member == f"{root}/members/vm0"
    assert made[f"{root}/events/{EVENT}/approval"].zxid == made[f"{root}/events/{EVENT}/admitted"].zxid  # one multi
    assert not made[f"{root}/events/{EVENT}/approval"].ephemeral
    assert f"{root}/out" not in made  # the failed multi changed nothing
    by_close = gone[f"{acks}/vm1"]
    assert by_close.by_close and by_close.session == closer_session and by_close.time_ms >= made[f"{acks}/vm1"].time_ms
    expired = gone[f"{acks}/vm2"]
    assert expired.by_close and expired.session == holder_session
    closes = {s.session: s for s in history.sessions if s.op == "close"}
    assert not closes[closer_session].expired and closes[holder_session].expired
    assert closes[holder_session].time_ms == expired.time_ms
    assert not gone[f"{root}/events/{EVENT}/approval"].by_close

    # The oracle's history: an observer that saw only the member node; the log gives the rest, under the
    # chroot it finds by that node.
    seen = stats[f"{root}/members/vm0"]
    observations = Observations(settings=OracleSettings(agent_vms=("vm0", "vm1", "vm2"), drain_wait_seconds=1.0),
                                started_at=seen.ctime / 1000 - 1, ended_at=time.time() + 1,
                                nodes=[NodeSighting("member", None, "vm0", seen.ctime / 1000, seen.ephemeralOwner,
                                                    seen.ctime / 1000 + 0.1)])
    judged = from_txn_log(observations, zk_server.data_dir, kinds=KINDS)
    nodes = {(n.kind, n.vm): n for n in judged.nodes}
    assert set(nodes) == {("member", "vm0"), ("record", None), ("approval", None), ("admitted", None),
                          ("ack", "vm1"), ("ack", "vm2")}
    assert nodes[("member", "vm0")].first_seen == seen.ctime / 1000 + 0.1
    assert nodes[("ack", "vm2")].ctime == stats[f"{acks}/vm2"].ctime / 1000 and nodes[("ack", "vm2")].first_seen is None
    assert nodes[("ack", "vm2")].gone_seen == expired.time_ms / 1000
    assert nodes[("ack", "vm2")].owner == holder_session
