"""Dataset samples → tenant-schema SFT batches, with the tenant's normalization stats.

A tenant trains on its own :class:`~joynexus.models.schema.DataSchema`. The
:class:`SFTBatchBuilder` maps dataset feature keys onto that schema (camera names,
state, action), reads ``action_chunk`` future actions per sample through
``delta_timestamps`` (with a padding mask at episode ends), normalizes state and
actions with the tenant's :class:`~joynexus.models.normalization.NormalizationStats`
(computed once from the dataset's ``meta/stats.json``) and emits
:class:`~joynexus.models.batch.ObservationBatch` objects.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image
from pydantic import BaseModel, ConfigDict, Field

from joynexus.data.lerobot_format import FeatureSpec
from joynexus.data.reader import DEFAULT_TOLERANCE_S, LeRobotDataset
from joynexus.data.stats import array_stats
from joynexus.errors import SchemaMismatchError
from joynexus.models.batch import ObservationBatch
from joynexus.models.normalization import NormalizationStats, NormMode
from joynexus.models.schema import DataSchema

__all__ = [
    "SFTBatch",
    "SFTBatchBuilder",
    "SFTFeatureMap",
]


class SFTFeatureMap(BaseModel):
    """Which dataset feature fills which part of the tenant schema.

    Args:
        cameras: Schema camera name → dataset image/video feature key.
        state: Dataset feature holding the state vector (``None`` when the schema has
            ``state_dim == 0``).
        action: Dataset feature holding the action vector.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    cameras: dict[str, str] = Field(min_length=1)
    state: str | None = "observation.state"
    action: str = "action"

    @classmethod
    def infer(cls, schema: DataSchema, features: Mapping[str, FeatureSpec]) -> SFTFeatureMap:
        """LeRobot naming: camera ``c`` → ``observation.images.c`` (or the only camera).

        Raises:
            SchemaMismatchError: a schema camera has no obvious dataset feature.
        """
        visual = [k for k, f in features.items() if f.is_visual]
        cams: dict[str, str] = {}
        for name in schema.camera_names:
            for key in (f"observation.images.{name}", f"observation.{name}", name):
                if key in visual:
                    cams[name] = key
                    break
            else:
                if len(schema.cameras) == 1 and len(visual) == 1:
                    cams[name] = visual[0]
                else:
                    raise SchemaMismatchError(
                        f"no dataset feature for schema camera {name!r}; image/video "
                        f"features are {visual}: pass an explicit SFTFeatureMap",
                        field=f"cameras.{name}",
                    )
        state = "observation.state" if schema.state_dim > 0 else None
        return cls(cameras=cams, state=state, action="action")


@dataclass(frozen=True)
class SFTBatch:
    """One SFT batch: the tenant-schema observations + normalized action chunks.

    Attributes:
        observations: ``ObservationBatch`` with ``actions`` ``[B, chunk, A]`` (normalized)
            and normalized ``state``.
        action_is_pad: bool ``[B, chunk]``; True where the chunk ran past the episode
            end (the action there repeats the last one and should be masked in the loss).
        indices: The dataset frame indices of the ``B`` samples.
    """

    observations: ObservationBatch
    action_is_pad: np.ndarray
    indices: np.ndarray


def _resize(image: np.ndarray, height: int, width: int) -> np.ndarray:
    if image.shape[:2] == (height, width):
        return image
    squeeze = image.shape[-1] == 1
    pil = Image.fromarray(image[..., 0] if squeeze else image)
    out = np.asarray(pil.resize((width, height), Image.Resampling.BILINEAR))
    return out[..., None] if squeeze else out


class SFTBatchBuilder:
    """Builds tenant-schema SFT batches from a LeRobot dataset.

    Args:
        root: Dataset directory.
        schema: The tenant's data schema.
        feature_map: Dataset → schema mapping; inferred from LeRobot names when omitted.
        normalization: The tenant's stats; computed from the dataset when omitted
            (then available as :attr:`normalization` to save with the tenant).
        norm_mode: ``mean_std`` or ``quantile`` when computing stats here.
        tolerance_s: Passed to :class:`LeRobotDataset`.

    Raises:
        SchemaMismatchError: a mapped feature is missing or its shape does not match the
            schema (state/action dimension, camera channels).
        DatasetError: the dataset is malformed.
    """

    def __init__(
        self,
        root: str | Path,
        schema: DataSchema,
        feature_map: SFTFeatureMap | None = None,
        *,
        normalization: NormalizationStats | None = None,
        norm_mode: NormMode = "mean_std",
        tolerance_s: float = DEFAULT_TOLERANCE_S,
    ) -> None:
        probe = LeRobotDataset(root, tolerance_s=tolerance_s)
        self.schema = schema
        self.feature_map = feature_map or SFTFeatureMap.infer(schema, probe.features)
        self._check_mapping(probe.features)
        fps = probe.fps
        chunk = [k / fps for k in range(schema.action_chunk)]
        self.dataset = LeRobotDataset(
            root, delta_timestamps={self.feature_map.action: chunk}, tolerance_s=tolerance_s
        )
        self.normalization = normalization or self._compute_normalization(norm_mode)
        if self.normalization.action.dim != schema.action_dim:
            raise SchemaMismatchError(
                f"normalization action stats have {self.normalization.action.dim} dims, "
                f"schema action_dim is {schema.action_dim}",
                field="actions",
            )

    def __len__(self) -> int:
        return len(self.dataset)

    def _check_mapping(self, features: Mapping[str, FeatureSpec]) -> None:
        fm, schema = self.feature_map, self.schema
        missing_cams = [c for c in schema.camera_names if c not in fm.cameras]
        if missing_cams:
            raise SchemaMismatchError(
                f"feature map has no dataset feature for schema cameras {missing_cams}",
                field="cameras",
            )
        for cam, key in fm.cameras.items():
            if cam not in schema.cameras:
                raise SchemaMismatchError(
                    f"feature map camera {cam!r} is not in schema cameras {schema.camera_names}",
                    field="cameras",
                )
            spec = features.get(key)
            if spec is None or not spec.is_visual:
                raise SchemaMismatchError(
                    f"cameras.{cam}: dataset has no image/video feature {key!r}",
                    field=f"cameras.{cam}",
                )
            if spec.image_hwc()[2] != schema.cameras[cam].channels:
                raise SchemaMismatchError(
                    f"cameras.{cam}: dataset feature {key!r} has {spec.image_hwc()[2]} "
                    f"channels, schema expects {schema.cameras[cam].channels}",
                    field=f"cameras.{cam}",
                )
        vectors = [("action", fm.action, schema.action_dim)]
        if schema.state_dim > 0:
            if fm.state is None:
                raise SchemaMismatchError(
                    f"schema has state_dim={schema.state_dim} but the feature map has no state",
                    field="state",
                )
            vectors.append(("state", fm.state, schema.state_dim))
        for field, key, dim in vectors:
            spec = features.get(key)
            if spec is None or spec.is_visual or spec.dtype == "string":
                raise SchemaMismatchError(
                    f"{field}: dataset has no numeric feature {key!r}", field=field
                )
            if spec.shape != (dim,):
                raise SchemaMismatchError(
                    f"{field}: dataset feature {key!r} has shape {list(spec.shape)}, schema "
                    f"expects [{dim}]",
                    field=field,
                    expected_shape=[dim],
                    shape=list(spec.shape),
                )

    def _compute_normalization(self, mode: NormMode) -> NormalizationStats:
        fm = self.feature_map
        state_key = fm.state if self.schema.state_dim > 0 else None
        stats = dict(self.dataset.meta.stats or {})
        for key in (fm.action, state_key):
            if key is not None and not {"mean", "std", "q01", "q99"} <= set(stats.get(key, {})):
                # v2.x datasets carry no quantiles: compute them from the data itself.
                stats[key] = array_stats(self.dataset.column(key))
        return NormalizationStats.from_dataset_stats(
            stats, action_key=fm.action, state_key=state_key, mode=mode
        )

    def build(self, indices: Sequence[int] | np.ndarray) -> SFTBatch:
        """The batch of the given dataset frame indices (in that order)."""
        idx = np.asarray(indices, dtype=np.int64)
        if idx.size == 0:
            raise ValueError("a batch needs at least one index")
        fm, schema = self.feature_map, self.schema
        cams: dict[str, list[np.ndarray]] = {c: [] for c in schema.camera_names}
        states, actions, pads, texts = [], [], [], []
        for i in idx:
            item = self.dataset[int(i)]
            for cam in schema.camera_names:
                spec = schema.cameras[cam]
                cams[cam].append(_resize(item[fm.cameras[cam]], spec.height, spec.width))
            if schema.state_dim > 0 and fm.state is not None:
                states.append(np.asarray(item[fm.state], np.float32))
            actions.append(np.asarray(item[fm.action], np.float32))
            pads.append(item[f"{fm.action}_is_pad"])
            texts.append(item["task"] or schema.instruction)
        b = len(idx)
        norm = self.normalization
        state = (
            norm.normalize(np.stack(states), "state")
            if states
            else np.zeros((b, 0), dtype=np.float32)
        )
        batch = ObservationBatch(
            cameras={c: np.stack(v).astype(np.uint8) for c, v in cams.items()},
            state=state,
            instructions=texts,
            actions=norm.normalize(np.stack(actions), "action"),
        )
        batch.validate(schema)
        return SFTBatch(observations=batch, action_is_pad=np.stack(pads), indices=idx)

    def sample(self, num_samples: int, seed: int) -> SFTBatch:
        """``num_samples`` random frames (without replacement when the dataset is large
        enough); the same seed gives the same batch."""
        if num_samples <= 0:
            raise ValueError(f"num_samples must be positive, got {num_samples}")
        rng = np.random.default_rng(seed)
        n = len(self.dataset)
        return self.build(rng.choice(n, size=num_samples, replace=num_samples > n))

    def batches(self, batch_size: int, *, seed: int, drop_last: bool = False) -> Iterator[SFTBatch]:
        """One epoch in a seeded random order, ``batch_size`` frames per batch."""
        if batch_size <= 0:
            raise ValueError(f"batch_size must be positive, got {batch_size}")
        order = np.random.default_rng(seed).permutation(len(self.dataset))
        for start in range(0, len(order), batch_size):
            part = order[start : start + batch_size]
            if drop_last and len(part) < batch_size:
                return
            yield self.build(part)
