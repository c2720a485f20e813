"""Many writers on one pool (``bench/arm_writers.py``), small: several VMs drain through admin state at
the same moment against one pool of the simulator's ARM, then recover, judged from the data plane."""

from __future__ import annotations

from pathlib import Path

from bench.arm_writers import WritersSetup, run_writers


def test_writers_of_one_pool_all_end_down_before_their_drain_returns_and_none_before_their_recovery(
    tmp_path: Path,
) -> None:
    setup = WritersSetup("small", pool_size=12, writers=4, async_seconds=0.3, retry_after=0,
                         conflict_while_updating=True)
    result = run_writers(tmp_path, setup)
    assert result["ok"], result["failures"]
    # Each VM's write was applied once to drain and once to recover; the rest met 412 or 409 and wrote again.
    assert result["puts_applied"] == 2 * setup.writers, result
    assert result["puts_412"] + result["puts_409"] > 0, result

