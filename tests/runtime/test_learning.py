"""Learning proofs with fixed seeds (reach2d: the goal is in the state, see its docs)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from joynexus.envs import EnvSpec
from joynexus.master.run import LocalRun, run_workloads
from joynexus.services.environment import EnvironmentService
from joynexus.services.inference import InferenceModelService
from joynexus.services.training import TrainingModelService
from joynexus.spec.workload import load_specs
from tests.workflows.helpers import rl_spec, spec


def test_sft_on_recorded_demos_halves_heldout_action_error(
    tmp_path: Path, tiny_model: str, reach2d_demos: Path
) -> None:
    # reach2d demos recorded with its scripted expert (the MetaWorld case below runs the
    # shipped example, recording included).
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
            "seed": 0,
            "tracking": ["mlflow"],  # the spec's own tracker (not tensorboard)
        }
    )
    run_dir = tmp_path / "run"
    summary = asyncio.run(run_workloads([s], run_dir, tracking=["tensorboard"]))
    t = summary.tenants["sft"]
    assert t.state == "completed", t.errors
    assert t.sft_heldout_error_initial is not None and t.sft_heldout_error_final is not None
    print(
        f"SFT held-out |a - a*|: {t.sft_heldout_error_initial:.4f} -> "
        f"{t.sft_heldout_error_final:.4f} after {t.final_version} updates"
    )
    assert t.sft_heldout_error_final <= 0.5 * t.sft_heldout_error_initial
    _assert_tracked(run_dir, "sft")


def _assert_tracked(run_dir: Path, tenant: str) -> None:
    """The run wrote the tenant's curves to the spec's tracker (MLflow) and to the one
    ``--tracking`` added for everyone (TensorBoard). Regression: ``run_workloads``
    subscribed no tracker and a spec could not name one."""
    from mlflow.tracking import MlflowClient
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir / "tensorboard" / tenant))
    acc.Reload()
    assert acc.Tags()["scalars"], "no scalar reached TensorBoard"
    client = MlflowClient(tracking_uri=(run_dir / "mlruns").resolve().as_uri())
    experiment = client.get_experiment_by_name("joynexus")
    assert experiment is not None
    (run,) = client.search_runs([experiment.experiment_id])
    assert run.data.tags["tenant_id"] == tenant and run.data.metrics
    assert run.info.status == "FINISHED"  # closed with the run


def test_sft_on_recorded_metaworld_demos_halves_heldout_action_error(tmp_path: Path) -> None:
    # The shipped example as a user runs it: the dataset is missing, so the runtime records
    # MetaWorld reach-v3 demonstrations with the scripted expert first, then trains.
    example = Path(__file__).parents[2] / "examples" / "workloads" / "sft-metaworld.yaml"
    (loaded,) = load_specs(example)
    assert loaded.dataset is not None
    s = loaded.model_copy(
        update={
            "dataset": loaded.dataset.model_copy(update={"path": tmp_path / "data"}),
            "output_dir": tmp_path / "out",
        }
    )
    summary = asyncio.run(run_workloads([s], tmp_path / "run"))
    t = summary.tenants[s.tenant]
    assert t.state == "completed", t.errors
    assert (tmp_path / "data" / "meta" / "info.json").is_file()  # recorded as LeRobot v3.0
    assert t.sft_heldout_error_initial is not None and t.sft_heldout_error_final is not None
    print(
        f"MetaWorld SFT held-out |a - a*|: {t.sft_heldout_error_initial:.4f} -> "
        f"{t.sft_heldout_error_final:.4f} after {t.final_version} updates"
    )
    assert t.sft_heldout_error_final <= 0.5 * t.sft_heldout_error_initial


PPO_UPDATES = 8  # jobs (each: 8 envs x 30 steps, 4 epochs of 4 microbatches)
EVAL_SEED = 777
EVAL_EPISODES = 16


async def _evaluate_initial_and_final(training: TrainingModelService, tenant: str) -> list[float]:
    """Mean-action return of version 0 and of the trained version, on the same seeds."""
    env = EnvironmentService()
    inference = InferenceModelService(training.base, env, training.queue)
    returns: list[float] = []
    try:
        await inference.start()
        # Version 0 rebuilt from the tenant config is the run's initial policy (same seed).
        await inference.add_tenant(training.config(tenant))
        session = await env.create_session(
            tenant, EnvSpec(kind="reach2d", num_envs=EVAL_EPISODES, image_size=32)
        )
        for publish in (False, True):
            if publish:
                payload = await training.export_params(tenant)
                await inference.load_weights(tenant, payload.policy_version, payload.named_tensors)
            result = await inference.evaluate(
                tenant, session.session_id, episodes=EVAL_EPISODES, seed=EVAL_SEED
            )
            returns.append(result.mean_return)
    finally:
        await inference.stop()
        await env.aclose()
    return returns


def test_ppo_raises_reach2d_return(tmp_path: Path, tiny_model: str) -> None:
    """PPO through an in-process Master (producer, advantage stage, actor) learns reach2d.

    Margin: the deterministic (policy-mean) return on 16 fixed-seed episodes rises by at
    least 30 % of its initial magnitude within 8 PPO jobs; the rollouts' success rate
    rises too. ``init_log_std: 0`` gives exploration on the scale of the action range,
    as a policy trained from scratch needs.
    """
    s = rl_spec(
        "ppo",
        tiny_model,
        tmp_path / "out",
        target=PPO_UPDATES,
        num_envs=8,
        horizon=30,
        max_in_flight=1,
        extra_algo={"epochs": 4, "microbatch_size": 60, "gamma": 0.95, "gae_lambda": 0.9},
        optimizer={"lr": 1e-3},
        action_module={"type": "oft", "hidden_dim": 64, "num_blocks": 1, "init_log_std": 0.0},
        seed=0,
    )
    opened: list[LocalRun] = []
    summary = asyncio.run(run_workloads([s], tmp_path / "run", on_open=opened.append))
    t = summary.tenants["ppo"]
    assert t.state == "completed", t.errors
    assert t.jobs_completed == PPO_UPDATES and t.jobs_failed == 0 and t.jobs_dropped == 0
    (run,) = opened
    assert run.master is not None and run.plane is not None
    tenant = run.master.reporter.tenant_of(run.workload_ids["ppo"])
    assert tenant is not None
    rollouts = tenant.metrics.of_kind("rollout")
    # The run is closed, but the in-process Training Model Service still holds the
    # tenant's trained slot (a completed workload keeps it; only a cancel frees it).
    training = run.plane.training
    assert isinstance(training, TrainingModelService)
    initial, final = asyncio.run(_evaluate_initial_and_final(training, "ppo"))
    print(
        f"PPO reach2d: eval return {initial:.2f} -> {final:.2f} after {t.final_version} "
        f"updates ({PPO_UPDATES} jobs); rollout return {t.rl_return_initial:.2f} -> "
        f"{t.rl_return_final:.2f}; success {rollouts[0]['success_rate']:.2f} -> "
        f"{rollouts[-1]['success_rate']:.2f}; wall {summary.wall_s:.0f} s"
    )
    assert final >= initial + 0.3 * abs(initial)
    first = sum(r["success_rate"] for r in rollouts[:2]) / 2
    last = sum(r["success_rate"] for r in rollouts[-2:]) / 2
    assert last > first
