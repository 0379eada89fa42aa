"""What the contract suites share: one parameter over the real service and its fake.

Each suite under ``tests/contracts`` runs the same assertions against the service the
runtime builds (a tiny backbone, reach2d simulator workers, the Training Queue) and
against the fake of :mod:`tests.fakes` that the Master's and workflows' tests run on,
so the fake cannot drift from what it stands in for. The tiny backbone is the
session's (built once, frozen, shared).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from joynexus.control.job import JobState, JobTimestamps, TaskType, TrainingJob
from joynexus.envs.base import EnvSpec
from joynexus.envs.registry import env_schema
from joynexus.models.backbone import ResidentBaseModel
from joynexus.models.batch import ObservationBatch
from joynexus.models.policies import OFTHeadConfig
from joynexus.models.schema import DataSchema
from joynexus.queues.meta import SampleMeta
from joynexus.queues.training import TrainingQueue
from joynexus.services.samples import camera_field, instructions_array
from joynexus.services.tenancy import TenantConfig
from joynexus.spec.workload import AlgorithmSpec
from tests.fakes.base import FakeBase

# The session's tiny backbones (the model-layer tests' fixtures), built once.
from tests.models.conftest import TinyBackbone, tiny_backbone, tiny_model_dir  # noqa: F401

KINDS = ["real", "fake"]
#: reach2d with 8 px images: one camera, state 4, action 2, chunk 1.
ENV_SPEC = EnvSpec(kind="reach2d", num_envs=2, image_size=8, max_episode_steps=3)
SCHEMA: DataSchema = env_schema(ENV_SPEC)
HEAD = OFTHeadConfig(hidden_dim=8, num_blocks=1)

AnyBase = ResidentBaseModel | FakeBase


@pytest.fixture(params=KINDS)
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def base(kind: str, tiny_backbone: TinyBackbone) -> AnyBase:  # noqa: F811
    """The resident base model of ``kind``: the tiny Qwen2.5-VL, or the fake's stand-in."""
    return tiny_backbone("qwen2_5_vl") if kind == "real" else FakeBase()


def tenant_config(
    tid: str, out: Path, *, algo: str = "sft", mb: int = 2, value_head: bool = False
) -> TenantConfig:
    return TenantConfig(
        tenant_id=tid,
        schema_=SCHEMA,
        head=HEAD,
        value_head=value_head,
        algorithm=AlgorithmSpec.model_validate({"name": algo, "microbatch_size": mb}),
        seed=3,
        output_dir=out,
    )


def job(
    tid: str,
    pid: str,
    n: int,
    *,
    task: TaskType = TaskType.SFT,
    job_id: str = "job-1",
    signature: str | None = None,
) -> TrainingJob:
    return TrainingJob(
        job_id=job_id,
        policy_key=f"{tid}/{task}",
        tenant_id=tid,
        task_type=task,
        partition_id=pid,
        sample_count=n,
        domain="vla",
        metadata={} if signature is None else {"schema_signature": signature},
        created_seq=1,
        producer_role="producer",
        consumer_role="actor",
        state=JobState.LEASED,
        timestamps=JobTimestamps(created_at=0.0, updated_at=0.0),
    )


def observations(n: int, seed: int = 0) -> ObservationBatch:
    return ObservationBatch.synthetic(SCHEMA, n, seed=seed)


def put_samples(
    queue: TrainingQueue,
    pid: str,
    tid: str,
    signature: str,
    n: int,
    *,
    rl: bool = False,
    seed: int = 0,
) -> list[int]:
    """``n`` samples of the tenant (SFT columns; with ``rl`` also log-probs, advantages,
    returns), annotated as the producers annotate them."""
    batch = observations(n, seed)
    assert batch.actions is not None
    cols: dict[str, np.ndarray] = {camera_field(c): batch.cameras[c] for c in SCHEMA.camera_names}
    cols["state"] = batch.state
    cols["instruction"] = instructions_array(batch.instructions)
    cols["actions"] = batch.actions
    if rl:
        rng = np.random.default_rng(seed)
        cols["log_probs"] = rng.normal(-2.0, 0.5, n).astype(np.float32)
        cols["advantages"] = rng.standard_normal(n).astype(np.float32)
        cols["returns"] = rng.standard_normal(n).astype(np.float32)
    meta = SampleMeta(tenant_id=tid, schema_signature=signature, behavior_policy_version=0)
    return queue.queue_put(pid, cols, meta)
