"""The layout's table (``zk_paths.NODES``) is the paths ``ZooKeeperPaths`` builds: each node of the table is a
path the store reads or writes, and the other way round."""

from __future__ import annotations

from coordinator.store.zk_paths import NODES, ZooKeeperPaths, history_name, parse_history_name


def test_every_node_of_the_layout_table_is_a_path_the_store_builds() -> None:
    paths = ZooKeeperPaths("/root/group")
    paths_of = [node.path for node in NODES]
    built = {
        paths.member("vm1"), paths.leader, paths.event("E1"), paths.registered("vm1"), paths.absent_vm("vm1"),
        paths.out_vm("vm1"), paths.admitted("E1"), paths.ack("E1", "vm1"), paths.approval("E1"), paths.pause,
        paths.layout_version, paths.drain("vm1"), paths.drain_admitted("vm1"),
        paths.history_entry(history_name(1.5, "E1")),
    }
    table = {"/root/group" + pattern.format(vm="vm1", EVENT_ID="E1", DONE_MS="0000000001500") for pattern in paths_of}
    assert table == built
    # The parents the store creates are the lists the table's nodes live in.
    assert {p.removeprefix("/root/group") for p in paths.layout()} == {
        "/" + pattern.split("/")[1] for pattern in paths_of if pattern.count("/") == 2 and "{vm}" in pattern
    } | {"/events", "/history"}


def test_a_history_entry_is_named_by_when_it_was_done_and_sorts_by_it() -> None:
    event = "C7E9D5B4-7F3A-4E2B-9D1C-0A1B2C3D4E5F"
    name = history_name(1_796_226_822.0025, event)
    assert name == f"1796226822002-{event}" or name == f"1796226822003-{event}"
    assert parse_history_name(name) == (int(name[:13]) / 1000, event)
    assert sorted([history_name(20.0, event), history_name(3.0, event)]) == [history_name(3.0, event),
                                                                            history_name(20.0, event)]
    for odd in ("", "123-" + event, "1796226822002", "1796226822002-not-an-id", "x796226822002-" + event):
        assert parse_history_name(odd) is None, odd
