"""RL on a flow-matching head end to end through an in-process Master (the shipped example).

The learning curve of the full example is measured in docs/RESULTS.md (it takes minutes);
here two jobs prove the path: rollouts record Flow-SDE chains, the actor-forward stage and
the actor recompute their log-probabilities, and PPO steps the DiT head and its critic.
"""

from __future__ import annotations

import asyncio
import math
from pathlib import Path

from joynexus.master.run import LocalRun, run_workloads
from joynexus.spec.workload import load_specs

EXAMPLE = Path(__file__).parents[2] / "examples" / "workloads" / "rl-flow-reach2d.yaml"
JOBS = 2


def test_flow_ppo_example_trains_end_to_end(tmp_path: Path, tiny_model: str) -> None:
    (loaded,) = load_specs(EXAMPLE)
    assert loaded.action_module.type == "flow_matching" and loaded.uses_value_head
    s = loaded.model_copy(
        update={
            "base_model": loaded.base_model.model_copy(update={"id": tiny_model}),
            "env": loaded.env.model_copy(update={"num_envs": 4}) if loaded.env else None,
            "algorithm": loaded.algorithm.model_copy(
                update={"horizon": 8, "microbatch_size": 16, "epochs": 2, "actor_forward": True}
            ),
            "scheduling": loaded.scheduling.model_copy(update={"completion_target": JOBS}),
            "output_dir": tmp_path / "out",
        }
    )
    opened: list[LocalRun] = []
    summary = asyncio.run(run_workloads([s], tmp_path / "run", on_open=opened.append))
    t = summary.tenants[s.tenant]
    assert t.state == "completed", t.errors
    assert t.jobs_completed == JOBS and t.jobs_failed == 0
    assert t.final_version == JOBS * 2 * 2  # jobs x epochs x (32 samples / 16 per microbatch)
    (run,) = opened
    assert run.master is not None
    tenant = run.master.reporter.tenant_of(run.workload_ids[s.tenant])
    assert tenant is not None
    trains = tenant.metrics.of_kind("train")
    assert len(trains) == JOBS
    for record in trains:
        # PPO statistics of the recomputed chain log-probs, and the critic's loss.
        assert math.isfinite(record["metric.approx_kl"]) and record["metric.approx_kl"] >= 0
        assert math.isfinite(record["metric.value_loss"])
