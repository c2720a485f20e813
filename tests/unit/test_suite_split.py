"""`scripts/test.sh` runs the end-to-end stories (marker ``e2e``) in a pytest process of their own, one
after another, beside a second process with every other test. The split is only as good as the marker:
a story without it would run beside another story and judge the machine's load instead of the agents,
and a quick test that carried it would only lengthen the stories' process. Both are caught here."""

from __future__ import annotations

import functools
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parent.parent.parent


@functools.cache  # tests/e2e is collected once for both tests
def _collected(*args: str) -> list[str]:
    """The test ids pytest selects with ``args``, collected but not run."""
    run = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--collect-only", "-q", *args],
                         cwd=ROOT, capture_output=True, text=True, timeout=300, check=False)
    assert run.returncode in (0, 5), run.stdout + run.stderr  # 5: nothing selected
    return [line for line in run.stdout.splitlines() if "::" in line]


def test_every_end_to_end_story_carries_the_e2e_marker() -> None:
    stories = _collected("tests/e2e")
    assert stories, "no end-to-end story collected"
    assert _collected("-m", "not e2e", "tests/e2e") == []


def test_only_the_end_to_end_stories_carry_the_e2e_marker() -> None:
    marked = _collected("-m", "e2e", "tests")
    assert marked == _collected("tests/e2e")
    assert all(test_id.startswith("tests/e2e/") for test_id in marked)
