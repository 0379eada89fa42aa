"""One check of environment specs: server limits and the gym allow-list."""

from __future__ import annotations

import pytest

from joynexus.envs.base import EnvSpec
from joynexus.envs.limits import (
    EnvLimits,
    GymAllowlist,
    env_limit_problems,
    gym_problems,
    raise_env_problems,
)
from joynexus.errors import PermissionDeniedError, SpecError


def _gym(task: str = "CartPole-v1", **options: object) -> EnvSpec:
    return EnvSpec(kind="gym", task=task, options=dict(options))


def test_limits_name_the_field_and_the_setting() -> None:
    spec = EnvSpec(kind="remote", num_envs=17, image_size=513)
    problems = env_limit_problems(spec, EnvLimits(), prefix="env.")
    by_field = {p.field: p for p in problems}
    assert set(by_field) == {"env.kind", "env.num_envs", "env.image_size"}
    assert by_field["env.kind"].forbidden
    assert "max_num_envs" in by_field["env.num_envs"].message
    assert "limit of 512 (max_image_size)" in by_field["env.image_size"].message
    assert env_limit_problems(EnvSpec(kind="fake", num_envs=16, image_size=512), EnvLimits()) == []


def test_default_allowlist_lets_tenants_import_nothing_and_pass_no_kwargs() -> None:
    allow = GymAllowlist(setting="ServerConfig.gym_allowed_{}")
    assert gym_problems(_gym(), allow) == []  # a registered id, no options: fine
    assert gym_problems(EnvSpec(kind="fake", options={"imports": ["os"]}), allow) == []

    problems = gym_problems(_gym(imports=["os"]), allow, prefix="spec.")
    assert [p.field for p in problems] == ["spec.options.imports"]
    assert problems[0].forbidden and "ServerConfig.gym_allowed_imports" in problems[0].message

    problems = gym_problems(_gym(make_kwargs={"render_mode": "human"}), allow)
    assert problems[0].field == "options.make_kwargs" and problems[0].forbidden
    assert "'render_mode'" in problems[0].message
    assert "ServerConfig.gym_allowed_make_kwargs" in problems[0].message

    # A "module:Env" id makes gymnasium import the module itself.
    problems = gym_problems(_gym("os:Anything-v0"), allow)
    assert problems[0].field == "task" and problems[0].forbidden
    assert "ServerConfig.gym_allowed_ids" in problems[0].message


def test_an_admin_allowlist_opens_exactly_what_it_lists() -> None:
    allow = GymAllowlist(ids=("CartPole-v1", "mod:Env-v0"), imports=("json",), make_kwargs=("x",))
    assert gym_problems(_gym(imports=["json"], make_kwargs={"x": 1}), allow) == []
    assert gym_problems(_gym("mod:Env-v0"), allow) == []
    problems = gym_problems(_gym("Acrobot-v1", imports=["json", "os"]), allow)
    assert {p.field for p in problems} == {"task", "options.imports"}
    assert "['os']" in next(p.message for p in problems if p.field == "options.imports")


def test_malformed_options_are_422_and_refusals_403() -> None:
    allow = GymAllowlist()
    bad = gym_problems(_gym(imports="os"), allow)  # a string would be iterated char by char
    assert [p.forbidden for p in bad] == [False]
    with pytest.raises(SpecError, match=r"options\.imports: must be a list"):
        raise_env_problems(bad)
    refused = gym_problems(_gym(imports=["os"]), allow)
    with pytest.raises(PermissionDeniedError) as info:
        raise_env_problems([*bad, *refused])
    assert info.value.details["fields"] == ["options.imports"]
    raise_env_problems([])  # nothing to refuse
