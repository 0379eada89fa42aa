"""PEFT round trip: a tenant checkpoint's adapter loads with ``peft.PeftModel`` and gives
the same backbone features as the service's mixed-adapter forward."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from joynexus.models.batch import ObservationBatch
from joynexus.models.canon.feature import max_abs_diff_left_padded
from joynexus.models.execution.grouped import GroupedExecutor
from joynexus.models.lora import PEFT_CONFIG_FILE, PEFT_WEIGHTS_FILE, LoRAConfig
from joynexus.models.policies import OFTHeadConfig
from joynexus.models.schema import LIBERO, PUSHT
from joynexus.models.tenant.slots import TenantSlot
from joynexus.models.tiny import quiet_transformers
from tests.models.conftest import TinyBackbone, TinyModelDir
from tests.models.reference import load_slot, save_slot
from tests.models.test_lora import randomize_b


@pytest.mark.filterwarnings("ignore:.*is_gradient_checkpointing.*:FutureWarning")
@pytest.mark.parametrize(
    ("arch", "vision"),
    [("qwen2_5_vl", False), ("smolvlm", False), ("smolvlm", True), ("paligemma", True)],
)
def test_peft_loads_the_checkpointed_adapter(
    arch: str,
    vision: bool,
    tiny_backbone: TinyBackbone,
    tiny_model_dir: TinyModelDir,
    tmp_path: Path,
) -> None:
    peft = pytest.importorskip("peft", reason="peft (dev extra) is not installed")
    import transformers

    base = tiny_backbone(arch)
    lora = LoRAConfig(
        rank=4,
        alpha=8.0,
        targets=("q_proj", "v_proj", "o_proj", "down_proj"),
        vision=vision,
        vision_projection=vision,
    )
    slot = TenantSlot("t", LIBERO, base, OFTHeadConfig(hidden_dim=32, lora=lora), seed=0)
    plain = TenantSlot("p", PUSHT, base, OFTHeadConfig(hidden_dim=32), seed=1)
    randomize_b(slot, 3)
    ckpt = save_slot(slot, tmp_path, step=1)
    assert (ckpt / PEFT_WEIGHTS_FILE).is_file() and (ckpt / PEFT_CONFIG_FILE).is_file()
    config = json.loads((ckpt / PEFT_CONFIG_FILE).read_text())
    assert config["peft_type"] == "LORA" and config["r"] == 4
    # A vision adapter exports the tower's and the projection's layers too.
    towers = ("vision_model", "vision_tower", "connector", "multi_modal_projector")
    assert any(t in m for m in config["target_modules"] for t in towers) == vision
    # The checkpoint restores (every file, PEFT ones included, hash-checked) ...
    again = TenantSlot("t", LIBERO, base, OFTHeadConfig(hidden_dim=32, lora=lora), seed=5)
    load_slot(again, ckpt)
    assert again.lora is not None and slot.lora is not None
    for (n, a), (_, b) in zip(
        again.lora.named_parameters(), slot.lora.named_parameters(), strict=True
    ):
        assert torch.equal(a, b), n
    # ... and holds no base weights: it is tiny next to the base.
    size = sum(p.stat().st_size for p in ckpt.iterdir())
    assert size < base.parameter_bytes() // 4

    batch = ObservationBatch.synthetic(LIBERO, 2, seed=9)
    executor = GroupedExecutor(base, [slot, plain])
    ours = executor.shared_forward({"t": batch, "p": ObservationBatch.synthetic(PUSHT, 1, seed=1)})[
        "t"
    ]

    with quiet_transformers():
        hf: Any = transformers.AutoModel.from_pretrained(str(tiny_model_dir(arch)))
    try:
        model = peft.PeftModel.from_pretrained(hf, str(ckpt))
    except (ValueError, KeyError, TypeError) as error:  # pragma: no cover - peft-version dependent
        pytest.skip(f"peft cannot load an adapter on this tiny {arch}: {error}")
    model.eval()
    feature = base.canonicalize([("t", LIBERO, batch)])
    with torch.no_grad():
        out = model(**feature.model_inputs, use_cache=False, return_dict=True)
    mask = feature.model_inputs["attention_mask"]
    theirs = out.last_hidden_state.masked_fill(~mask.bool().unsqueeze(-1), 0.0)
    diff = max_abs_diff_left_padded(ours.hidden_states, ours.attention_mask, theirs, mask)
    assert diff <= 1e-5 * float(theirs.abs().max()), f"{arch}: peft vs service differ by {diff}"
    # The adapter matters: peft's base path differs from it.
    with torch.no_grad(), model.disable_adapter():
        bare = model(**feature.model_inputs, use_cache=False, return_dict=True)
    bare_hidden = bare.last_hidden_state.masked_fill(~mask.bool().unsqueeze(-1), 0.0)
    assert max_abs_diff_left_padded(bare_hidden, mask, theirs, mask) > 1e-3
