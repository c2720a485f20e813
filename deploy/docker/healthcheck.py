"""Container health check of the agent: exit 0 when its admin listener answers 200 on /livez, else 1.

``coordinator-healthcheck [URL]`` (default http://127.0.0.1:9110/livez, the agent's default ``http.listen``).
The image is python slim, without curl: this uses only the standard library, ignores proxy variables and
never waits longer than its timeout. ``/livez`` turns 503 once the agent's loop has stopped completing
cycles, so the engine restarts (or reports) a wedged agent, not merely a dead one.
"""

from __future__ import annotations

import sys
import urllib.error
import urllib.request

DEFAULT_URL = "http://127.0.0.1:9110/livez"
TIMEOUT_SECONDS = 3.0


def main(argv: list[str]) -> int:
    url = argv[1] if len(argv) > 1 else DEFAULT_URL
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(url, timeout=TIMEOUT_SECONDS) as response:
            status = int(response.status)
    except urllib.error.HTTPError as exc:
        status = exc.code
    except (OSError, ValueError) as exc:
        print(f"coordinator-healthcheck: {url}: {exc}", file=sys.stderr)
        return 1
    if status != 200:
        print(f"coordinator-healthcheck: {url}: HTTP {status}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
