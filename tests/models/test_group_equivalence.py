"""Grouped features equal per-tenant serial features (paper §4.3, Figure 8)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from joynexus.models.batch import ObservationBatch
from joynexus.models.canon.feature import max_abs_diff_left_padded
from joynexus.models.schema import CALVIN, LIBERO, PUSHT
from tests.models.conftest import TinyBackbone

TOL = 1e-5


def _groups() -> list[tuple[str, object, ObservationBatch]]:
    libero_a = ObservationBatch.synthetic(LIBERO, 3, seed=1)
    # Instructions of clearly different lengths so rows need different amounts of padding.
    libero_a = dataclasses.replace(
        libero_a, instructions=["open", "pick up the red block", "put the bowl on the plate " * 3]
    )
    return [
        ("libero-a", LIBERO, libero_a),
        ("pusht", PUSHT, ObservationBatch.synthetic(PUSHT, 2, seed=2)),
        ("libero-b", LIBERO, ObservationBatch.synthetic(LIBERO, 1, seed=3)),
        ("calvin", CALVIN, ObservationBatch.synthetic(CALVIN, 2, seed=4)),
    ]


@pytest.mark.parametrize("arch", ["qwen2_5_vl", "qwen3_vl", "paligemma", "smolvlm", "pi0"])
def test_grouped_equals_serial(arch: str, tiny_backbone: TinyBackbone) -> None:
    base = tiny_backbone(arch)
    groups = _groups()
    feature = base.canonicalize(groups)  # type: ignore[arg-type]
    grouped = base.encode(feature)

    mask = grouped.attention_mask
    lengths = mask.sum(dim=1)
    assert int(lengths.min()) < int(lengths.max()), "rows should need different padding"
    # Left padding: every row's last position is a real token.
    assert bool(mask[:, -1].all())
    assert [s.tenant_id for s in feature.slices] == ["libero-a", "pusht", "libero-b", "calvin"]

    for tenant_id, schema, batch in groups:
        serial_feature = base.canonicalize([(tenant_id, schema, batch)])  # type: ignore[list-item]
        serial = base.encode(serial_feature)
        entry = feature.slice_of(tenant_id)
        rows = grouped.rows(entry.start, entry.stop)
        diff = max_abs_diff_left_padded(
            rows.hidden_states, rows.attention_mask, serial.hidden_states, serial.attention_mask
        )
        assert diff <= TOL, f"{arch}/{tenant_id}: grouped vs serial differ by {diff}"
        assert entry.schema_signature == serial_feature.slices[0].schema_signature
        assert entry.schema_signature == base.signature_for(schema)  # type: ignore[arg-type]
        width = serial_feature.state.shape[1]
        assert torch.equal(feature.split(feature.state)[tenant_id][:, :width], serial_feature.state)


def test_a_different_batch_mate_changes_nothing_but_padding(tiny_backbone: TinyBackbone) -> None:
    base = tiny_backbone("qwen2_5_vl")
    target = ("libero", LIBERO, ObservationBatch.synthetic(LIBERO, 2, seed=9))
    out_a = base.encode(base.canonicalize([target, *_groups()[1:2]]))  # type: ignore[list-item]
    out_b = base.encode(base.canonicalize([*_groups()[3:], target]))  # type: ignore[list-item]
    a, b = out_a.rows(0, 2), out_b.rows(2, 4)
    diff = max_abs_diff_left_padded(
        a.hidden_states, a.attention_mask, b.hidden_states, b.attention_mask
    )
    assert diff <= TOL
    # The comparison is not vacuous: a different observation gives different features.
    other = ("libero", LIBERO, ObservationBatch.synthetic(LIBERO, 2, seed=10))
    out_c = base.encode(base.canonicalize([other]))
    with pytest.raises(ValueError):  # different instructions → different real tokens
        max_abs_diff_left_padded(
            a.hidden_states, a.attention_mask, out_c.hidden_states, out_c.attention_mask
        )
    same_text = dataclasses.replace(other[2], instructions=target[2].instructions)
    out_d = base.encode(base.canonicalize([("libero", LIBERO, same_text)]))
    assert (
        max_abs_diff_left_padded(
            a.hidden_states, a.attention_mask, out_d.hidden_states, out_d.attention_mask
        )
        > 1e-3
    )


def test_feature_layout_masks_and_split(tiny_backbone: TinyBackbone) -> None:
    base = tiny_backbone("qwen3_vl")
    groups = _groups()
    feature = base.canonicalize(groups)  # type: ignore[arg-type]
    assert feature.batch_size == 8
    assert feature.camera_mask.shape == (8, base.num_camera_slots)
    pusht = feature.slice_of("pusht")
    # PushT has one camera: its second slot is a blank, masked image.
    assert feature.camera_mask[pusht.start : pusht.stop].tolist() == [[True, False]] * 2
    assert bool(feature.camera_mask[:3].all())
    assert feature.state.shape == (8, CALVIN.state_dim)
    assert feature.state_mask[pusht.start].tolist() == [True] * 2 + [False] * 13
    assert float(feature.state[pusht.start, 2:].abs().sum()) == 0.0
    expected_state = torch.from_numpy(groups[1][2].state)
    assert torch.equal(feature.state[pusht.start : pusht.stop, :2], expected_state)
    out = base.encode(feature)
    parts = feature.split(out.hidden_states)
    assert {k: v.shape[0] for k, v in parts.items()} == {
        "libero-a": 3,
        "pusht": 2,
        "libero-b": 1,
        "calvin": 2,
    }
    # Padded positions are zeroed so heads cannot pick up garbage.
    pad = ~out.attention_mask.bool()
    assert float(out.hidden_states[pad].abs().sum()) == 0.0
    assert np.isfinite(out.hidden_states.numpy()).all()
