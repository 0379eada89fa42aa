"""SFT raises the success rate on the easiest task (MetaWorld reach-v3, state only).

The whole path a user runs: the scripted expert's successful demonstrations are
recorded on first use, one SFT tenant trains on them through the Master, and its
success rate is measured before and after on evaluation seeds disjoint from the
demonstration seeds. The test fails unless the rate rises by at least 20 points and
the final rate's Wilson interval lies above the initial rate.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from joynexus.master.run import run_workloads
from joynexus.spec.workload import parse_spec

pytest.importorskip("metaworld")


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:Constant:UserWarning")  # metaworld's own expert warns
def test_sft_raises_success_on_metaworld_reach(tmp_path: Path, tiny_model: str) -> None:
    spec = parse_spec(
        {
            "tenant": "reach",
            "task": "sft",
            "base_model": {"id": tiny_model, "canonical_image_size": 28},
            "env": {
                "kind": "metaworld",
                "task": "reach-v3",
                "num_envs": 5,
                "image_size": 8,
                "max_episode_steps": 150,
                "observation": {"images": False},
            },
            "dataset": {
                "path": str(tmp_path / "demos"),
                "record_episodes": 30,
                "record_failures": False,
            },
            "action_module": {"type": "oft", "hidden_dim": 128, "num_blocks": 2},
            "optimizer": {"lr": 0.001},
            "algorithm": {"name": "sft", "samples_per_job": 128, "microbatch_size": 128},
            "scheduling": {"completion_target": 120, "prefetch": 2},
            "success_eval": {"episodes": 20},
        }
    )
    summary = asyncio.run(run_workloads([spec], tmp_path / "run"))
    t = summary.tenants["reach"]
    assert t.state == "completed", t.errors
    assert t.success_rate_ci95_initial is not None and t.success_rate_ci95 is not None
    print(
        f"reach-v3 SFT success {t.success_rate_initial:.2f} {t.success_rate_ci95_initial} "
        f"-> {t.success_rate_final:.2f} {t.success_rate_ci95} over {t.eval_episodes} episodes"
    )
    assert t.eval_episodes == 20
    assert t.success_rate_initial is not None and t.success_rate_final is not None
    assert t.success_rate_final >= t.success_rate_initial + 0.2
    assert t.success_rate_ci95[0] > t.success_rate_initial
