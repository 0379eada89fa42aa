"""The backbone lock is held for torch work only: checkpoint files are written outside it.

A checkpoint snapshots its tensors under the lock and writes them after releasing it,
so a predict issued while a checkpoint is being written waits at most for one training
step. The second test measures how long the lock is held per completed job (train,
checkpoint, publish), the figure docs/ARCHITECTURE.md quotes.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from joynexus.models.backbone import ResidentBaseModel
from joynexus.models.batch import ObservationBatch
from joynexus.models.checkpoints import payload as payload_module
from joynexus.queues.training import TrainingQueue
from joynexus.services import tenancy
from joynexus.services.environment import EnvironmentService
from joynexus.services.inference import InferenceModelService
from joynexus.services.training import TrainingModelService
from tests.services.test_training_service import SCHEMA, config, make_job, put_sft


class TimedRLock:
    """A re-entrant lock that adds up how long it was held (outermost acquisitions)."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._depth = 0
        self._since = 0.0
        self.held_s = 0.0

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        got = self._lock.acquire(blocking, timeout)
        if got:
            self._depth += 1
            if self._depth == 1:
                self._since = time.perf_counter()
        return got

    def release(self) -> None:
        self._depth -= 1
        if self._depth == 0:
            self.held_s += time.perf_counter() - self._since
        self._lock.release()

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()

    @contextmanager
    def priority(self) -> Iterator[TimedRLock]:
        """A priority acquisition (a publication, a predict batch): timed the same."""
        with self:
            yield self


def _services(base: ResidentBaseModel, tmp_path: Path) -> tuple[Any, InferenceModelService]:
    training = TrainingModelService(base, TrainingQueue(), output_dir=tmp_path)
    inference = InferenceModelService(base, EnvironmentService(), TrainingQueue())
    return training, inference


def test_predict_runs_while_a_checkpoint_is_being_written(
    base: ResidentBaseModel, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    entered, release = threading.Event(), threading.Event()
    write = payload_module.write_checkpoint

    def blocked_write(*args: Any, **kwargs: Any) -> Path:
        entered.set()
        # The writer stalls (a slow disk) until the predict below has been answered.
        assert release.wait(timeout=120), "the predict never finished"
        return write(*args, **kwargs)

    monkeypatch.setattr(payload_module, "write_checkpoint", blocked_write)

    async def main() -> None:
        training, inference = _services(base, tmp_path)
        cfg = config("writer", tmp_path / "ckpt")
        await training.add_tenant(cfg)
        await inference.add_tenant(config("reader", tmp_path / "serve"))
        obs = ObservationBatch.synthetic(SCHEMA, 1, seed=1, with_actions=False)
        async with inference:
            await inference.predict(obs, "reader")  # warm-up
            save = asyncio.create_task(training.save(step=1))
            assert await asyncio.to_thread(entered.wait, 120)
            try:
                # The writer holds no lock now: the predict gets the backbone at once.
                result = await asyncio.wait_for(inference.predict(obs, "reader"), timeout=120)
                assert not save.done()
                assert result.actions.shape == (1, SCHEMA.action_chunk, SCHEMA.action_dim)
            finally:
                release.set()
            (path,) = await save
        assert (path / "manifest.json").is_file()
        assert path == tmp_path / "ckpt" / "writer" / "step_1"

    asyncio.run(main())


def test_lock_hold_per_completed_job(
    base: ResidentBaseModel, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    timed = TimedRLock()
    monkeypatch.setitem(tenancy._BACKBONE_LOCKS, base, timed)
    jobs = 4

    async def main() -> dict[str, float]:
        training, inference = _services(base, tmp_path)
        cfg = config("t", tmp_path / "ckpt", mb=4)
        sig = (await training.add_tenant(cfg)).schema_signature
        await inference.add_tenant(cfg)
        phases = {"train": 0.0, "save": 0.0, "publish": 0.0}
        for j in range(jobs):
            put_sft(training.queue, f"p{j}", "t", sig, 8, seed=j)
            mark = timed.held_s
            await training.train_job(make_job("t", f"p{j}", 8, sig, job_id=f"j{j}"))
            phases["train"] += timed.held_s - mark
            mark = timed.held_s
            await training.save(step=training.policy_version("t"))
            phases["save"] += timed.held_s - mark
            mark = timed.held_s
            payload = await training.export_params("t")
            await inference.load_weights("t", payload.policy_version, payload.named_tensors)
            phases["publish"] += timed.held_s - mark
        return {k: v / jobs * 1e3 for k, v in phases.items()}

    per_job_ms = asyncio.run(main())
    total = sum(per_job_ms.values())
    print(
        f"\nbackbone lock held per completed job: {total:.2f} ms "
        + " ".join(f"{k}={v:.2f}ms" for k, v in per_job_ms.items())
    )
    assert per_job_ms["train"] > 0
