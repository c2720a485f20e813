"""Runs drain and recover jobs one at a time on a worker thread, so the agent loop never blocks.

Jobs run in submission order: a recover submitted while a drain runs starts after it. The loop polls
``current`` every cycle; a job's exception is kept on its future and reported, never lost.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

__all__ = ["Job", "JobExecutor"]

log = logging.getLogger(__name__)


class Job:
    def __init__(self, kind: str, future: Future[None]) -> None:
        self.kind = kind
        self._future = future

    @property
    def running(self) -> bool:
        return not self._future.done()

    @property
    def error(self) -> BaseException | None:
        if not self._future.done():
            return None
        return self._future.exception()


class JobExecutor:
    def __init__(self, on_done: Callable[[], None] = lambda: None) -> None:
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="actions")
        self._on_done = on_done
        self.current: Job | None = None

    def submit(self, kind: str, fn: Callable[[], None]) -> Job:
        """Queue ``fn``; ``on_done`` (which must not block) is called when it finishes, however."""
        future = self._pool.submit(fn)
        future.add_done_callback(lambda _: self._on_done())
        self.current = Job(kind, future)
        return self.current

    def shutdown(self, wait: bool = True) -> None:
        self._pool.shutdown(wait=wait, cancel_futures=False)
