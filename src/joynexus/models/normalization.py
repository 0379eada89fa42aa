"""A tenant's normalization statistics for state and actions (mean/std or quantiles).

Normalization statistics belong to the tenant, not the dataset: they are picked once
from a dataset's ``meta/stats.json`` content (:meth:`NormalizationStats.from_dataset_stats`;
mean/std, or q01/q99 quantiles, as the tenant chooses), travel with the tenant's slot,
payloads and checkpoints (:meth:`NormalizationStats.save` / :meth:`~NormalizationStats.load`),
and map predicted actions back to robot units at inference time
(:meth:`NormalizationStats.unnormalize`). The SFT batch builder
(:mod:`joynexus.data.sft`) normalizes with them.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from joynexus.errors import DatasetError, SchemaMismatchError
from joynexus.utils.files import atomic_write_bytes

__all__ = ["RELATIVE_SCALE_FLOOR", "FeatureNormStats", "NormMode", "NormalizationStats"]

NormMode = Literal["mean_std", "quantile"]

#: Smallest scale of a dimension, relative to its center's magnitude. A constant
#: dimension (std 0: a gripper held closed in every demonstration, at -1) floored at
#: ``eps`` = 1e-6 alone loses its normalized value on the way through float32 robot
#: units (-1 + 1e-6 x rounds to steps of 0.06–0.12 in x), so a sampled action came back
#: from the environment as another action than the one whose log-probability the
#: rollout recorded, and RL's importance ratios were off before any update (PPO clipped
#: 70 % of the samples of its first step). At 1e-3 the round trip errs by ~1e-4.
RELATIVE_SCALE_FLOOR = 1e-3


class FeatureNormStats(BaseModel):
    """Per-element statistics of one vector feature."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    mean: list[float] = Field(min_length=1)
    std: list[float] = Field(min_length=1)
    q01: list[float] = Field(min_length=1)
    q99: list[float] = Field(min_length=1)

    @model_validator(mode="after")
    def _same_length(self) -> FeatureNormStats:
        n = len(self.mean)
        if any(len(v) != n for v in (self.std, self.q01, self.q99)):
            raise ValueError("mean, std, q01 and q99 must have the same length")
        return self

    @property
    def dim(self) -> int:
        return len(self.mean)


class NormalizationStats(BaseModel):
    """How one tenant normalizes state and actions.

    ``mean_std``: ``(x - mean) / std``. ``quantile``: ``2 (x - q01) / (q99 - q01) - 1``
    (q01..q99 → -1..1, not clipped, so it stays invertible). Denominators are floored
    at ``eps`` so constant dimensions map to 0 instead of dividing by zero, and at
    ``RELATIVE_SCALE_FLOOR`` × |center| so that float32 can carry a normalized value
    through robot units and back (see :data:`RELATIVE_SCALE_FLOOR`).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    mode: NormMode = "mean_std"
    state: FeatureNormStats | None = None
    action: FeatureNormStats
    eps: float = Field(default=1e-6, gt=0)

    @classmethod
    def from_dataset_stats(
        cls,
        stats: Mapping[str, Mapping[str, np.ndarray]],
        *,
        action_key: str,
        state_key: str | None,
        mode: NormMode = "mean_std",
    ) -> NormalizationStats:
        """Pick the tenant's stats out of a dataset's ``stats.json`` content.

        Raises:
            DatasetError: a key or one of mean/std/q01/q99 is missing.
        """

        def pick(key: str) -> FeatureNormStats:
            if key not in stats:
                raise DatasetError(
                    f"dataset statistics have no entry for {key!r} (have {list(stats)})",
                    feature=key,
                )
            feat = stats[key]
            missing = [n for n in ("mean", "std", "q01", "q99") if n not in feat]
            if missing:
                raise DatasetError(
                    f"dataset statistics of {key!r} lack {missing}; recompute them with "
                    "quantiles (datasets written by JoyNexus have them)",
                    feature=key,
                    missing=missing,
                )
            return FeatureNormStats(
                **{
                    n: np.asarray(feat[n], dtype=np.float64).reshape(-1).tolist()
                    for n in ("mean", "std", "q01", "q99")
                }
            )

        return cls(
            mode=mode,
            state=pick(state_key) if state_key is not None else None,
            action=pick(action_key),
        )

    def center_scale(self, which: Literal["state", "action"]) -> tuple[np.ndarray, np.ndarray]:
        """The ``(center, scale)`` that :meth:`normalize` uses, floors applied:
        ``normalized = (x - center) / scale`` (what an exported policy must use too).

        Raises:
            SchemaMismatchError: no statistics for ``which``.
        """
        feat = self.state if which == "state" else self.action
        if feat is None:
            raise SchemaMismatchError(f"normalization stats hold no {which} statistics")
        if self.mode == "mean_std":
            center = np.asarray(feat.mean, np.float64)
            scale = np.asarray(feat.std, np.float64)
        else:
            lo, hi = np.asarray(feat.q01, np.float64), np.asarray(feat.q99, np.float64)
            center = (lo + hi) / 2.0
            scale = (hi - lo) / 2.0
        floor = np.maximum(self.eps, RELATIVE_SCALE_FLOOR * np.abs(center))
        return center, np.maximum(scale, floor)

    def _check(self, x: np.ndarray, which: str, dim: int) -> None:
        if x.shape[-1:] != (dim,):
            raise SchemaMismatchError(
                f"{which}: last dimension must be {dim} to match the normalization stats, "
                f"got shape {list(x.shape)}",
                field=which,
            )

    def normalize(self, x: np.ndarray, which: Literal["state", "action"]) -> np.ndarray:
        """Robot units → normalized float32 (any leading shape, last dim = feature dim)."""
        center, scale = self.center_scale(which)
        arr = np.asarray(x, dtype=np.float64)
        self._check(arr, which, center.shape[0])
        out: np.ndarray = ((arr - center) / scale).astype(np.float32)
        return out

    def unnormalize(self, x: np.ndarray, which: Literal["state", "action"]) -> np.ndarray:
        """Normalized values → robot units (inverse of :meth:`normalize`)."""
        center, scale = self.center_scale(which)
        arr = np.asarray(x, dtype=np.float64)
        self._check(arr, which, center.shape[0])
        out: np.ndarray = (arr * scale + center).astype(np.float32)
        return out

    def save(self, path: str | Path) -> None:
        """Write as JSON (atomically)."""
        atomic_write_bytes(Path(path), self.model_dump_json(indent=2).encode())

    @classmethod
    def load(cls, path: str | Path) -> NormalizationStats:
        """Read what :meth:`save` wrote.

        Raises:
            DatasetError: the file is missing or does not validate.
        """
        p = Path(path)
        if not p.is_file():
            raise DatasetError(f"{p}: normalization stats file missing", file=str(p))
        try:
            return cls.model_validate_json(p.read_text())
        except ValueError as exc:
            raise DatasetError(f"{p}: invalid normalization stats ({exc})", file=str(p)) from exc
