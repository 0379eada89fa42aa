"""The remote env adapter (kind ``"remote"``): a simulator behind ``joynexus env-server``.

Options: ``url`` (required, e.g. ``"http://127.0.0.1:8765"``) and ``timeout_s``
(default 60, per HTTP call). ``num_envs`` is requested from the server;
``image_size``, when set, resizes the server's camera images on arrival. The server's
own spec (kind, task, fast rendering, episode limit) is fixed when it is started.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from joynexus.envs.base import (
    EnvAdapter,
    EnvObservation,
    EnvSpec,
    EnvStep,
    check_actions,
    check_group_size,
)
from joynexus.envs.registry import register_env
from joynexus.envs.render import resize_image
from joynexus.envs.wire import decode_observation, decode_step, packb, unpackb
from joynexus.errors import (
    CapacityError,
    EnvironmentServiceError,
    JoyNexusError,
    NotFoundError,
    SchemaMismatchError,
    SpecError,
)
from joynexus.models.schema import CameraSpec, DataSchema

__all__ = ["RemoteEnvAdapter", "make_remote", "remote_schema"]

_OPTIONS = {"url", "timeout_s"}
_MSGPACK = "application/msgpack"
_ERRORS: dict[str, type[JoyNexusError]] = {
    cls.code: cls for cls in (SchemaMismatchError, SpecError, CapacityError, NotFoundError)
}


def _options(spec: EnvSpec) -> tuple[str, float]:
    unknown = set(spec.options) - _OPTIONS
    if unknown:
        raise SpecError(f"unknown remote option(s) {sorted(unknown)}; allowed: {sorted(_OPTIONS)}")
    url = spec.options.get("url")
    if not isinstance(url, str) or not url.startswith(("http://", "https://")):
        raise SpecError("kind 'remote' needs options.url = 'http://HOST:PORT' of an env-server")
    return url.rstrip("/"), float(spec.options.get("timeout_s", 60.0))


def _resized(schema: DataSchema, image_size: int | None) -> DataSchema:
    if image_size is None:
        return schema
    cams = {
        name: CameraSpec(height=image_size, width=image_size, channels=cam.channels)
        for name, cam in schema.cameras.items()
    }
    return schema.model_copy(update={"cameras": cams})


class _Http:
    """A tiny msgpack-over-HTTP caller that turns server errors back into JoyNexus errors."""

    def __init__(self, url: str, timeout_s: float, client: Any | None = None) -> None:
        import httpx

        self._httpx = httpx
        self.client = client if client is not None else httpx.Client(timeout=timeout_s)
        self._owns_client = client is None
        self.url = url

    def call(self, method: str, path: str, payload: Any | None = None) -> Any:
        httpx = self._httpx
        try:
            resp = self.client.request(
                method,
                self.url + path,
                content=packb(payload) if payload is not None else None,
                headers={"content-type": _MSGPACK, "accept": _MSGPACK},
            )
        except httpx.TimeoutException as exc:
            raise EnvironmentServiceError(
                f"env server at {self.url} did not answer {method} {path} in time: {exc}"
            ) from exc
        except httpx.HTTPError as exc:
            raise EnvironmentServiceError(
                f"cannot reach env server at {self.url} ({method} {path}): {exc}"
            ) from exc
        data = unpackb(resp.content) if resp.content else {}
        if resp.status_code >= 400:
            code = data.get("code") if isinstance(data, dict) else None
            message = data.get("message") if isinstance(data, dict) else None
            cls = _ERRORS.get(str(code), EnvironmentServiceError)
            raise cls(f"env server {self.url}: {message or resp.text}", status=resp.status_code)
        return data

    def close(self) -> None:
        if self._owns_client:
            self.client.close()


def remote_schema(spec: EnvSpec) -> DataSchema:
    """Ask the server for its schema (images resized to ``spec.image_size`` when set)."""
    url, timeout_s = _options(spec)
    http = _Http(url, timeout_s)
    try:
        info = http.call("GET", "/v1/info")
    finally:
        http.close()
    return _resized(DataSchema.model_validate(info["schema"]), spec.image_size)


class RemoteEnvAdapter(EnvAdapter):
    """One session on a remote env server, used like any local simulator.

    Args:
        spec: ``kind="remote"`` with ``options.url``.
        client: An ``httpx.Client``-compatible client (tests pass an in-process one).

    Raises:
        SpecError: Bad options, or the server refused the session.
        EnvironmentServiceError: The server is unreachable or failed.
    """

    def __init__(self, spec: EnvSpec, *, client: Any | None = None) -> None:
        url, timeout_s = _options(spec)
        self._http = _Http(url, timeout_s, client)
        created = self._http.call("POST", "/v1/sessions", {"num_envs": spec.num_envs})
        self._session = str(created["session_id"])
        self._server_schema = DataSchema.model_validate(created["schema"])
        self.schema = _resized(self._server_schema, spec.image_size)
        self.num_envs = spec.num_envs
        self._closed = False

    def _fit(self, obs: EnvObservation) -> EnvObservation:
        cams = {}
        for name, spec in self.schema.cameras.items():
            frames = obs.cameras[name]
            if frames.shape[1:3] != (spec.height, spec.width):
                frames = np.stack([resize_image(f, spec.height, spec.width) for f in frames])
            cams[name] = frames
        return EnvObservation(cameras=cams, state=obs.state, instruction=obs.instruction)

    def reset(self, seed: int | None = None, *, group_size: int = 1) -> EnvObservation:
        check_group_size(self.num_envs, group_size)
        body: dict[str, Any] = {"seed": seed}
        if group_size != 1:  # a server that predates groups is sent what it knows
            body["group_size"] = group_size
        data = self._http.call("POST", f"/v1/sessions/{self._session}/reset", body)
        return self._fit(decode_observation(data))

    def step(self, actions: np.ndarray) -> EnvStep:
        acts = check_actions(actions, num_envs=self.num_envs, action_dim=self.schema.action_dim)
        data = self._http.call("POST", f"/v1/sessions/{self._session}/step", {"actions": acts})
        result = decode_step(data)
        result.observation = self._fit(result.observation)
        final = result.info.get("final_observation")
        if isinstance(final, EnvObservation):
            result.info["final_observation"] = self._fit(final)
        return result

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self._http.call("DELETE", f"/v1/sessions/{self._session}")
        except JoyNexusError:
            pass  # the server may already be gone; nothing is left to release here
        finally:
            self._http.close()


def make_remote(spec: EnvSpec) -> EnvAdapter:
    """Open a session on the env server named by ``spec.options['url']``."""
    return RemoteEnvAdapter(spec)


register_env(
    "remote",
    "joynexus.envs.remote:make_remote",
    schema="joynexus.envs.remote:remote_schema",
    description="a simulator served by `joynexus env-server` (options.url)",
    requires=["httpx", "msgpack"],
)
