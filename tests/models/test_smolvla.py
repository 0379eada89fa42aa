"""SmolVLA both ways against the REAL lerobot 0.4.4 (in its side venv, required).

In: JoyNexus loads what lerobot's ``save_pretrained`` wrote and computes the same actions
for the same observation and noise. Out: a changed model (its expert and projections
moved, the tenant's own normalization) exported by JoyNexus is what lerobot's
``from_pretrained`` loads, and lerobot's actions are JoyNexus's.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from joynexus.interop.lerobot import read_lerobot_checkpoint
from joynexus.models.archs.smolvlm.smolvla import SmolVLA, export_smolvla
from tests.interop.lerobot_helpers import (
    CAMERAS,
    TASKS,
    lerobot_actions,
    observation,
    tiny_smolvla,
)

#: fp32, same noise: the issue's bound (measured: 2.4e-7 in, 6.3e-7 out; the prefix is
#: computed in two parts here, shared then state token, in one pass by lerobot).
ATOL = 1e-4


@pytest.fixture(scope="module")
def smolvla(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_smolvla(tmp_path_factory.mktemp("lerobot") / "smolvla")


def _ours(model: SmolVLA, obs: dict[str, torch.Tensor]) -> torch.Tensor:
    images = [obs[f"observation.images.{c}"] for c in CAMERAS]
    return model.predict(images, obs["observation.state"], TASKS, obs["noise"])


def test_joynexus_computes_lerobots_actions_from_its_checkpoint(
    smolvla: Path, tmp_path: Path
) -> None:
    model = SmolVLA.from_lerobot(smolvla)
    obs = observation()
    theirs = lerobot_actions(smolvla, obs, tmp_path)
    ours = _ours(model, obs)
    assert ours.shape == theirs.shape == (2, 4, 6)
    assert (ours - theirs).abs().max().item() <= ATOL
    # The noise matters (the comparison is not of two constants).
    other = dict(obs, noise=torch.randn(2, 4, 8, generator=torch.Generator().manual_seed(9)))
    assert (_ours(model, other) - ours).abs().max().item() > 1e-3


def test_lerobot_loads_a_joynexus_export_and_agrees(smolvla: Path, tmp_path: Path) -> None:
    model = SmolVLA.from_lerobot(smolvla)
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():  # what training moves: the expert, the projections
        for name, param in model.named_parameters():
            if "lm_expert" in name or ".action_" in name or "state_proj" in name:
                param.add_(0.05 * torch.randn(param.shape, generator=g))
    stats = {
        "action": {"mean": [0.1 * i for i in range(6)], "std": [1.0 + 0.2 * i for i in range(6)]},
        "observation.state": {"mean": [0.5] * 6, "std": [2.0] * 6},
    }
    out = export_smolvla(model, tmp_path / "exported", stats=stats)
    assert sorted(p.name for p in out.iterdir()) == [
        "config.json",
        "model.safetensors",
        "policy_postprocessor.json",
        "policy_postprocessor_step_0_unnormalizer_processor.safetensors",
        "policy_preprocessor.json",
        "policy_preprocessor_step_5_normalizer_processor.safetensors",
        "vlm",  # the tiny checkpoint's own VLM (config + tokenizer) travels with it
    ]
    assert read_lerobot_checkpoint(out).stats["observation.state"]["std"] == [2.0] * 6
    exported = SmolVLA.from_lerobot(out)  # our own reader sees the tenant's stats too
    obs = observation(seed=1)
    theirs = lerobot_actions(out, obs, tmp_path / "run")
    ours = _ours(exported, obs)
    assert (ours - theirs).abs().max().item() <= ATOL
    # And the export is not the original checkpoint.
    original = lerobot_actions(smolvla, obs, tmp_path / "orig")
    assert (original - theirs).abs().max().item() > 1e-2


def test_one_shared_prefix_serves_tenants_with_their_own_state_projections(
    smolvla: Path,
) -> None:
    """Two tenants' rows share one image+language pass; each extends it by its own state
    token. Grouped = each tenant alone (their own state_proj, their own rows)."""
    alice, bob = SmolVLA.from_lerobot(smolvla), SmolVLA.from_lerobot(smolvla)
    with torch.no_grad():
        bob.model.state_proj.weight.mul_(-1.5)  # a tenant whose state_proj moved
    obs = observation(seed=2)
    images = [alice.prepare_image(obs[f"observation.images.{c}"]) for c in CAMERAS]
    ids, lang = alice.tokenize(TASKS, torch.device("cpu"))
    state = alice.normalize_state(obs["observation.state"])
    with torch.no_grad():
        embs, pad = alice.embed_shared(images, ids, lang)
        shared = alice.shared_cache(embs, pad)  # once, for both tenants' rows
        for tenant, row in ((alice, 0), (bob, 1)):
            grouped, _ = tenant.with_state(
                [(k[row : row + 1], v[row : row + 1]) for k, v in shared],
                pad[row : row + 1],
                state[row : row + 1],
            )
            alone_embs, alone_pad = tenant.embed_shared(
                [i[row : row + 1] for i in images], ids[row : row + 1], lang[row : row + 1]
            )
            alone, _ = tenant.with_state(
                tenant.shared_cache(alone_embs, alone_pad), alone_pad, state[row : row + 1]
            )
            for (gk, gv), (ak, av) in zip(grouped, alone, strict=True):
                torch.testing.assert_close(gk, ak, rtol=0, atol=1e-5)
                torch.testing.assert_close(gv, av, rtol=0, atol=1e-5)
        # The state token is the tenant's: bob's differs from alice's on the same row.
        a, _ = alice.with_state([(k[1:], v[1:]) for k, v in shared], pad[1:], state[1:])
        b, _ = bob.with_state([(k[1:], v[1:]) for k, v in shared], pad[1:], state[1:])
        assert (a[-1][0][:, -1] - b[-1][0][:, -1]).abs().max() > 1e-3
        torch.testing.assert_close(a[-1][0][:, :-1], b[-1][0][:, :-1], rtol=0, atol=0)
