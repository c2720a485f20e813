"""What one ZooKeeper session read, node by node, kept while the watch set by each read has not fired.

The agent's view of the group is made of a few dozen nodes (the lists ``/members``, ``/events``..., the
records and acks of the events), and a change touches one of them. ``NodeCache`` keeps the answer of every
request the view sent (``children``, ``data`` or ``exists`` of a path), each sent with a watch, and drops
an answer when its watch fires: a read of the view then sends requests only for the answers it lacks, so
a change costs each agent the nodes that changed (one child list, one record, one ack), not the group's
lists again. A change to a list brings the data of the new names only: the names that stayed are kept.

Which answers a watch event drops (its type and path, as kazoo hands it to the watcher):

* ``CHILD``: the children of the path;
* ``CHANGED``: its data and its ``exists`` answer;
* ``CREATED`` and ``DELETED``: every answer about the path;
* an event without a path: everything.

Rules that keep the answers current (``docs/architecture.md``, "The view and its cost"):

* An answer is kept only if its request carried a watch and was answered without error: a ``NoNode``
  answer to ``getData`` or ``getChildren`` sets no watch on the server, so it is asked again next time.
* A watch that fires while a read is under way drops the answer even if it arrives after the
  watch event: ``begin`` and ``end`` bracket each read, and ``keep`` refuses a key whose watch fired in
  between (an answer the read got may predate the change its watch announced).
* ``begin`` with another session or connection (``stamp``) than the kept answers' drops them all: their
  watches may have gone with the connection, and a new session starts with none.
* ``memo`` keeps what a read made of a group of answers (the record of one event, from its node, its
  children and its acks), dropped with any answer under its path.

Thread-safety: ``on_watch`` runs on kazoo's watcher thread, the rest on the agent's loop.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from typing import Literal

from kazoo.protocol.states import EventType, WatchedEvent

__all__ = ["Key", "Kind", "NodeCache", "stale"]

Kind = Literal["children", "data", "exists"]
Key = tuple[Kind, str]

_DROPPED: dict[str, tuple[Kind, ...]] = {
    EventType.CHILD: ("children",),
    EventType.CHANGED: ("data", "exists"),
    EventType.CREATED: ("children", "data", "exists"),
    EventType.DELETED: ("children", "data", "exists"),
}


class NodeCache:
    """See the module docstring."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._answers: dict[Key, object] = {}
        self._memos: dict[str, object] = {}  # path -> what was made of the answers under it
        self._stamp: tuple[int, int] | None = None  # (session id, epoch) of the kept answers
        self._fired: set[str] | None = None  # paths whose watch fired since ``begin`` (None: no read)
        # Paths whose ``exists`` watch announced their creation (and no deletion since): a hint of which
        # request to send first (``Fetch.present``), never an answer.
        self._created: set[str] = set()

    # -- one read ---------------------------------------------------------------------------------------

    def begin(self, stamp: tuple[int, int]) -> None:
        """A read starts in session and connection ``stamp``: answers of another stamp are dropped."""
        with self._lock:
            if self._stamp != stamp:
                self._answers.clear()
                self._memos.clear()
                self._created.clear()
                self._stamp = stamp
            self._fired = set()

    def end(self) -> frozenset[str]:
        """The read is over: the paths whose watch fired while it was under way."""
        with self._lock:
            fired, self._fired = self._fired, None
        return frozenset(fired or ())

    # -- answers ----------------------------------------------------------------------------------------

    def get(self, key: Key) -> tuple[bool, object]:
        """(True, the kept answer) or (False, None)."""
        with self._lock:
            if key in self._answers:
                return True, self._answers[key]
        return False, None

    def keep(self, key: Key, answer: object) -> None:
        """Keep the answer of a watched request sent during the current read, unless its watch fired
        since the read began."""
        with self._lock:
            if self._fired is not None and key[1] in self._fired:
                return
            self._answers[key] = answer

    def created(self, path: str) -> bool:
        """Whether the last watch event about ``path`` announced its creation (a hint, see ``_created``)."""
        with self._lock:
            return path in self._created

    def memo(self, path: str) -> tuple[bool, object]:
        """(True, what was made of the answers under ``path``) or (False, None)."""
        with self._lock:
            if path in self._memos:
                return True, self._memos[path]
        return False, None

    def keep_memo(self, path: str, value: object) -> None:
        """Keep ``value`` for ``path`` unless a watch under it fired since the read began."""
        with self._lock:
            if self._fired is not None and any(_under(fired, path) for fired in self._fired):
                return
            self._memos[path] = value

    def __len__(self) -> int:
        with self._lock:
            return len(self._answers)

    # -- dropping -----------------------------------------------------------------------------------------

    def on_watch(self, event: WatchedEvent) -> None:
        """A watch fired (kazoo's watcher thread): drop what it makes stale."""
        path = event.path
        kinds = _DROPPED.get(event.type) if path else None
        with self._lock:
            if not path or kinds is None:
                self._answers.clear()
                self._memos.clear()
                if self._fired is not None:
                    self._fired.add("/")
                return
            for kind in kinds:
                self._answers.pop((kind, path), None)
            self._drop_memos((path,))
            if self._fired is not None:
                self._fired.add(path)
            if event.type == EventType.CREATED:
                self._created.add(path)
            elif event.type == EventType.DELETED:
                self._created.discard(path)

    def drop_under(self, path: str) -> None:
        """Drop every answer and memo about ``path`` and the nodes under it (this store wrote there)."""
        with self._lock:
            for key in [key for key in self._answers if _under(key[1], path)]:
                del self._answers[key]
            for memo in [memo for memo in self._memos if _under(memo, path)]:
                del self._memos[memo]
            self._drop_memos((path,))

    def drop_node(self, path: str) -> None:
        """Drop every answer about ``path`` itself and the memos at or above it (this store wrote there)."""
        with self._lock:
            for kind in ("children", "data", "exists"):
                self._answers.pop((kind, path), None)
            self._drop_memos((path,))

    def clear(self) -> None:
        with self._lock:
            self._answers.clear()
            self._memos.clear()
            self._created.clear()

    def _drop_memos(self, paths: Iterable[str]) -> None:
        # A memo is dropped with any answer at or under its path (lock held).
        for path in paths:
            node = path
            while node:
                self._memos.pop(node, None)
                node = node.rsplit("/", 1)[0]


def _under(path: str, parent: str) -> bool:
    """``path`` is ``parent`` or below it (``/`` is above everything)."""
    return parent == "/" or path == parent or path.startswith(parent + "/") or path == "/"


def stale(answers: Iterable[str], memos: Iterable[str], fired: frozenset[str]) -> bool:
    """Whether a watch that fired during a read (``fired``) concerns an answer or a memo the read took from
    the cache: the read may then mix that old answer with newer ones, and is made again. An answer (the
    children, data or ``exists`` of a path, in ``answers`` by its path) is concerned only by a watch on
    that very path, the one its request set; a memo (what was made of every answer under a path) by a watch
    at or under its path; an event without a path (``/``) concerns everything. A list kept from the cache
    is not made stale by a change under one of its children: with 200 agents the group changes during
    almost every read, and taking every change under ``/events`` for one to the list of events sent
    reads round until the last attempt, which reads everything."""
    if not fired:
        return False
    if "/" in fired:
        return True
    answers = set(answers)
    return bool(answers & fired) or any(_under(path, memo) for memo in memos for path in fired)
