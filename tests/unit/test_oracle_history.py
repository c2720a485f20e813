"""The oracle's node history from ZooKeeper's transaction log (``tests.oracle.history``): the
log's creations and deletions replace an observer's late or missing sightings, on hand-made runs and on
logs written in ZooKeeper's format (``tests.unit.test_txnlog``)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from tests.oracle import NodeSighting, check, dump, load
from tests.oracle.history import (
    GROUP_KINDS,
    KINDS,
    TXN_LOG,
    from_txn_log,
    node_kind,
    recorded_kinds,
)
from tests.oracle.txnlog import read_history
from tests.unit.test_oracle import E1, T0, Run, drained_freeze, invariants
from tests.unit.test_txnlog import close_session, create, create_session, delete, record, write_log

ROOT = "/azure-maintenance/g3-abc123"
ACKS = f"{ROOT}/events/{E1}/acks"
VM0, VM1 = 0xA, 0xB  # the sessions of vm0's and vm1's agents, as ``drained_freeze`` names the acks' owners


def ms(t: float) -> int:
    return round((T0 + t) * 1000)


def group_log(directory: Path, *, ack_vm1: tuple[float, float] | None, root: str = ROOT) -> Path:
    """A standalone server's log of the run of ``drained_freeze``: the group's parents, vm0's ack at 5 s and
    vm1's (``ack_vm1``: created, deleted; None: none), both deleted at 13.5 s unless said otherwise."""
    acks = f"{root}/events/{E1}/acks"
    records = [record(1, 0, 1, ms(-5), create_session())]
    for zxid, path in enumerate((root.rsplit("/", 1)[0], root, f"{root}/members", f"{root}/events",
                                 f"{root}/events/{E1}", acks), 2):
        records.append(record(1, zxid, zxid, ms(-4), create(path)))
    records.append(record(VM0, 1, 10, ms(5.0), create(f"{acks}/vm0", ephemeral=True)))
    zxid = 11
    if ack_vm1 is not None:
        made, gone = ack_vm1
        records.append(record(VM1, 1, zxid, ms(made), create(f"{acks}/vm1", ephemeral=True)))
        records.append(record(VM1, 2, zxid + 1, ms(gone), delete(f"{acks}/vm1")))
        zxid += 2
    records.append(record(VM0, 2, zxid, ms(13.5), delete(f"{acks}/vm0")))
    return write_log(directory / "zookeeper" / "data" / "version-2" / "log.1", records).parent.parent.parent


def test_an_ack_the_observer_missed_but_the_log_has_before_the_approval_is_no_s1_violation(tmp_path: Path) -> None:
    run = Run()
    drained_freeze(run, ack_vm1=None)  # the observer never saw vm1's ack
    assert invariants(run.verdict()) == ["S1"]
    judged = from_txn_log(run.obs, group_log(tmp_path, ack_vm1=(5.2, 13.5)))
    assert judged.nodes_from == TXN_LOG and judged.zk_blind == []
    assert judged.nodes_from_counts == {"log": 2, "seen": 1, "unseen": 1, "seen_gone_late": 0, "not_in_log": 0}
    verdict = check(judged)
    assert verdict.ok, verdict.render(T0)
    vm0, vm1 = sorted((n for n in judged.nodes if n.kind == "ack"), key=lambda n: n.ctime)
    assert vm0 == NodeSighting("ack", E1, "vm0", T0 + 5.0, VM0, T0 + 5.05, T0 + 13.5)  # first_seen kept
    assert vm1 == NodeSighting("ack", E1, "vm1", T0 + 5.2, VM1, None, T0 + 13.5)  # never seen by the observer
    assert run.obs.nodes_from == "observer" and len(run.obs.nodes) == 1  # the observations given are unchanged


def test_an_ack_the_log_has_only_after_the_approval_is_an_s1_violation(tmp_path: Path) -> None:
    run = Run()
    drained_freeze(run, ack_vm1=None)
    verdict = check(from_txn_log(run.obs, group_log(tmp_path, ack_vm1=(7.4, 13.5))))
    assert invariants(verdict) == ["S1"] and "vm1 had not acknowledged" in verdict.violations[0].summary


def test_the_log_judges_an_approval_the_observer_was_blind_to(tmp_path: Path) -> None:
    # Without the log the recorder's silence around the approval is no evidence; the log has no blind spot.
    run = Run()
    drained_freeze(run, ack_vm1=None)
    run.obs.zk_blind.append((T0 + 4.0, T0 + 9.0))
    assert run.verdict().ok
    assert invariants(check(from_txn_log(run.obs, group_log(tmp_path, ack_vm1=(7.4, 13.5))))) == ["S1"]
    assert check(from_txn_log(run.obs, group_log(tmp_path / "2", ack_vm1=(6.0, 13.5)))).ok


def test_an_ack_seen_gone_late_counts_only_until_its_deletion(tmp_path: Path) -> None:
    # The observer saw vm1's ack go at 8 s, after the approval at 7 s; the log deleted it at 6.5 s.
    run = Run()
    drained_freeze(run, ack_vm1=5.2)
    run.obs.nodes[-1] = dataclasses.replace(run.obs.nodes[-1], gone_seen=T0 + 8.0)
    assert run.verdict().ok
    judged = from_txn_log(run.obs, group_log(tmp_path, ack_vm1=(5.2, 6.5)))
    assert judged.nodes_from_counts["seen"] == 2 and judged.nodes_from_counts["seen_gone_late"] == 1
    assert invariants(check(judged)) == ["S1"]


def test_a_closed_session_deletes_its_ack_at_the_close(tmp_path: Path) -> None:
    run = Run()
    drained_freeze(run, ack_vm1=None)
    data = group_log(tmp_path, ack_vm1=None)
    log = data / "data" / "version-2" / "log.1"
    more = [record(VM1, 1, 40, ms(5.2), create(f"{ACKS}/vm1", ephemeral=True)),
            record(VM1, 0, 41, ms(6.9), close_session(f"{ACKS}/vm1"))]  # expired before the approval
    write_log(log, [*_records_of(log), *more])
    judged = from_txn_log(run.obs, data)
    vm1 = next(n for n in judged.nodes if n.vm == "vm1")
    assert vm1.gone_seen == T0 + 6.9
    assert invariants(check(judged)) == ["S1"]


def _records_of(log: Path) -> list[bytes]:
    """The records of a log this module wrote, without its header and padding (to append to them)."""
    body = log.read_bytes()[16:]
    out, at = [], 0
    while at + 12 <= len(body) and (length := int.from_bytes(body[at + 8:at + 12], "big")) > 0:
        out.append(body[at:at + 12 + length + 1])
        at += 12 + length + 1
    return out


def test_the_groups_chroot_is_found_by_the_observers_nodes_and_another_groups_log_changes_nothing(
        tmp_path: Path) -> None:
    run = Run()
    drained_freeze(run, ack_vm1=None)
    mine = group_log(tmp_path / "mine", ack_vm1=(5.2, 13.5))
    assert from_txn_log(run.obs, mine, chroot=ROOT) == from_txn_log(run.obs, mine)
    # Another group's log (another chroot, its nodes made at other times) holds none of the observer's nodes.
    other = read_history(group_log(tmp_path / "other", ack_vm1=(5.2, 13.5), root="/azure-maintenance/g3-other"))
    elsewhere = dataclasses.replace(run.obs, nodes=[dataclasses.replace(n, ctime=n.ctime + 0.001)
                                                     for n in run.obs.nodes])
    assert from_txn_log(elsewhere, other) is elsewhere
    assert from_txn_log(run.obs, other).nodes_from == TXN_LOG  # the same node names at the same ms: found
    assert from_txn_log(run.obs, tmp_path / "no-log-here") is run.obs
    assert from_txn_log(run.obs, None) is run.obs


def test_only_the_kinds_the_observer_records_come_from_the_log(tmp_path: Path) -> None:
    run = Run()
    drained_freeze(run, ack_vm1=None)
    assert recorded_kinds(run.obs) == GROUP_KINDS
    data = group_log(tmp_path, ack_vm1=(5.2, 13.5))
    log = data / "data" / "version-2" / "log.1"
    write_log(log, [*_records_of(log), record(VM0, 3, 50, ms(2.0), create(f"{ROOT}/leader", ephemeral=True))])
    assert {n.kind for n in from_txn_log(run.obs, data).nodes} == {"ack"}
    assert "leader" in {n.kind for n in from_txn_log(run.obs, data, kinds=KINDS).nodes}
    run.node("record", 1.0, event_id=E1)
    assert recorded_kinds(run.obs) == KINDS


def test_nodes_after_the_record_ended_are_left_out_and_a_late_deletion_leaves_the_node_standing(
        tmp_path: Path) -> None:
    run = Run(end=10.0)
    drained_freeze(run, ack_vm1=None)
    judged = from_txn_log(run.obs, group_log(tmp_path, ack_vm1=(5.2, 13.5)))
    assert [n.gone_seen for n in judged.nodes] == [None, None]  # both deleted at 13.5 s, after the end
    run = Run(end=5.1)
    drained_freeze(run, ack_vm1=None)
    assert [n.vm for n in from_txn_log(run.obs, group_log(tmp_path / "2", ack_vm1=(5.2, 13.5))).nodes] == ["vm0"]


def test_a_sighting_the_log_lacks_is_kept_as_the_observer_made_it(tmp_path: Path) -> None:
    run = Run()
    drained_freeze(run)  # the observer saw vm1's ack at 5 s; this log has vm0's only
    run.obs.zk_blind.append((T0 + 20.0, T0 + 21.0))
    judged = from_txn_log(run.obs, group_log(tmp_path, ack_vm1=None), chroot=ROOT)
    assert judged.nodes_from_counts["not_in_log"] == 1
    assert judged.zk_blind == run.obs.zk_blind  # not the whole history: the recorder's blind spots stand
    # A log with nothing of the group under the chroot given changes nothing.
    assert from_txn_log(run.obs, group_log(tmp_path / "2", ack_vm1=None), chroot="/elsewhere") is run.obs
    assert any(n.vm == "vm1" and n.first_seen == T0 + 5.05 for n in judged.nodes)
    assert check(judged).ok


def test_a_record_judged_from_the_log_reads_back_and_merges_again_the_same(tmp_path: Path) -> None:
    run = Run()
    drained_freeze(run, ack_vm1=None)
    data = group_log(tmp_path, ack_vm1=(5.2, 13.5))
    judged = from_txn_log(run.obs, data)
    again = load(dump(judged))
    assert again == judged
    assert from_txn_log(again, data) == judged
    old = load(dump(run.obs))
    assert old.nodes_from == "observer" and old.nodes_from_counts == {}


def test_paths_map_to_the_kinds_the_observers_record() -> None:
    assert node_kind("/members/vm1") == ("member", None, "vm1")
    assert node_kind("/leader") == ("leader", None, None)
    assert node_kind("/pause") == ("pause", None, None)
    assert node_kind("/out/vm2") == ("out", None, "vm2")
    assert node_kind(f"/events/{E1}") == ("record", E1, None)
    assert node_kind(f"/events/{E1}/acks/vm0") == ("ack", E1, "vm0")
    assert node_kind(f"/events/{E1}/approval") == ("approval", E1, None)
    assert node_kind(f"/events/{E1}/admitted") == ("admitted", E1, None)
    for path in ("/members", "/events", f"/events/{E1}/acks", "/registry/vm1", "/absent/vm1", "", "members/vm1"):
        assert node_kind(path) is None, path
