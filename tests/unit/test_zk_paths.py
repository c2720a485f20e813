"""The layout's table (``zk_paths.NODES``) is the paths ``ZooKeeperPaths`` builds: each node of the table is a
path the store reads or writes, and the other way round."""

from __future__ import annotations

from coordinator.store.zk_paths import NODES, ZooKeeperPaths


def test_every_node_of_the_layout_table_is_a_path_the_store_builds() -> None:
    paths = ZooKeeperPaths("/root/group")
    built = {
        paths.member("vm1"), paths.leader, paths.event("E1"), paths.registered("vm1"), paths.absent_vm("vm1"),
        paths.out_vm("vm1"), paths.admitted("E1"), paths.ack("E1", "vm1"), paths.approval("E1"), paths.pause,
        paths.layout_version, paths.drain("vm1"), paths.drain_admitted("vm1"),
    }
    table = {"/root/group" + pattern.format(vm="vm1", EVENT_ID="E1") for pattern, _ in NODES}
    assert table == built
    # The parents the store creates are the lists the table's nodes live in.
    assert {p.removeprefix("/root/group") for p in paths.layout()} == {
        "/" + pattern.split("/")[1] for pattern, _ in NODES if pattern.count("/") == 2 and "{vm}" in pattern
    } | {"/events"}
