"""A workload's own recording keeps the same episodes ``joynexus data record`` does.

Regression: ``joynexus data record`` kept successful demonstrations only by default
while a spec's ``dataset.record_failures`` defaulted to true, so the same expert and
seeds gave different datasets depending on who recorded them.
"""

from __future__ import annotations

import inspect
from pathlib import Path

from joynexus.cli.data import record
from joynexus.data.record import record_episodes, record_missing_dataset
from joynexus.spec.workload import parse_spec


def _sft_spec(path: Path, **dataset: object) -> dict[str, object]:
    return {
        "tenant": "t",
        "task": "sft",
        "base_model": {"id": "tiny:qwen2_5_vl"},
        # 4 steps reach the goal only from the closest starts: some episodes fail.
        "env": {"kind": "reach2d", "image_size": 8, "max_episode_steps": 4},
        "dataset": {"path": str(path), "record_episodes": 8, **dataset},
    }


def test_defaults_agree_successful_episodes_only(tmp_path: Path) -> None:
    cli_default = inspect.signature(record).parameters["keep_failures"].default
    lib_default = inspect.signature(record_episodes).parameters["keep_failures"].default
    spec = parse_spec(_sft_spec(tmp_path / "own"))
    assert spec.dataset is not None
    assert spec.dataset.record_failures is False
    assert cli_default is False and lib_default is False

    own = record_missing_dataset(spec)
    assert 0 < own.successes < own.episodes == 8
    assert own.kept == own.successes  # the failed episodes were not written

    every = parse_spec(_sft_spec(tmp_path / "all", record_failures=True))
    assert record_missing_dataset(every).kept == 8
