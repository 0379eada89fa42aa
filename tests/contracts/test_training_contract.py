"""The Training Model Service contract, run against the real service and the fake.

What the Master, the actor loop and the custom-algorithm primitives rely on: the error
classes for unknown tenants and bad partitions, a version step per optimizer step,
exported parameters that describe the tenant, and checkpoints that round-trip.
"""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from joynexus.control.job import TaskType
from joynexus.errors import (
    ConflictError,
    InvalidRequestError,
    NotFoundError,
    PermissionDeniedError,
    SchemaMismatchError,
)
from joynexus.queues.training import TrainingQueue
from joynexus.services.protocols import TrainingModelServiceAPI
from joynexus.services.training import TrainBatch, TrainingModelService, TrainJobResult
from tests.contracts.conftest import (
    SCHEMA,
    AnyBase,
    job,
    observations,
    put_samples,
    tenant_config,
)
from tests.fakes.base import FakeBase
from tests.fakes.training import FakeTrainingService

A, B = "alice", "bob"


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def make(base: AnyBase, queue: TrainingQueue, out: Path) -> TrainingModelServiceAPI:
    if isinstance(base, FakeBase):
        return FakeTrainingService(base, queue, output_dir=out)
    return TrainingModelService(base, queue, output_dir=out)


@pytest.fixture
def queue() -> TrainingQueue:
    return TrainingQueue()


@pytest.fixture
def svc(base: AnyBase, queue: TrainingQueue, tmp_path: Path) -> TrainingModelServiceAPI:
    return make(base, queue, tmp_path)


def test_add_tenant_answers_version_zero_and_the_bases_signature(
    svc: TrainingModelServiceAPI, base: AnyBase, tmp_path: Path
) -> None:
    info = run(svc.add_tenant(tenant_config(A, tmp_path)))
    assert (info.tenant_id, info.policy_version) == (A, 0)
    assert info.schema_signature == base.signature_for(SCHEMA)
    assert svc.tenant_ids() == [A] and svc.policy_version(A) == 0
    assert svc.config(A).tenant_id == A
    with pytest.raises(ConflictError, match="already has a training slot"):
        run(svc.add_tenant(tenant_config(A, tmp_path)))
    run(svc.remove_tenant(A))
    assert svc.tenant_ids() == []
    assert run(svc.add_tenant(tenant_config(A, tmp_path))).policy_version == 0


def test_an_unknown_tenant_is_not_found_everywhere(svc: TrainingModelServiceAPI) -> None:
    calls: list[Any] = [
        lambda: svc.policy_version("ghost"),
        lambda: svc.config("ghost"),
        lambda: run(svc.remove_tenant("ghost")),
        lambda: run(svc.export_params("ghost")),
        lambda: run(svc.save(1, ["ghost"])),
        lambda: run(svc.restore("ghost")),
        lambda: run(svc.train_batch("ghost", TrainBatch(observations(2)))),
        lambda: run(svc.train_job(job("ghost", "p", 2))),
    ]
    for call in calls:
        with pytest.raises(NotFoundError, match="ghost"):
            call()


def test_train_job_steps_the_version_once_per_microbatch(
    svc: TrainingModelServiceAPI, queue: TrainingQueue, tmp_path: Path
) -> None:
    sig = run(svc.add_tenant(tenant_config(A, tmp_path, mb=2))).schema_signature
    put_samples(queue, "p", A, sig, 4)
    result = run(svc.train_job(job(A, "p", 4, signature=sig), heartbeat=lambda: None))
    assert isinstance(result, TrainJobResult)
    assert (result.job_id, result.tenant_id, result.num_microbatches, result.num_samples) == (
        "job-1",
        A,
        2,
        4,
    )
    assert result.policy_version == 2 == svc.policy_version(A)
    assert len(result.losses) == 2 and all(np.isfinite(result.losses))
    assert np.isfinite(result.metrics["loss"])
    # A retried job re-reads its partition from the start.
    assert run(svc.train_job(job(A, "p", 4))).policy_version == 4


def test_train_job_refuses_partitions_it_must_not_train_on(
    svc: TrainingModelServiceAPI, queue: TrainingQueue, tmp_path: Path
) -> None:
    sig = run(svc.add_tenant(tenant_config(A, tmp_path))).schema_signature
    put_samples(queue, "short", A, sig, 2)
    with pytest.raises(ConflictError, match="fewer ready samples"):
        run(svc.train_job(job(A, "short", 4)))
    put_samples(queue, "foreign", B, sig, 2)
    with pytest.raises(PermissionDeniedError, match="belongs to tenant 'bob'"):
        run(svc.train_job(job(A, "foreign", 2)))
    put_samples(queue, "other-schema", A, "sig-of-another-interface", 2)
    with pytest.raises(SchemaMismatchError):
        run(svc.train_job(job(A, "other-schema", 2)))
    with pytest.raises(SchemaMismatchError):
        run(svc.train_job(job(A, "short", 2, signature="sig-of-another-interface")))
    with pytest.raises(InvalidRequestError, match="sample_count"):
        run(svc.train_job(job(A, "short", 0)))
    with pytest.raises(InvalidRequestError, match="algorithm 'sft'"):
        run(svc.train_job(job(A, "short", 2, task=TaskType.RL)))
    # Only the short job's first (full) microbatch stepped before it failed.
    assert svc.policy_version(A) == 1


def test_train_jobs_isolated_returns_each_jobs_error_in_its_place(
    svc: TrainingModelServiceAPI, queue: TrainingQueue, tmp_path: Path
) -> None:
    sig = run(svc.add_tenant(tenant_config(A, tmp_path))).schema_signature
    put_samples(queue, "p", A, sig, 2)
    out = run(svc.train_jobs_isolated([job("ghost", "p", 2, job_id="j0"), job(A, "p", 2)]))
    assert isinstance(out[0], NotFoundError)
    assert isinstance(out[1], TrainJobResult) and out[1].policy_version == 1


def test_actor_forward_attaches_log_probs_and_values_to_every_sample(
    svc: TrainingModelServiceAPI, queue: TrainingQueue, tmp_path: Path
) -> None:
    config = tenant_config(A, tmp_path, algo="ppo", value_head=True)
    sig = run(svc.add_tenant(config)).schema_signature
    put_samples(queue, "p", A, sig, 3, rl=True)
    run(svc.actor_forward(job(A, "p", 3, task=TaskType.RL)))
    meta = queue.get_meta("p", ["actor_log_probs", "actor_values"], 8, "check")
    data = queue.get_data(meta)
    for name in ("actor_log_probs", "actor_values"):
        value = np.asarray(data[name])
        assert value.shape == (3,) and value.dtype == np.float32, name
        assert np.isfinite(value).all()
    result = run(svc.train_job(job(A, "p", 3, task=TaskType.RL)))
    assert result.policy_version == 2  # microbatches of 2: two steps
    with pytest.raises(ConflictError):
        run(svc.actor_forward(job(A, "p", 5, task=TaskType.RL)))


def test_train_batch_steps_once_and_checks_its_batch_first(
    svc: TrainingModelServiceAPI, tmp_path: Path
) -> None:
    run(svc.add_tenant(tenant_config(A, tmp_path, algo="reinforce")))
    batch = TrainBatch(observations(2), loss="reinforce", advantages=np.ones(2, np.float32))
    assert run(svc.train_batch(A, batch)).policy_version == 1 == svc.policy_version(A)
    no_actions = dataclasses.replace(observations(2), actions=None)
    with pytest.raises(InvalidRequestError, match="actions"):
        run(svc.train_batch(A, TrainBatch(no_actions)))
    with pytest.raises(InvalidRequestError, match="advantages"):
        run(svc.train_batch(A, TrainBatch(observations(2), loss="reinforce")))
    wrong = TrainBatch(observations(2), loss="reinforce", advantages=np.ones(3, np.float32))
    with pytest.raises(SchemaMismatchError, match="advantages"):
        run(svc.train_batch(A, wrong))
    bad_state = dataclasses.replace(
        observations(2), state=np.zeros((2, SCHEMA.state_dim + 1), np.float32)
    )
    with pytest.raises(SchemaMismatchError):
        run(svc.train_batch(A, TrainBatch(bad_state)))
    assert svc.policy_version(A) == 1  # no refused batch stepped


def test_export_params_describes_the_tenants_current_policy(
    svc: TrainingModelServiceAPI, tmp_path: Path
) -> None:
    sig = run(svc.add_tenant(tenant_config(A, tmp_path))).schema_signature
    run(svc.train_batch(A, TrainBatch(observations(2))))
    payload = run(svc.export_params(A))
    assert (payload.tenant_id, payload.policy_version, payload.schema_signature) == (A, 1, sig)
    assert payload.named_tensors
    for name, tensor in payload.named_tensors.items():
        assert isinstance(tensor, torch.Tensor) and tensor.device.type == "cpu", name
        assert not name.startswith("base"), f"{name}: base weights are never exported"


def test_checkpoints_round_trip_with_their_ledger(
    svc: TrainingModelServiceAPI, tmp_path: Path
) -> None:
    run(svc.add_tenant(tenant_config(A, tmp_path)))
    assert svc.latest_checkpoint(A) is None and svc.checkpoint_ledger(A) == {}
    with pytest.raises(NotFoundError, match="no checkpoint"):
        run(svc.restore(A))
    batch = TrainBatch(observations(2))
    paths = []
    for step in (1, 2, 3):
        run(svc.train_batch(A, batch))
        paths += run(svc.save(step, [A], ledger={"jobs_applied": step}))
    assert [p.name for p in paths] == ["step_1", "step_2", "step_3"]
    assert svc.latest_checkpoint(A) == paths[-1]
    assert svc.checkpoint_ledger(A) == {"jobs_applied": 3}
    with pytest.raises(ConflictError, match="already exists"):
        run(svc.save(3, [A]))
    run(svc.train_batch(A, batch))
    assert svc.policy_version(A) == 4
    assert run(svc.restore(A)) == 3 == svc.policy_version(A)
    assert run(svc.restore(A, paths[0])) == 1
    assert run(svc.prune_checkpoints(A, keep_last=1)) == paths[:2]
    assert not paths[0].exists() and svc.latest_checkpoint(A) == paths[-1]


def test_a_checkpoint_survives_the_slot_and_restores_a_new_one(
    svc: TrainingModelServiceAPI, tmp_path: Path
) -> None:
    run(svc.add_tenant(tenant_config(A, tmp_path)))
    run(svc.train_batch(A, TrainBatch(observations(2))))
    before = run(svc.export_params(A))
    run(svc.save(1))  # every tenant
    run(svc.remove_tenant(A))
    run(svc.add_tenant(tenant_config(A, tmp_path)))
    assert run(svc.restore(A)) == 1
    after = run(svc.export_params(A))
    assert sorted(after.named_tensors) == sorted(before.named_tensors)
    for name, tensor in before.named_tensors.items():
        assert torch.equal(after.named_tensors[name], tensor), name
    other = tenant_config(B, tmp_path)
    run(svc.add_tenant(other))
    path = svc.latest_checkpoint(A)
    assert path is not None
    with pytest.raises(InvalidRequestError, match="belongs to tenant"):
        run(svc.restore(B, path))


def test_a_staged_save_writes_the_weights_as_they_were_when_staged(
    svc: TrainingModelServiceAPI, tmp_path: Path
) -> None:
    """What lets the actor commit an update behind the tenant's next one."""
    run(svc.add_tenant(tenant_config(A, tmp_path)))
    batch = TrainBatch(observations(2))
    run(svc.train_batch(A, batch))
    staged = run(svc.export_params(A))
    token = run(svc.stage_save(1, [A], ledger={"jobs_applied": 1}))
    run(svc.train_batch(A, batch))  # the slot moves on before the write
    moved = run(svc.export_params(A)).named_tensors
    assert any(not torch.equal(moved[n], t) for n, t in staged.named_tensors.items())
    assert svc.latest_checkpoint(A) is None  # nothing on disk until written
    (path,) = run(svc.write_staged(token))
    assert path.name == "step_1" and svc.checkpoint_ledger(A) == {"jobs_applied": 1}
    assert svc.policy_version(A) == 2
    assert run(svc.restore(A)) == 1
    restored = run(svc.export_params(A))
    for name, tensor in staged.named_tensors.items():
        assert torch.equal(restored.named_tensors[name], tensor), name
    with pytest.raises(NotFoundError, match="no staged save"):
        run(svc.write_staged(token))  # used up
    dropped = run(svc.stage_save(2, [A]))
    run(svc.discard_staged(dropped))
    with pytest.raises(NotFoundError, match="no staged save"):
        run(svc.write_staged(dropped))
