"""Usage of services in other processes: drained there, merged here, each count once."""

from __future__ import annotations

import pytest

from joynexus.metrics.usage import UsageMeter


def test_a_drained_meter_hands_over_its_counts_once() -> None:
    remote = UsageMeter()
    remote.record_training({"a": 3, "b": 1}, shared_seconds=2.0, own_seconds={"a": 0.5})
    remote.record_env("b", steps=4, seconds=1.0)
    host = UsageMeter()
    host.record_request("a")
    host.merge(remote.drain())
    host.merge(remote.drain())  # nothing new: nothing added twice
    a, b = host.tenant("a"), host.tenant("b")
    assert a.device_seconds["training"] == pytest.approx(2.0 * 3 / 4 + 0.5)
    assert b.device_seconds["training"] == pytest.approx(0.5)
    assert b.device_seconds["environment"] == pytest.approx(1.0)
    assert (a.samples_trained, b.samples_trained, b.env_steps, a.requests) == (3, 1, 4, 1)
    report = host.snapshot()
    assert report.service_seconds["training"] == pytest.approx(2.5)
    assert remote.snapshot().tenants == {}
