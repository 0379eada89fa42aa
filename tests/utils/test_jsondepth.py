"""The depth bound on free-form JSON data (job metadata, env options)."""

from __future__ import annotations

from typing import Any

import pytest

from joynexus.utils.jsondepth import MAX_JSON_DEPTH, check_json_depth, json_depth_problem


def _nested(levels: int, leaf: Any = 1) -> Any:
    value = leaf
    for i in range(levels):
        value = {"k": value} if i % 2 else [value]
    return value


def test_scalars_and_flat_data_pass() -> None:
    for value in (None, 3, "text", {}, [], {"a": [1, 2, {"b": None}]}):
        assert json_depth_problem(value) is None


@pytest.mark.parametrize("limit", [1, 2, 5, MAX_JSON_DEPTH])
def test_objects_and_arrays_both_count_and_the_limit_itself_passes(limit: int) -> None:
    assert json_depth_problem(_nested(limit), limit) is None
    problem = json_depth_problem(_nested(limit + 1), limit, "metadata")
    assert problem is not None
    assert problem.startswith("metadata") and f"more than {limit} levels" in problem


def test_the_refusal_names_the_path_with_its_middle_elided() -> None:
    problem = json_depth_problem({"outer": {"x": [{"inner": [[1]]}]}}, 4, "options")
    assert problem is not None
    assert problem.startswith("options['outer']['x'][0]['inner'] nests")  # level 5
    long = json_depth_problem(_nested(100), 10, "m")
    assert long is not None and "…" in long and len(long) < 300


def test_no_depth_makes_it_recurse() -> None:
    # Far past Python's recursion limit: the walk is iterative.
    assert json_depth_problem(_nested(100_000)) is not None
    with pytest.raises(ValueError, match="more than 32 levels"):
        check_json_depth(_nested(100_000), where="metadata")
    assert check_json_depth({"a": 1}) == {"a": 1}
