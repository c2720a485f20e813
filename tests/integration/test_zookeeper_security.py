"""ZooKeeper authentication, ACLs and TLS, against real servers: a plain one with digest ACLs, and a
TLS-only one that requires client certificates.

What is checked is what an attacker who reaches the ensemble could do: a client without the agents'
credentials (or with a reader's or an operator's) must not be able to write an acknowledgement, an
approval or anything else an agent trusts, and a plaintext client must not reach a TLS-only server.
"""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.security import ACL, OPEN_ACL_UNSAFE, Permissions, make_digest_acl_credential

from coordinator.control import ControlError, GroupAddress, drain, pause, resume, undrain
from coordinator.errors import StoreUnavailable
from coordinator.store.base import EventRecord, WriteResult
from coordinator.store.zk_paths import ZooKeeperPaths
from coordinator.store.zk_security import NodeAcls, digest_identity, node_acls, parse_identity
from coordinator.store.zk_session import ClientOptions, TlsOptions, client_arguments
from coordinator.store.zookeeper import ZooKeeperStore
from coordinator.testbed.zookeeper import LocalZooKeeper
from tests.integration.test_zookeeper_watched_view import eventually

AGENT = ("coordinator", "agent-secret")
OPERATOR = ("operator", "operator-secret")
READER = ("reader", "reader-secret")
EVENT = "4BB2A2CE-5D5A-4B5E-B2E4-2C3A3B4C5D6E"
T0 = 1_700_000_000.0


def acls() -> NodeAcls:
    return node_acls([digest_identity(*AGENT)], [digest_identity(*OPERATOR)], [digest_identity(*READER)])


def credential(who: tuple[str, str]) -> tuple[tuple[str, str], ...]:
    return (("digest", f"{who[0]}:{who[1]}"),)


def record() -> EventRecord:
    return EventRecord(event_id=EVENT, event_type="Reboot", resources=("vm-a", "vm-b"), not_before=T0 + 600,
                       published_by="vm-a", published_at=T0)


def client(hosts: str, who: tuple[str, str] | None = None, tls: TlsOptions | None = None) -> KazooClient:
    options = ClientOptions(hosts=hosts, session_timeout=10.0, auth_data=credential(who) if who else (), tls=tls)
    kazoo = KazooClient(**{**client_arguments(options), "connection_retry": {"max_tries": 2, "delay": 0.2}})
    kazoo.start(timeout=10)
    return kazoo


def agent_store(hosts: str, root: str, who: tuple[str, str] = AGENT, **kwargs: object) -> ZooKeeperStore:
    return ZooKeeperStore(hosts, root, "group", session_timeout=6.0, operation_timeout=3.0,
                          auth_data=credential(who), acls=acls(), **kwargs)  # type: ignore[arg-type]


def remove_namespace(hosts: str, root: str) -> None:
    """Delete ``root`` with the agents' credentials: with ACLs on, nobody else may."""
    cleaner = client(hosts, AGENT)
    try:
        cleaner.delete(root, recursive=True)
    finally:
        cleaner.stop()
        cleaner.close()


@pytest.fixture
def secured(zk_hosts: str, zk_chroot: str) -> Iterator[tuple[ZooKeeperStore, ZooKeeperPaths]]:
    """An agent's store with ACLs, joined, with one event published and acknowledged by vm-a. The
    namespace is removed at the end with the agents' credentials (nobody else may)."""
    store = agent_store(zk_hosts, zk_chroot)
    store.start()
    assert store.join("vm-a", {"admin": "127.0.0.1:1"}) is WriteResult.DONE
    assert store.publish_event(record()) is WriteResult.DONE
    assert store.acknowledge(EVENT, "vm-a", T0) is WriteResult.DONE
    try:
        yield store, ZooKeeperPaths(store.base_path)
    finally:
        store.stop()
        remove_namespace(zk_hosts, zk_chroot)


def forgeries(paths: ZooKeeperPaths) -> list[tuple[str, Callable[[KazooClient], object]]]:
    """Every write that would make an agent release an event or misjudge the group."""
    return [
        ("an acknowledgement", lambda c: c.create(paths.ack(EVENT, "vm-b"), b'{"at": 1}')),
        ("an approval", lambda c: c.create(paths.approval(EVENT), b'{"by": "vm-a"}')),
        ("an admission", lambda c: c.create(paths.admitted(EVENT), b"{}")),
        ("a changed event record", lambda c: c.set(paths.event(EVENT), b"{}")),
        ("a new event record", lambda c: c.create(paths.event("00000000-0000-0000-0000-000000000000"), b"{}")),
        ("a member", lambda c: c.create(paths.member("vm-z"), b"{}", ephemeral=True)),
        ("an absence mark", lambda c: c.create(paths.absent_vm("vm-b"), b"{}")),
        ("a removed acknowledgement", lambda c: c.delete(paths.ack(EVENT, "vm-a"))),
        ("an ACL change", lambda c: c.set_acls(paths.base, OPEN_ACL_UNSAFE)),
    ]


@pytest.mark.parametrize("who", [None, OPERATOR, READER, ("coordinator", "wrong-password")],
                         ids=["anonymous", "operator", "reader", "wrong-password"])
def test_only_the_agents_identity_can_write_what_agents_trust(
    secured: tuple[ZooKeeperStore, ZooKeeperPaths], zk_hosts: str, who: tuple[str, str] | None
) -> None:
    store, paths = secured
    intruder = client(zk_hosts, who)
    try:
        refused = []
        for what, write in forgeries(paths):
            try:
                write(intruder)
            except NoAuthError:
                refused.append(what)
        assert refused == [what for what, _ in forgeries(paths)]
        view = store.read_view("vm-a")  # and the agent still reads what it wrote, unchanged
        assert set(view.records[EVENT].acks) == {"vm-a"}
        assert view.records[EVENT].approval is None and view.members == frozenset({"vm-a"})
    finally:
        intruder.stop()
        intruder.close()


def test_readers_and_operators_read_and_strangers_do_not(
    secured: tuple[ZooKeeperStore, ZooKeeperPaths], zk_hosts: str
) -> None:
    _, paths = secured
    for who in (OPERATOR, READER):
        reader = client(zk_hosts, who)
        try:
            assert reader.get_children(paths.acks(EVENT)) == ["vm-a"]
            assert reader.get(paths.event(EVENT))[0]
        finally:
            reader.stop()
            reader.close()
    stranger = client(zk_hosts, None)
    try:
        with pytest.raises(NoAuthError):
            stranger.get_children(paths.events)
        with pytest.raises(NoAuthError):
            stranger.get(paths.event(EVENT))
    finally:
        stranger.stop()
        stranger.close()


def test_operators_pause_and_resume_and_readers_cannot(
    secured: tuple[ZooKeeperStore, ZooKeeperPaths], zk_hosts: str, zk_chroot: str
) -> None:
    store, paths = secured

    def address(who: tuple[str, str]) -> GroupAddress:
        return GroupAddress(zk_hosts, zk_chroot, "group", auth_data=credential(who))

    with pytest.raises(ControlError, match="not authorised as reader"):
        pause(address(READER), "maintenance freeze")
    found, created = pause(address(OPERATOR), "maintenance freeze")
    assert created and found.reason == "maintenance freeze"
    assert store.read_view("vm-a").paused is not None
    reader = client(zk_hosts, READER)
    try:  # the pause node carries its own ACL: readers read it, and cannot lift it
        assert b"maintenance freeze" in reader.get(paths.pause)[0]
        with pytest.raises(NoAuthError):
            reader.delete(paths.pause)
    finally:
        reader.stop()
        reader.close()
    assert resume(address(OPERATOR)) is True
    assert store.read_view("vm-a").paused is None


def test_operators_drain_and_undrain_by_hand_the_agents_admit_and_readers_cannot(
    secured: tuple[ZooKeeperStore, ZooKeeperPaths], zk_hosts: str, zk_chroot: str
) -> None:
    store, paths = secured

    def address(who: tuple[str, str]) -> GroupAddress:
        return GroupAddress(zk_hosts, zk_chroot, "group", auth_data=credential(who))

    with pytest.raises(ControlError, match="not authorised as reader"):
        drain(address(READER), "vm-a", "disk swap")
    _, created = drain(address(OPERATOR), "vm-a", "disk swap")
    assert created
    # The agent admits it (a rewrite of the operator's node): the node's ACL lets it. Its view is kept by
    # watches: the operator's node reaches it a round trip later.
    asked = eventually(store, "vm-a", lambda view: "vm-a" in view.drains, "the drain in the agent's view"
                       ).drains["vm-a"].asked
    assert store.admit_drain("vm-a", asked, "vm-a", 1.0) is WriteResult.DONE
    assert store.read_view("vm-a").drains["vm-a"].admitted_by == "vm-a"
    reader = client(zk_hosts, READER)
    try:  # readers read the drain, and can neither undo it nor make one
        assert b"disk swap" in reader.get(paths.drain("vm-a"))[0]
        with pytest.raises(NoAuthError):
            reader.delete(paths.drain("vm-a"))
        with pytest.raises(NoAuthError):
            reader.create(paths.drain("vm-b"), b"{}")
    finally:
        reader.stop()
        reader.close()
    operator = client(zk_hosts, OPERATOR)
    try:  # an operator cannot admit a drain past the budget, nor take an admission back
        with pytest.raises(NoAuthError):
            operator.create(paths.drain_admitted("vm-b"), b'{"by": "vm-a", "at": 1, "drain": 1}')
        with pytest.raises(NoAuthError):
            operator.delete(paths.drain_admitted("vm-a"))
    finally:
        operator.stop()
        operator.close()
    assert undrain(address(OPERATOR), "vm-a") is True
    eventually(store, "vm-a", lambda view: view.drains == {}, "the undrain in the agent's view")


def test_a_pause_node_the_agents_cannot_read_still_pauses_and_the_rest_is_read(
    secured: tuple[ZooKeeperStore, ZooKeeperPaths], zk_hosts: str
) -> None:
    """An operator may create the pause node with any ACL; one that shuts the agents out must neither be
    ignored (approvals would go on) nor make the whole view unreadable (drains would stop)."""
    store, paths = secured
    operator = client(zk_hosts, OPERATOR)
    try:
        operator.create(paths.pause, b'{"reason": "mine", "by": "ops", "at": 1}',
                        acl=[ACL(Permissions.ALL, digest_identity(*OPERATOR))])
        view = store.read_view("vm-a")
        assert view.paused is not None and view.paused.reason == "pause node not readable by the agents"
        assert set(view.records[EVENT].acks) == {"vm-a"}
        operator.delete(paths.pause)
    finally:
        operator.stop()
        operator.close()


def test_an_agent_with_wrong_credentials_says_so_and_writes_nothing(
    secured: tuple[ZooKeeperStore, ZooKeeperPaths], zk_hosts: str, zk_chroot: str,
    caplog: pytest.LogCaptureFixture
) -> None:
    _, paths = secured
    wrong = agent_store(zk_hosts, zk_chroot, ("coordinator", "not-the-password"))
    try:
        with pytest.raises(StoreUnavailable, match="not authorised as coordinator") as raised:
            wrong.start()
        assert "zookeeper.auth" in str(raised.value)
    finally:
        wrong.stop()
    checker = client(zk_hosts, AGENT)
    try:
        assert checker.get_children(paths.members) == ["vm-a"]
        assert checker.get_children(paths.acks(EVENT)) == ["vm-a"]
    finally:
        checker.stop()
        checker.close()


def test_an_open_namespace_is_closed_when_the_agents_get_credentials(
    zk_hosts: str, zk_chroot: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A group that ran without ACLs: the first agent started with credentials sets the ACL of every
    node, records included, so an old record cannot be used to forge an acknowledgement."""
    open_store = ZooKeeperStore(zk_hosts, zk_chroot, "group", session_timeout=6.0, operation_timeout=3.0)
    open_store.start()
    assert open_store.publish_event(record()) is WriteResult.DONE
    open_store.stop()
    paths = ZooKeeperPaths(f"{zk_chroot}/group")
    store = agent_store(zk_hosts, zk_chroot)
    with caplog.at_level(logging.WARNING, logger="coordinator.store.zk_context"):
        store.start()
    try:
        assert any("world:anyone=rwcda" in r.getMessage() for r in caplog.records), caplog.text
        anonymous = client(zk_hosts)
        try:
            with pytest.raises(NoAuthError):
                anonymous.create(paths.ack(EVENT, "vm-b"), b"{}")
            with pytest.raises(NoAuthError):
                anonymous.create(paths.approval(EVENT), b"{}")
        finally:
            anonymous.stop()
            anonymous.close()
        acl, _ = store.client.get_acls(paths.acks(EVENT))  # type: ignore[union-attr]
        assert set(acl) == set(acls().default)
    finally:
        store.stop()
        remove_namespace(zk_hosts, zk_chroot)


def test_digest_identities_match_what_zookeeper_computes() -> None:
    assert digest_identity(*AGENT).id == make_digest_acl_credential(*AGENT)
    assert parse_identity(f"digest:{make_digest_acl_credential(*READER)}") == digest_identity(*READER)


# -- TLS ------------------------------------------------------------------------------------------------


def tls_options(server: LocalZooKeeper, who: str | None = "agent", check_hostname: bool = True) -> TlsOptions:
    assert server.tls is not None
    pki = server.tls.pki
    return TlsOptions(ca=str(pki.ca), certfile=str(pki.cert(who)) if who else None,
                      keyfile=str(pki.key(who)) if who else None, check_hostname=check_hostname)


def test_a_plaintext_client_is_refused_by_a_tls_only_server(zk_tls_server: LocalZooKeeper) -> None:
    started = time.monotonic()
    with pytest.raises(KazooTimeoutError):
        client(zk_tls_server.hosts)
    assert time.monotonic() - started < 30


def test_a_client_without_a_certificate_is_refused_when_the_server_requires_one(
    zk_tls_server: LocalZooKeeper,
) -> None:
    with pytest.raises(KazooTimeoutError):
        client(zk_tls_server.hosts, tls=tls_options(zk_tls_server, who=None))


def test_a_server_whose_certificate_does_not_name_the_host_is_refused(zk_tls_server: LocalZooKeeper) -> None:
    """The server's certificate names 127.0.0.1 only. Reached as localhost (the same address), hostname
    checking refuses it; without the check, the same connection succeeds."""
    addresses = {info[4][0] for info in socket.getaddrinfo("localhost", zk_tls_server.secure_port, socket.AF_INET)}
    assert addresses == {"127.0.0.1"}
    by_name = f"localhost:{zk_tls_server.secure_port}"
    with pytest.raises(KazooTimeoutError):
        client(by_name, tls=tls_options(zk_tls_server))
    unchecked = client(by_name, tls=tls_options(zk_tls_server, check_hostname=False))
    try:
        assert unchecked.connected
    finally:
        unchecked.stop()
        unchecked.close()


def test_the_store_works_over_tls_with_x509_and_digest_identities(zk_tls_server: LocalZooKeeper) -> None:
    """The agents authenticate twice here (their certificate and their digest); the ACL names the
    certificate's identity for agents, so a client with another certificate but no digest cannot write."""
    assert zk_tls_server.tls is not None
    pki = zk_tls_server.tls.pki
    group = node_acls([parse_identity(pki.x509_identity("agent"))],
                      readers=[parse_identity(pki.x509_identity("reader"))])
    store = ZooKeeperStore(zk_tls_server.hosts, "/tls-tests", f"g{time.monotonic_ns()}", session_timeout=6.0,
                           operation_timeout=3.0, tls=tls_options(zk_tls_server), acls=group)
    store.start()
    try:
        assert store.join("vm-a", {}) is WriteResult.DONE
        assert store.publish_event(record()) is WriteResult.DONE
        assert store.acknowledge(EVENT, "vm-a", T0) is WriteResult.DONE
        paths = ZooKeeperPaths(store.base_path)
        for who, can_read in (("reader", True), ("stranger", False)):
            other = client(zk_tls_server.hosts, tls=tls_options(zk_tls_server, who))
            try:
                if can_read:
                    assert other.get_children(paths.acks(EVENT)) == ["vm-a"]
                for what, write in forgeries(paths):
                    with pytest.raises(NoAuthError):
                        write(other)
                        pytest.fail(f"{who} wrote {what}")
            finally:
                other.stop()
                other.close()
    finally:
        store.stop()


def test_tls_files_that_do_not_exist_are_named(tmp_path: Path) -> None:
    from coordinator.config import ZooKeeperTlsConfig

    with pytest.raises(ValueError, match="cannot read"):
        ZooKeeperTlsConfig(ca=tmp_path / "missing.pem")
