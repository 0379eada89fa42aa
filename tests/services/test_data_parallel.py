"""Data-parallel training role: k gloo ranks train exactly what one process trains.

Two local processes (``torch.multiprocessing`` spawn) join one gloo group on 127.0.0.1;
each holds a :class:`DataParallelTrainingService` with the same tenants and the same
partitions and trains the same grouped jobs. Per tenant, every step's loss and the
final weights must equal the single-process Training Model Service's.
"""

from __future__ import annotations

import asyncio
import itertools
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.multiprocessing as mp

from joynexus.bench.server_procs import free_port
from joynexus.control.job import TaskType
from joynexus.models.backbone import ResidentBaseModel
from joynexus.models.batch import ObservationBatch
from joynexus.queues.training import TrainingQueue
from joynexus.services.data_parallel import (
    DataParallelTrainingService,
    RankGroup,
    loss_share,
    row_range,
)
from joynexus.services.job_plan import Microbatch
from joynexus.services.training import TrainingModelService
from tests.services.test_training_service import SCHEMA, config, make_job, put_rl, put_sft

# Padded chunk steps that differ per row, so the masked SFT loss weighs rows unevenly.
PAD = np.zeros((8, SCHEMA.action_chunk), bool)
PAD[1, 2:] = PAD[5, 1:] = PAD[6, 3:] = True


def test_rows_are_split_contiguously_and_completely() -> None:
    for rows in range(0, 9):
        for world in (1, 2, 3):
            parts = [row_range(rows, r, world) for r in range(world)]
            assert parts[0][0] == 0 and parts[-1][1] == rows
            assert all(a[1] == b[0] for a, b in itertools.pairwise(parts))
            sizes = [hi - lo for lo, hi in parts]
            assert max(sizes) - min(sizes) <= 1


def test_a_masked_sft_loss_weighs_rows_by_their_unpadded_steps() -> None:
    batch = ObservationBatch.synthetic(SCHEMA, 8, seed=0)
    item = Microbatch("sft", config("a", Path(".")), None, batch, {"action_is_pad": PAD})  # type: ignore[arg-type]
    valid = (~PAD).sum()
    assert loss_share(item, 0, 4) == pytest.approx((~PAD[:4]).sum() / valid)
    assert loss_share(item, 0, 4) + loss_share(item, 4, 8) == pytest.approx(1.0)
    rl = Microbatch("ppo", item.config, None, batch, {"action_is_pad": PAD})  # type: ignore[arg-type]
    assert loss_share(rl, 0, 3) == pytest.approx(3 / 8)


async def _train(svc: TrainingModelService, out: Path) -> dict[str, Any]:
    sig = (await svc.add_tenant(config("s", out))).schema_signature
    await svc.add_tenant(config("r", out, algo="grpo", mb=3))
    put_sft(svc.queue, "ps", "s", sig, 8, action_is_pad=PAD)
    put_rl(svc.queue, "pr", "r", sig, 9)
    jobs = [
        make_job("s", "ps", 8, sig, job_id="js"),
        make_job("r", "pr", 9, sig, TaskType.RL, "jr"),
    ]
    results = await svc.train_jobs(jobs)
    return {
        "losses": {r.tenant_id: r.losses for r in results},
        "versions": {r.tenant_id: r.policy_version for r in results},
        "weights": {
            t: {n: p.detach().clone() for n, p in svc.slot(t).named_parameters()}
            for t in ("s", "r")
        },
    }


def _rank_main(rank: int, world: int, port: int, model_dir: str, out: str) -> None:
    torch.set_num_threads(1)
    base = ResidentBaseModel.from_pretrained(model_dir)
    ranks = RankGroup(rank, world, f"tcp://127.0.0.1:{port}", timeout_s=120)
    svc = DataParallelTrainingService(base, TrainingQueue(), output_dir=Path(out), ranks=ranks)
    result = asyncio.run(_train(svc, Path(out)))
    torch.save(result, Path(out) / f"rank{rank}.pt")
    torch.distributed.destroy_process_group()


@pytest.mark.slow
def test_two_gloo_ranks_train_the_same_losses_and_weights_as_one_process(
    tiny_model_dir: Any, tmp_path: Path
) -> None:
    model_dir = str(tiny_model_dir("qwen2_5_vl"))
    reference = asyncio.run(
        _train(
            TrainingModelService(
                ResidentBaseModel.from_pretrained(model_dir), TrainingQueue(), output_dir=tmp_path
            ),
            tmp_path,
        )
    )
    mp.start_processes(
        _rank_main,
        args=(2, free_port(), model_dir, str(tmp_path)),
        nprocs=2,
        join=True,
        start_method="spawn",
    )
    for rank in (0, 1):
        got = torch.load(tmp_path / f"rank{rank}.pt")
        assert got["versions"] == reference["versions"] == {"s": 2, "r": 3}
        for tenant in ("s", "r"):
            np.testing.assert_allclose(
                got["losses"][tenant], reference["losses"][tenant], rtol=1e-5, atol=1e-7
            )
            for name, ref in reference["weights"][tenant].items():
                torch.testing.assert_close(
                    got["weights"][tenant][name], ref, rtol=1e-5, atol=1e-6, msg=name
                )
