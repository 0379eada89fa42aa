"""A trainable workload's success rate, measured before and after training by the Master."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from joynexus.api import WorkloadState
from joynexus.spec.workload import parse_spec
from joynexus.workflows import launch
from joynexus.workflows.compile import compile_workloads
from joynexus.workflows.success import SUCCESS_EVAL, SuccessMeasure, recorded_measure
from tests.fakes.plane import FakeEnvironmentService, FakeServer, rl_spec

A = "alice"


@pytest.fixture
def server(tmp_path: Path) -> Iterator[FakeServer]:
    srv = FakeServer(tmp_path / "run")
    yield srv
    srv.close()


def _with_success_eval(episodes: int = 6, **extra: Any) -> Any:
    spec = rl_spec(A, target=2)
    data = spec.model_dump(mode="json", by_alias=True)
    data["success_eval"] = {"episodes": episodes, "seed": 500, **extra}
    return parse_spec(data)


def test_rl_workload_is_measured_before_its_first_and_after_its_last_update(
    server: FakeServer,
) -> None:
    st = server.run(server.master.lifecycle.submit(_with_success_eval(), A))
    done = server.run(server.master.lifecycle.wait(st.workload_id, timeout_s=10))
    assert done.state is WorkloadState.COMPLETED, done
    records = server.master.reporter.metrics(A, st.workload_id, kind=SUCCESS_EVAL).records
    assert [r["phase"] for r in records] == ["initial", "final"]
    initial, final = (SuccessMeasure.from_record(r) for r in records)
    assert initial.version == 0  # before any update
    assert final.version == done.policy_version and final.version > 0
    # The fake simulator: even sub-envs succeed; two sub-envs, 6 seeded episodes.
    assert (final.episodes, final.successes, final.first_seed) == (6, 3, 500)
    low, high = final.ci95
    assert low < 0.5 < high
    # The final measurement ran before the session closed, in the tenant's own session.
    assert done.session_id in server.plane.env.closed
    tenant = server.master.reporter.tenant_of(st.workload_id)
    assert tenant is not None and tenant.errors == []


def test_initial_measurement_can_be_skipped(server: FakeServer) -> None:
    st = server.run(server.master.lifecycle.submit(_with_success_eval(initial=False), A))
    server.run(server.master.lifecycle.wait(st.workload_id, timeout_s=10))
    records = server.master.reporter.metrics(A, st.workload_id).records
    assert recorded_measure(records, "initial") is None
    assert recorded_measure(records, "final") is not None


def test_the_measurement_before_training_can_play_fewer_episodes(server: FakeServer) -> None:
    # An untrained policy runs every episode to its step budget: on a slow simulator
    # the before-measurement is the costly one, so it may play a prefix of the seeds.
    st = server.run(
        server.master.lifecycle.submit(_with_success_eval(episodes=6, initial_episodes=2), A)
    )
    done = server.run(server.master.lifecycle.wait(st.workload_id, timeout_s=10))
    assert done.state is WorkloadState.COMPLETED, done
    records = server.master.reporter.metrics(A, st.workload_id).records
    initial, final = recorded_measure(records, "initial"), recorded_measure(records, "final")
    assert initial is not None and final is not None
    assert (initial.episodes, initial.first_seed) == (2, 500)
    assert (final.episodes, final.first_seed) == (6, 500)


def test_an_sft_workload_that_measures_success_gets_a_session(tmp_path: Path) -> None:
    data = {
        "tenant": A,
        "task": "sft",
        "base_model": {"id": "tiny:qwen2_5_vl"},
        "env": {"kind": "reach2d", "image_size": 8},
        "dataset": {"path": str(tmp_path / "demos")},
    }
    plain = compile_workloads([parse_spec(data)]).workloads[0]
    measured = compile_workloads([parse_spec({**data, "success_eval": {}})]).workloads[0]
    env = FakeEnvironmentService()
    assert asyncio.run(launch.open_session(env, plain)) is None
    assert asyncio.run(launch.open_session(env, measured)) is not None


def test_a_simulator_crash_mid_measurement_measures_again_on_the_new_session(
    server: FakeServer,
) -> None:
    from joynexus.errors import SimulatorCrashedError

    inference, env = server.plane.inference, server.plane.env
    evaluate, calls = inference.evaluate, []

    async def crash_once_after_training(*args: Any, **kwargs: Any) -> Any:
        calls.append(args[1])
        if len(calls) == 2:  # the final measurement: its simulator dies mid-way
            tenant = server.master.book.tenants[A]
            assert tenant.spec.env is not None
            # What session recovery does: a new session, swapped in for the tenant.
            tenant.session_id = (await env.create_session(A, tenant.spec.env)).session_id
            raise SimulatorCrashedError("the simulator did not answer step within 60 s")
        return await evaluate(*args, **kwargs)

    inference.evaluate = crash_once_after_training  # type: ignore[method-assign]
    st = server.run(server.master.lifecycle.submit(_with_success_eval(), A))
    done = server.run(server.master.lifecycle.wait(st.workload_id, timeout_s=10))
    assert done.state is WorkloadState.COMPLETED, done
    records = server.master.reporter.metrics(A, st.workload_id, kind=SUCCESS_EVAL).records
    assert [r["phase"] for r in records] == ["initial", "final"]
    final = SuccessMeasure.from_record(records[-1])
    assert (final.episodes, final.successes, final.first_seed) == (6, 3, 500)
    # Measured again from the first seed, on the new session.
    assert len(calls) == 3 and calls[2] != calls[1]
    tenant = server.master.reporter.tenant_of(st.workload_id)
    assert tenant is not None and tenant.errors == []
