"""Log lines carry ``vm``, ``event_id`` and ``phase`` as fields: JSON lines of a real agent's actions have them
as keys of their own, text lines read as before."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from coordinator import logsetup
from coordinator.logsetup import log_context, make_handler, set_log_defaults
from tests.unit.test_safety_regressions import AT_ONCE, Bench, E


@pytest.fixture
def json_lines() -> Iterator[io.StringIO]:
    stream = io.StringIO()
    handler = make_handler("json", stream)
    root = logging.getLogger()
    level = root.level
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    try:
        yield stream
    finally:
        root.removeHandler(handler)
        root.setLevel(level)


def parsed(stream: io.StringIO) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stream.getvalue().splitlines()]


def test_json_lines_of_an_acknowledgement_carry_vm_event_and_phase_as_fields(
    tmp_path: Path, json_lines: io.StringIO
) -> None:
    bench = Bench(tmp_path, AT_ONCE)
    for name in ("vm0", "vm1", "vm2"):
        bench.add(name)
    bench.group.schedule(E, ["vm0", "vmx"])
    bench.run(20)
    lines = parsed(json_lines)
    [ack] = [line for line in lines if line["message"].startswith("acknowledged")]
    assert (ack["vm"], ack["event_id"], ack["phase"]) == ("vm0", E, "drained")
    assert ack["logger"] == "coordinator.agent" and ack["level"] == "INFO"
    # An action's line, logged on the job's thread, carries the drain's event and phase too.
    [probe] = [line for line in lines if line["message"].startswith("probe drain done")]
    assert (probe["vm"], probe["event_id"], probe["phase"]) == ("vm0", E, "draining")
    # A cycle's line names its VM without naming an event.
    cycles = [line for line in lines if line["message"].startswith("cycle (vm=vm1")]
    assert cycles and all(line["vm"] == "vm1" and "event_id" not in line for line in cycles)


def test_fields_from_the_call_win_over_the_context_which_wins_over_the_process(
    monkeypatch: pytest.MonkeyPatch, json_lines: io.StringIO
) -> None:
    monkeypatch.setattr(logsetup, "_defaults", {})
    other = logging.getLogger("coordinator.poller")
    other.info("outside any context")
    set_log_defaults(vm="vm9")
    other.info("with the process default")
    with log_context(vm="vm1", phase=lambda: "serving"):
        other.info("in a cycle")
        other.info("about one event", extra={"event_id": E})
    first, second, third, fourth = parsed(json_lines)
    assert "vm" not in first
    assert second["vm"] == "vm9"
    assert (third["vm"], third["phase"]) == ("vm1", "serving") and "event_id" not in third
    assert fourth["event_id"] == E


def test_text_lines_read_as_before() -> None:
    stream = io.StringIO()
    logger = logging.getLogger("tests.text")
    logger.addHandler(make_handler("text", stream))
    logger.propagate = False
    try:
        with log_context(vm="vm0", phase="drained"):
            logger.warning("acknowledged (vm=%s event=%s)", "vm0", E, extra={"event_id": E})
    finally:
        logger.handlers.clear()
        logger.propagate = True
    assert stream.getvalue().rstrip().endswith(f"WARNING tests.text: acknowledged (vm=vm0 event={E})")


def test_kazoo_repeats_its_connection_lines_once_a_minute_and_says_how_many_it_held_back() -> None:
    import io

    from coordinator.logsetup import RepeatFilter

    now = [0.0]
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter("%(name)s %(message)s"))
    handler.addFilter(RepeatFilter(every=60.0, clock=lambda: now[0]))
    kazoo = logging.getLogger("kazoo.client.test")
    ours = logging.getLogger("coordinator.agent.test")
    for logger in (kazoo, ours):
        logger.addHandler(handler)
        logger.propagate = False
        logger.setLevel(logging.WARNING)
    try:
        for second in range(110):  # ZooKeeper down: one failed attempt after another, every half second
            now[0] = second / 2
            kazoo.warning("Connection dropped: socket connection error: %s", f"refused by 10.0.0.{second % 3}")
            if second % 55 == 0:
                ours.warning("store connection lost (vm=vm0)")
        now[0] = 61.0
        kazoo.warning("Connection dropped: socket connection error: %s", "refused")
    finally:
        for logger in (kazoo, ours):
            logger.removeHandler(handler)
            logger.propagate = True
    lines = stream.getvalue().splitlines()
    kazoo_lines = [line for line in lines if line.startswith("kazoo")]
    assert len(kazoo_lines) == 2
    assert kazoo_lines[1].endswith("(109 more like it in the last 60 s held back)")
    assert sum(1 for line in lines if line.startswith("coordinator")) == 2  # other loggers pass untouched


def test_text_lines_are_stamped_in_utc_with_the_zone_said() -> None:
    import io
    import re

    from coordinator.logsetup import make_handler

    stream = io.StringIO()
    handler = make_handler("text", stream)
    logger = logging.getLogger("coordinator.test.stamp")
    logger.addHandler(handler)
    logger.propagate = False
    try:
        logger.warning("hello")
    finally:
        logger.removeHandler(handler)
        logger.propagate = True
    assert re.match(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z WARNING coordinator\.test\.stamp: hello$",
                    stream.getvalue().strip())
