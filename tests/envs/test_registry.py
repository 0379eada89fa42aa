"""Env registry: kinds by name, schemas without starting simulators, availability."""

from __future__ import annotations

import sys

import pytest

from joynexus.envs import EnvSpec, env_schema, list_envs, make_env, register_env, unregister_env
from joynexus.envs.registry import resolve_callable
from joynexus.errors import SpecError
from joynexus.models.schema import DataSchema
from tests.envs.fake_envs import fake_schema


def test_builtin_kinds_are_registered_without_importing_simulators() -> None:
    kinds = {info.kind for info in list_envs()}
    assert {"pusht", "metaworld", "gym", "remote", "fake"} <= kinds
    # Importing joynexus.envs must not have loaded any simulator package.
    import subprocess

    code = (
        "import sys, joynexus.envs; "
        "print(sorted(m for m in ('mujoco','metaworld','gym_pusht','pygame') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_unknown_kind_lists_known_kinds() -> None:
    with pytest.raises(SpecError, match=r"unknown env kind 'nope'; known kinds: .*pusht"):
        make_env(EnvSpec(kind="nope"))
    with pytest.raises(SpecError, match="known kinds"):
        env_schema(EnvSpec(kind="nope"))


def test_schema_without_starting_a_simulator() -> None:
    schema = env_schema(EnvSpec(kind="pusht", image_size=48))
    assert schema.cameras["top"].shape == (48, 48, 3)
    assert (schema.state_dim, schema.action_dim) == (2, 2)
    mw = env_schema(EnvSpec(kind="metaworld", task="button-press-v3", image_size=32))
    assert list(mw.cameras) == ["corner"] and mw.state_dim == 39 and mw.action_dim == 4
    assert mw.instruction == "button press"
    with pytest.raises(SpecError, match="needs a task"):
        env_schema(EnvSpec(kind="metaworld"))
    with pytest.raises(SpecError, match="camera"):
        env_schema(EnvSpec(kind="metaworld", task="reach-v3", options={"camera": "nose"}))


def test_availability_reports_missing_modules() -> None:
    register_env(
        "needs-missing",
        "tests.envs.fake_envs:make_fake",
        schema=fake_schema,
        description="needs a module that is not installed",
        requires=["joynexus_no_such_module"],
    )
    try:
        info = {i.kind: i for i in list_envs()}["needs-missing"]
        assert not info.available and "joynexus_no_such_module" in (info.reason or "")
        with pytest.raises(SpecError, match="joynexus_no_such_module"):
            make_env(EnvSpec(kind="needs-missing"))
        with pytest.raises(SpecError, match="already registered"):
            register_env("needs-missing", "x:y", schema=fake_schema, description="dup")
    finally:
        unregister_env("needs-missing")


def test_resolve_callable_errors() -> None:
    assert resolve_callable("tests.envs.fake_envs:fake_schema") is fake_schema
    for bad in ("no_colon", "tests.envs.fake_envs:missing", "no_such_pkg_x:f"):
        with pytest.raises(SpecError):
            resolve_callable(bad)


def test_env_spec_is_strict() -> None:
    with pytest.raises(ValueError, match="extra"):
        EnvSpec.model_validate({"kind": "pusht", "colour": "red"})
    with pytest.raises(ValueError):
        EnvSpec(kind="pusht", num_envs=0)
    assert isinstance(env_schema(EnvSpec(kind="fake")), DataSchema)
