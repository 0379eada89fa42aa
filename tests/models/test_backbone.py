"""ResidentBaseModel: loading, freezing, errors, identity and save → reload."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from joynexus.errors import InvalidRequestError, ModelNotFoundError, SchemaMismatchError
from joynexus.models import backbone as backbone_module
from joynexus.models.backbone import ResidentBaseModel
from joynexus.models.batch import ObservationBatch
from joynexus.models.canon.canonicalize import resize_with_pad
from joynexus.models.schema import LIBERO, PUSHT, CameraSpec, DataSchema, schema_signature
from joynexus.utils.intra_op import thread_intra_op_threads
from tests.models.conftest import TinyBackbone, TinyModelDir


def test_loads_frozen_in_eval_mode_with_fp32_on_cpu(tiny_backbone: TinyBackbone) -> None:
    base = tiny_backbone("qwen2_5_vl")
    assert base.arch == "qwen2_5_vl"
    assert base.dtype == torch.float32 and base.device == torch.device("cpu")
    assert not base.model.training
    assert all(not p.requires_grad for p in base.model.parameters())
    assert base.hidden_size == 128
    assert base.canonical_image_size == 56 and base.num_camera_slots == 2
    n = sum(p.numel() for p in base.model.parameters())
    assert base.parameter_bytes() == 4 * n


def test_encode_builds_no_graph_even_under_enable_grad(tiny_backbone: TinyBackbone) -> None:
    base = tiny_backbone("qwen3_vl")
    feature = base.canonicalize([("t", PUSHT, ObservationBatch.synthetic(PUSHT, 2, seed=0))])
    with torch.enable_grad():
        out = base.encode(feature)
    assert not out.hidden_states.requires_grad
    assert out.hidden_states.grad_fn is None
    assert out.hidden_states.shape[:2] == out.attention_mask.shape
    assert out.hidden_size == base.hidden_size


def test_output_layers(tiny_model_dir: TinyModelDir) -> None:
    base = ResidentBaseModel.from_pretrained(
        str(tiny_model_dir("qwen2_5_vl")), output_layers=[1, -1]
    )
    out = base.encode(
        base.canonicalize([("t", PUSHT, ObservationBatch.synthetic(PUSHT, 1, seed=0))])
    )
    assert out.layers is not None and set(out.layers) == {1, -1}
    assert out.layers[1].shape == out.hidden_states.shape
    assert not torch.equal(out.layers[1], out.hidden_states)
    with pytest.raises(InvalidRequestError, match="output_layers"):
        ResidentBaseModel.from_pretrained(str(tiny_model_dir("qwen2_5_vl")), output_layers=[7])


def test_missing_model_names_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    missing = tmp_path / "no-such-model"
    with pytest.raises(ModelNotFoundError, match="no-such-model") as info:
        ResidentBaseModel.from_pretrained(str(missing))
    assert info.value.http_status == 404
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ModelNotFoundError, match="empty"):
        ResidentBaseModel.from_pretrained(str(empty))
    # A hub id in offline mode resolves only from the local cache: never downloads.
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    with pytest.raises(ModelNotFoundError, match="joynexus-test/definitely-missing"):
        ResidentBaseModel.from_pretrained("joynexus-test/definitely-missing")


def test_bad_canonical_size_and_too_many_cameras(
    tiny_model_dir: TinyModelDir, tiny_backbone: TinyBackbone
) -> None:
    with pytest.raises(InvalidRequestError, match="multiple of 28"):
        ResidentBaseModel.from_pretrained(
            str(tiny_model_dir("qwen2_5_vl")), canonical_image_size=50
        )
    base = tiny_backbone("qwen2_5_vl")
    three = DataSchema(
        cameras={n: CameraSpec(height=16, width=16) for n in ("a", "b", "c")},
        state_dim=1,
        action_dim=1,
    )
    with pytest.raises(SchemaMismatchError, match="3 cameras but the base model has 2"):
        base.canonicalize([("t", three, ObservationBatch.synthetic(three, 1, seed=0))])


def test_canonicalize_validates_every_group(tiny_backbone: TinyBackbone) -> None:
    base = tiny_backbone("qwen2_5_vl")
    good = ObservationBatch.synthetic(LIBERO, 1, seed=0)
    bad = dataclasses.replace(
        ObservationBatch.synthetic(PUSHT, 1, seed=0), state=np.zeros((1, 3), np.float32)
    )
    with pytest.raises(SchemaMismatchError, match=r"state: expected shape \[1, 2\]"):
        base.canonicalize([("a", LIBERO, good), ("b", PUSHT, bad)])
    with pytest.raises(InvalidRequestError, match="appears twice"):
        base.canonicalize([("a", LIBERO, good), ("a", LIBERO, good)])
    with pytest.raises(InvalidRequestError, match="at least one"):
        base.canonicalize([])
    feature = base.canonicalize([("a", LIBERO, good)])
    with pytest.raises(InvalidRequestError, match="no rows"):
        feature.slice_of("zzz")
    with pytest.raises(InvalidRequestError, match="first dimension 1"):
        feature.split(torch.zeros(3, 2))


def test_signatures_are_deterministic(
    tiny_model_dir: TinyModelDir, tiny_backbone: TinyBackbone
) -> None:
    base = tiny_backbone("qwen2_5_vl")
    again = ResidentBaseModel.from_pretrained(str(tiny_model_dir("qwen2_5_vl")))
    assert base.signature_for(LIBERO) == again.signature_for(LIBERO)
    assert base.signature_for(LIBERO) == schema_signature(
        LIBERO, base_model_id=base.model_id, canonical_image_size=56
    )
    assert base.signature_for(LIBERO) != base.signature_for(PUSHT)
    # Asked again (from the backbone's table), every field the signature reads still counts
    # and the tenant-facing ones still do not.
    for _ in range(2):
        assert base.signature_for(PUSHT) == schema_signature(
            PUSHT, base_model_id=base.model_id, canonical_image_size=56
        )
        chunked = PUSHT.model_copy(update={"action_chunk": PUSHT.action_chunk + 1})
        assert base.signature_for(chunked) != base.signature_for(PUSHT)
        renamed = PUSHT.model_copy(update={"name": "other", "fps": 3.0})
        assert base.signature_for(renamed) == base.signature_for(PUSHT)
    assert base.prefix_key() == again.prefix_key()
    other = tiny_backbone("qwen3_vl")
    assert other.prefix_key() != base.prefix_key()
    assert other.signature_for(LIBERO) != base.signature_for(LIBERO)


@pytest.mark.parametrize("arch", ["qwen2_5_vl", "qwen3_vl"])
def test_save_then_reload_gives_identical_features(
    arch: str, tiny_backbone: TinyBackbone, tmp_path: Path
) -> None:
    base = tiny_backbone(arch)
    base.model.save_pretrained(tmp_path)
    base.processor.save_pretrained(tmp_path)
    reloaded = ResidentBaseModel.from_pretrained(
        str(tmp_path), canonical_image_size=base.canonical_image_size
    )
    groups = [
        ("a", LIBERO, ObservationBatch.synthetic(LIBERO, 2, seed=5)),
        ("b", PUSHT, ObservationBatch.synthetic(PUSHT, 1, seed=6)),
    ]
    f1, f2 = base.canonicalize(groups), reloaded.canonicalize(groups)
    assert f1.model_inputs.keys() == f2.model_inputs.keys()
    for key in f1.model_inputs:
        assert torch.equal(f1.model_inputs[key], f2.model_inputs[key]), key
    assert torch.equal(base.encode(f1).hidden_states, reloaded.encode(f2).hidden_states)


def test_small_canonicalizations_run_serially_and_equal_the_parallel_ones(
    tiny_backbone: TinyBackbone, monkeypatch: pytest.MonkeyPatch
) -> None:
    base = tiny_backbone("qwen2_5_vl")
    threads: list[int] = []
    inner = backbone_module.canonicalize

    def recording(*args: Any, **kwargs: Any) -> Any:
        threads.append(thread_intra_op_threads())
        return inner(*args, **kwargs)

    monkeypatch.setattr(backbone_module, "canonicalize", recording)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        one = [("a", LIBERO, ObservationBatch.synthetic(LIBERO, 1, seed=3))]
        many = [("a", LIBERO, ObservationBatch.synthetic(LIBERO, 4, seed=3))]
        size = base.canonical_image_size
        # Between one row's pixels (2 slots) and four rows'.
        monkeypatch.setattr(backbone_module, "SERIAL_CANONICALIZE_PIXELS", 3 * size * size)
        serial = base.canonicalize(one)
        parallel = base.canonicalize(many)  # 4 rows x 2 slots: above the serial limit
        monkeypatch.setattr(backbone_module, "SERIAL_CANONICALIZE_PIXELS", 0)
        one_parallel = base.canonicalize(one)
    finally:
        torch.set_num_threads(before)
    assert threads == [1, 2, 2]
    assert parallel.batch_size == 4
    for key, value in serial.model_inputs.items():
        assert torch.equal(value, one_parallel.model_inputs[key]), key


def test_resize_with_pad_into_a_zeroed_slot_writes_only_the_image() -> None:
    wide = np.full((2, 20, 40, 3), 200, np.uint8)
    images = torch.zeros((2, 2, 3, 40, 40), dtype=torch.uint8)
    out = resize_with_pad(wide, 40, into=images[:, 1])
    assert out.data_ptr() == images[:, 1].data_ptr()
    assert torch.equal(images[:, 1], resize_with_pad(wide, 40))
    assert int(images[:, 0].max()) == 0


def test_resize_with_pad_keeps_aspect_and_centres() -> None:
    wide = np.full((1, 20, 40, 3), 200, np.uint8)
    out = resize_with_pad(wide, 40)
    assert out.shape == (1, 3, 40, 40) and out.dtype == torch.uint8
    # 20×40 → 20×40 (no scaling needed on the long side), padded 10 rows above/below.
    assert int(out[0, :, :10].max()) == 0 and int(out[0, :, 30:].max()) == 0
    assert int(out[0, :, 10:30].min()) == 200
    tall_gray = np.full((2, 64, 32, 1), 50, np.uint8)
    out = resize_with_pad(tall_gray, 32)
    assert out.shape == (2, 3, 32, 32)
    assert int(out[:, :, :, :8].max()) == 0 and int(out[:, :, :, 24:].max()) == 0
    assert int(out[:, :, :, 8:24].min()) == 50
    same = np.arange(2 * 8 * 8 * 3, dtype=np.uint8).reshape(2, 8, 8, 3)
    assert torch.equal(resize_with_pad(same, 8), torch.from_numpy(same).permute(0, 3, 1, 2))


def test_the_forward_split_is_measured_by_default_and_an_unknown_kind_is_refused(
    tiny_backbone: TinyBackbone, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.conftest import SHIPPED_FORWARD_SPLIT

    assert SHIPPED_FORWARD_SPLIT == "measured"
    base = tiny_backbone("qwen2_5_vl")
    assert base.forward_split == "size"  # the suite pins the size rule (tests/conftest.py)
    monkeypatch.setattr(backbone_module, "DEFAULT_FORWARD_SPLIT", "measured")
    model = ResidentBaseModel.from_pretrained(str(base.source))
    assert model.forward_split == "measured"
    base = model
    with pytest.raises(InvalidRequestError, match="forward_split must be one of") as err:
        base.use_forward_split("fastest")  # type: ignore[arg-type]  # the wrong kind on purpose
    assert err.value.details["field"] == "forward_split"
    assert base.forward_split == "measured"
    with pytest.raises(InvalidRequestError, match="canonicalizer must be one of"):
        base.use_canonicalizer("pixels")  # type: ignore[arg-type]  # the wrong kind on purpose
