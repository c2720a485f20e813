"""Reading a group for ``coordinator status``: ZooKeeper through the store's own read code, read-only,
and each member's admin ``/status`` over HTTP.

ZooKeeper: a ``ZooKeeperStore`` that never creates its layout (``create_layout=False``), over a kazoo
client that refuses every write request (``ReadOnlyKazooClient``): the status command cannot create,
join, campaign or write anything, whatever a later change of the store does. It reads the view with
``read_view`` under a name no agent uses (the view is the same for any reader; the name only decides
``i_am_leader``, always False here), the member info with ``member_info``, and, with plain kazoo reads,
the leader node (for its ``since``) and the group-wide ``pause`` node. The store's reads set watches and
answer from its cache while nothing changed, so ``--watch`` costs ZooKeeper almost nothing between
changes; a watch that fires wakes the watch loop (``set_wakeup``).

HTTP: each member's member info carries its admin address (``http.listen``); a wildcard host is replaced
by the host of its probe URL. All members are asked at once, each with a short timeout. An answer counts
only if it names the member itself: an admin address on 127.0.0.1 reaches, from another machine, whatever
agent runs there, never the member's.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any, NoReturn, TypeVar
from urllib.parse import urlsplit

import httpx
from kazoo.client import KazooClient
from kazoo.exceptions import KazooException, NoNodeError
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.interfaces import IAsyncResult
from kazoo.protocol.states import WatchedEvent
from kazoo.security import ACL

from coordinator.errors import ConfigError, StoreError
from coordinator.httpserver import split_host_port
from coordinator.store.base import ClusterView
from coordinator.store.payloads import LeaderNode, PauseNode, PayloadError
from coordinator.store.zk_session import ClientOptions, TlsOptions, client_arguments
from coordinator.store.zookeeper import ZooKeeperStore

__all__ = [
    "OBSERVER",
    "AgentAnswer",
    "GroupRead",
    "GroupReader",
    "GroupStatusError",
    "PauseNode",
    "ReadOnlyKazooClient",
    "admin_status_url",
    "ask_agents",
    "read_only_client_factory",
]

#: The name the status command reads the view under. It never joins: no member node carries it.
OBSERVER = "coordinator-status"

_T = TypeVar("_T")


class GroupStatusError(Exception):
    """The group cannot be read (ZooKeeper unreachable, no such cluster): a one-line message."""


class ReadOnlyKazooClient(KazooClient):
    """A kazoo client that refuses to send any write: create, set, delete, transactions, ACL changes,
    reconfiguration. The refusal is raised before anything reaches the server."""

    def _refuse(self, *args: Any, **kwargs: Any) -> NoReturn:
        raise PermissionError("the status command's ZooKeeper client is read-only")

    create = create_async = ensure_path = ensure_path_async = _refuse
    set = set_async = delete = delete_async = transaction = _refuse
    set_acls = set_acls_async = reconfig = reconfig_async = _refuse


def read_only_client_factory(options: ClientOptions) -> KazooClient:
    """``ReadOnlyKazooClient`` with the store's options (auth, TLS), also accepting servers in read-only
    mode (a server cut off from its quorum still shows what it last knew). Connection attempts are
    retried as the agents' are: within the operation timeout for a one-shot read, forever under --watch."""
    return ReadOnlyKazooClient(read_only=True, **client_arguments(options))


@dataclass(frozen=True)
class AgentAnswer:
    """One member's ``/status``: ``body`` when it answered as itself, else ``error``."""

    url: str | None
    body: Mapping[str, Any] | None = None
    error: str | None = None


@dataclass(frozen=True)
class GroupRead:
    """Everything one read found, before any interpretation."""

    cluster: str
    base_path: str
    hosts: str
    read_at: float  # unix time
    mono: float  # monotonic time of the read
    view: ClusterView
    member_info: Mapping[str, Mapping[str, object]]
    leader_since: float | None
    paused: PauseNode | None
    paused_unreadable: str | None  # why a pause node that exists could not be read
    pause_ctime: float | None
    read_only_server: bool
    agents: Mapping[str, AgentAnswer] = field(default_factory=dict)


def admin_status_url(info: Mapping[str, object]) -> str | None:
    """The ``/status`` URL of a member, from its member info; None if it gives no usable admin address."""
    admin = info.get("admin")
    if not isinstance(admin, str) or not admin:
        return None
    if admin.startswith(("http://", "https://")):
        return admin.rstrip("/") + "/status"
    try:
        host, port = split_host_port(admin)
    except ValueError:
        return None
    if host in ("", "0.0.0.0", "::"):
        probe = info.get("probe")
        host = (urlsplit(probe).hostname or "") if isinstance(probe, str) else ""
        if not host:
            return None
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{port}/status"


def ask_agents(
    urls: Mapping[str, str | None], timeout: float, transport: httpx.BaseTransport | None = None
) -> dict[str, AgentAnswer]:
    """Ask every member's agent for its ``/status`` at once, each bounded by ``timeout``. Never raises:
    an agent that cannot be read gets an ``error``."""
    answers: dict[str, AgentAnswer] = {vm: AgentAnswer(None, error="no admin address in its member info")
                                       for vm, url in urls.items() if url is None}
    wanted = {vm: url for vm, url in urls.items() if url is not None}
    if not wanted:
        return answers
    with httpx.Client(timeout=timeout, trust_env=False, transport=transport) as client:

        def ask(vm: str, url: str) -> AgentAnswer:
            try:
                response = client.get(url)
            except httpx.TimeoutException:
                return AgentAnswer(url, error=f"no answer within {timeout:g} s")
            except httpx.HTTPError as exc:
                return AgentAnswer(url, error=_brief_http_error(exc))
            if response.status_code != 200:
                return AgentAnswer(url, error=f"HTTP {response.status_code}")
            try:
                body = response.json()
            except ValueError:
                return AgentAnswer(url, error="answer is not JSON")
            if not isinstance(body, dict):
                return AgentAnswer(url, error="answer is not a JSON object")
            said = body.get("vm")
            if said is None:
                return AgentAnswer(url, error="agent still starting")
            if not isinstance(said, str) or said.lower() != vm:
                # e.g. an admin address on 127.0.0.1, asked from another VM: not this member's agent.
                return AgentAnswer(url, error=f"answered as {str(said)[:64]!r}: this address does not reach {vm}")
            return AgentAnswer(url, body=body)

        with ThreadPoolExecutor(max_workers=min(16, len(wanted)), thread_name_prefix="status-http") as pool:
            futures = {vm: pool.submit(ask, vm, url) for vm, url in wanted.items()}
            answers.update({vm: future.result() for vm, future in futures.items()})
    return answers


def _brief_http_error(exc: httpx.HTTPError) -> str:
    if isinstance(exc, httpx.ConnectError):
        return "connection refused or unreachable"
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0][:120]


class GroupReader:
    """A read-only session on the group's ZooKeeper; ``open`` it, ``read`` as often as needed, ``close``.

    ``timeout`` bounds connecting and every read; ``http_timeout`` each agent's ``/status``;
    ``session_timeout`` is the session asked for (default: twice ``timeout``, at least 10 s).
    """

    def __init__(
        self,
        hosts: str,
        root: str,
        cluster: str,
        *,
        timeout: float = 5.0,
        http_timeout: float = 1.0,
        ask_agents_too: bool = True,
        client_factory: Callable[[ClientOptions], KazooClient] = read_only_client_factory,
        transport: httpx.BaseTransport | None = None,
        auth_data: tuple[tuple[str, str], ...] = (),
        tls: TlsOptions | None = None,
        session_timeout: float | None = None,
    ) -> None:
        self.hosts = hosts
        self.cluster = cluster
        self._timeout = timeout
        self._http_timeout = http_timeout
        self._ask_agents = ask_agents_too
        self._transport = transport
        try:
            self._store = ZooKeeperStore(
                hosts, root, cluster,
                session_timeout=max(10.0, 2 * timeout) if session_timeout is None else session_timeout,
                operation_timeout=timeout,
                client_factory=client_factory,
                auth_data=auth_data,
                tls=tls,
                create_layout=False,
                ack_times=True,
            )
        except ConfigError as exc:
            raise GroupStatusError(str(exc)) from None
        self.base_path = self._store.base_path
        self._root = self.base_path.rsplit("/", 1)[0] or "/"
        self._wakeup: Callable[[], None] = lambda: None
        self.watch = self._on_watch  # one bound method: kazoo keeps one watcher per path

    # -- life cycle -----------------------------------------------------------------------------------

    def open(self, *, require_cluster: bool = True) -> None:
        """Connect and (unless not ``require_cluster``) check that the cluster exists. Raises
        ``GroupStatusError``."""
        try:
            self._store.start()
        except StoreError as exc:
            raise GroupStatusError(f"cannot reach ZooKeeper at {self.hosts}: {exc}") from None
        if not require_cluster:
            return
        try:
            if self._call(lambda c: c.exists_async(self.base_path)) is None:
                raise GroupStatusError(self._not_found())
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        self._store.stop()

    @property
    def granted_session_timeout(self) -> float | None:
        """The session timeout the server granted (seconds), once connected."""
        return self._store.granted_session_timeout

    @property
    def connected_read_only(self) -> bool:
        """Whether the server this session reached is in read-only mode (cut off from its quorum)."""
        client = self._store.client
        return client is not None and str(getattr(client, "client_state", "")) == "CONNECTED_RO"

    def exists(self) -> bool:
        """Whether the cluster's base node exists. Raises ``GroupStatusError``."""
        return self._call(lambda c: c.exists_async(self.base_path)) is not None

    def acl(self, path: str) -> list[ACL] | None:
        """The ACL of the node at ``path``, None if there is no such node. Raises ``GroupStatusError``
        (``NoAuthError`` included: ZooKeeper shows an ACL only to who may read or administer the node)."""
        try:
            acl, _ = self._call(lambda c: c.get_acls_async(path))
        except NoNodeError:
            return None
        return list(acl)

    def children(self, path: str) -> list[str]:
        """The children of ``path`` ([] if there is no such node). Raises ``GroupStatusError``."""
        try:
            children: list[str] = self._call(lambda c: c.get_children_async(path))
        except NoNodeError:
            return []
        return sorted(children)

    def set_wakeup(self, callback: Callable[[], None]) -> None:
        """``callback`` is called (from kazoo's threads, it must not block) when a watched node changes."""
        self._wakeup = callback
        self._store.set_wakeup(callback)

    def _on_watch(self, event: WatchedEvent) -> None:
        self._wakeup()

    # -- reads ----------------------------------------------------------------------------------------

    def read(self, *, history: bool = True, history_since: float | None = None) -> GroupRead:
        """One read of the group, with (``history``) the finished records moved to the history among its
        records (those done at ``history_since`` or later, if given). Raises ``GroupStatusError`` if
        ZooKeeper cannot be read now."""
        try:
            view = self._store.read_view(OBSERVER)
            info = self._store.member_info(sorted(view.members))
            finished = self._store.read_history(history_since) if history else {}
            if finished:
                view = replace(view, records={**finished, **view.records})  # a record still in /events wins
        except StoreError as exc:
            raise GroupStatusError(f"cannot read ZooKeeper at {self.hosts}: {exc}") from None
        leader_since = self._leader_since() if view.leader is not None else None
        paused, unreadable, ctime = self._pause()
        now, mono = time.time(), time.monotonic()
        agents: dict[str, AgentAnswer] = {}
        if self._ask_agents:
            urls = {vm: admin_status_url(info.get(vm, {})) for vm in sorted(view.members)}
            agents = ask_agents(urls, self._http_timeout, self._transport)
        read_only = self.connected_read_only
        return GroupRead(
            cluster=self.cluster, base_path=self.base_path, hosts=self.hosts, read_at=now, mono=mono,
            view=view, member_info=info, leader_since=leader_since, paused=paused, paused_unreadable=unreadable,
            pause_ctime=ctime, read_only_server=read_only, agents=agents,
        )

    def _leader_since(self) -> float | None:
        try:
            data, _ = self._call(lambda c: c.get_async(f"{self.base_path}/leader"))
            return LeaderNode.from_bytes(data, f"{self.base_path}/leader").since
        except (NoNodeError, PayloadError):
            return None

    def _pause(self) -> tuple[PauseNode | None, str | None, float | None]:
        """The pause node, if there is one: (parsed, None, ctime) or (None, why unreadable, ctime)."""
        path = f"{self.base_path}/pause"
        # exists() with a watch: its creation wakes --watch too (a data watch is not set on a missing node).
        if self._call(lambda c: c.exists_async(path, watch=self.watch)) is None:
            return None, None, None
        try:
            data, stat = self._call(lambda c: c.get_async(path, watch=self.watch))
        except NoNodeError:
            return None, None, None
        ctime = stat.ctime / 1000.0
        try:
            return PauseNode.from_bytes(data, path), None, ctime
        except PayloadError as exc:
            return None, exc.reason, ctime

    def _not_found(self) -> str:
        message = f"no cluster {self.cluster!r} in ZooKeeper at {self.hosts}: {self.base_path} does not exist"
        try:
            children: list[str] = self._call(lambda c: c.get_children_async(self._root))
            known = sorted(children)
        except NoNodeError:
            return f"{message} (nor does {self._root}: no agent has used this root yet)"
        except GroupStatusError:
            return message
        if known:
            shown = ", ".join(known[:10]) + (f" and {len(known) - 10} more" if len(known) > 10 else "")
            return f"{message} (clusters under {self._root}: {shown})"
        return f"{message} ({self._root} holds no cluster)"

    def _call(self, request: Callable[[KazooClient], IAsyncResult[_T]]) -> _T:
        """One plain kazoo request, bounded by the timeout. ``NoNodeError`` passes through; every other
        failure raises ``GroupStatusError``."""
        client = self._store.client
        if client is None:
            raise GroupStatusError(f"cannot read ZooKeeper at {self.hosts}: not connected")
        try:
            return request(client).get(timeout=self._timeout)
        except NoNodeError:
            raise
        except (KazooException, KazooTimeoutError, client.handler.timeout_exception) as exc:
            what = f"no answer within {self._timeout:g} s" if isinstance(exc, KazooTimeoutError) else type(exc).__name__
            raise GroupStatusError(f"cannot read ZooKeeper at {self.hosts}: {what}") from None
