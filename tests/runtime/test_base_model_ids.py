"""How a spec's base_model.id names a locally built model (tiny:<arch>, small:<arch>)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from joynexus.errors import SpecError
from joynexus.runtime.plane import load_base_model
from joynexus.spec.workload import BaseModelSpec


@pytest.mark.parametrize("prefix", ["tiny", "small"])
def test_an_unknown_architecture_lists_the_allowed_ids(prefix: str, tmp_path: Path) -> None:
    with pytest.raises(SpecError, match=f"unknown {prefix} architecture") as info:
        load_base_model(BaseModelSpec(id=f"{prefix}:nope"), tmp_path)
    assert f"'{prefix}:pi0'" in str(info.value)
    assert not any(tmp_path.iterdir())  # nothing was built


def test_a_tiny_model_keeps_its_spec_id_wherever_it_is_built(tmp_path: Path) -> None:
    """A checkpoint trained on tiny:qwen2_5_vl in one run directory loads in another
    (``init_from`` a checkpoint path): the model is known by its spec id, not by the
    directory it was materialized in."""
    from joynexus.models.policies import OFTHeadConfig
    from joynexus.models.schema import PUSHT
    from joynexus.models.tenant.slots import TenantSlot
    from tests.models.reference import load_slot, save_slot

    spec = BaseModelSpec(id="tiny:qwen2_5_vl", canonical_image_size=28)
    one = load_base_model(spec, tmp_path / "run-1" / "models")
    two = load_base_model(spec, tmp_path / "run-2" / "models")
    assert one.model_id == two.model_id == "tiny:qwen2_5_vl"
    assert one.source != two.source  # built twice, in each run directory
    assert one.signature_for(PUSHT) == two.signature_for(PUSHT)
    # What the id promises: built from a fixed seed, the same weights in both places.
    pairs = zip(one.model.parameters(), two.model.parameters(), strict=True)
    assert all(torch.equal(p, q) for p, q in pairs)
    trained = TenantSlot("a", PUSHT, one, OFTHeadConfig(hidden_dim=32, num_blocks=1))
    ckpt = save_slot(trained, tmp_path / "run-1" / "outputs", step=3)
    fresh = TenantSlot("a", PUSHT, two, OFTHeadConfig(hidden_dim=32, num_blocks=1))
    load_slot(fresh, ckpt)  # refused before: another base model id, another signature
    before, after = trained.state_tensors(), fresh.state_tensors()
    assert before.keys() == after.keys()
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_the_spec_chooses_the_canonicalizer(tmp_path: Path) -> None:
    """``base_model.canonicalizer`` (``serve --canonicalizer``) picks the path; the
    tensor one is the default and the processor stays selectable as the reference."""
    default = load_base_model(BaseModelSpec(id="tiny:paligemma"), tmp_path)
    assert default.canonicalizer == "tensor"
    reference = load_base_model(
        BaseModelSpec(id="tiny:paligemma", canonicalizer="processor"), tmp_path
    )
    assert reference.canonicalizer == "processor"
