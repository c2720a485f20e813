"""``LoadGenerator``: a steady load through the load balancer, for the demo, the story and the compose stack."""

from __future__ import annotations

import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import httpx

__all__ = ["LoadGenerator"]


class LoadGenerator:
    """Sends GET requests at a fixed rate on its own thread; counts who answered and what failed.

    A request that gets no 200 within ``timeout`` seconds has failed; ``failures`` keeps the wall-clock
    time each failed request was sent, and what went wrong."""

    def __init__(self, url: str, rate: float, timeout: float = 3.0) -> None:
        self._url = url
        self._interval = 1.0 / rate
        self._timeout = timeout
        self.sent = 0
        self.failures: list[tuple[float, str]] = []
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self.served: Counter[str] = Counter()
        self.failed: Counter[str] = Counter()
        self._window: Counter[str] = Counter()
        self._thread = threading.Thread(target=self._run, name="load", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)

    def take_window(self) -> Counter[str]:
        """What happened since the last call: answers per server, and ``error`` for failures."""
        with self._lock:
            window, self._window = self._window, Counter()
        return window

    def _run(self) -> None:
        # Requests go out at the fixed rate whatever the answers: a slow server does not slow the load
        # (up to ``workers`` requests in flight), as independent clients would not wait for each other.
        workers = max(4, int(self._timeout / self._interval) + 2)
        with httpx.Client(timeout=self._timeout, trust_env=False,
                          limits=httpx.Limits(max_connections=workers)) as client, \
                ThreadPoolExecutor(workers, thread_name_prefix="load") as pool:
            next_at = time.monotonic()
            while not self._stop.wait(max(0.0, next_at - time.monotonic())):
                next_at += self._interval
                pool.submit(self._one, client)

    def _one(self, client: httpx.Client) -> None:
        sent_at = time.time()
        try:
            response = client.get(self._url)
            ok = response.status_code == 200
            key = response.headers.get("X-Served-By", "?") if ok else f"http {response.status_code}"
        except httpx.HTTPError as exc:
            key = f"error {type(exc).__name__}"
        failed = key.startswith(("http ", "error "))
        with self._lock:
            self.sent += 1
            if failed:
                self.failures.append((sent_at, key))
            (self.failed if failed else self.served)[key] += 1
            self._window["error" if failed else key] += 1
