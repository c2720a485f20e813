"""Blockers as values: what ``/status`` gives of them, and what ``coordinator status`` reads back."""

from __future__ import annotations

import pytest

from coordinator.blockers import DECIDED, Blocker, Hold


def test_a_blocker_weighed_at_approval_says_so_in_words_and_as_a_value() -> None:
    budget = Blocker(Hold.BUDGET, "maintenance budget: 2 VM(s) in maintenance, at most 2")
    held = budget.weighed_at_approval()
    assert str(budget) == "maintenance budget: 2 VM(s) in maintenance, at most 2"
    assert str(held) == "at approval: maintenance budget: 2 VM(s) in maintenance, at most 2"
    assert budget.about_admission and not held.about_admission
    assert held.kind is Hold.BUDGET and held.words == budget.words


@pytest.mark.parametrize("blocker", [
    Blocker(Hold.NOT_ACKNOWLEDGED, "vm1 has not acknowledged", "vm1"),
    Blocker(Hold.PEER_NOT_SERVING, "it would leave no VM serving (not confirmed in rotation: vm2: no answer)",
            at_approval=True, lasting=True),
    Blocker(Hold.PAUSED, "approvals paused by ops: at approval: vm1 has not acknowledged"),
])
def test_status_gives_a_blocker_that_reads_back_the_same(blocker: Blocker) -> None:
    assert Blocker.from_json(blocker.as_json()) == blocker


@pytest.mark.parametrize("value", [
    "vm1 has not acknowledged",  # the words alone, as an agent before the kinds gave them
    {"kind": "something new", "words": "x"},  # a kind of a later version
    {"kind": "budget"},  # no words
    {"kind": "no_agent", "words": "vm9 runs no agent", "vm": 9},
])
def test_what_is_not_a_blocker_of_this_version_reads_as_none(value: object) -> None:
    assert Blocker.from_json(value) is None


def test_the_decided_kinds_leave_out_what_only_the_status_command_says() -> None:
    assert Hold.NOT_BEFORE not in DECIDED and Hold.UNDECIDED not in DECIDED
    assert len(DECIDED) == len(Hold) - 2
