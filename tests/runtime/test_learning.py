"""Learning proofs with fixed seeds (reach2d: the goal is in the state, see its docs)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from joynexus.runtime import EmbeddedRuntime
from tests.workflows.helpers import spec


def test_sft_on_recorded_demos_halves_heldout_action_error(
    tmp_path: Path, tiny_model: str, reach2d_demos: Path
) -> None:
    # reach2d demos recorded with its scripted expert (MetaWorld recording is too slow
    # for a unit test; `examples/workloads/sft-metaworld.yaml` runs the same path on it).
    s = spec(
        {
            "tenant": "sft",
            "task": "sft",
            "base_model": {"id": tiny_model},
            "dataset": {"path": str(reach2d_demos), "heldout_fraction": 0.2},
            "action_module": {"type": "oft", "hidden_dim": 64, "num_blocks": 1},
            "optimizer": {"lr": 0.001},
            "algorithm": {"name": "sft", "samples_per_job": 64, "microbatch_size": 32},
            "scheduling": {"completion_target": 20, "prefetch": 2},
            "output_dir": str(tmp_path / "out"),
            "seed": 0,
        }
    )
    summary = asyncio.run(EmbeddedRuntime(tmp_path / "run").run([s]))
    t = summary.tenants["sft"]
    assert t.sft_heldout_error_initial is not None and t.sft_heldout_error_final is not None
    print(
        f"SFT held-out |a - a*|: {t.sft_heldout_error_initial:.4f} -> "
        f"{t.sft_heldout_error_final:.4f} after {t.final_version} updates"
    )
    assert t.sft_heldout_error_final <= 0.5 * t.sft_heldout_error_initial
