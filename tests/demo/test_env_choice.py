"""The demo checks its simulators before anything starts and says which it chose, and why.

Regressions: a fresh clone with no LIBERO asset pack recorded demos for minutes and then
died with a ``FileNotFoundError`` for LIBERO's base scene; with ``--envs fast`` the
reason printed was "budget under 8 min".
"""

from __future__ import annotations

import asyncio
import importlib.util
from collections.abc import Sequence
from pathlib import Path

import pytest
from typer.testing import CliRunner

from joynexus.cli.main import app
from joynexus.demo.envcheck import check_envs, file_problems
from joynexus.demo.mixture import (
    PAPER_MIN_MINUTES,
    EnvChoice,
    build_mixture,
    choose_envs,
    profile_env_specs,
)
from joynexus.envs.base import EnvSpec
from joynexus.envs.libero_setup import ASSETS_ENV_VAR
from joynexus.errors import SpecError
from tests.envs.libero_hidden import hide_libero_assets, hide_libero_pack


def _installed(*modules: str) -> pytest.MarkDecorator:
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    return pytest.mark.skipif(bool(missing), reason=f"not installed: {missing}")


async def _files_only(specs: Sequence[EnvSpec]) -> list[tuple[str, str]]:
    """The real file checks (LIBERO's assets included), no renderer probes."""
    return [(p.kind, p.reason) for p in file_problems(specs)]


async def _all_fine(specs: Sequence[EnvSpec]) -> list[tuple[str, str]]:
    return []


def _broken(*kinds: str) -> object:
    async def check(specs: Sequence[EnvSpec]) -> list[tuple[str, str]]:
        return [(s.kind, f"{s.kind} is broken; install X") for s in specs if s.kind in kinds]

    return check


def _choose(minutes: float, profile: str | None = None, check: object = _all_fine) -> EnvChoice:
    return asyncio.run(choose_envs(minutes, profile, check=check))  # type: ignore[arg-type]


@_installed("libero", "gym_pusht", "metaworld")
def test_without_the_pack_the_demo_picks_the_fast_simulators_and_says_why(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    hide_libero_assets(monkeypatch, tmp_path)
    choice = _choose(10.0, check=_files_only)
    assert choice.profile == "fast"
    assert choice.reason.startswith("the budget (10 min) fits the paper's simulators, but libero")
    assert "LIBERO has no scene assets" in choice.reason and ASSETS_ENV_VAR in choice.reason
    assert "instead the fast simulators: PushT, MetaWorld reach-v3 and reach2d" in choice.reason
    assert set(choice.unavailable) == {"libero"}


@_installed("libero", "mani_skill")
def test_a_fresh_clone_runs_the_paper_simulators_from_the_registry_assets(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # No pack beside the checkout, no environment variable: the project's install brought
    # LIBERO's assets, so the default budget picks the paper's mixture with LIBERO.
    hide_libero_pack(monkeypatch, tmp_path)
    choice = _choose(10.0, check=_files_only)
    assert choice.profile == "paper", choice.reason
    assert not choice.unavailable


@_installed("libero")
def test_forcing_the_paper_simulators_without_the_pack_stops_at_once(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    hide_libero_assets(monkeypatch, tmp_path)
    with pytest.raises(SpecError) as caught:
        # The default check: LIBERO's files are missing, so no renderer is even probed.
        asyncio.run(choose_envs(10.0, "paper"))
    message = caught.value.message
    assert message.startswith("--envs paper cannot run here: libero: LIBERO has no scene assets")
    assert ASSETS_ENV_VAR in message and "\n" not in message


@_installed("libero")
def test_the_cli_stops_with_one_line_before_creating_anything(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    hide_libero_assets(monkeypatch, tmp_path)
    out = tmp_path / "demo"
    result = CliRunner().invoke(app, ["demo", "--envs", "paper", "--out", str(out)])
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output
    (error,) = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert (
        error.startswith("error: --envs paper cannot run here: libero: ")
        and ASSETS_ENV_VAR in error
    )
    assert not out.exists()


@pytest.mark.parametrize("profile", ["fast", "paper", "test"])
def test_a_forced_profile_says_it_was_forced(profile: str, tmp_path: Path) -> None:
    choice = _choose(3.0, profile)  # 3 min: the budget alone would pick "fast"
    assert choice.profile == profile
    assert choice.reason.startswith(f"chosen with --envs {profile}: ")
    assert "budget" not in choice.reason
    mixture = build_mixture(tmp_path, minutes=3.0, profile=choice.profile, reason=choice.reason)
    assert mixture.reason == choice.reason
    # Without a reason given, build_mixture says the same (it no longer reuses the budget's).
    assert build_mixture(tmp_path, minutes=3.0, profile="fast").reason.startswith(
        "chosen with --envs fast: "
    )


def test_the_budget_reason_names_the_budget() -> None:
    paper = _choose(PAPER_MIN_MINUTES)
    assert paper.profile == "paper" and paper.reason.startswith("the budget (8 min) is at least 8")
    fast = _choose(3.0)
    assert fast.profile == "fast" and fast.reason.startswith("the budget (3 min) is under 8 min")


def test_a_broken_forced_profile_names_the_simulator_and_the_fix() -> None:
    with pytest.raises(SpecError, match=r"^--envs fast cannot run here: metaworld: metaworld is"):
        _choose(3.0, "fast", check=_broken("metaworld"))


def test_when_nothing_can_run_the_demo_says_so() -> None:
    with pytest.raises(SpecError, match="the demo's simulators cannot run here: maniskill: "):
        _choose(10.0, check=_broken("maniskill", "metaworld"))


def test_profiles_list_their_simulators() -> None:
    kinds = [s.kind for s in profile_env_specs("paper")]
    assert kinds == ["libero", "maniskill", "maniskill", "metaworld"]


@_installed("gym_pusht", "libero")
def test_check_envs_reports_files_then_skips_the_renderer_probes(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    hide_libero_assets(monkeypatch, tmp_path)
    probed: list[Sequence[str]] = []

    async def no_probe(kinds: Sequence[str], **_: object) -> dict[str, str]:
        probed.append(kinds)
        return {}

    monkeypatch.setattr("joynexus.demo.envcheck.probe_renderers", no_probe)
    problems = asyncio.run(check_envs(profile_env_specs("paper")))
    assert [p.kind for p in problems] == ["libero"]
    assert probed == []  # a missing file is known at once: no renderer is started
    assert asyncio.run(check_envs(profile_env_specs("test"))) == []
    assert probed == [["reach2d", "pusht"]]


@_installed("metaworld", "mujoco")
def test_a_renderer_that_does_not_start_is_the_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    # MuJoCo refuses an unknown GL backend at import: the probe's last line is the reason.
    monkeypatch.setenv("MUJOCO_GL", "no-such-backend")
    problems = asyncio.run(check_envs([EnvSpec(kind="metaworld", task="reach-v3")]))
    (problem,) = problems
    assert problem.kind == "metaworld"
    assert problem.reason.startswith("MuJoCo on EGL does not work here (")
    assert "no-such-backend" in problem.reason and "install EGL" in problem.reason
