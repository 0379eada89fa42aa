"""Core pinning (``--device-cores``): parsing, planning, and the pinning really applied to
this process (the model services) and to a simulator worker process."""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from typer.testing import CliRunner

from joynexus.cli.main import app
from joynexus.envs import EnvSpec
from joynexus.errors import InvalidRequestError
from joynexus.models.backbone import ResidentBaseModel
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
def test_device_pinning_splits_host_threads_from_device_work_and_is_restored() -> None:
    before = set(os.sched_getaffinity(0))
    threads_before = torch.get_num_threads()
    device = min(before)
    host = before  # the host keeps every core; the workers get the others
    plan = CorePlan(
        mode=str(device), device=frozenset({device}), workers=frozenset(before - {device})
    )
    seen: dict[str, set[int]] = {}
    go, done = threading.Event(), threading.Event()

    def older_thread() -> None:  # a Python thread started before the pinning: host
        go.wait(10)
        seen["older"] = set(os.sched_getaffinity(0))
        with affinity.on_device():
            seen["older on device"] = set(os.sched_getaffinity(0))
        seen["older after"] = set(os.sched_getaffinity(0))
        done.set()

    thread = threading.Thread(target=older_thread)
    thread.start()
    with pin_device(plan):
        # This thread (the event loop's) is host: it keeps every core.
        assert os.sched_getaffinity(0) == host
        assert torch.get_num_threads() == 1
        with affinity.on_device():
            assert affinity.current_affinity() == [device]
            assert torch.get_num_threads() == 1
        assert os.sched_getaffinity(0) == host
        # Threads that are not Python's (torch's intra-op workers) stay on the device.
        python_ids = {t.native_id for t in threading.enumerate()}
        others = [int(t) for t in os.listdir("/proc/self/task") if int(t) not in python_ids]
        for tid in others:
            with contextlib.suppress(ProcessLookupError):  # one that ended meanwhile
                assert os.sched_getaffinity(tid) == {device}, tid
        go.set()
        assert done.wait(10)
        assert seen == {"older": host, "older on device": {device}, "older after": host}
    thread.join(10)
    assert os.sched_getaffinity(0) == before
    assert torch.get_num_threads() == threads_before
    with affinity.on_device():  # no pinning in force: nothing moves
        assert os.sched_getaffinity(0) == before


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


@needs_pinning
@pytest.mark.usefixtures("restore_affinity")
def test_training_steps_and_inference_batches_run_on_the_device_cores(
    base: ResidentBaseModel, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Pinned, the services' device work runs on the device's cores; the event loop
    that drives them keeps every core (the host)."""
    from joynexus.models.batch import ObservationBatch
    from joynexus.queues.training import TrainingQueue
    from joynexus.services import training as training_module
    from joynexus.services.inference import InferenceModelService
    from joynexus.services.training import TrainBatch, TrainingModelService
    from tests.services.test_training_service import SCHEMA, config

    before = set(os.sched_getaffinity(0))
    device = min(before)
    plan = CorePlan(
        mode=str(device), device=frozenset({device}), workers=frozenset(before - {device})
    )
    seen: dict[str, list[set[int]]] = {"step": [], "batch": []}
    real_step = training_module.grouped_step

    def step_spy(*args: Any, **kwargs: Any) -> Any:
        seen["step"].append(set(os.sched_getaffinity(0)))
        return real_step(*args, **kwargs)

    monkeypatch.setattr(training_module, "grouped_step", step_spy)
    obs = ObservationBatch.synthetic(SCHEMA, 2, seed=0)

    async def main() -> set[int]:
        training = TrainingModelService(base, TrainingQueue(), output_dir=tmp_path)
        await training.add_tenant(config("a", tmp_path))
        await training.train_batch("a", TrainBatch(observations=obs, loss="sft"))
        inference = InferenceModelService(base, EnvironmentService(), TrainingQueue())
        real_batch = inference._executor.run_requests

        def batch_spy(*args: Any, **kwargs: Any) -> Any:
            seen["batch"].append(set(os.sched_getaffinity(0)))
            return real_batch(*args, **kwargs)

        monkeypatch.setattr(inference._executor, "run_requests", batch_spy)
        async with inference:
            await inference.add_tenant(config("a", tmp_path))
            query = ObservationBatch.synthetic(SCHEMA, 1, seed=0, with_actions=False)
            await inference.predict(query, "a")
        return set(os.sched_getaffinity(0))

    with pin_device(plan):
        host = asyncio.run(main())
    assert seen == {"step": [{device}], "batch": [{device}]}
    assert host == before
