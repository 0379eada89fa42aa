"""A policy family is a plug-in: registered in the test, it trains and serves unchanged.

The family below exists only here: a config, a head and one ``register_policy`` call.
It then goes through the normal paths: a workload spec and a service tenant config name
it by ``type``, the Training Model Service runs SFT train jobs on it, its exported
payload loads into the Inference Model Service, and ``predict`` answers with its actions.
No service, slot or spec code knows its type.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Literal

import numpy as np
import pytest
import torch
from pydantic import Field
from torch import nn

from joynexus.errors import InvalidRequestError
from joynexus.models.backbone import ResidentBaseModel
from joynexus.models.batch import ObservationBatch
from joynexus.models.policies import (
    PolicyConfig,
    PolicyFamily,
    PolicyHead,
    masked_mean,
    masked_reduce,
    policy_types,
    register_policy,
    unregister_policy,
)
from joynexus.models.schema import DataSchema
from joynexus.models.types import BackboneOutput
from joynexus.queues.training import TrainingQueue
from joynexus.services.environment import EnvironmentService
from joynexus.services.inference import InferenceModelService
from joynexus.services.rl_loss import rl_fields
from joynexus.services.tenancy import TenantConfig
from joynexus.services.training import TrainingModelService
from joynexus.spec.workload import parse_spec
from tests.services.test_training_service import SCHEMA, make_job, put_sft


class LinearHeadConfig(PolicyConfig):
    """The test family: one linear map from pooled features and state to the chunk."""

    type: Literal["linear_test"] = "linear_test"
    init_scale: float = Field(default=0.1, gt=0)


class LinearHead(PolicyHead):
    def __init__(self, config: LinearHeadConfig, hidden_size: int, schema: DataSchema):
        super().__init__(
            hidden_size=hidden_size,
            state_dim=schema.state_dim,
            action_dim=schema.action_dim,
            action_chunk=schema.action_chunk,
        )
        self.out = nn.Linear(
            hidden_size + schema.state_dim, schema.action_chunk * schema.action_dim
        )
        with torch.no_grad():
            self.out.weight.mul_(config.init_scale)

    def _forward(self, features: BackboneOutput, state: torch.Tensor) -> torch.Tensor:
        w = self.out.weight
        pooled = masked_mean(features.hidden_states.to(w), features.attention_mask.to(w.device))
        flat: torch.Tensor = self.out(torch.cat([pooled, state.to(w)], dim=-1))
        return flat.view(-1, self.action_chunk, self.action_dim)

    def loss(
        self,
        features: BackboneOutput,
        state: torch.Tensor,
        actions: torch.Tensor,
        action_mask: torch.Tensor | None = None,
        *,
        generator: torch.Generator | None = None,
    ) -> torch.Tensor:
        self.check_inputs(features, state, actions)
        pred = self._forward(features, state)
        return masked_reduce((pred - actions.to(pred)).pow(2), action_mask)

    @torch.no_grad()
    def predict(
        self,
        features: BackboneOutput,
        state: torch.Tensor,
        *,
        generator: torch.Generator | None = None,
    ) -> torch.Tensor:
        self.check_inputs(features, state)
        return self._forward(features, state)


def build_linear_head(
    config: LinearHeadConfig, hidden_size: int, schema: DataSchema, base: object
) -> PolicyHead:
    return LinearHead(config, hidden_size, schema)


@pytest.fixture
def linear_family() -> Iterator[None]:
    register_policy(PolicyFamily(LinearHeadConfig, build_linear_head))
    yield
    unregister_policy("linear_test")


def _tenant(tmp_path: Path) -> TenantConfig:
    # Parsed from plain data, as a spec's action_module reaches the services.
    return TenantConfig.model_validate(
        {
            "tenant_id": "lin",
            "schema": SCHEMA.model_dump(),
            "head": {"type": "linear_test", "init_scale": 0.5},
            "optimizer": {"lr": 3e-2},
            "algorithm": {"name": "sft", "microbatch_size": 4},
            "seed": 3,
            "output_dir": str(tmp_path),
        }
    )


def test_a_registered_family_trains_by_sft_and_serves_predict(
    linear_family: None, base: ResidentBaseModel, tmp_path: Path
) -> None:
    config = _tenant(tmp_path)
    assert isinstance(config.head, LinearHeadConfig) and config.head.init_scale == 0.5
    obs = ObservationBatch.synthetic(SCHEMA, 3, seed=11, with_actions=False)

    async def main() -> None:
        trainer = TrainingModelService(base, TrainingQueue(), output_dir=tmp_path)
        info = await trainer.add_tenant(config)
        assert isinstance(trainer.slot("lin").action_module, LinearHead)
        results = []
        for i in range(6):
            put_sft(trainer.queue, f"p{i}", "lin", info.schema_signature, 8, seed=0)
            job = make_job("lin", f"p{i}", 8, info.schema_signature, job_id=f"j{i}")
            results.append(await trainer.train_job(job))
        assert [r.policy_version for r in results] == [2, 4, 6, 8, 10, 12]
        assert np.mean(results[-1].losses) < 0.5 * np.mean(results[0].losses)
        # RL needs a policy density, which this family does not declare.
        with pytest.raises(InvalidRequestError, match=r"'linear_test'.*sft and evaluation only"):
            rl_fields(trainer.slot("lin"))
        payload = await trainer.export_params("lin")

        server = InferenceModelService(
            base, EnvironmentService(), TrainingQueue(), max_batch_size=8, max_wait_s=0.01
        )
        async with server:
            await server.add_tenant(config, payload)
            served = await server.predict(obs, "lin")
        assert served.policy_version == 12
        assert served.actions.shape == (3, SCHEMA.action_chunk, SCHEMA.action_dim)
        # The served actions are the trained head's own prediction.
        slot = trainer.slot("lin")
        features = base.encode(base.canonicalize([("lin", SCHEMA, obs)]))
        expected = slot.predict(features, torch.as_tensor(obs.state)).cpu().numpy()
        np.testing.assert_allclose(served.actions, expected, rtol=1e-4, atol=1e-5)

    asyncio.run(main())


def test_a_spec_names_a_registered_family_and_round_trips(linear_family: None) -> None:
    assert "linear_test" in policy_types()
    raw = {
        "tenant": "lin",
        "task": "custom",
        "base_model": {"id": "tiny"},
        "schema": "pusht",
        "action_module": {"type": "linear_test", "init_scale": 0.25},
    }
    spec = parse_spec(raw)
    assert isinstance(spec.action_module, LinearHeadConfig)
    dumped = spec.model_dump(mode="json", by_alias=True)
    assert dumped["action_module"] == {"type": "linear_test", "lora": None, "init_scale": 0.25}
    assert parse_spec(dumped).action_module == spec.action_module


def test_an_unregistered_type_names_the_registered_ones() -> None:
    raw = {
        "tenant": "lin",
        "task": "custom",
        "base_model": {"id": "tiny"},
        "schema": "pusht",
        "action_module": {"type": "linear_test"},
    }
    with pytest.raises(
        Exception, match=r"action_module: type 'linear_test' is not a registered.*'oft'"
    ):
        parse_spec(raw)
