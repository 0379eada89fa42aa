"""One tenant's batch of observations (and optional action targets), as numpy arrays.

:class:`ObservationBatch` is the tenant-facing form of model input: raw camera images
at the tenant's own resolution, the robot state and the instruction per sample. The
resident base model canonicalizes many of these (one per tenant) into a single
:class:`~joynexus.models.canon.feature.VLAFeature`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from joynexus.errors import SchemaMismatchError
from joynexus.models.schema import DataSchema

# Short instructions of different lengths, so synthetic batches exercise padding.
_SYNTHETIC_INSTRUCTIONS = (
    "pick up the red block",
    "open the top drawer of the cabinet",
    "push the T-shaped block onto the target",
    "put the bowl on the plate",
    "turn on the stove and put the pot on it",
    "close the microwave",
)


@dataclass(frozen=True)
class ObservationBatch:
    """A batch of ``B`` observations of one tenant.

    Attributes:
        cameras: Camera name → ``uint8 [B, H, W, C]`` images, in the schema's order.
        state: ``float32 [B, state_dim]`` (``[B, 0]`` when the schema has no state).
        instructions: ``B`` language instructions.
        actions: Optional ``float32 [B, action_chunk, action_dim]`` targets (SFT).
    """

    cameras: dict[str, np.ndarray]
    state: np.ndarray
    instructions: list[str]
    actions: np.ndarray | None = None

    @property
    def batch_size(self) -> int:
        return len(self.instructions)

    def validate(self, schema: DataSchema) -> None:
        """Check every field against ``schema``.

        Raises:
            SchemaMismatchError: naming the field and the expected shape/dtype when a
                camera is missing or extra, an image has the wrong shape or dtype, the
                state/action dimensions or dtypes are wrong, state/actions hold NaN or
                inf, or the per-field batch sizes disagree.
        """
        b = self.batch_size
        if b == 0:
            raise SchemaMismatchError(
                "instructions: a batch needs at least one sample", field="instructions"
            )
        for i, text in enumerate(self.instructions):
            if not isinstance(text, str):
                raise SchemaMismatchError(
                    f"instructions[{i}]: expected str, got {type(text).__name__}",
                    field="instructions",
                )
        expected_cams = schema.camera_names
        missing = [c for c in expected_cams if c not in self.cameras]
        extra = [c for c in self.cameras if c not in schema.cameras]
        if missing or extra:
            raise SchemaMismatchError(
                f"cameras: expected {expected_cams} for schema {schema.name!r}, "
                f"missing {missing}, unexpected {extra}",
                field="cameras",
                expected=expected_cams,
                missing=missing,
                extra=extra,
            )
        for name, spec in schema.cameras.items():
            img = self.cameras[name]
            field = f"cameras.{name}"
            expected_shape = (b, *spec.shape)
            if not isinstance(img, np.ndarray):
                raise SchemaMismatchError(
                    f"{field}: expected a numpy array uint8 {list(expected_shape)}, "
                    f"got {type(img).__name__}",
                    field=field,
                )
            if img.dtype != np.uint8:
                raise SchemaMismatchError(
                    f"{field}: expected dtype uint8, got {img.dtype}",
                    field=field,
                    expected_dtype="uint8",
                    dtype=str(img.dtype),
                )
            if tuple(img.shape) != expected_shape:
                raise SchemaMismatchError(
                    f"{field}: expected shape [B, H, W, C] = {list(expected_shape)}, "
                    f"got {list(img.shape)}",
                    field=field,
                    expected_shape=list(expected_shape),
                    shape=list(img.shape),
                )
        _check_float_array(self.state, "state", (b, schema.state_dim))
        if self.actions is not None:
            _check_float_array(self.actions, "actions", (b, schema.action_chunk, schema.action_dim))

    @classmethod
    def concat(cls, batches: list[ObservationBatch]) -> ObservationBatch:
        """Rows of several batches of the same schema, in order (e.g. one tenant's
        requests from different sessions, before canonicalization).

        Raises:
            SchemaMismatchError: When the batches have different camera sets, or only
                some carry actions.
        """
        if not batches:
            raise SchemaMismatchError("concat: expected at least one batch", field="batches")
        names = list(batches[0].cameras)
        with_actions = batches[0].actions is not None
        for b in batches[1:]:
            if list(b.cameras) != names:
                raise SchemaMismatchError(
                    f"cameras: cannot concatenate batches with cameras {names} and "
                    f"{list(b.cameras)}",
                    field="cameras",
                )
            if (b.actions is not None) != with_actions:
                raise SchemaMismatchError(
                    "actions: either every batch carries actions or none does",
                    field="actions",
                )
        actions = None
        if with_actions:
            actions = np.concatenate([b.actions for b in batches if b.actions is not None])
        return cls(
            cameras={n: np.concatenate([b.cameras[n] for b in batches]) for n in names},
            state=np.concatenate([b.state for b in batches]),
            instructions=[t for b in batches for t in b.instructions],
            actions=actions,
        )

    @classmethod
    def synthetic(
        cls,
        schema: DataSchema,
        batch_size: int,
        *,
        seed: int,
        with_actions: bool = True,
    ) -> ObservationBatch:
        """Deterministic random data that satisfies ``schema`` (tests, benchmarks).

        Same ``(schema, batch_size, seed)`` → identical arrays on every machine.
        """
        if batch_size <= 0:
            raise ValueError(f"batch_size must be positive, got {batch_size}")
        rng = np.random.default_rng(seed)
        cameras = {
            name: rng.integers(0, 256, size=(batch_size, *spec.shape), dtype=np.uint8)
            for name, spec in schema.cameras.items()
        }
        state = rng.standard_normal((batch_size, schema.state_dim)).astype(np.float32)
        picks = rng.integers(0, len(_SYNTHETIC_INSTRUCTIONS), size=batch_size)
        instructions = [schema.instruction or _SYNTHETIC_INSTRUCTIONS[int(i)] for i in picks]
        actions = None
        if with_actions:
            actions = np.tanh(
                rng.standard_normal((batch_size, schema.action_chunk, schema.action_dim))
            ).astype(np.float32)
        return cls(cameras=cameras, state=state, instructions=instructions, actions=actions)


def _check_float_array(arr: object, field: str, expected_shape: tuple[int, ...]) -> None:
    if not isinstance(arr, np.ndarray):
        raise SchemaMismatchError(
            f"{field}: expected a numpy array float32 {list(expected_shape)}, "
            f"got {type(arr).__name__}",
            field=field,
        )
    if arr.dtype != np.float32:
        raise SchemaMismatchError(
            f"{field}: expected dtype float32 {list(expected_shape)}, got {arr.dtype}",
            field=field,
            expected_dtype="float32",
            dtype=str(arr.dtype),
        )
    if tuple(arr.shape) != expected_shape:
        raise SchemaMismatchError(
            f"{field}: expected shape {list(expected_shape)}, got {list(arr.shape)}",
            field=field,
            expected_shape=list(expected_shape),
            shape=list(arr.shape),
        )
    if not np.isfinite(arr).all():
        raise SchemaMismatchError(
            f"{field}: contains NaN or inf values (expected finite float32)", field=field
        )
