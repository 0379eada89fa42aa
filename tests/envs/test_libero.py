"""LIBERO adapter: config/asset setup, schema, and real tasks from the asset pack.

The simulator tests need LIBERO's scene assets, which no package registry ships; they
run from the asset pack (``$JOYNEXUS_LIBERO_ASSETS`` or ``../shared/libero`` next to the
checkout) and are skipped, saying so, where there is none.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import yaml

from joynexus.envs import EnvAdapter, EnvSpec, env_schema, list_envs, make_env
from joynexus.envs.libero import quat_to_axis_angle, resolve_task
from joynexus.envs.libero_setup import (
    ASSETS_ENV_VAR,
    find_asset_pack,
    installed_assets,
    prepare_libero,
)
from joynexus.errors import SpecError

SIZE = 32
PACK = find_asset_pack()
needs_pack = pytest.mark.skipif(
    PACK is None,
    reason=(
        "no LIBERO asset pack: set $JOYNEXUS_LIBERO_ASSETS or put one at ../shared/libero "
        "(LIBERO's scene assets come from no package registry)"
    ),
)


def test_registered_with_requirements() -> None:
    rows = {row.kind: row for row in list_envs()}
    if PACK is None and installed_assets() is None:  # a fresh clone: no scene assets
        assert not rows["libero"].available
        assert ASSETS_ENV_VAR in (rows["libero"].reason or "")
    else:
        assert rows["libero"].available, rows["libero"].reason


def test_schema_is_the_libero_preset_at_the_requested_size() -> None:
    task = "libero_goal/open_the_top_drawer_and_put_the_bowl_inside"
    schema = env_schema(EnvSpec(kind="libero", task=task, image_size=64))
    assert schema.camera_names == ["image", "wrist_image"]
    assert schema.cameras["wrist_image"].shape == (64, 64, 3)
    assert (schema.state_dim, schema.action_dim) == (8, 7)
    assert schema.instruction == "open the top drawer and put the bowl inside"


@pytest.mark.parametrize(
    ("task", "options", "needle"),
    [
        ("libero_spatial", {}, "<suite>/<task"),
        ("libero_100/0", {}, "unknown LIBERO suite"),
        ("libero_spatial/0", {"init_state_index": -1}, "init_state_index"),
        ("libero_spatial/0", {"settle_steps": 1.5}, "settle_steps"),
        ("libero_spatial/0", {"camera": "agentview"}, "unknown libero option"),
    ],
)
def test_bad_specs_are_rejected(task: str, options: dict[str, object], needle: str) -> None:
    with pytest.raises(SpecError, match=needle):
        env_schema(EnvSpec(kind="libero", task=task, options=options))


def test_axis_angle() -> None:
    identity = np.array([0.0, 0.0, 0.0, 1.0])
    np.testing.assert_allclose(quat_to_axis_angle(identity), 0.0)
    half_turn_about_z = np.array([0.0, 0.0, np.sin(np.pi / 4), np.cos(np.pi / 4)])
    np.testing.assert_allclose(quat_to_axis_angle(half_turn_about_z), [0, 0, np.pi / 2])


def test_env_var_that_is_not_a_pack_is_an_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ASSETS_ENV_VAR, str(tmp_path))
    with pytest.raises(SpecError, match="not a LIBERO asset pack"):
        find_asset_pack()


def _fake_pack(root: Path) -> Path:
    for name in ("assets", "bddl_files", "init_files"):
        (root / name).mkdir(parents=True)
    return root


def test_env_var_selects_a_pack(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pack = _fake_pack(tmp_path / "pack")
    monkeypatch.setenv(ASSETS_ENV_VAR, str(pack))
    assert find_asset_pack() == pack.resolve()


def test_prepare_writes_an_absolute_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LIBERO_CONFIG_PATH", raising=False)
    pack = _fake_pack(tmp_path / "pack")
    # prepare_libero must come before the first import of libero.libero (which reads it).
    paths = prepare_libero(pack, config_root=tmp_path / "cfg")
    import libero.libero as libero_pkg

    try:
        config = yaml.safe_load((paths.config_dir / "config.yaml").read_text())
        assert set(config) == {"benchmark_root", "bddl_files", "init_states", "datasets", "assets"}
        assert all(Path(value).is_absolute() for value in config.values())
        assert config["bddl_files"] == str(pack.resolve() / "bddl_files")
        assert libero_pkg.get_libero_path("init_states") == str(pack.resolve() / "init_files")
        assert libero_pkg.get_assets_path() == str(pack.resolve() / "assets")
    finally:
        # Later tests configure the real pack again; do not leave the fake one behind.
        libero_pkg._assets_path_cache = None


@needs_pack
def test_both_suites_resolve_from_the_pack() -> None:
    prepare_libero()
    goal = resolve_task("libero_goal", "open_the_middle_drawer_of_the_cabinet")
    assert goal.language == "open the middle drawer of the cabinet"
    assert Path(goal.bddl_file).is_file()
    spatial = resolve_task("libero_spatial", "9")
    assert spatial.index == 9 and Path(spatial.bddl_file).is_file()
    with pytest.raises(SpecError, match="has 10 tasks"):
        resolve_task("libero_spatial", "10")


@pytest.fixture(scope="module")
def env() -> Iterator[EnvAdapter]:
    if PACK is None:
        pytest.skip("no LIBERO asset pack (see the module docstring)")
    adapter = make_env(
        EnvSpec(
            kind="libero",
            task="libero_spatial/0",
            image_size=SIZE,
            max_episode_steps=2,
            options={"init_state_index": 3},
        )
    )
    yield adapter
    adapter.close()


def _sim_state(env: EnvAdapter) -> np.ndarray:
    sub = env.envs[0]  # type: ignore[attr-defined]  # a VectorEnvAdapter's sub-env
    return np.asarray(sub.env.get_sim_state())


def _init_states(env: EnvAdapter) -> np.ndarray:
    sub = env.envs[0]  # type: ignore[attr-defined]
    return np.asarray(sub.init_states)


@needs_pack
def test_reset_starts_from_the_fixed_init_state(env: EnvAdapter) -> None:
    obs = env.reset(seed=0)
    np.testing.assert_allclose(_sim_state(env), _init_states(env)[3])
    assert env.schema.instruction.startswith("pick up the black bowl")
    assert obs.instruction == env.schema.instruction
    for name in ("image", "wrist_image"):
        frame = obs.cameras[name]
        assert frame.shape == (1, SIZE, SIZE, 3) and frame.dtype == np.uint8
        assert frame.std() > 0
    assert obs.state.shape == (1, 8) and obs.state.dtype == np.float32
    # Gripper fingers are symmetric about the hand.
    assert obs.state[0, 6] == pytest.approx(-obs.state[0, 7], abs=1e-3)


@needs_pack
def test_steps_then_the_next_episode_takes_the_next_init_state(env: EnvAdapter) -> None:
    obs = env.reset(seed=0)
    action = np.zeros((1, 7), np.float32)
    action[0, 2] = 1.0  # end effector up
    first = env.step(action)
    assert first.observation.state[0, 2] > obs.state[0, 2]
    assert first.reward.dtype == np.float32 and not first.success[0]
    second = env.step(action)
    assert second.truncated[0] and not second.terminated[0]
    np.testing.assert_allclose(_sim_state(env), _init_states(env)[4])
    # A fresh reset walks from the configured index again.
    env.reset()
    np.testing.assert_allclose(_sim_state(env), _init_states(env)[3])
