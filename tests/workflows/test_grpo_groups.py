"""GRPO with groups end to end: the producer's grouped rollout, the advantage stage."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import numpy as np

from joynexus.control.job import JobState
from joynexus.control.scheduler import TrainingScheduler
from joynexus.envs import EnvSpec, env_schema, make_env
from joynexus.envs.seeds import grouped_rollout_seed
from joynexus.models.backbone import ResidentBaseModel
from joynexus.queues.training import TrainingQueue
from joynexus.services.environment import EnvironmentService
from joynexus.services.inference import InferenceModelService
from joynexus.services.tenancy import TenantConfig
from joynexus.services.training import TrainingModelService
from joynexus.utils.clock import FakeClock
from joynexus.workflows.context import MetricsLog, WorkflowContext, WorkflowTenant
from joynexus.workflows.rl import produce_rl
from joynexus.workflows.stages import advantage_once
from tests.workflows.helpers import rl_spec

NUM_ENVS, GROUP_SIZE, HORIZON = 4, 2, 3


def test_a_grouped_rollout_starts_each_group_from_one_state_and_normalizes_within_it(
    tiny_backbone: Any, tmp_path: Path
) -> None:
    base: ResidentBaseModel = tiny_backbone("qwen2_5_vl")

    async def main() -> None:
        queue, env = TrainingQueue(), EnvironmentService()
        training = TrainingModelService(base, queue, output_dir=tmp_path)
        inference = InferenceModelService(base, env, queue)
        await inference.start()
        spec = rl_spec(
            "g",
            "unused",
            tmp_path,
            num_envs=NUM_ENVS,
            horizon=HORIZON,
            extra_algo={"name": "grpo", "group_size": GROUP_SIZE},
        )
        assert spec.env is not None
        schema = env_schema(spec.env)
        config = TenantConfig.from_spec(spec, schema)
        info = await training.add_tenant(config)
        await inference.add_tenant(config, await training.export_params("g"))
        session = await env.create_session("g", spec.env)
        tenant = WorkflowTenant(
            spec=spec,
            schema=schema,
            schema_signature=info.schema_signature,
            config=config,
            metrics=MetricsLog(None, FakeClock()),
            session_id=session.session_id,
        )
        ctx = WorkflowContext(
            scheduler=TrainingScheduler.in_memory(clock=FakeClock()),
            queue=queue,
            training=training,
            inference=inference,
            clock=FakeClock(),
            tenants={"g": tenant},
        )
        seen_first_states: list[np.ndarray] = []
        try:
            for _ in range(2):
                assert await produce_rl(ctx, tenant) is None
                job = ctx.scheduler.list_jobs(tenant_id="g", state=JobState.NEEDS_ADVANTAGES)[0]
                fields = ["state", "t", "env", "group", "rewards", "dones"]
                data = queue.get_data(queue.get_meta(job.partition_id, fields, 64, "chk"))
                t, envs = np.asarray(data["t"]), np.asarray(data["env"])
                np.testing.assert_array_equal(np.asarray(data["group"]), envs // GROUP_SIZE)
                first = np.asarray(data["state"])[t == 0][np.argsort(envs[t == 0])]
                # reach2d's state holds the agent and goal positions: the initial state.
                np.testing.assert_array_equal(first[0], first[1])
                np.testing.assert_array_equal(first[2], first[3])
                assert not np.array_equal(first[0], first[2])
                # ... drawn from the job's block of the training seeds.
                seed = grouped_rollout_seed(spec.seed, job.created_seq, NUM_ENVS // GROUP_SIZE)
                local = make_env(EnvSpec(kind="reach2d", num_envs=NUM_ENVS))
                expected = local.reset(seed=seed, group_size=GROUP_SIZE).state
                local.close()
                np.testing.assert_array_equal(first, expected)
                seen_first_states.append(first)

                ready = await advantage_once(ctx)
                assert ready is not None and ready.state is JobState.READY
                out = queue.get_data(
                    queue.get_meta(job.partition_id, ["advantages", "env", "group"], 64, "adv")
                )
                adv = np.asarray(out["advantages"])
                # Normalized within each group: every group's mean advantage is zero.
                for g in range(NUM_ENVS // GROUP_SIZE):
                    assert abs(float(adv[np.asarray(out["group"]) == g].mean())) < 1e-4
                queue.clear(job.partition_id)
                ctx.scheduler.fail(job.job_id, "test: not trained")
            # A new rollout starts from new initial states.
            assert not np.array_equal(seen_first_states[0][0], seen_first_states[1][0])
        finally:
            await inference.stop()
            await env.aclose()

    asyncio.run(main())
