"""LoRA through the execution plane: a LoRA + head SFT tenant and a head-only tenant on
the same recorded demonstrations, in one run (grouped steps, one mixed-adapter forward)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from joynexus.master.run import run_workloads
from tests.workflows.helpers import spec


def _sft(tenant: str, model: str, demos: Path, out: Path, **head: Any) -> Any:
    return spec(
        {
            "tenant": tenant,
            "task": "sft",
            "base_model": {"id": model},
            "dataset": {"path": str(demos), "heldout_fraction": 0.2},
            "action_module": {"type": "oft", "hidden_dim": 64, "num_blocks": 1, **head},
            "optimizer": {"lr": 0.001},
            "algorithm": {"name": "sft", "samples_per_job": 64, "microbatch_size": 32},
            "scheduling": {"completion_target": 20, "prefetch": 2, "checkpoint_every": 20},
            "output_dir": str(out),
            "seed": 0,
        }
    )


def test_lora_and_head_only_sft_learn_side_by_side(
    tmp_path: Path, tiny_model: str, reach2d_demos: Path
) -> None:
    specs = [
        _sft("head", tiny_model, reach2d_demos, tmp_path / "out"),
        _sft("lora", tiny_model, reach2d_demos, tmp_path / "out", lora={"rank": 8}),
    ]
    summary = asyncio.run(run_workloads(specs, tmp_path / "run"))
    errors = {}
    for tid in ("head", "lora"):
        t = summary.tenants[tid]
        assert t.state == "completed", t.errors
        assert t.sft_heldout_error_initial is not None and t.sft_heldout_error_final is not None
        errors[tid] = (t.sft_heldout_error_initial, t.sft_heldout_error_final)
        assert t.sft_heldout_error_final <= 0.5 * t.sft_heldout_error_initial, tid
    print(f"reach2d SFT held-out |a - a*| initial -> final: {errors}")
    # The LoRA tenant's checkpoint holds its adapter in PEFT format, next to the head.
    ckpts = sorted((tmp_path / "run").rglob("adapter_config.json"))
    assert ckpts and all("lora" in str(p) for p in ckpts)
    assert all((p.parent / "action_module.safetensors").is_file() for p in ckpts)
