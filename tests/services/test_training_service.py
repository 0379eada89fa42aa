"""Training Model Service: train_job (SFT / PPO / GRPO / REINFORCE), grouping, checkpoints."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from joynexus.control.job import JobState, JobTimestamps, TaskType, TrainingJob
from joynexus.errors import (
    InvalidRequestError,
    PermissionDeniedError,
    SchemaMismatchError,
    StaleLeaseError,
)
from joynexus.models.backbone import ResidentBaseModel
from joynexus.models.batch import ObservationBatch
from joynexus.models.policies import FlowMatchingHeadConfig, OFTHeadConfig
from joynexus.models.schema import CameraSpec, DataSchema
from joynexus.models.tenant.slots import OptimizerConfig
from joynexus.queues.meta import SampleMeta
from joynexus.queues.training import TrainingQueue
from joynexus.services.samples import camera_field, instructions_array
from joynexus.services.tenancy import TenantConfig
from joynexus.services.training import TrainBatch, TrainingModelService
from joynexus.spec.workload import AlgorithmSpec

SCHEMA = DataSchema(
    name="tiny",
    cameras={"cam": CameraSpec(height=32, width=32)},
    state_dim=3,
    action_dim=2,
    action_chunk=4,
    instruction="push the block",
)
OTHER = SCHEMA.model_copy(update={"action_dim": 3})
OFT = OFTHeadConfig(hidden_dim=32, num_blocks=1)
FM = FlowMatchingHeadConfig(hidden_dim=32, num_layers=1, num_heads=2, num_inference_steps=2)


def config(
    tid: str,
    out: Path,
    *,
    algo: str = "sft",
    value_head: bool = False,
    head: OFTHeadConfig | FlowMatchingHeadConfig = OFT,
    mb: int = 4,
    epochs: int = 1,
    schema: DataSchema = SCHEMA,
    lr: float = 1e-3,
) -> TenantConfig:
    return TenantConfig(
        tenant_id=tid,
        schema_=schema,
        head=head,
        optimizer=OptimizerConfig(lr=lr),
        value_head=value_head,
        algorithm=AlgorithmSpec(name=algo, microbatch_size=mb, epochs=epochs),  # type: ignore[arg-type]
        seed=7,
        output_dir=out,
    )


def make_job(
    tid: str, pid: str, n: int, sig: str, task: TaskType = TaskType.SFT, job_id: str = "job-1"
) -> TrainingJob:
    return TrainingJob(
        job_id=job_id,
        policy_key=f"{tid}/{task}",
        tenant_id=tid,
        task_type=task,
        partition_id=pid,
        sample_count=n,
        domain="d",
        metadata={"schema_signature": sig},
        created_seq=1,
        producer_role="producer",
        consumer_role="actor",
        state=JobState.LEASED,
        timestamps=JobTimestamps(created_at=0.0, updated_at=0.0),
    )


def obs_columns(schema: DataSchema, n: int, seed: int) -> dict[str, np.ndarray]:
    batch = ObservationBatch.synthetic(schema, n, seed=seed)
    assert batch.actions is not None
    cols = {camera_field(c): batch.cameras[c] for c in schema.camera_names}
    cols["state"] = batch.state
    cols["instruction"] = instructions_array(batch.instructions)
    cols["actions"] = batch.actions
    return cols


def put_sft(
    queue: TrainingQueue, pid: str, tid: str, sig: str, n: int, seed: int = 0, **extra: np.ndarray
) -> None:
    cols = obs_columns(SCHEMA, n, seed)
    cols["action_is_pad"] = np.zeros((n, SCHEMA.action_chunk), bool)
    cols.update(extra)
    queue.queue_put(pid, cols, SampleMeta(tenant_id=tid, schema_signature=sig))


def put_rl(queue: TrainingQueue, pid: str, tid: str, sig: str, n: int, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    cols = obs_columns(SCHEMA, n, seed)
    cols["log_probs"] = rng.normal(-2.0, 0.5, n).astype(np.float32)
    cols["advantages"] = rng.standard_normal(n).astype(np.float32)
    cols["returns"] = rng.standard_normal(n).astype(np.float32)
    queue.queue_put(
        pid, cols, SampleMeta(tenant_id=tid, schema_signature=sig, behavior_policy_version=0)
    )


def service(base: ResidentBaseModel, tmp_path: Path, queue: TrainingQueue | None = None) -> Any:
    return TrainingModelService(base, queue or TrainingQueue(), output_dir=tmp_path)


def test_sft_train_job_lowers_loss_and_bumps_version_per_microbatch(
    base: ResidentBaseModel, tmp_path: Path
) -> None:
    async def main() -> None:
        svc = service(base, tmp_path)
        info = await svc.add_tenant(config("a", tmp_path, lr=3e-3))
        put_sft(svc.queue, "p", "a", info.schema_signature, 8)
        job = make_job("a", "p", 8, info.schema_signature)
        beats: list[int] = []
        # 10 jobs: the OFT output layer starts near zero (RL-friendly), so the first loss
        # is already the zero predictor's and memorising the random targets takes longer.
        results = [await svc.train_job(job, heartbeat=lambda: beats.append(1)) for _ in range(10)]
        assert [r.num_microbatches for r in results] == [2] * 10
        assert results[-1].policy_version == 20 == svc.policy_version("a")
        assert len(beats) == 20
        first, last = np.mean(results[0].losses), np.mean(results[-1].losses)
        assert last < 0.7 * first

    asyncio.run(main())


def test_sft_masks_padded_action_steps(base: ResidentBaseModel, tmp_path: Path) -> None:
    async def main() -> None:
        svc = service(base, tmp_path)
        info = await svc.add_tenant(config("a", tmp_path))
        await svc.add_tenant(config("b", tmp_path))
        pad = np.zeros((4, SCHEMA.action_chunk), bool)
        pad[:, 2:] = True
        clean = obs_columns(SCHEMA, 4, 0)["actions"]
        garbage = clean.copy()
        garbage[:, 2:] = 1e3
        sig = info.schema_signature
        put_sft(svc.queue, "pa", "a", sig, 4, action_is_pad=pad, actions=clean)
        put_sft(svc.queue, "pb", "b", sig, 4, action_is_pad=pad, actions=garbage)
        ra = await svc.train_job(make_job("a", "pa", 4, sig))
        rb = await svc.train_job(make_job("b", "pb", 4, sig))
        assert ra.losses[0] == pytest.approx(rb.losses[0], rel=1e-6)
        assert rb.losses[0] < 10.0

    asyncio.run(main())


def test_ppo_train_job_with_critic_steps_once_per_microbatch(
    base: ResidentBaseModel, tmp_path: Path
) -> None:
    async def main() -> None:
        svc = service(base, tmp_path)
        info = await svc.add_tenant(
            config("a", tmp_path, algo="ppo", value_head=True, mb=4, epochs=2)
        )
        put_rl(svc.queue, "p", "a", info.schema_signature, 10)
        before = {n: p.detach().clone() for n, p in svc.slot("a").named_parameters()}
        res = await svc.train_job(make_job("a", "p", 10, info.schema_signature, TaskType.RL))
        assert res.num_microbatches == 6 and res.num_samples == 20
        assert res.policy_version == 6
        assert {"value_loss", "clip_fraction", "approx_kl", "entropy"} <= set(res.metrics)
        assert all(np.isfinite(res.losses))
        after = dict(svc.slot("a").named_parameters())
        assert not torch.equal(before["value_head.out.weight"], after["value_head.out.weight"])
        assert not torch.equal(before["action_module.log_std"], after["action_module.log_std"])

    asyncio.run(main())


@pytest.mark.parametrize("algo", ["grpo", "reinforce"])
def test_critic_free_rl_variants_update_the_policy(
    base: ResidentBaseModel, tmp_path: Path, algo: str
) -> None:
    async def main() -> None:
        svc = service(base, tmp_path)
        info = await svc.add_tenant(config("a", tmp_path, algo=algo, mb=8))
        put_rl(svc.queue, "p", "a", info.schema_signature, 8)
        before = svc.slot("a").action_module.out_proj.weight.detach().clone()
        res = await svc.train_job(make_job("a", "p", 8, info.schema_signature, TaskType.RL))
        assert res.policy_version == 1 and "value_loss" not in res.metrics
        assert not torch.equal(before, svc.slot("a").action_module.out_proj.weight)

    asyncio.run(main())


def test_flow_matching_heads_train_sft_and_rl_from_recorded_chains(
    base: ResidentBaseModel, tmp_path: Path
) -> None:
    async def main() -> None:
        svc = service(base, tmp_path)
        info = await svc.add_tenant(config("fm", tmp_path, head=FM))
        await svc.add_tenant(config("fmrl", tmp_path, head=FM, algo="ppo", value_head=True))
        sig = info.schema_signature
        put_sft(svc.queue, "p", "fm", sig, 4)
        assert (await svc.train_job(make_job("fm", "p", 4, sig))).policy_version == 1
        # RL samples as a rollout writes them: the behaviour policy's own chains.
        slot = svc.slot("fmrl")
        batch = ObservationBatch.synthetic(SCHEMA, 4, seed=0)
        features = svc._executor.shared_forward({"fmrl": batch})["fmrl"]
        drawn = slot.sample(
            features, torch.from_numpy(batch.state), generator=torch.Generator().manual_seed(0)
        )
        assert drawn.log_probs is not None and drawn.chain is not None
        put_rl(svc.queue, "r", "fmrl", sig, 4)
        meta = svc.queue.get_meta("r", ["actions"], 4, "overwrite")
        svc.queue.put(
            {
                "actions": drawn.actions.numpy(),
                "log_probs": drawn.log_probs.numpy(),
                "flow_chain": drawn.chain.numpy(),
            },
            meta,
        )
        job = make_job("fmrl", "r", 4, sig, TaskType.RL)
        # The actor's recomputation at the behaviour weights: importance ratio 1.
        await svc.actor_forward(job)
        got = svc.queue.get_data(svc.queue.get_meta("r", ["actor_log_probs"], 4, "check"))
        ratio = np.exp(np.asarray(got["actor_log_probs"]) - drawn.log_probs.numpy())
        np.testing.assert_allclose(ratio, 1.0, atol=1e-4)
        res = await svc.train_job(job)
        assert res.policy_version == 1 and "value_loss" in res.metrics
        # Samples without their chains cannot be trained on a flow head.
        put_rl(svc.queue, "bare", "fmrl", sig, 4)
        with pytest.raises(InvalidRequestError, match="flow_chain"):
            await svc.train_job(make_job("fmrl", "bare", 4, sig, TaskType.RL, job_id="job-2"))
        assert svc.policy_version("fmrl") == 1

    asyncio.run(main())


def test_annotations_of_every_sample_are_checked(base: ResidentBaseModel, tmp_path: Path) -> None:
    async def main() -> None:
        svc = service(base, tmp_path)
        info = await svc.add_tenant(config("a", tmp_path))
        sig = info.schema_signature
        put_sft(svc.queue, "p", "a", sig, 3)
        put_sft(svc.queue, "p", "intruder", sig, 1, seed=1)
        with pytest.raises(PermissionDeniedError, match=r"job 'job-1': sample 3 .*'intruder'"):
            await svc.train_job(make_job("a", "p", 4, sig))
        put_sft(svc.queue, "q", "a", "sig-other", 2)
        with pytest.raises(SchemaMismatchError, match=r"job 'job-1': sample 0"):
            await svc.train_job(make_job("a", "q", 2, sig))
        with pytest.raises(SchemaMismatchError, match="declares schema signature"):
            await svc.train_job(make_job("a", "p", 3, "sig-other"))
        assert svc.policy_version("a") == 0

    asyncio.run(main())


def test_train_jobs_share_forwards_and_equal_serial_training(
    base: ResidentBaseModel, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rows: list[int] = []
    encode = base.encode

    def counting(feature: Any) -> Any:
        out = encode(feature)
        rows.append(int(out.hidden_states.shape[0]))
        return out

    monkeypatch.setattr(base, "encode", counting)

    async def run(grouped: bool) -> list[list[float]]:
        svc = service(base, tmp_path / str(grouped))
        sig = (await svc.add_tenant(config("s", tmp_path))).schema_signature
        await svc.add_tenant(config("r", tmp_path, algo="ppo", value_head=True, mb=3))
        put_sft(svc.queue, "ps", "s", sig, 8)
        put_rl(svc.queue, "pr", "r", sig, 9)
        jobs = [
            make_job("s", "ps", 8, sig, job_id="js"),
            make_job("r", "pr", 9, sig, TaskType.RL, "jr"),
        ]
        if grouped:
            results = await svc.train_jobs(jobs)
        else:
            results = [await svc.train_job(j) for j in jobs]
        assert [r.policy_version for r in results] == [2, 3]
        return [r.losses for r in results]

    grouped = asyncio.run(run(True))
    assert rows == [7, 7, 3]  # 4 SFT + 3 RL rows per shared forward; then RL alone
    rows.clear()
    serial = asyncio.run(run(False))
    assert rows == [4, 4, 3, 3, 3]
    for g, s in zip(grouped, serial, strict=True):
        np.testing.assert_allclose(g, s, rtol=1e-5, atol=1e-6)


def test_export_params_holds_only_the_tenant_modules(
    base: ResidentBaseModel, tmp_path: Path
) -> None:
    async def main() -> None:
        svc = service(base, tmp_path)
        await svc.add_tenant(config("a", tmp_path, algo="ppo", value_head=True))
        payload = await svc.export_params("a")
        assert payload.tenant_id == "a" and payload.policy_version == 0
        assert payload.named_tensors
        assert all(n.startswith(("action_module.", "value_head.")) for n in payload.named_tensors)
        base_numel = sum(p.numel() for p in base.model.parameters())
        assert sum(t.numel() for t in payload.named_tensors.values()) < base_numel
        base_ptrs = {p.data_ptr() for p in base.model.parameters()}
        assert not base_ptrs & {t.data_ptr() for t in payload.named_tensors.values()}

    asyncio.run(main())


def test_train_batch_custom_algorithm(base: ResidentBaseModel, tmp_path: Path) -> None:
    async def main() -> None:
        svc = service(base, tmp_path)
        await svc.add_tenant(config("a", tmp_path, algo="ppo"))
        obs = ObservationBatch.synthetic(SCHEMA, 3, seed=2)
        res = await svc.train_batch(
            "a",
            TrainBatch(
                observations=obs,
                loss="reinforce",
                advantages=np.array([1.0, -1.0, 0.5], np.float32),
            ),
        )
        assert res.policy_version == 1 and np.isfinite(res.loss)
        with pytest.raises(InvalidRequestError, match="advantages"):
            await svc.train_batch("a", TrainBatch(observations=obs, loss="ppo"))

    asyncio.run(main())


def test_train_batch_checks_every_field_against_the_batch(
    base: ResidentBaseModel, tmp_path: Path
) -> None:
    async def main() -> None:
        svc = service(base, tmp_path)
        await svc.add_tenant(config("a", tmp_path, algo="ppo", value_head=True))
        obs = ObservationBatch.synthetic(SCHEMA, 1, seed=2)
        one = np.zeros(1, np.float32)
        before = {k: v.clone() for k, v in svc.slot("a").state_tensors().items()}
        cases: list[tuple[TrainBatch, type[Exception], str]] = [
            # The reproducer: advantages [7] for a batch of 1 stepped the optimizer.
            (
                TrainBatch(obs, "ppo", advantages=np.ones(7, np.float32), old_log_probs=one),
                SchemaMismatchError,
                r"advantages: expected shape float32 \[B\] = \[1\].*got \[7\]",
            ),
            (
                TrainBatch(obs, "ppo", advantages=one, old_log_probs=np.zeros((1, 4), np.float32)),
                SchemaMismatchError,
                r"old_log_probs: expected shape float32 \[B\] = \[1\]",
            ),
            (
                TrainBatch(obs, "ppo", advantages=one, old_log_probs=one, returns=np.ones(2)),
                SchemaMismatchError,
                r"returns: expected shape float32 \[B\] = \[1\]",
            ),
            (
                TrainBatch(obs, "ppo", advantages=one),
                InvalidRequestError,
                "loss 'ppo' needs old_log_probs",
            ),
            (
                TrainBatch(
                    obs, "ppo", advantages=np.full(1, np.nan, np.float32), old_log_probs=one
                ),
                InvalidRequestError,
                "advantages: contains NaN",
            ),
            (
                TrainBatch(obs, "sft", action_is_pad=np.zeros((1, 3), bool)),
                SchemaMismatchError,
                r"action_is_pad: expected shape bool \[B, chunk\] = \[1, 4\]",
            ),
            (
                TrainBatch(obs, "sft", advantages=np.ones(7, np.float32)),  # unused, still checked
                SchemaMismatchError,
                "advantages",
            ),
        ]
        for batch, error, message in cases:
            with pytest.raises(error, match=message):
                await svc.train_batch("a", batch)
        assert svc.policy_version("a") == 0  # the optimizer never stepped
        after = svc.slot("a").state_tensors()
        assert all(torch.equal(before[k], after[k]) for k in before)
        res = await svc.train_batch("a", TrainBatch(obs, "ppo", advantages=one, old_log_probs=one))
        assert res.policy_version == 1

    asyncio.run(main())


def test_actor_forward_log_probs_replace_behaviour_log_probs(
    base: ResidentBaseModel, tmp_path: Path
) -> None:
    async def main() -> None:
        svc = service(base, tmp_path)
        info = await svc.add_tenant(config("a", tmp_path, algo="ppo", value_head=True, mb=6))
        put_rl(svc.queue, "p", "a", info.schema_signature, 6)  # log_probs far from the actor
        job = make_job("a", "p", 6, info.schema_signature, TaskType.RL)
        await svc.actor_forward(job)
        assert {"actor_log_probs", "actor_values"} <= set(svc.queue.info("p").fields)
        res = await svc.train_job(job)
        # One microbatch under the unchanged actor: the ratio is exactly 1.
        assert res.metrics["approx_kl"] == pytest.approx(0.0, abs=1e-6)
        assert res.metrics["clip_fraction"] == 0.0

    asyncio.run(main())


def test_resume_from_checkpoint_reproduces_next_losses(
    base: ResidentBaseModel, tmp_path: Path
) -> None:
    async def losses(svc: Any, sig: str, first: int, count: int) -> list[float]:
        out: list[float] = []
        for j in range(first, first + count):
            pid = f"p{j}"
            put_sft(svc.queue, pid, "fm", sig, 4, seed=j)
            out += (await svc.train_job(make_job("fm", pid, 4, sig, job_id=f"j{j}"))).losses
        return out

    async def main() -> None:
        cfg = config("fm", tmp_path / "ckpt", head=FM, mb=2)
        straight = service(base, tmp_path / "a")
        sig = (await straight.add_tenant(cfg)).schema_signature
        full = await losses(straight, sig, 0, 4)

        first = service(base, tmp_path / "b")
        await first.add_tenant(cfg)
        head = await losses(first, sig, 0, 2)
        (path,) = await first.save(step=2)
        assert path == tmp_path / "ckpt" / "fm" / "step_2"
        assert (path / "manifest.json").is_file() and (path / "optimizer.safetensors").is_file()

        resumed = service(base, tmp_path / "c")
        await resumed.add_tenant(cfg)
        assert await resumed.restore("fm") == 4
        tail = await losses(resumed, sig, 2, 2)
        np.testing.assert_allclose(head + tail, full, rtol=0, atol=1e-6)

    asyncio.run(main())


def test_a_job_whose_step_fails_leaves_the_group_the_others_go_on(
    base: ResidentBaseModel, tmp_path: Path
) -> None:
    async def main() -> None:
        svc = service(base, tmp_path)
        step = svc._grouped_step
        seen: list[list[str]] = []

        def failing_a(items: Any, isolate: bool = False) -> Any:
            seen.append([it.slot.tenant_id for it in items])
            outcomes = step(items, isolate)
            return [
                ValueError("a broke") if it.slot.tenant_id == "a" else out
                for it, out in zip(items, outcomes, strict=True)
            ]

        svc._grouped_step = failing_a
        sig = (await svc.add_tenant(config("a", tmp_path))).schema_signature
        await svc.add_tenant(config("b", tmp_path))
        put_sft(svc.queue, "pa", "a", sig, 12)
        put_sft(svc.queue, "pb", "b", sig, 12, seed=1)
        jobs = [
            make_job("a", "pa", 12, sig, job_id="ja"),
            make_job("b", "pb", 12, sig, job_id="jb"),
        ]
        a, b = await svc.train_jobs_isolated(jobs)
        assert isinstance(a, ValueError) and str(a) == "a broke"
        assert not isinstance(b, Exception) and b.num_microbatches == 3
        assert seen == [["a", "b"], ["b"], ["b"]]

    asyncio.run(main())


def test_a_waves_steps_run_in_one_thread_reading_ahead(
    base: ResidentBaseModel, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from joynexus.services import wave

    read = wave.read_microbatch
    read_done = {k: threading.Event() for k in range(3)}
    overlapped: list[bool] = []
    threads: set[int] = set()

    async def reading(queue: Any, plan: Any, k: int) -> Any:
        out = await read(queue, plan, k)
        read_done[k].set()
        return out

    monkeypatch.setattr(wave, "read_microbatch", reading)

    async def main() -> None:
        svc = service(base, tmp_path)
        step = svc._grouped_step

        def stepping(items: Any, isolate: bool = False) -> Any:
            threads.add(threading.get_ident())
            k = len(overlapped)
            # The read of microbatch k + 1 finishes while step k runs.
            overlapped.append(read_done[k + 1].wait(timeout=30) if k + 1 in read_done else True)
            return step(items, isolate)

        svc._grouped_step = stepping
        sig = (await svc.add_tenant(config("a", tmp_path))).schema_signature
        put_sft(svc.queue, "p", "a", sig, 12)
        beats: list[int] = []
        result = await svc.train_job(make_job("a", "p", 12, sig), heartbeat=lambda: beats.append(1))
        assert result.num_microbatches == 3 and result.policy_version == 3
        assert beats == [1, 1, 1]

    asyncio.run(main())
    assert overlapped == [True, True, True]
    assert len(threads) == 1 and threading.get_ident() not in threads


def test_a_lost_lease_stops_the_job_one_step_later(base: ResidentBaseModel, tmp_path: Path) -> None:
    async def main() -> None:
        svc = service(base, tmp_path)
        sig = (await svc.add_tenant(config("a", tmp_path))).schema_signature
        put_sft(svc.queue, "p", "a", sig, 16)
        beats: list[int] = []

        def beat() -> None:
            beats.append(1)
            if len(beats) == 2:
                raise StaleLeaseError("lease lost")

        with pytest.raises(StaleLeaseError, match="lease lost"):
            await svc.train_job(make_job("a", "p", 16, sig), heartbeat=beat)
        # Step 2's beat runs on the loop while step 3 runs; step 4 never starts.
        assert svc.policy_version("a") == 3 and len(beats) == 2

    asyncio.run(main())


def test_a_cancelled_job_stops_after_the_running_step(
    base: ResidentBaseModel, tmp_path: Path
) -> None:
    entered, release = threading.Event(), threading.Event()
    calls: list[int] = []
    versions: list[int] = []

    async def main() -> None:
        svc = service(base, tmp_path)
        step = svc._grouped_step

        def stepping(items: Any, isolate: bool = False) -> Any:
            calls.append(1)
            if len(calls) == 2:
                entered.set()
                release.wait(30)
            out = step(items, isolate)
            versions.append(svc.policy_version("a"))
            return out

        svc._grouped_step = stepping
        sig = (await svc.add_tenant(config("a", tmp_path))).schema_signature
        put_sft(svc.queue, "p", "a", sig, 16)
        task = asyncio.create_task(svc.train_job(make_job("a", "p", 16, sig)))
        assert await asyncio.to_thread(entered.wait, 30)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        release.set()

    # asyncio.run returns once the worker threads have finished.
    asyncio.run(main())
    assert len(calls) == 2 and versions == [1, 2]
