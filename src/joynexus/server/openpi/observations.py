"""One openpi observation dict -> one tenant's :class:`ObservationBatch` of one sample.

openpi clients send a flat dict per decision: images under ``observation/<camera>``
(``uint8`` H×W×3; ALOHA's example sends C×H×W, openpi's own input transforms accept
float images in [0, 1] too), the robot state under ``observation/state`` and the
instruction under ``prompt``. :class:`ObservationAdapter` maps those keys — or the ones
the tenant's ``serving.openpi`` section names — onto the tenant's
:class:`~joynexus.models.schema.DataSchema`. An image of another height and width than
the tenant's camera is resized with padding to it (:mod:`.resize`), as openpi's input
transforms do: LIBERO's example sends 224×224 whatever the policy's input. Keys it does
not use are ignored (robots send extras, e.g. DROID's second exterior camera). A missing
key, or a value that cannot be mapped (another channel count, not an image, a state of
another length), is a :class:`~joynexus.errors.SchemaMismatchError` whose message lists
every expected key with its dtype and shape, so the text frame the robot gets says what
to send.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from joynexus.errors import SchemaMismatchError, SpecError
from joynexus.models.batch import ObservationBatch
from joynexus.models.schema import DataSchema
from joynexus.server.openpi.resize import resize_with_pad

if TYPE_CHECKING:  # the spec package loads torch; a front process builds adapters too
    from joynexus.spec.serving import OpenPIServing

__all__ = ["MAX_PROMPT_CHARS", "ObservationAdapter"]

MAX_PROMPT_CHARS = 4096
#: What to convert a camera's image to, by the channel count the tenant's schema gives.
_CHANNELS = {1: "grayscale", 3: "RGB", 4: "RGBA"}


class ObservationAdapter:
    """Keys and shapes one tenant's openpi connection expects (see module docstring).

    Raises:
        SpecError: the serving options name a camera the schema does not have.
    """

    def __init__(self, schema: DataSchema, options: OpenPIServing) -> None:
        unknown = sorted(set(options.cameras or {}) - set(schema.cameras))
        if unknown:
            raise SpecError(
                f"serving.openpi.cameras names {unknown}, which the tenant's schema "
                f"{schema.name!r} does not have (its cameras: {schema.camera_names})",
                field="serving.openpi.cameras",
            )
        self.schema = schema
        self.camera_keys = options.camera_keys(schema.camera_names)
        self.state_keys = options.state_keys() if schema.state_dim > 0 else []
        self.prompt_key = options.prompt

    @classmethod
    def of_keys(
        cls,
        schema: DataSchema,
        camera_keys: dict[str, str],
        state_keys: list[str],
        prompt_key: str,
    ) -> ObservationAdapter:
        """The adapter whose keys an adapter of the model process resolved (a front's)."""
        adapter = cls.__new__(cls)
        adapter.schema = schema
        adapter.camera_keys = dict(camera_keys)
        adapter.state_keys = list(state_keys)
        adapter.prompt_key = prompt_key
        return adapter

    def expected(self) -> dict[str, str]:
        """Request key -> what it must hold (the metadata frame and every error show it)."""
        out = {
            key: (
                f"uint8 {list(self.schema.cameras[cam].shape)} (H, W, C; "
                "another H×W is resized with padding)"
            )
            for cam, key in self.camera_keys.items()
        }
        if len(self.state_keys) == 1:
            out[self.state_keys[0]] = f"float [{self.schema.state_dim}]"
        elif self.state_keys:
            for key in self.state_keys:
                out[key] = f"float [n] (concatenated into the state of {self.schema.state_dim})"
        default = self.schema.instruction
        out[self.prompt_key] = f"str (default {default!r})" if default else "str"
        return out

    def _fail(self, problem: str, field: str) -> SchemaMismatchError:
        listing = "; ".join(f"{k}: {v}" for k, v in self.expected().items())
        return SchemaMismatchError(
            f"observation {problem}; expected keys: {listing}",
            field=field,
            expected=self.expected(),
        )

    def batch(self, obs: Any) -> ObservationBatch:
        """The observation as a batch of one, in the tenant's schema.

        Raises:
            SchemaMismatchError: a key is missing, or holds the wrong type or shape.
        """
        if not isinstance(obs, dict):
            raise self._fail(f"must be a map, got {type(obs).__name__}", "observation")
        missing = [k for k in (*self.camera_keys.values(), *self.state_keys) if k not in obs]
        if self.prompt_key not in obs and not self.schema.instruction:
            missing.append(self.prompt_key)
        if missing:
            raise self._fail(f"is missing {missing} (got keys {sorted(map(str, obs))})", "keys")
        cameras = {cam: self._image(obs[key], cam, key) for cam, key in self.camera_keys.items()}
        return ObservationBatch(
            cameras=cameras,
            state=self._state(obs)[None, :],
            instructions=[self._prompt(obs)],
        )

    def _image(self, value: Any, cam: str, key: str) -> np.ndarray:
        height, width, channels = self.schema.cameras[cam].shape
        if not isinstance(value, np.ndarray):
            raise self._fail(f"{key!r} must be a numpy array, got {type(value).__name__}", key)
        img = value[:, :, None] if value.ndim == 2 and channels == 1 else value
        if img.ndim != 3:
            raise self._fail(
                f"{key!r} has shape {list(value.shape)}: an image is H×W×{channels}", key
            )
        if img.shape[2] != channels and img.shape[0] == channels:
            img = np.moveaxis(img, 0, -1)  # C×H×W, as openpi's ALOHA example sends it
        if img.shape[2] != channels:
            raise self._fail(
                f"{key!r} has shape {list(value.shape)}: {channels} channel(s) expected "
                f"(H×W×{channels} or {channels}×H×W); convert the camera's image to "
                f"{_CHANNELS.get(channels, f'{channels} channels')} before sending",
                key,
            )
        if img.dtype != np.uint8 and img.dtype.kind != "f":
            raise self._fail(f"{key!r} has dtype {img.dtype}, not uint8 (or float in [0, 1])", key)
        if min(img.shape[:2]) < 1:
            raise self._fail(f"{key!r} has shape {list(value.shape)}: the image is empty", key)
        # Another size is scaled to fit and padded black, as openpi's input transforms do;
        # float images read as [0, 1], also as there.
        return resize_with_pad(img, height, width)[None]

    def _state(self, obs: dict[Any, Any]) -> np.ndarray:
        parts: list[np.ndarray] = []
        for key in self.state_keys:
            value = obs[key]
            arr = (
                np.asarray(value)
                if isinstance(value, np.ndarray | np.generic | float | int)
                else None
            )
            if isinstance(value, list):
                arr = np.asarray(value) if all(isinstance(v, float | int) for v in value) else None
            if arr is None or arr.dtype.kind not in "biuf":
                raise self._fail(f"{key!r} must be numbers, got {type(value).__name__}", key)
            parts.append(arr.astype(np.float32).reshape(-1))
        state = np.concatenate(parts) if parts else np.zeros(0, dtype=np.float32)
        if state.shape != (self.schema.state_dim,):
            got = " + ".join(str(p.size) for p in parts) or "0"
            raise self._fail(
                f"state from {self.state_keys} has {got} values, not {self.schema.state_dim}",
                "state",
            )
        if not bool(np.isfinite(state).all()):
            raise self._fail(f"state from {self.state_keys} holds NaN or inf", "state")
        return state

    def _prompt(self, obs: dict[Any, Any]) -> str:
        value = obs.get(self.prompt_key, self.schema.instruction)
        if isinstance(value, bytes):
            value = value.decode("utf-8", errors="replace")
        if not isinstance(value, str) or len(value) > MAX_PROMPT_CHARS:
            raise self._fail(
                f"{self.prompt_key!r} must be a str of at most {MAX_PROMPT_CHARS} characters",
                self.prompt_key,
            )
        return value
