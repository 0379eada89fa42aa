"""The measured choice between a serial and a split CPU forward (utils/split_choice.py)."""

from __future__ import annotations

import pytest

from joynexus.utils.split_choice import SplitChooser

WORK = 1 << 26


def _run(chooser: SplitChooser, costs: dict[bool, float], n: int) -> list[bool]:
    """``n`` forwards of WORK whose seconds are ``costs[split]``; the ways chosen."""
    ways = []
    for _ in range(n):
        split = chooser.choose(WORK, rule=True)
        chooser.record(WORK, split, costs[split])
        ways.append(split)
    return ways


def test_the_size_rule_decides_first_then_the_other_way_is_measured_once() -> None:
    chooser = SplitChooser(explore_every=0)
    assert _run(chooser, {True: 1.0, False: 2.0}, 2) == [True, False]
    assert chooser.choose(WORK, rule=False) is True  # measured: split is cheaper


def test_the_cheaper_way_wins_whatever_the_rule_says() -> None:
    chooser = SplitChooser(explore_every=0)
    ways = _run(chooser, {True: 3.0, False: 1.0}, 10)  # a busy second core
    assert ways[:2] == [True, False]
    assert ways[2:] == [False] * 8


def test_the_worse_way_is_measured_again_after_its_cost_ratio_and_a_change_is_followed() -> None:
    chooser = SplitChooser(explore_every=2, smoothing=1.0)
    busy = _run(chooser, {True: 3.0, False: 1.0}, 16)
    # Split on call 1 (the rule), then once serial has run 2 × 3 = 6 times since.
    assert [i + 1 for i, split in enumerate(busy) if split] == [1, 9, 16]
    # The second core frees up: the next measurement of split finds it cheaper.
    quiet = _run(chooser, {True: 0.5, False: 1.0}, 7)
    assert quiet[-1] is True and chooser.choose(WORK, rule=False) is True


def test_a_far_worse_way_is_measured_again_rarely() -> None:
    chooser = SplitChooser(explore_every=16)
    ways = _run(chooser, {True: 100.0, False: 1.0}, 1000)
    spent = sum(100.0 if split else 1.0 for split in ways[2:])
    assert sum(ways[2:]) <= 1000 / (16 * 100) + 1
    assert spent <= 1.1 * 998  # re-measuring costs under a tenth more


def test_sizes_are_measured_apart() -> None:
    chooser = SplitChooser(explore_every=0)
    _run(chooser, {True: 3.0, False: 1.0}, 3)
    small = 1 << 20
    assert chooser.choose(small, rule=False) is False  # its own bucket: the rule first
    assert set(chooser.costs()) == {WORK.bit_length(), small.bit_length()}
    measured = chooser.costs()[WORK.bit_length()]
    assert measured["serial"] < measured["split"]


def test_smoothing_outside_its_range_is_refused() -> None:
    with pytest.raises(ValueError, match="smoothing"):
        SplitChooser(smoothing=0.0)
