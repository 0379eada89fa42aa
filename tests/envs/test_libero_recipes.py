"""The shipped LIBERO recipes: learning from the camera, and the suite evaluation after it.

The learning runs themselves are measured in docs/results/notes/libero.md, not here;
these tests hold the recipes to what the measurements rest on: the camera and the
robot's own state only, the head's own image encoder, evaluation seeds apart from the
demonstrations, and a suite evaluation whose policy is the recipe's checkpoint.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from typer.testing import CliRunner

from joynexus.cli.main import app
from joynexus.envs.base import EnvSpec
from joynexus.envs.registry import env_schema
from joynexus.envs.seeds import demo_seeds, eval_seeds, shared_seeds
from joynexus.errors import SpecError
from joynexus.spec.workload import WorkloadSpec, load_specs

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("libero") is None, reason="hf-libero is not installed"
)

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "workloads"
LEARN = EXAMPLES / "learn-libero.yaml"
SUITE = EXAMPLES / "eval-libero-suite.yaml"
RL = EXAMPLES / "rl-libero-from-sft.yaml"


def _by_tenant(path: Path) -> dict[str, WorkloadSpec]:
    return {s.tenant: s for s in load_specs(path)}


def test_the_learning_recipe_passes_spec_check() -> None:
    result = CliRunner().invoke(app, ["spec", "check", str(LEARN)])
    assert result.exit_code == 0, result.output
    assert "ok libero-goal-stove: sft" in result.output
    assert "ok libero-goal-cabinet: sft" in result.output


def test_the_learning_recipe_learns_from_the_camera_on_two_tasks_of_one_suite() -> None:
    specs = list(_by_tenant(LEARN).values())
    assert len(specs) >= 2
    suites = set()
    for spec in specs:
        env, ev, data = spec.env, spec.success_eval, spec.dataset
        assert env is not None and ev is not None and data is not None
        assert env.kind == "libero" and env.task is not None
        suites.add(env.task.split("/")[0])
        # The camera and the robot's own state; no object pose.
        assert env.observation.images and env.observation.state == "proprio"
        assert spec.action_module.image_encoder is not None  # type: ignore[union-attr]
        # Demonstrations recorded on first use, successes only; evaluation on other seeds.
        assert data.record_episodes is not None and not data.record_failures
        demos = demo_seeds(spec.seed, data.record_episodes)
        assert len(shared_seeds(demos, eval_seeds(ev.seed, ev.episodes))) == 0
        # The costly before-measurement is the smaller one, and it is taken.
        assert ev.initial and ev.initial_episodes is not None
        assert ev.initial_episodes < ev.episodes
    assert len(suites) == 1


def test_the_suite_evaluation_runs_the_recipes_policy_on_every_task() -> None:
    learned = _by_tenant(LEARN)["libero-goal-stove"]
    suite = _by_tenant(SUITE)
    policy, evaluation = suite["libero-goal-policy"], suite["libero-goal-suite"]
    # Its policy starts from the learning recipe's checkpoint, in the same interface.
    assert policy.init_from is not None
    assert Path(policy.init_from).parts[-2:] == ("libero-goal-stove", "step_300")
    assert learned.scheduling.completion_target == 300
    assert policy.env == learned.env
    assert policy.action_module == learned.action_module
    assert policy.base_model == learned.base_model
    # ... and the policy does not move: one job at a negligible learning rate.
    assert policy.scheduling.completion_target == 1 and policy.optimizer.lr <= 1e-8
    ev = evaluation.evaluation
    assert ev is not None and ev.targets == ["libero-goal-policy"]
    assert ev.tasks == ["libero_goal/*"] and ev.runs == 1
    # The same episodes on every task: LIBERO's fixed init states.
    assert evaluation.env is not None
    assert evaluation.env.options.get("init_state_index") == 0


def test_the_rl_recipe_starts_grpo_from_its_sft_tenants_checkpoint() -> None:
    result = CliRunner().invoke(app, ["spec", "check", str(RL)])
    assert result.exit_code == 0, result.output
    specs = _by_tenant(RL)
    sft, rl = specs["libero-stove-sft40"], specs["libero-stove-grpo"]
    assert sft.task == "sft" and rl.task == "rl" and rl.init_from == sft.tenant
    assert sft.env is not None and rl.env is not None and sft.dataset is not None
    # The same task and interface; only the number of sub-envs differs.
    assert rl.env.model_copy(update={"num_envs": sft.env.num_envs}) == sft.env
    assert rl.env.observation.images and rl.env.observation.state == "proprio"
    assert rl.base_model == sft.base_model
    # The SFT checkpoint is the one RL starts from: written at the last job.
    assert sft.scheduling.checkpoint_every == sft.scheduling.completion_target
    assert rl.algorithm.name == "grpo"
    # Before and after on the same episodes, never a demonstration's seed.
    ev = rl.success_eval
    assert ev is not None and ev.initial and ev.initial_episodes in (None, ev.episodes)
    assert sft.dataset.record_episodes is not None
    demos = demo_seeds(sft.seed, sft.dataset.record_episodes)
    assert len(shared_seeds(demos, eval_seeds(ev.seed, ev.episodes))) == 0


def test_libero_offers_proprio_state_and_refuses_privileged() -> None:
    task = "libero_goal/put_the_bowl_on_the_plate"
    default = env_schema(EnvSpec(kind="libero", task=task, image_size=16))
    proprio = env_schema(
        EnvSpec(kind="libero", task=task, image_size=16, observation={"state": "proprio"})
    )
    assert proprio.state_dim == default.state_dim == 8
    with pytest.raises(SpecError, match=r"offers observation.state \['default', 'proprio'\]"):
        env_schema(
            EnvSpec(kind="libero", task=task, image_size=16, observation={"state": "privileged"})
        )
