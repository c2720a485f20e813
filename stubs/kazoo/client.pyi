from collections.abc import Callable, Iterable, Sequence
from typing import Any

from kazoo.interfaces import IAsyncResult, IHandler
from kazoo.protocol.states import WatchedEvent, ZnodeStat

_Watch = Callable[[WatchedEvent], object]
_Listener = Callable[[str], object]

class KazooClient:
    handler: IHandler
    hosts: Sequence[tuple[str, int]]
    chroot: str
    state: str
    def __init__(
        self,
        hosts: str = "127.0.0.1:2181",
        timeout: float = 10.0,
        client_id: tuple[int, bytes] | None = None,
        handler: IHandler | None = None,
        default_acl: Sequence[Any] | None = None,
        auth_data: Iterable[tuple[str, str]] | None = None,
        sasl_options: dict[str, str] | None = None,
        read_only: bool | None = None,
        randomize_hosts: bool = True,
        connection_retry: Any = None,
        command_retry: Any = None,
        logger: Any = None,
        keyfile: str | None = None,
        keyfile_password: str | None = None,
        certfile: str | None = None,
        ca: str | None = None,
        use_ssl: bool = False,
        verify_certs: bool = True,
        check_hostname: bool = False,
        **kwargs: Any,
    ) -> None: ...
    @property
    def client_id(self) -> tuple[int, bytes] | None: ...
    @property
    def connected(self) -> bool: ...
    def add_listener(self, listener: _Listener) -> None: ...
    def remove_listener(self, listener: _Listener) -> None: ...
    def start(self, timeout: float = 15) -> None: ...
    def start_async(self) -> Any: ...
    def stop(self) -> None: ...
    def close(self) -> None: ...
    def sync_async(self, path: str) -> IAsyncResult[str]: ...
    def create_async(
        self,
        path: str,
        value: bytes = b"",
        acl: Sequence[Any] | None = None,
        ephemeral: bool = False,
        sequence: bool = False,
        makepath: bool = False,
        include_data: bool = False,
    ) -> IAsyncResult[Any]: ...
    def ensure_path_async(self, path: str, acl: Sequence[Any] | None = None) -> IAsyncResult[Any]: ...
    def exists_async(self, path: str, watch: _Watch | None = None) -> IAsyncResult[ZnodeStat | None]: ...
    def get_async(self, path: str, watch: _Watch | None = None) -> IAsyncResult[tuple[bytes, ZnodeStat]]: ...
    def get_children_async(
        self, path: str, watch: _Watch | None = None, include_data: bool = False
    ) -> IAsyncResult[list[str]]: ...
    def set_async(self, path: str, value: bytes, version: int = -1) -> IAsyncResult[ZnodeStat]: ...
    def delete_async(self, path: str, version: int = -1) -> IAsyncResult[bool]: ...
    def transaction(self) -> TransactionRequest: ...
    # Blocking variants (used by tests and tools, never by the store: they are unbounded).
    def get(self, path: str, watch: _Watch | None = None) -> tuple[bytes, ZnodeStat]: ...
    def get_children(self, path: str, watch: _Watch | None = None) -> list[str]: ...
    def exists(self, path: str, watch: _Watch | None = None) -> ZnodeStat | None: ...
    def create(
        self,
        path: str,
        value: bytes = b"",
        acl: Sequence[Any] | None = None,
        ephemeral: bool = False,
        sequence: bool = False,
        makepath: bool = False,
    ) -> str: ...
    def delete(self, path: str, version: int = -1, recursive: bool = False) -> bool: ...

class TransactionRequest:
    def create(
        self,
        path: str,
        value: bytes = b"",
        acl: Sequence[Any] | None = None,
        ephemeral: bool = False,
        sequence: bool = False,
    ) -> None: ...
    def delete(self, path: str, version: int = -1) -> None: ...
    def set_data(self, path: str, value: bytes, version: int = -1) -> None: ...
    def check(self, path: str, version: int) -> None: ...
    def commit_async(self) -> IAsyncResult[list[object]]: ...
