"""ObservationBatch: validation errors name the field; synthetic data is deterministic."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from joynexus.errors import SchemaMismatchError
from joynexus.models.batch import ObservationBatch
from joynexus.models.schema import LIBERO, PUSHT, CameraSpec, DataSchema

SMALL = DataSchema(
    name="small",
    cameras={"front": CameraSpec(height=32, width=40), "wrist": CameraSpec(height=16, width=16)},
    state_dim=3,
    action_dim=2,
    action_chunk=4,
)


def test_synthetic_matches_schema_and_is_deterministic() -> None:
    a = ObservationBatch.synthetic(SMALL, 3, seed=7)
    b = ObservationBatch.synthetic(SMALL, 3, seed=7)
    c = ObservationBatch.synthetic(SMALL, 3, seed=8)
    a.validate(SMALL)
    assert a.batch_size == 3
    assert a.cameras["front"].shape == (3, 32, 40, 3)
    assert a.state.shape == (3, 3) and a.state.dtype == np.float32
    assert a.actions is not None and a.actions.shape == (3, 4, 2)
    assert all(np.array_equal(a.cameras[k], b.cameras[k]) for k in a.cameras)
    assert np.array_equal(a.state, b.state) and a.instructions == b.instructions
    assert not np.array_equal(a.state, c.state)
    assert ObservationBatch.synthetic(SMALL, 2, seed=0, with_actions=False).actions is None


def test_zero_state_dim_is_valid() -> None:
    schema = SMALL.model_copy(update={"state_dim": 0})
    batch = ObservationBatch.synthetic(schema, 2, seed=0)
    assert batch.state.shape == (2, 0)
    batch.validate(schema)


def _expect(batch: ObservationBatch, *fragments: str) -> None:
    with pytest.raises(SchemaMismatchError) as info:
        batch.validate(SMALL)
    for fragment in fragments:
        assert fragment in str(info.value)
    assert info.value.code == "schema_mismatch"


def test_validation_names_field_and_expected_shape() -> None:
    good = ObservationBatch.synthetic(SMALL, 2, seed=0)
    cams = dict(good.cameras)

    missing = {k: v for k, v in cams.items() if k != "wrist"}
    _expect(dataclasses.replace(good, cameras=missing), "cameras", "missing ['wrist']")
    _expect(dataclasses.replace(good, cameras={**cams, "top": cams["wrist"]}), "top")
    wrong_hw = {**cams, "front": np.zeros((2, 40, 32, 3), np.uint8)}
    _expect(dataclasses.replace(good, cameras=wrong_hw), "cameras.front", "[2, 32, 40, 3]")
    wrong_c = {**cams, "front": np.zeros((2, 32, 40, 4), np.uint8)}
    _expect(dataclasses.replace(good, cameras=wrong_c), "cameras.front", "[2, 32, 40, 3]")
    wrong_dtype = {**cams, "front": cams["front"].astype(np.float32)}
    _expect(dataclasses.replace(good, cameras=wrong_dtype), "cameras.front", "uint8")
    _expect(dataclasses.replace(good, state=np.zeros((2, 5), np.float32)), "state", "[2, 3]")
    _expect(dataclasses.replace(good, state=good.state.astype(np.float64)), "state", "float32")
    nan_state = good.state.copy()
    nan_state[1, 0] = np.nan
    _expect(dataclasses.replace(good, state=nan_state), "state", "NaN")
    bad_actions = np.zeros((2, 4, 3), np.float32)
    _expect(dataclasses.replace(good, actions=bad_actions), "actions", "[2, 4, 2]")
    inf_actions = np.zeros((2, 4, 2), np.float32)
    inf_actions[0, 0, 0] = np.inf
    _expect(dataclasses.replace(good, actions=inf_actions), "actions", "inf")
    _expect(dataclasses.replace(good, instructions=["only one"]), "[1, 32, 40, 3]")
    _expect(dataclasses.replace(good, instructions=[]), "instructions")


def test_concat_keeps_row_order() -> None:
    a = ObservationBatch.synthetic(PUSHT, 2, seed=1)
    b = ObservationBatch.synthetic(PUSHT, 3, seed=2)
    ab = ObservationBatch.concat([a, b])
    ab.validate(PUSHT)
    assert ab.batch_size == 5
    assert np.array_equal(ab.cameras["top"][2:], b.cameras["top"])
    assert ab.actions is not None and np.array_equal(ab.actions[:2], a.actions)
    with pytest.raises(SchemaMismatchError, match="cameras"):
        ObservationBatch.concat([a, ObservationBatch.synthetic(LIBERO, 1, seed=0)])
