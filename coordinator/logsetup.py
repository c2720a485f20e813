"""Logging set-up: text for people, JSON lines for log shippers.

Log lines about one VM, one event or one drain phase carry them as fields: ``vm``, ``event_id`` and
``phase`` are attributes of the record, and JSON lines have them as keys of their own (text lines keep
them in the message, where they read as before). A call sets them with ``extra={"event_id": ...}``; the
agent binds ``vm`` and ``phase`` for everything logged during one of its cycles or jobs with
``log_context``, and ``set_log_defaults`` names the VM for the whole process (threads that run no cycle:
the IMDS poller, the peer probes, the ZooKeeper client). A field set by the call wins over the context,
which wins over the process defaults. Callable values are called when the record is made (the phase
of the moment).
"""

from __future__ import annotations

import json
import logging
import logging.handlers
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from types import MappingProxyType
from typing import Any, TextIO

__all__ = [
    "FIELDS", "ContextFilter", "RepeatFilter", "configure_logging", "log_context", "make_handler", "set_log_defaults",
]

#: The record attributes that JSON lines carry as keys of their own, when a record has them.
FIELDS = ("vm", "event_id", "phase")

_NOTHING: Mapping[str, object] = MappingProxyType({})
_context: ContextVar[Mapping[str, object]] = ContextVar("coordinator_log_context", default=_NOTHING)
_defaults: dict[str, object] = {}


@contextmanager
def log_context(**fields: object) -> Iterator[None]:
    """Bind fields to every record logged by this thread (or task) until the block ends. ``None`` values
    are left out; callables are called for each record."""
    bound = {**_context.get(), **{k: v for k, v in fields.items() if v is not None}}
    token = _context.set(bound)
    try:
        yield
    finally:
        _context.reset(token)


def set_log_defaults(**fields: object) -> None:
    """Fields of every record of the process that neither the call nor a ``log_context`` sets."""
    _defaults.update({k: v for k, v in fields.items() if v is not None})


class ContextFilter(logging.Filter):
    """Adds the bound fields to each record; runs on the thread that logs (a handler's filter)."""

    def filter(self, record: logging.LogRecord) -> bool:
        for source in (_context.get(), _defaults):
            for name, value in source.items():
                if getattr(record, name, None) is None:
                    try:
                        setattr(record, name, value() if callable(value) else value)
                    except Exception:  # a field must never cost the log line
                        continue
        return True


class RepeatFilter(logging.Filter):
    """Lets a library's message through once, then at most once every ``every`` seconds, saying how many
    like it were held back meanwhile. kazoo logs each failed connection attempt (about 110 lines a minute
    while ZooKeeper is down); the agent says once when its connection changes, and this keeps kazoo's own
    lines to a reminder. Messages are alike when they come from one logger, at one level, with one
    format string (the host and the error may differ). Records of other loggers pass untouched."""

    def __init__(self, prefixes: tuple[str, ...] = ("kazoo",), every: float = 60.0,
                 clock: Any = time.monotonic) -> None:
        super().__init__()
        self._prefixes = prefixes
        self._every = every
        self._clock = clock
        self._lock = threading.Lock()
        self._seen: dict[tuple[str, int, str], tuple[float, int]] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        if not record.name.startswith(self._prefixes):
            return True
        key = (record.name, record.levelno, str(record.msg))
        now = self._clock()
        with self._lock:
            last, held = self._seen.get(key, (None, 0))
            if last is not None and now - last < self._every:
                self._seen[key] = (last, held + 1)
                return False
            self._seen[key] = (now, 0)
            if len(self._seen) > 1000:  # bounded: forget the oldest templates
                for old in sorted(self._seen, key=lambda k: self._seen[k][0])[:500]:
                    del self._seen[old]
        if held:
            record.msg = f"{record.msg} ({held} more like it in the last {self._every:.0f} s held back)"
        return True


class _TextFormatter(logging.Formatter):
    """Text lines stamped in UTC with the zone said (``2026-11-26T03:36:11.123Z``), as JSON lines are: a
    line read on another machine, or beside ZooKeeper's and HAProxy's logs, is never an hour off."""

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z"


class _JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        body: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for name in FIELDS:
            value = getattr(record, name, None)
            if value is not None:
                body[name] = value if isinstance(value, str | int | float | bool) else str(value)
        if record.exc_info:
            body["exc"] = self.formatException(record.exc_info)
        return json.dumps(body)


#: A log file (the Windows service's) is rotated at this size, keeping this many old files.
LOG_FILE_BYTES = 10 * 1024 * 1024
LOG_FILE_BACKUPS = 5


def make_handler(fmt: str = "text", stream: TextIO | None = None, *, file: Path | None = None) -> logging.Handler:
    """A handler writing to ``stream`` (stderr by default), or to ``file`` (created with its directory,
    rotated at ``LOG_FILE_BYTES``, ``LOG_FILE_BACKUPS`` kept, UTF-8), in ``fmt`` ("text" or "json"),
    with the fields of ``log_context`` and ``set_log_defaults`` added to its records."""
    handler: logging.Handler
    if file is not None:
        file.parent.mkdir(parents=True, exist_ok=True)
        handler = logging.handlers.RotatingFileHandler(
            file, maxBytes=LOG_FILE_BYTES, backupCount=LOG_FILE_BACKUPS, encoding="utf-8")
    else:
        handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    if fmt == "json":
        handler.setFormatter(_JsonFormatter())
    else:
        handler.setFormatter(_TextFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    handler.addFilter(ContextFilter())
    handler.addFilter(RepeatFilter())
    return handler


def configure_logging(level: str = "INFO", fmt: str = "text", *, file: Path | None = None) -> None:
    """Send every record to stderr, or to ``file`` (see ``make_handler``), replacing earlier handlers."""
    root = logging.getLogger()
    root.handlers[:] = [make_handler(fmt, file=file)]
    root.setLevel(level)
    logging.getLogger("kazoo").setLevel(max(logging.getLevelName(level), logging.WARNING))
    logging.getLogger("httpx").setLevel(logging.WARNING)
