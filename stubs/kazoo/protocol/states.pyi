from collections.abc import Callable
from typing import Any, NamedTuple

class KazooState:
    SUSPENDED: str
    CONNECTED: str
    LOST: str

class EventType:
    CREATED: str
    DELETED: str
    CHANGED: str
    CHILD: str
    NONE: str

class WatchedEvent(NamedTuple):
    type: str
    state: str
    path: str | None

class ZnodeStat(NamedTuple):
    czxid: int
    mzxid: int
    ctime: int
    mtime: int
    version: int
    cversion: int
    aversion: int
    ephemeralOwner: int
    dataLength: int
    numChildren: int
    pzxid: int

class Callback(NamedTuple):
    type: str
    func: Callable[..., Any]
    args: tuple[Any, ...]
