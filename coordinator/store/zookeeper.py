"""The coordination store on ZooKeeper, through kazoo: ``ZooKeeperStore``, the façade of the modules below.

Layout: see ``coordinator.store.base``. Every path lives under ``{root}/{cluster}`` so that one ensemble
serves many VM groups (``coordinator.store.zk_paths``). The prefix is added by the store rather than by
a ZooKeeper chroot in the connection string, so that the store can create its own base path on first
start (a chroot cannot be created through a client that is chrooted into it).

The modules behind it:

* ``coordinator.store.zk_session``: the kazoo client, its options (auth, TLS), and the timing and failure
  rules every method follows: one deadline of ``operation_timeout`` per method, nothing sent unless
  CONNECTED, a failed write is an unknown outcome, a quiet period after an unanswered request;
* ``coordinator.store.zk_context``: what the modules share (session, paths, clock, base layout);
* ``coordinator.store.zk_membership``: ``join`` and ``campaign``;
* ``coordinator.store.zk_view``: the reads behind ``read_view`` and ``member_info``, the watches they
  set, and what a read does with nodes that do not parse;
* ``coordinator.store.zk_watch``: the watched view: ``read_view``, ``member_info``, ``join`` and
  ``campaign`` answered with no request while nothing changed (an idle agent sends nothing);
* ``coordinator.store.zk_records``: the writes of event records, absences and out-of-rotation marks;
* ``coordinator.store.zk_gate``: ``approve``, the last gate before the POST to IMDS;
* ``coordinator.store.zk_drains``: drains by hand, as the view reads them, and the leader's admissions;
* ``coordinator.store.payloads``: the node data (UTF-8 JSON, one pydantic model per node kind).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable, Collection, Iterator, Mapping

from kazoo.client import KazooClient

from coordinator.errors import ConfigError, DuplicateMember, InvalidName, LayoutMismatch
from coordinator.names import normalize_event_id, normalize_vm_name
from coordinator.store import zk_drains, zk_gate, zk_history, zk_membership, zk_records, zk_view
from coordinator.store.base import (
    ApprovalOutcome,
    ApprovalResult,
    ClusterView,
    ConnectionState,
    EventRecord,
    Part,
    Pause,
    WriteResult,
)
from coordinator.store.zk_context import StoreContext
from coordinator.store.zk_paths import ZooKeeperPaths, validate_cluster, validate_root
from coordinator.store.zk_security import NodeAcls
from coordinator.store.zk_session import (
    ClientFactory,
    ClientOptions,
    TlsOptions,
    ZooKeeperSession,
    default_client_factory,
)
from coordinator.store.zk_watch import WatchedView

__all__ = [
    "ClientFactory",
    "ClientOptions",
    "TlsOptions",
    "ZooKeeperStore",
    "default_client_factory",
]

log = logging.getLogger(__name__)


class ZooKeeperStore:
    """``Store`` on a ZooKeeper ensemble. See ``coordinator.store.zk_session`` for the timing rules.

    ``session_timeout`` is what the client asks for (the server may lower it to its
    ``maxSessionTimeout``); ``operation_timeout`` bounds every method, including ``start``.
    ``client_factory`` builds the kazoo client (tests inject their own); ``clock`` gives the wall-clock
    time written into ``/leader`` and ``/registry/{vm}``. ``ack_times``: the view reads each ack's data
    for its time (``coordinator status``); an agent's view lists the acks by name only.
    """

    def __init__(
        self,
        hosts: str,
        root: str,
        cluster: str,
        *,
        session_timeout: float = 10.0,
        operation_timeout: float = 5.0,
        client_factory: ClientFactory = default_client_factory,
        auth_data: Collection[tuple[str, str]] = (),
        tls: TlsOptions | None = None,
        acls: NodeAcls | None = None,
        clock: Callable[[], float] = time.time,
        create_layout: bool = True,
        ack_times: bool = False,
    ) -> None:
        if "/" in hosts:
            raise ConfigError(
                f"zookeeper hosts {hosts!r} must not carry a chroot: the store's paths come from root and cluster"
            )
        if session_timeout <= 0 or operation_timeout <= 0:
            raise ConfigError("session_timeout and operation_timeout must be positive")
        self._paths = ZooKeeperPaths(f"{validate_root(root)}/{validate_cluster(cluster)}")
        options = ClientOptions(hosts=hosts, session_timeout=session_timeout, auth_data=tuple(auth_data), tls=tls,
                                acls=acls)
        self._session = ZooKeeperSession(options, operation_timeout, client_factory)
        self._ctx = StoreContext(self._session, self._paths, clock, create_layout)
        self._watched = WatchedView(self._session, self._paths, ack_times=ack_times)
        self._membership = zk_membership.Membership()
        self._mismatch: LayoutMismatch | None = None  # the last view read the group in another layout
        self._history: dict[str, EventRecord | None] = {}  # the history's entries read so far (``read_history``)
        self._keeping = zk_history.HistoryKeeping()  # when this store last listed the history (``archive_done``)

    # -- introspection ------------------------------------------------------------------------------

    @property
    def base_path(self) -> str:
        """``{root}/{cluster}``: where this store's nodes live."""
        return self._paths.base

    @property
    def operation_timeout(self) -> float:
        return self._session.operation_timeout

    @property
    def client(self) -> KazooClient | None:
        """The kazoo client of the current connection (for diagnostics and tests), or None."""
        return self._session.client

    @property
    def session_id(self) -> int | None:
        """The current ZooKeeper session id, or None while not connected."""
        return self._session.session_id

    @property
    def duplicate(self) -> DuplicateMember | None:
        """The refusal of the last ``join`` (another agent runs with this VM's name), until a ``join``
        succeeds; None otherwise. Sends nothing."""
        return self._membership.duplicate

    # -- life cycle and signalling --------------------------------------------------------------------

    def start(self) -> None:
        """Connect and create the base layout, within ``operation_timeout``. Raises ``StoreUnavailable``.
        Calling it again while started does nothing (kazoo reconnects by itself after a loss)."""
        if self._session.client is not None:
            return
        deadline = self._session.deadline()
        client = self._session.connect(deadline)
        try:
            with self._session.reading("create the base layout"):
                self._ctx.ensure_layout(client, deadline)
                self._ctx.ensure_acls(client, deadline)
        except BaseException:
            self.stop()
            raise
        log.info("connected to ZooKeeper %s, base path %s", self._session.options.hosts, self._paths.base)

    def stop(self) -> None:
        """Close the session (its ephemeral nodes vanish). Bounded by ``operation_timeout``; never raises."""
        self._session.close()

    @property
    def connection_state(self) -> ConnectionState:
        """kazoo's state, except SUSPENDED during the quiet period that follows an unanswered request."""
        return self._session.connection_state

    def set_wakeup(self, callback: Callable[[], None]) -> None:
        self._session.set_wakeup(callback)

    # -- membership and leadership --------------------------------------------------------------------

    def join(self, vm: str, info: Mapping[str, object]) -> WriteResult:
        """See ``coordinator.store.zk_membership.join``."""
        return zk_membership.join(self._ctx, self._watched, self._membership, vm, info)

    def campaign(self, vm: str) -> bool:
        """See ``coordinator.store.zk_membership.campaign``."""
        return zk_membership.campaign(self._ctx, self._watched, self._membership, vm, self._mismatch)

    # -- reads ----------------------------------------------------------------------------------------

    def read_view(self, vm: str, *, part: Part = Part.WHOLE) -> ClusterView:
        """See ``coordinator.store.zk_watch.WatchedView.read_view``. While ``join`` is refused, ``vm`` is
        not among the members: the node under its name is another agent's."""
        vm = normalize_vm_name(vm)
        try:
            view = self._watched.read_view(vm, part=part)
        except LayoutMismatch as exc:
            self._mismatch = exc  # said by the agent as a view it cannot read; no campaign meanwhile
            raise
        self._mismatch = None
        duplicate = self._membership.duplicate
        if duplicate is not None and duplicate.vm == vm and vm in view.members:
            view = dataclasses.replace(view, members=view.members - {vm})
        return view

    def member_info(self, vms: Collection[str]) -> dict[str, dict[str, object]]:
        """See ``coordinator.store.zk_watch.WatchedView.member_info``."""
        return self._watched.member_info([normalize_vm_name(vm) for vm in vms])

    def read_pause(self) -> Pause | None:
        """See ``Store.read_pause``: ``exists`` (and ``get`` when there is one) on ``/pause``, no watch."""
        return zk_view.read_pause_now(self._ctx)

    @property
    def granted_session_timeout(self) -> float | None:
        """See ``Store.granted_session_timeout``."""
        return self._session.granted_timeout

    # -- the approval gate ----------------------------------------------------------------------------

    def approve(
        self, event_id: str, vm: str, required: Collection[str], *, as_leader: bool, at: float,
        admission: bool = False,
    ) -> ApprovalResult:
        """See ``coordinator.store.zk_gate.approve``. REFUSED, with nothing sent, while ``join`` is refused."""
        duplicate = self._membership.duplicate
        if duplicate is not None:
            return ApprovalResult(ApprovalOutcome.REFUSED, reason=str(duplicate))
        with self._touching(event_id):
            return zk_gate.approve(self._ctx, event_id, vm, required, as_leader=as_leader, at=at,
                                   admission=admission)

    def vouch(self, event_id: str, vms: Collection[str], *, by: str, reason: str, at: float) -> WriteResult:
        with self._touching(event_id):
            return zk_records.vouch(self._ctx, event_id, vms, by=by, reason=reason, at=at)

    def approve_vouched(self, event_id: str, by: str, required: Collection[str], vouched: Collection[str], *,
                        reason: str, at: float) -> ApprovalResult:
        """See ``coordinator.store.zk_gate.approve_vouched``."""
        with self._touching(event_id):
            return zk_gate.approve_vouched(self._ctx, event_id, by, required, vouched, reason=reason, at=at)

    # -- writes (``coordinator.store.zk_records``) ----------------------------------------------------

    def publish_event(self, record: EventRecord) -> WriteResult:
        with self._touching(record.event_id):
            return zk_records.publish_event(self._ctx, record)

    # An ack and its withdrawal leave the record's node as it is: the watch events of the write itself drop
    # what they change (the list of acks, or this VM's own ack), and nothing else is read again.
    def acknowledge(self, event_id: str, vm: str, at: float) -> WriteResult:
        return zk_records.acknowledge(self._ctx, event_id, vm, at)

    def withdraw_ack(self, event_id: str, vm: str) -> WriteResult:
        return zk_records.withdraw_ack(self._ctx, event_id, vm)

    def admit(self, event_id: str, vm: str, at: float) -> WriteResult:
        with self._touching(event_id):
            return zk_records.admit(self._ctx, event_id, vm, at, known=self._known_record(event_id))

    def mark_absent(self, vm: str, at: float) -> WriteResult:
        return zk_records.mark_absent(self._ctx, vm, at)

    def clear_absent(self, vm: str) -> WriteResult:
        return zk_records.clear_absent(self._ctx, vm)

    def mark_done(self, event_id: str, at: float, *, started_at: float | None = None) -> WriteResult:
        """Set ``done_at``, and delete ``admitted`` and ``approval``, in one versioned transaction: an
        event that comes back (a flap, a reused EventId) inherits neither. The record's data keeps what
        they held (``closed``) and ``started_at``, for the history."""
        with self._touching(event_id):
            return zk_records.set_done(self._ctx, event_id, at, drop=("admitted", "approval"), started_at=started_at,
                                       known=self._known_record(event_id))

    def reopen(self, event_id: str) -> WriteResult:
        """Clear ``done_at`` with a versioned write, keeping every other field of the record but the history's
        (``started_at``, ``closed``)."""
        with self._touching(event_id):
            return zk_records.set_done(self._ctx, event_id, None, drop=())

    def mark_out(self, vm: str, events: tuple[str, ...], at: float) -> WriteResult:
        return zk_records.mark_out(self._ctx, vm, events, at)

    def clear_out(self, vm: str) -> WriteResult:
        return zk_records.clear_out(self._ctx, vm)

    def admit_drain(self, vm: str, asked: int, by: str, at: float) -> WriteResult:
        return zk_drains.admit_drain(self._ctx, vm, asked, by, at)

    def forget_drain_admission(self, vm: str) -> WriteResult:
        return zk_drains.forget_drain_admission(self._ctx, vm)

    def archive_done(self, event_ids: Collection[str], older_than: float) -> int:
        """See ``coordinator.store.zk_history.archive_done``; each record starts from what the view read."""
        ids = [normalize_event_id(event_id) for event_id in event_ids]
        known = {event_id: found for event_id in ids if (found := self._known_record(event_id)) is not None}
        try:
            return zk_history.archive_done(self._ctx, ids, older_than, known, self._keeping)
        finally:
            for event_id in ids:
                self._watched.touch(event_id)  # the other records are read from what is kept

    def read_history(self, since: float | None = None) -> dict[str, EventRecord]:
        """The finished records moved out of ``/events`` (``coordinator.store.zk_history.read_history``),
        read once, without a watch: for ``coordinator status``, never for an agent."""
        client, _ = self._session.connected(write=False)
        with self._session.reading("read the history"):
            return zk_history.read_history(self._ctx, client, self._session.deadline(), since, self._history)

    def purge_done(self, older_than: float) -> int:
        try:
            return zk_records.purge_done(self._ctx, older_than)
        finally:
            self._watched.forget_records()

    def _known_record(self, event_id: str) -> zk_records.Known | None:
        """The record's data and stat as the last view read them (None: not kept), which the decision to
        write was made on: the versioned rewrite starts from it, and reads the record only if it changed."""
        try:
            return self._watched.known_data(self._paths.event(normalize_event_id(event_id)))
        except InvalidName:
            return None

    @contextlib.contextmanager
    def _touching(self, event_id: str) -> Iterator[None]:
        """Whatever the write's outcome, the record is read again by the next ``read_view``."""
        try:
            yield
        finally:
            with contextlib.suppress(InvalidName):
                self._watched.touch(normalize_event_id(event_id))
