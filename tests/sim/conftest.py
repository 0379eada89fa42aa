"""Small scenarios that run in well under a second."""

from __future__ import annotations

from typing import Any

import pytest

from joynexus.sim.scenario import Scenario, preset


def small(**changes: Any) -> Scenario:
    """paper-5.1 with short rollouts and a 10-minute window (plus ``changes``)."""
    base = preset("paper-5.1")
    data = base.model_dump()
    data["name"] = "small"
    data["window_s"] = 600.0
    for t in data["rl_tenants"]:
        t["horizon"] = max(4, t["horizon"] // 8)
    for key, value in changes.items():
        if isinstance(value, dict) and isinstance(data.get(key), dict):
            data[key] = data[key] | value
        else:
            data[key] = value
    return Scenario.model_validate(data)


@pytest.fixture
def small_scenario() -> Scenario:
    return small()
