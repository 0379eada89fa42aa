"""RL from an SFT tenant through the real plane trains with the KL anchor by default.

The SFT tenant learns reach2d from demonstrations; a GRPO tenant names it in
``init_from``, so its slot freezes the SFT policy as its reference and every update adds
``kl_coef · KL(π ‖ π_ref)`` (default :data:`DEFAULT_KL_COEF`), reported per job as
``kl_ref``; the reference stays the SFT tenant's final policy while the RL head moves.
"""

from __future__ import annotations

import asyncio
import math
from pathlib import Path

import torch

from joynexus.master.run import LocalRun, run_workloads
from joynexus.services.training import TrainingModelService
from tests.workflows.helpers import rl_spec, spec

JOBS = 3


def test_grpo_from_sft_is_anchored_to_the_sft_policy(
    tmp_path: Path, tiny_model: str, reach2d_demos: Path
) -> None:
    sft = spec(
        {
            "tenant": "sft",
            "task": "sft",
            "base_model": {"id": tiny_model},
            "dataset": {"path": str(reach2d_demos), "heldout_fraction": 0.2},
            "action_module": {"type": "oft", "hidden_dim": 64, "num_blocks": 1},
            "optimizer": {"lr": 0.001},
            "algorithm": {"name": "sft", "samples_per_job": 64, "microbatch_size": 32},
            "scheduling": {"completion_target": 5, "prefetch": 2},
        }
    )
    grpo = rl_spec(
        "grpo",
        tiny_model,
        tmp_path / "out",
        target=JOBS,
        num_envs=4,
        horizon=8,
        max_in_flight=1,
        extra_algo={"name": "grpo", "group_size": 2, "microbatch_size": 16},
        init_from="sft",
    )
    assert grpo.anchor_coef() > 0  # on by default from init_from
    opened: list[LocalRun] = []
    summary = asyncio.run(run_workloads([sft, grpo], tmp_path / "run", on_open=opened.append))
    t = summary.tenants["grpo"]
    assert t.state == "completed", t.errors
    (run,) = opened
    assert run.master is not None and run.plane is not None
    tenant = run.master.reporter.tenant_of(run.workload_ids["grpo"])
    assert tenant is not None
    kls = [r["metric.kl_ref"] for r in tenant.metrics.of_kind("train")]
    assert len(kls) == JOBS and all(math.isfinite(k) and k > 0 for k in kls)
    training = run.plane.training
    assert isinstance(training, TrainingModelService)
    reference = training.slot("grpo").reference_module
    assert reference is not None
    sft_head = training.slot("sft").action_module.state_dict()
    rl_head = training.slot("grpo").action_module.state_dict()
    for name, tensor in reference.state_dict().items():
        if not name.endswith("log_std"):  # the RL tenant's own exploration noise
            assert torch.equal(tensor, sft_head[name]), name
    assert any(not torch.equal(rl_head[k], sft_head[k]) for k in sft_head)
