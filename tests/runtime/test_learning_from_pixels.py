"""SFT from pixels: success rises on the easiest task, and what the camera adds on MetaWorld.

reach2d with ``observation.state: proprio``: the state is the agent's position, the goal
a green disc seen only in the image. SFT on the scripted expert's demonstrations through
the whole image path (rendered recording, video decode, canonical image handed on by the
backbone, the tenant's own image encoder) must raise success beyond its Wilson
intervals; a policy that cannot read the goal from the pixels does not reach it.

MetaWorld reach-v3 (proprio state, goal visible only in the image): two tenants train
side by side on the same expert episodes, one seeing the camera, the other a black frame
(``images: false``). The test fails unless the camera tenant's held-out action error
falls clearly (to half); it passes only if that error also ends clearly below the blind
tenant's, and is an expected failure (xfail) while it does not — the gap measured today
(docs/RESULTS.md §15), which this test will report closed.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from joynexus.master.run import run_workloads
from joynexus.spec.workload import WorkloadSpec, parse_spec

# reach2d at CI size (measured in docs/RESULTS.md §15).
REACH2D_DEMOS = 40
REACH2D_JOBS = 60
REACH2D_EPISODES = 40


def _tenant(name: str, images: bool, demos: Path, tiny_model: str) -> WorkloadSpec:
    spec: dict[str, Any] = {
        "tenant": name,
        "task": "sft",
        "base_model": {"id": tiny_model, "canonical_image_size": 56},
        "env": {
            "kind": "metaworld",
            "task": "reach-v3",
            "image_size": 64,
            "max_episode_steps": 150,
            "observation": {"images": images, "state": "proprio"},
        },
        "dataset": {"path": str(demos), "record_episodes": 30, "heldout_fraction": 0.2},
        "action_module": {
            "type": "oft",
            "hidden_dim": 128,
            "num_blocks": 2,
            "pooling": "attention",
        },
        "optimizer": {"lr": 0.001},
        "algorithm": {"name": "sft", "samples_per_job": 128, "microbatch_size": 128},
        "scheduling": {"completion_target": 80, "prefetch": 2},
    }
    return parse_spec(spec)


@pytest.mark.slow
def test_sft_from_pixels_raises_success_on_the_easiest_task(
    tmp_path: Path, tiny_model: str
) -> None:
    spec = parse_spec(
        {
            "tenant": "px-reach2d",
            "task": "sft",
            "base_model": {"id": tiny_model, "canonical_image_size": 56},
            "env": {
                "kind": "reach2d",
                "num_envs": 4,
                "image_size": 56,
                "observation": {"images": True, "state": "proprio"},
            },
            "dataset": {"path": str(tmp_path / "demos"), "record_episodes": REACH2D_DEMOS},
            # The tenant's own trainable image encoder reads where the goal is; the
            # frozen random backbone's features alone do not carry it (§15.1).
            "action_module": {
                "type": "oft",
                "hidden_dim": 128,
                "num_blocks": 2,
                "image_encoder": {"size": 56},
            },
            "optimizer": {"lr": 0.001},
            "algorithm": {"name": "sft", "samples_per_job": 128, "microbatch_size": 128},
            "scheduling": {"completion_target": REACH2D_JOBS, "prefetch": 2},
            "success_eval": {"episodes": REACH2D_EPISODES},
        }
    )
    summary = asyncio.run(run_workloads([spec], tmp_path / "run"))
    t = summary.tenants["px-reach2d"]
    assert t.state == "completed", t.errors
    before, after = t.success_rate_ci95_initial, t.success_rate_ci95
    print(f"reach2d from pixels: {t.success_rate_initial} {before}", end=" ")
    print(f"-> {t.success_rate_final} {after}")
    assert before is not None and after is not None
    # Rose beyond its intervals: the goal came through the pixels into the actions.
    assert after[0] > before[1]


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:Constant:UserWarning")  # metaworld's own expert warns
def test_sft_from_pixels_reads_the_goal_from_the_camera(tmp_path: Path, tiny_model: str) -> None:
    pytest.importorskip("metaworld")
    specs = [
        _tenant("camera", True, tmp_path / "demos-camera", tiny_model),
        _tenant("blind", False, tmp_path / "demos-blind", tiny_model),
    ]
    summary = asyncio.run(run_workloads(specs, tmp_path / "run"))
    camera, blind = summary.tenants["camera"], summary.tenants["blind"]
    assert camera.state == "completed", camera.errors
    assert blind.state == "completed", blind.errors
    errors = {
        name: (t.sft_heldout_error_initial, t.sft_heldout_error_final)
        for name, t in (("camera", camera), ("blind", blind))
    }
    print(f"reach-v3 SFT held-out action error (initial, final): {errors}")
    initial, final = errors["camera"]
    _, blind_final = errors["blind"]
    assert initial is not None and final is not None and blind_final is not None
    # SFT through the whole image path (rendered recording, video decode, canonical
    # image, backbone forward with the image tokens) must learn: a broken image path
    # (NaN or garbage frames, misaligned rows) keeps the error up.
    assert final < 0.5 * initial
    if final >= 0.8 * blind_final:
        # Measured (docs/RESULTS.md §15): the frozen tiny random backbone's features do
        # not yet carry the goal; the camera tenant learns no better than the blind one.
        pytest.xfail(
            f"the camera does not help yet: held-out error {final:.3f} with the camera, "
            f"{blind_final:.3f} without (needs < 0.8x)"
        )
