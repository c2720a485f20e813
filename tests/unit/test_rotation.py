"""When HAProxy took a server out of rotation, from the changes a watcher saw."""

from __future__ import annotations

from coordinator.testbed.rotation import Change, RotationWatch, in_rotation, out_of_rotation_since

CHANGES = [Change(1.0, "vm0", "UP"), Change(1.0, "vm1", "UP"), Change(5.0, "vm0", "UP 1/2"),
           Change(5.5, "vm0", "DOWN"), Change(9.0, "vm0", "UP"), Change(10.0, "vm1", "DRAIN")]


def test_a_server_leaves_rotation_when_its_status_stops_being_up() -> None:
    assert in_rotation("UP") and in_rotation("UP 1/2")  # one failed check: HAProxy still sends it requests
    assert not any(in_rotation(s) for s in ("DOWN", "DRAIN", "MAINT", "DOWN 1/2", "NOLB"))


def test_out_of_rotation_since_finds_the_first_change_out_after_the_notice() -> None:
    assert out_of_rotation_since(CHANGES, "vm0", 2.0) == Change(5.5, "vm0", "DOWN")
    assert out_of_rotation_since(CHANGES, "vm0", 6.0) == Change(5.5, "vm0", "DOWN")  # already out at the notice
    assert out_of_rotation_since(CHANGES, "vm0", 9.5) is None
    assert out_of_rotation_since(CHANGES, "vm1", 2.0, until=9.0) is None  # out only after the event started
    assert out_of_rotation_since(CHANGES, "vm1", 2.0) == Change(10.0, "vm1", "DRAIN")


def test_the_watch_records_changes_only_and_skips_a_failed_reading() -> None:
    readings: list[dict[str, str] | OSError] = [{"vm0": "UP"}, {"vm0": "UP"}, OSError("busy"), {"vm0": "DRAIN"}]
    times = iter([1.0, 2.0, 4.0])

    def statuses() -> dict[str, str]:
        reading = readings.pop(0)
        if isinstance(reading, OSError):
            raise reading
        return reading

    watch = RotationWatch(statuses, clock=lambda: next(times))
    for _ in range(4):
        watch.poll()
    assert watch.changes == [Change(1.0, "vm0", "UP"), Change(4.0, "vm0", "DRAIN")]
