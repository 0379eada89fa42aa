from pathlib import Path

import pytest

from joynexus.errors import SpecError
from joynexus.spec.workload import TaskKind, load_specs, parse_spec, spec_json_schema

BASE = {"id": "models/tiny-qwen"}


def rl_spec(**over: object) -> dict[str, object]:
    spec: dict[str, object] = {
        "tenant": "alice",
        "task": "rl",
        "base_model": BASE,
        "env": {"kind": "pusht", "num_envs": 2, "image_size": 32},
        "algorithm": {"name": "ppo", "horizon": 16},
    }
    spec.update(over)
    return spec


def test_rl_spec_defaults_and_value_head() -> None:
    spec = parse_spec(rl_spec())
    assert spec.task is TaskKind.RL
    assert spec.uses_value_head  # PPO trains a critic by default
    assert spec.scheduling.max_in_flight == 2


@pytest.mark.parametrize(
    ("over", "message"),
    [
        ({"env": None}, "needs an 'env'"),
        ({"algorithm": {"name": "sft"}}, "algorithm.name in"),
        (
            {"action_module": {"type": "flow_matching", "num_inference_steps": 65}},
            "num_inference_steps must be <= 64 for rl",
        ),
        (
            {
                "action_module": {"type": "flow_matching"},
                "algorithm": {"name": "ppo", "entropy_coef": 0.01},
            },
            "entropy_coef must be 0 with a 'flow_matching' head",
        ),
        ({"tenant": "../etc"}, "tenant"),
        ({"schema": "nonexistent"}, "presets"),
        ({"colour": "blue"}, "colour"),
        ({"scheduling": {"max_in_flight": 0}}, "scheduling.max_in_flight"),
    ],
)
def test_bad_specs_say_what_is_wrong(over: dict[str, object], message: str) -> None:
    with pytest.raises(SpecError, match=message.replace("(", r"\(")):
        parse_spec(rl_spec(**over))


@pytest.mark.parametrize("algorithm", ["ppo", "grpo", "reinforce"])
def test_rl_on_flow_matching_heads_is_accepted(algorithm: str) -> None:
    spec = parse_spec(
        rl_spec(
            action_module={"type": "flow_matching", "num_inference_steps": 64},
            algorithm={"name": algorithm, "horizon": 16},
        )
    )
    assert spec.action_module.type == "flow_matching"
    assert spec.uses_value_head == (algorithm == "ppo")  # the critic is PPO's, any head


def test_sft_and_eval_rules() -> None:
    with pytest.raises(SpecError, match="needs a 'dataset'"):
        parse_spec({"tenant": "bob", "task": "sft", "base_model": BASE})
    with pytest.raises(SpecError, match="targets"):
        parse_spec({"tenant": "eve", "task": "eval", "base_model": BASE, "env": {"kind": "pusht"}})
    spec = parse_spec(
        {
            "tenant": "eve",
            "task": "eval",
            "base_model": BASE,
            "env": {"kind": "pusht"},
            "evaluation": {"targets": ["alice"]},
        }
    )
    assert spec.evaluation is not None and spec.evaluation.targets == ["alice"]
    # A suite's tasks at once, each a simulator session: within a tenant's 8 sessions
    # beside the evaluation's own.
    eight = {"targets": ["alice"], "tasks": ["a", "b"], "sessions": 8}
    with pytest.raises(SpecError, match="sessions"):
        parse_spec({**spec.model_dump(exclude_none=True), "evaluation": eight})


def test_load_specs_resolves_paths_and_rejects_duplicates(tmp_path: Path) -> None:
    f = tmp_path / "w.yaml"
    f.write_text(
        "workloads:\n"
        "  - {tenant: a, task: sft, base_model: {id: m}, dataset: {path: data/d}}\n"
        "  - {tenant: b, task: rl, base_model: {id: m}, env: {kind: pusht},"
        " algorithm: {name: grpo}}\n"
    )
    a, b = load_specs(f)
    assert a.dataset is not None and a.dataset.path == tmp_path / "data" / "d"
    assert b.output_dir == tmp_path / "runs"
    f.write_text(
        "- {tenant: a, task: rl, base_model: {id: m}, env: {kind: pusht}, "
        "algorithm: {name: ppo}}\n" * 2
    )
    with pytest.raises(SpecError, match="unique"):
        load_specs(f)
    with pytest.raises(SpecError, match="not found"):
        load_specs(tmp_path / "missing.yaml")


def test_json_schema_names_the_alias() -> None:
    schema = spec_json_schema()
    assert "schema" in schema["properties"]
    assert set(schema["required"]) >= {"tenant", "task", "base_model"}


def test_lora_spec_defaults_and_round_trip() -> None:
    spec = parse_spec(rl_spec(action_module={"type": "oft", "lora": {"rank": 16}}))
    lora = spec.action_module.lora
    assert lora is not None and lora.rank == 16 and lora.scaling == lora.alpha / 16
    assert "q_proj" in lora.targets and "down_proj" in lora.targets and not lora.vision
    again = parse_spec(rl_spec(action_module=spec.action_module.model_dump(mode="json")))
    assert again.action_module == spec.action_module
    assert parse_spec(rl_spec()).action_module.lora is None
    vision = {"type": "oft", "lora": {"vision": True, "vision_projection": True}}
    lora = parse_spec(rl_spec(action_module=vision)).action_module.lora
    assert lora is not None and lora.vision and lora.vision_projection


@pytest.mark.parametrize(
    ("lora", "message"),
    [
        ({"targets": ["q_proj", "qkv"]}, r"unknown LoRA target\(s\) \['qkv'\]; valid targets: \["),
        ({"targets": []}, "targets"),
        ({"targets": ["q_proj", "q_proj"]}, "repeat"),
        ({"rank": 0}, "rank"),
        ({"dropout": 1.0}, "dropout"),
        ({"vision_tower": True}, "vision_tower"),
        ({"ranks": 8}, "ranks"),
    ],
)
def test_bad_lora_specs_say_what_is_wrong(lora: dict[str, object], message: str) -> None:
    with pytest.raises(SpecError, match=message) as info:
        parse_spec(rl_spec(action_module={"type": "oft", "lora": lora}))
    assert "action_module" in str(info.value)


def test_unknown_lora_target_lists_every_valid_name() -> None:
    with pytest.raises(SpecError) as info:
        parse_spec(rl_spec(action_module={"type": "flow_matching", "lora": {"targets": ["x"]}}))
    for name in ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"):
        assert name in str(info.value)


def test_kl_anchor_defaults_on_from_init_from_and_off_without() -> None:
    from joynexus.spec.workload import DEFAULT_KL_COEF

    assert parse_spec(rl_spec(init_from="sft")).anchor_coef() == DEFAULT_KL_COEF
    assert parse_spec(rl_spec()).anchor_coef() == 0.0  # a fresh head: nothing to anchor to
    explicit = rl_spec(init_from="sft", algorithm={"name": "grpo", "kl_coef": 0.5})
    assert parse_spec(explicit).anchor_coef() == 0.5
    off = rl_spec(init_from="sft", algorithm={"name": "grpo", "kl_coef": 0})
    assert parse_spec(off).anchor_coef() == 0.0
    budget = rl_spec(init_from="sft", algorithm={"name": "grpo", "kl_budget": 0.3})
    assert parse_spec(budget).algorithm.kl_budget == 0.3  # on the default coefficient
    assert parse_spec(budget).anchor_coef() == DEFAULT_KL_COEF
    assert parse_spec(rl_spec(init_from="sft")).algorithm.kl_budget == 0.0  # plain anchor
    # A fresh RL tenant may say 0 explicitly.
    assert parse_spec(rl_spec(algorithm={"name": "ppo", "kl_coef": 0})).anchor_coef() == 0.0


@pytest.mark.parametrize(
    ("over", "message"),
    [
        ({"algorithm": {"name": "grpo", "kl_coef": 0.1}}, "starts from a fresh head"),
        ({"init_from": "sft", "algorithm": {"name": "grpo", "kl_coef": -1}}, "kl_coef"),
        ({"init_from": "sft", "algorithm": {"name": "grpo", "kl_coef": 101}}, "kl_coef"),
        ({"algorithm": {"name": "grpo", "kl_budget": 0.2}}, "bounds the KL anchor"),
        (
            {"init_from": "sft", "algorithm": {"name": "grpo", "kl_coef": 0, "kl_budget": 0.2}},
            "bounds the KL anchor",
        ),
        ({"init_from": "sft", "algorithm": {"name": "grpo", "kl_budget": -1}}, "kl_budget"),
        (
            {
                "task": "sft",
                "env": None,
                "dataset": {"path": "demos"},
                "algorithm": {"name": "sft", "kl_coef": 0.1},
            },
            "belongs to an rl workload",
        ),
    ],
)
def test_kl_anchor_refused_where_it_cannot_apply(over: dict[str, object], message: str) -> None:
    with pytest.raises(SpecError, match=message):
        parse_spec(rl_spec(**over))
