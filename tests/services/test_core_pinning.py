"""Core pinning (``--device-cores``): parsing, planning, and the pinning really applied to
this process (the model services) and to a simulator worker process."""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from joynexus.cli.main import app
from joynexus.envs import EnvSpec
from joynexus.errors import InvalidRequestError
from joynexus.services.environment import EnvironmentService, EnvironmentServiceConfig
from joynexus.utils import affinity
from joynexus.utils.affinity import CorePlan, parse_core_list, pin_device, plan_cores

needs_pinning = pytest.mark.skipif(
    not affinity.can_pin() or len(os.sched_getaffinity(0)) < 2,
    reason="needs os.sched_setaffinity and at least 2 usable cores",
)


@pytest.fixture
def restore_affinity() -> Iterator[None]:
    """Whatever a test does, this process's cores and torch threads come back."""
    cores = set(os.sched_getaffinity(0)) if affinity.can_pin() else None
    threads = torch.get_num_threads()
    try:
        yield
    finally:
        if cores is not None:
            affinity.pin_this_process(cores)
        torch.set_num_threads(threads)


def test_core_lists_parse() -> None:
    assert parse_core_list("0") == {0}
    assert parse_core_list("0-1") == {0, 1}
    assert parse_core_list("0,2-3, 5") == {0, 2, 3, 5}
    for bad in ("", "x", "1-", "-1", "3-1", "0,,1", "0.5", "1-2-3"):
        with pytest.raises(InvalidRequestError, match="--device-cores"):
            parse_core_list(bad)


def test_plans_split_the_usable_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(affinity, "can_pin", lambda: True)
    four = range(4)
    auto = plan_cores("auto", four)
    assert (auto.device, auto.workers) == ({0, 1}, {2, 3})
    assert plan_cores("auto", range(3)).device == {0}
    one = plan_cores("0", four)
    assert (one.device, one.worker_cores) == ({0}, [1, 2, 3])
    assert one.describe() == (
        "core pinning: model services (the device) on cores 0, simulator workers on cores 1-3"
    )
    assert one.to_json() == {
        "mode": "0",
        "pinned": True,
        "device_cores": [0],
        "worker_cores": [1, 2, 3],
        "note": "",
    }
    off = plan_cores("none", four)
    assert not off.pinned and off.to_json()["device_cores"] is None
    assert off.describe().startswith("core pinning: off")
    single = plan_cores("auto", [0])
    assert not single.pinned and "nothing to split" in single.note
    with pytest.raises(InvalidRequestError, match="not usable here"):
        plan_cores("4", four)
    with pytest.raises(InvalidRequestError, match="leaves no core for the simulator"):
        plan_cores("0-3", four)


def test_without_sched_setaffinity_it_says_so_and_runs_unpinned(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(affinity, "can_pin", lambda: False)
    for option in ("auto", "0"):
        plan = plan_cores(option, range(4))
        assert not plan.pinned
        assert "no os.sched_setaffinity" in plan.describe()
    with pytest.raises(InvalidRequestError):
        plan_cores("zero", range(4))  # a malformed value is still an error
    with pin_device(plan) as applied:  # nothing to apply, nothing raised
        assert applied is plan


@needs_pinning
@pytest.mark.usefixtures("restore_affinity")
def test_device_pinning_applies_to_every_thread_and_is_restored() -> None:
    before = set(os.sched_getaffinity(0))
    threads_before = torch.get_num_threads()
    device = min(before)
    plan = CorePlan(mode=str(device), device=frozenset({device}), workers=frozenset(before))
    seen: dict[str, set[int]] = {}
    go, done = threading.Event(), threading.Event()

    def older_thread() -> None:  # started before the pinning: pinned all the same
        go.wait(10)
        seen["older"] = set(os.sched_getaffinity(0))
        done.set()

    thread = threading.Thread(target=older_thread)
    thread.start()
    with pin_device(plan):
        assert os.sched_getaffinity(0) == {device}
        assert torch.get_num_threads() == 1
        assert affinity.current_affinity() == [device]
        go.set()
        assert done.wait(10)
        assert seen["older"] == {device}
    thread.join(10)
    assert os.sched_getaffinity(0) == before
    assert torch.get_num_threads() == threads_before


@needs_pinning
def test_simulator_workers_run_on_the_worker_cores() -> None:
    cores = sorted(os.sched_getaffinity(0))
    workers = [cores[-1]]
    service = EnvironmentService(EnvironmentServiceConfig(worker_cores=workers))

    async def main() -> None:
        try:
            info = await service.create_session("alice", EnvSpec(kind="fake", num_envs=1))
            pid = service._sessions[info.session_id].worker.process.pid
            assert pid is not None
            assert sorted(os.sched_getaffinity(pid)) == workers
            # This process was not touched.
            assert sorted(os.sched_getaffinity(0)) == cores
        finally:
            await service.aclose()

    asyncio.run(main())


def test_bad_device_cores_exit_2(tmp_path: Path) -> None:
    runner = CliRunner()
    spec = tmp_path / "missing.yaml"
    for args in (
        ["run", str(spec), "--device-cores", "zero"],
        ["run", str(spec), "--device-cores", "3-1"],
        ["demo", "--device-cores", "0-99999", "--out", str(tmp_path / "d")],
    ):
        result = runner.invoke(app, args)
        assert result.exit_code == 2, (args, result.output)
        assert "--device-cores" in result.output
    assert not (tmp_path / "d").exists()  # stopped before anything started


@needs_pinning
def test_run_pins_only_the_embedded_runtime(tmp_path: Path) -> None:
    device = str(min(os.sched_getaffinity(0)))
    result = CliRunner().invoke(
        app, ["run", str(tmp_path / "x.yaml"), "--device-cores", device, "--runtime", "ray"]
    )
    assert result.exit_code == 2, result.output
    assert "--runtime embedded only" in result.output
    assert f"model services (the device) on cores {device}" in result.output
