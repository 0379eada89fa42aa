"""SFT batch building: tenant-schema shapes, action chunks, normalization round trips."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from joynexus.data.sft import SFTBatchBuilder, SFTFeatureMap
from joynexus.errors import DatasetError, SchemaMismatchError
from joynexus.models.batch import ObservationBatch
from joynexus.models.normalization import FeatureNormStats, NormalizationStats
from joynexus.models.schema import CameraSpec, DataSchema
from tests.data.conftest import EPISODE_LENGTHS, SIZE, TASKS, action_of, frame_image, state_of

SCHEMA = DataSchema(
    name="tiny",
    cameras={
        "top": CameraSpec(height=SIZE, width=SIZE),
        "wrist": CameraSpec(height=SIZE, width=SIZE),
    },
    state_dim=3,
    action_dim=2,
    action_chunk=4,
    fps=10.0,
)


def _all(fn: object) -> np.ndarray:
    return np.stack(
        [fn(ep, i) for ep, n in enumerate(EPISODE_LENGTHS) for i in range(n)]  # type: ignore[operator]
    ).astype(np.float64)


def test_batches_have_tenant_schema_shapes(tiny_dataset: Path) -> None:
    builder = SFTBatchBuilder(tiny_dataset, SCHEMA)
    assert builder.feature_map == SFTFeatureMap(
        cameras={"top": "observation.images.top", "wrist": "observation.images.wrist"},
        state="observation.state",
        action="action",
    )
    batch = builder.sample(6, seed=3)
    obs = batch.observations
    assert isinstance(obs, ObservationBatch)
    obs.validate(SCHEMA)
    assert obs.cameras["top"].shape == (6, SIZE, SIZE, 3)
    assert obs.cameras["wrist"].dtype == np.uint8
    assert obs.state.shape == (6, 3) and obs.state.dtype == np.float32
    assert obs.actions is not None and obs.actions.shape == (6, 4, 2)
    assert batch.action_is_pad.shape == (6, 4) and batch.action_is_pad.dtype == bool
    assert set(obs.instructions) <= set(TASKS)


def test_batch_contents_and_chunk_padding(tiny_dataset: Path) -> None:
    builder = SFTBatchBuilder(tiny_dataset, SCHEMA)
    norm = builder.normalization
    # Frame 3 of episode 0 (length 6): actions 3, 4, 5, then padding.
    batch = builder.build([3, 6])
    actions = norm.unnormalize(batch.observations.actions, "action")  # type: ignore[arg-type]
    np.testing.assert_allclose(
        actions[0], np.stack([action_of(0, f) for f in (3, 4, 5, 5)]), atol=1e-4
    )
    assert batch.action_is_pad[0].tolist() == [False, False, False, True]
    assert not batch.action_is_pad[1].any()
    np.testing.assert_allclose(
        norm.unnormalize(batch.observations.state, "state")[1], state_of(1, 0), atol=1e-4
    )
    np.testing.assert_array_equal(batch.observations.cameras["wrist"][1], frame_image(1, 0, 77))
    assert batch.observations.instructions == [TASKS[0], TASKS[1]]
    assert batch.indices.tolist() == [3, 6]


def test_sampling_is_seeded(tiny_dataset: Path) -> None:
    builder = SFTBatchBuilder(tiny_dataset, SCHEMA)
    a, b, c = builder.sample(5, seed=1), builder.sample(5, seed=1), builder.sample(5, seed=2)
    assert a.indices.tolist() == b.indices.tolist()
    assert a.indices.tolist() != c.indices.tolist()
    assert len(set(a.indices.tolist())) == 5  # without replacement
    np.testing.assert_array_equal(a.observations.state, b.observations.state)
    epoch = list(builder.batches(8, seed=0))
    seen = np.concatenate([x.indices for x in epoch])
    assert sorted(seen.tolist()) == list(range(len(builder)))
    assert [len(x.indices) for x in epoch] == [8, 8, 4]
    assert [len(x.indices) for x in builder.batches(8, seed=0, drop_last=True)] == [8, 8]


@pytest.mark.parametrize("mode", ["mean_std", "quantile"])
def test_normalization_uses_dataset_stats_and_round_trips(
    tiny_dataset: Path, tmp_path: Path, mode: str
) -> None:
    builder = SFTBatchBuilder(tiny_dataset, SCHEMA, norm_mode=mode)  # type: ignore[arg-type]
    norm = builder.normalization
    states = _all(state_of)
    assert norm.state is not None
    if mode == "mean_std":
        np.testing.assert_allclose(norm.state.mean, states.mean(0), rtol=1e-6)
        z = norm.normalize(states, "state")
        np.testing.assert_allclose(z.mean(0), 0.0, atol=1e-5)
        np.testing.assert_allclose(z.std(0), 1.0, atol=1e-4)
    else:
        np.testing.assert_allclose(norm.state.q01, np.quantile(states, 0.01, axis=0), rtol=1e-6)
        z = norm.normalize(states, "state")
        np.testing.assert_allclose(
            norm.normalize(np.quantile(states, [0.01, 0.99], axis=0), "state"),
            [[-1, -1, -1], [1, 1, 1]],
            atol=1e-5,
        )
    np.testing.assert_allclose(norm.unnormalize(z, "state"), states, rtol=1e-5, atol=1e-4)
    path = tmp_path / "tenant" / "normalization.json"
    norm.save(path)
    loaded = NormalizationStats.load(path)
    assert loaded == norm
    rebuilt = SFTBatchBuilder(tiny_dataset, SCHEMA, normalization=loaded)
    np.testing.assert_array_equal(
        rebuilt.build([5]).observations.actions, builder.build([5]).observations.actions
    )


def test_constant_dimensions_do_not_blow_up() -> None:
    feat = FeatureNormStats(mean=[1.0, 2.0], std=[0.0, 1.0], q01=[1.0, 0.0], q99=[1.0, 4.0])
    for mode in ("mean_std", "quantile"):
        norm = NormalizationStats(mode=mode, action=feat)  # type: ignore[arg-type]
        x = np.array([[1.0, 3.0]], dtype=np.float32)
        z = norm.normalize(x, "action")
        assert np.isfinite(z).all() and z[0, 0] == 0.0
        np.testing.assert_allclose(norm.unnormalize(z, "action"), x, atol=1e-6)
    with pytest.raises(SchemaMismatchError, match="last dimension must be 2"):
        norm.normalize(np.zeros((1, 3)), "action")
    with pytest.raises(SchemaMismatchError, match="no state statistics"):
        norm.normalize(np.zeros((1, 2)), "state")


def test_load_rejects_bad_files(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match="missing"):
        NormalizationStats.load(tmp_path / "nope.json")
    bad = tmp_path / "bad.json"
    bad.write_text('{"mode": "minmax", "action": {}}')
    with pytest.raises(DatasetError, match="invalid normalization stats"):
        NormalizationStats.load(bad)


def test_schema_mismatch_is_reported(tiny_dataset: Path) -> None:
    wrong_action = SCHEMA.model_copy(update={"action_dim": 7})
    with pytest.raises(
        SchemaMismatchError,
        match=r"action: dataset feature 'action' has shape \[2\], schema expects \[7\]",
    ):
        SFTBatchBuilder(tiny_dataset, wrong_action)
    wrong_state = SCHEMA.model_copy(update={"state_dim": 8})
    with pytest.raises(SchemaMismatchError, match="state"):
        SFTBatchBuilder(tiny_dataset, wrong_state)
    unknown_cam = SCHEMA.model_copy(
        update={"cameras": {"left": CameraSpec(height=SIZE, width=SIZE), **SCHEMA.cameras}}
    )
    with pytest.raises(SchemaMismatchError, match="schema camera 'left'"):
        SFTBatchBuilder(tiny_dataset, unknown_cam)
    bad_map = SFTFeatureMap(cameras={"top": "action", "wrist": "observation.images.wrist"})
    with pytest.raises(SchemaMismatchError, match="no image/video feature 'action'"):
        SFTBatchBuilder(tiny_dataset, SCHEMA, bad_map)


def test_cameras_are_resized_to_the_schema(tiny_dataset: Path) -> None:
    schema = SCHEMA.model_copy(
        update={"cameras": {"top": CameraSpec(height=16, width=24)}, "state_dim": 0}
    )
    builder = SFTBatchBuilder(
        tiny_dataset, schema, SFTFeatureMap(cameras={"top": "observation.images.top"}, state=None)
    )
    obs = builder.sample(2, seed=0).observations
    assert obs.cameras["top"].shape == (2, 16, 24, 3)
    assert obs.state.shape == (2, 0)
    assert builder.normalization.state is None
