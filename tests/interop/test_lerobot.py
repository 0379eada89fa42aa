"""LeRobot checkpoints, made and read back with the REAL ``lerobot`` package.

``lerobot`` pins torch < 2.11 and transformers < 5, so it lives in its own venv
(``.venv-lerobot``, built by ``make install`` through scripts/install-python-extras.sh).
Without that venv these tests FAIL and say how to build it: they never skip.
"""

from __future__ import annotations

import json
import re
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from joynexus.errors import InvalidRequestError, ServiceUnavailableError, SpecError
from joynexus.interop.lerobot import (
    FAMILIES,
    HOSTED_FAMILIES,
    LEROBOT_VENV_ENV,
    POSTPROCESSOR,
    PREPROCESSOR,
    SchemaDims,
    check_lerobot_base,
    hub_family,
    make_tiny_lerobot,
    read_lerobot_checkpoint,
    run_lerobot_side,
)
from joynexus.spec.workload import parse_spec
from joynexus.workflows.compile import compile_workloads
from tests.interop.lerobot_helpers import lerobot_actions, observation, tiny_smolvla

FITS = SchemaDims(state_dim=6, action_dim=6, action_chunk=4)


@pytest.fixture(scope="module")
def smolvla(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny SmolVLA checkpoint written by lerobot's own SmolVLAPolicy.save_pretrained."""
    return tiny_smolvla(tmp_path_factory.mktemp("lerobot") / "smolvla")


def _copy(src: Path, tmp_path: Path) -> Path:
    dst = tmp_path / "ckpt"
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("vlm"))
    return dst


def test_make_tiny_writes_the_lerobot_layout(smolvla: Path) -> None:
    names = {p.name for p in smolvla.iterdir()}
    assert {"config.json", "model.safetensors", PREPROCESSOR, POSTPROCESSOR} <= names
    config = json.loads((smolvla / "config.json").read_text())
    assert config["type"] == "smolvla"
    # The VLM is the local tiny one, never a hub id.
    assert Path(config["vlm_model_name"]).is_dir()
    weights = load_file(str(smolvla / "model.safetensors"))
    assert any(k.startswith("model.vlm_with_expert.lm_expert.") for k in weights)
    assert any(k.startswith("model.vlm_with_expert.vlm.") for k in weights)


def test_read_checkpoint_reports_dims_and_normalization(smolvla: Path) -> None:
    ckpt = read_lerobot_checkpoint(smolvla)
    assert (ckpt.type, ckpt.state_dim, ckpt.action_dim, ckpt.chunk_size) == ("smolvla", 6, 6, 4)
    assert (ckpt.max_state_dim, ckpt.max_action_dim) == (8, 8)
    assert ckpt.cameras == ["top", "wrist"]
    # The statistics are the ones lerobot's normalizer saved (made-up, not identity).
    std = ckpt.stats["observation.state"]["std"]
    assert len(std) == 6 and all(0.5 <= s <= 1.5 for s in std)
    assert len(ckpt.stats["action"]["mean"]) == 6


def test_lerobot_loads_what_it_saved_and_predicts_with_fixed_noise(
    smolvla: Path, tmp_path: Path
) -> None:
    obs = observation()
    first = lerobot_actions(smolvla, obs, tmp_path / "a")
    again = lerobot_actions(smolvla, obs, tmp_path / "b")
    assert first.shape == (2, 4, 6)
    # Same noise, same actions; and the rows (different observations) differ.
    torch.testing.assert_close(first, again, rtol=0, atol=0)
    assert not torch.allclose(first[0], first[1])


def test_unknown_type_is_a_spec_error(smolvla: Path, tmp_path: Path) -> None:
    bad = _copy(smolvla, tmp_path)
    config = json.loads((bad / "config.json").read_text())
    config["type"] = "act"
    (bad / "config.json").write_text(json.dumps(config))
    with pytest.raises(SpecError, match="'act' is a LeRobot policy type JoyNexus cannot host"):
        check_lerobot_base(str(bad), FITS)
    config["type"] = "my_policy"
    (bad / "config.json").write_text(json.dumps(config))
    with pytest.raises(SpecError, match="'my_policy' is an unknown type"):
        check_lerobot_base(str(bad), FITS)


@pytest.mark.parametrize("missing", [PREPROCESSOR, POSTPROCESSOR, "state file"])
def test_missing_processor_files_are_spec_errors(
    smolvla: Path, tmp_path: Path, missing: str
) -> None:
    bad = _copy(smolvla, tmp_path)
    if missing == "state file":
        next(bad.glob("policy_preprocessor_step_*normalizer*.safetensors")).unlink()
        match = "names the state file"
    else:
        (bad / missing).unlink()
        match = f"{missing} is missing"
    with pytest.raises(SpecError, match=match):
        check_lerobot_base(str(bad), FITS)


def test_schema_wider_than_the_checkpoint_is_a_spec_error(smolvla: Path) -> None:
    wide = SchemaDims(state_dim=6, action_dim=9, action_chunk=5)
    with pytest.raises(SpecError) as info:
        check_lerobot_base(str(smolvla), wide)
    assert info.value.details["fields"] == ["schema.action_dim", "schema.action_chunk"]
    assert "9 exceeds the smolvla checkpoint's max_action_dim of 8" in str(info.value)


def test_a_fitting_smolvla_checkpoint_is_accepted_and_other_families_are_refused(
    smolvla: Path, tmp_path: Path
) -> None:
    ckpt = check_lerobot_base(str(smolvla), FITS)
    assert ckpt is not None and ckpt.type == "smolvla" and ckpt.max_action_dim == 8
    # A LeRobot policy of a family JoyNexus does not read: a SpecError naming it, at
    # spec time (and so for a family it reads but does not host, if there is one).
    other = _copy(smolvla, tmp_path)
    config = json.loads((other / "config.json").read_text())
    (other / "config.json").write_text(json.dumps({**config, "type": "act"}))
    with pytest.raises(SpecError, match="type 'act' is a LeRobot policy type JoyNexus cannot"):
        check_lerobot_base(str(other), FITS)
    for family in sorted(set(FAMILIES) - set(HOSTED_FAMILIES)):
        (other / "config.json").write_text(json.dumps({**config, "type": family}))
        with pytest.raises(SpecError, match=f"LeRobot '{family}' policy: JoyNexus reads"):
            check_lerobot_base(str(other), FITS)


def _custom_spec(model: str, action_dim: int) -> Any:
    return parse_spec(
        {
            "tenant": "alice",
            "task": "custom",
            "base_model": {"id": model},
            "schema": {
                "cameras": {"top": {"height": 64, "width": 64}},
                "state_dim": 6,
                "action_dim": action_dim,
                "action_chunk": 4,
            },
            "action_module": {"type": "oft", "hidden_dim": 32, "num_blocks": 1},
        }
    )


def test_spec_check_and_submission_refuse_a_bad_lerobot_base(smolvla: Path) -> None:
    # compile_workloads is what `spec check`, `joynexus run` and the server's workload
    # submission run: the error comes before anything is loaded.
    with pytest.raises(SpecError, match=r"schema\.action_dim"):
        compile_workloads([_custom_spec(str(smolvla), 12)], allow_custom=True)
    # The same checkpoint with a schema that fits is accepted.
    run = compile_workloads([_custom_spec(str(smolvla), 6)], allow_custom=True)
    assert [w.tenant_id for w in run.workloads] == ["alice"]


def test_hub_ids_are_checked_by_the_family_they_name() -> None:
    assert hub_family("lerobot/smolvla_base") == "smolvla"
    assert hub_family("lerobot/pi05_base") == "pi05"
    assert hub_family("lerobot/act_aloha_sim_transfer_cube_human") == "act"
    assert hub_family("HuggingFaceTB/SmolVLM2-500M-Video-Instruct") is None
    with pytest.raises(SpecError, match="LeRobot 'diffusion' policy; JoyNexus hosts"):
        check_lerobot_base("lerobot/diffusion_pusht", FITS)
    # A family read but not hosted (if there is one) is refused by hub id too ...
    for family in sorted(set(FAMILIES) - set(HOSTED_FAMILIES)):
        with pytest.raises(SpecError, match=f"hosts only {re.escape(str(list(HOSTED_FAMILIES)))}"):
            check_lerobot_base(f"lerobot/{family}_base", FITS)
    # ... and a hosted family by hub id passes the offline check (its dims are checked on
    # load).
    for family in HOSTED_FAMILIES:
        assert check_lerobot_base(f"lerobot/{family}_base", FITS) is None
    # Not a LeRobot policy: nothing to check here.
    assert check_lerobot_base("HuggingFaceTB/SmolVLM2-500M-Video-Instruct", FITS) is None


def test_make_tiny_refuses_families_it_cannot_build(tmp_path: Path) -> None:
    with pytest.raises(InvalidRequestError, match="tiny LeRobot checkpoints exist for"):
        make_tiny_lerobot("pi0", tmp_path / "x")


def test_a_missing_venv_says_how_to_build_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(LEROBOT_VENV_ENV, str(tmp_path / "nowhere"))
    monkeypatch.setattr(sys, "prefix", str(tmp_path / "venv"))
    import joynexus.interop.venvs as venvs

    monkeypatch.setattr(venvs, "_CHECKOUT", tmp_path)
    with pytest.raises(ServiceUnavailableError, match=r"install-python-extras\.sh"):
        run_lerobot_side(["make-tiny"])


def test_the_backbones_page_offers_no_lerobot_id_the_code_refuses() -> None:
    """Regression: docs/BACKBONES.md offered ``lerobot/pi0_base`` as a hostable base
    model while ``spec check`` refused it. Every ``lerobot/...`` id its "Which models"
    section offers (outside the sentence saying what is refused) passes the check."""
    page = (Path(__file__).resolve().parents[2] / "docs" / "BACKBONES.md").read_text()
    section = page.split("## Which models", 1)[1].split("\n## ", 1)[0]
    sentences = re.split(r"(?<=\.)\s", " ".join(section.split()))
    offered = {
        m for s in sentences if "refused" not in s for m in re.findall(r"`(lerobot/[\w.-]+)`", s)
    }
    assert offered, "the section names no LeRobot id"
    for model_id in sorted(offered):
        check_lerobot_base(model_id, None)  # raises SpecError for one the code refuses
    # A family the code reads but does not host (if any) is named as refused there.
    for family in sorted(set(FAMILIES) - set(HOSTED_FAMILIES)):
        with pytest.raises(SpecError):
            check_lerobot_base(f"lerobot/{family}_base", None)
        assert f"`lerobot/{family}_base`" in section and "refused" in section
