"""The remote-env HTTP server: serve one env kind (or any gymnasium id) to JoyNexus.

This is how a tenant brings its own simulator: run ``joynexus env-server --env ID`` next
to it, and name ``{"kind": "remote", "options": {"url": ...}}`` in the workload spec.

Protocol (msgpack bodies; arrays as a msgpack extension, see :mod:`joynexus.envs.wire`)::

    GET    /v1/info                        -> {kind, task, schema}
    POST   /v1/sessions         {num_envs} -> {session_id, schema}
    POST   /v1/sessions/{id}/reset  {seed} -> observation
    POST   /v1/sessions/{id}/step {actions}-> step
    DELETE /v1/sessions/{id}               -> {}

A grouped reset adds ``group_size`` to the reset body (sub-env ``i`` seeded with
``seed + i // group_size``, see :mod:`joynexus.envs.base`); without it the reset is
ungrouped.

Errors answer the JoyNexus error body ``{code, message, details}`` with the error's
HTTP status. Every simulator call runs on one dedicated thread, because OpenGL
contexts (MuJoCo's EGL renderer) belong to the thread that made them current.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import socket
import threading
import time
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from fastapi import FastAPI, Request
from fastapi.responses import Response

from joynexus.envs.base import EnvAdapter, EnvSpec, check_group_size
from joynexus.envs.registry import env_schema, make_env
from joynexus.envs.wire import encode_observation, encode_step, packb, unpackb
from joynexus.errors import (
    CapacityError,
    InvalidRequestError,
    JoyNexusError,
    NotFoundError,
)

__all__ = [
    "MSGPACK",
    "BackgroundEnvServer",
    "create_env_server_app",
    "env_server_spec",
    "listening_socket",
    "serve_env",
]

MSGPACK = "application/msgpack"
T = TypeVar("T")


def env_server_spec(
    env: str,
    *,
    task: str | None = None,
    image_size: int | None = None,
    fast_render: bool = True,
    max_episode_steps: int | None = None,
) -> EnvSpec:
    """The spec a server serves: a registered JoyNexus kind, else a gymnasium env id."""
    from joynexus.envs.registry import list_envs

    kinds = {info.kind for info in list_envs()} - {"remote"}
    if env in kinds:
        return EnvSpec(
            kind=env,
            task=task,
            image_size=image_size,
            fast_render=fast_render,
            max_episode_steps=max_episode_steps,
        )
    return EnvSpec(
        kind="gym",
        task=env,
        image_size=image_size,
        fast_render=fast_render,
        max_episode_steps=max_episode_steps,
    )


def create_env_server_app(spec: EnvSpec, *, max_sessions: int = 16) -> FastAPI:
    """A FastAPI app serving sessions of ``spec`` (its ``num_envs`` is set per session)."""
    executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="joynexus-env")
    sessions: dict[str, EnvAdapter] = {}

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        for adapter in list(sessions.values()):
            await on_sim_thread(adapter.close)
        sessions.clear()
        executor.shutdown(wait=False)

    app = FastAPI(title="JoyNexus env server", version="1", lifespan=lifespan)
    ids = itertools.count(1)
    schema_cache: dict[str, Any] = {}

    async def on_sim_thread(fn: Callable[[], T]) -> T:
        return await asyncio.get_running_loop().run_in_executor(executor, fn)

    def reply(payload: Any, status: int = 200) -> Response:
        return Response(content=packb(payload), media_type=MSGPACK, status_code=status)

    async def body(request: Request) -> dict[str, Any]:
        raw = await request.body()
        data = unpackb(raw) if raw else {}
        if not isinstance(data, dict):
            raise InvalidRequestError("request body must be a msgpack map")
        return data

    def session(session_id: str) -> EnvAdapter:
        try:
            return sessions[session_id]
        except KeyError:
            raise NotFoundError(f"no env session {session_id!r} on this server") from None

    @app.exception_handler(JoyNexusError)
    async def _joynexus_error(_: Request, exc: JoyNexusError) -> Response:
        return reply(exc.to_dict(), exc.http_status)

    @app.get("/v1/info")
    async def info() -> Response:
        if "schema" not in schema_cache:
            schema = await on_sim_thread(lambda: env_schema(spec))
            schema_cache["schema"] = schema.model_dump(mode="json")
        return reply({"kind": spec.kind, "task": spec.task, "schema": schema_cache["schema"]})

    @app.post("/v1/sessions")
    async def create(request: Request) -> Response:
        data = await body(request)
        num_envs = data.get("num_envs", 1)
        if not isinstance(num_envs, int) or num_envs < 1:
            raise InvalidRequestError(f"num_envs must be a positive integer, got {num_envs!r}")
        if len(sessions) >= max_sessions:
            raise CapacityError(f"this env server holds at most {max_sessions} sessions")
        sub = spec.model_copy(update={"num_envs": num_envs})
        adapter = await on_sim_thread(lambda: make_env(sub))
        session_id = f"remote-{next(ids)}"
        sessions[session_id] = adapter
        return reply(
            {"session_id": session_id, "schema": adapter.schema.model_dump(mode="json")}, 201
        )

    @app.post("/v1/sessions/{session_id}/reset")
    async def reset(session_id: str, request: Request) -> Response:
        data = await body(request)
        adapter = session(session_id)
        seed = data.get("seed")
        group_size = data.get("group_size", 1)
        check_group_size(adapter.num_envs, group_size)
        if group_size == 1:
            obs = await on_sim_thread(lambda: adapter.reset(seed=seed))
        else:
            obs = await on_sim_thread(lambda: adapter.reset(seed=seed, group_size=group_size))
        return reply(encode_observation(obs))

    @app.post("/v1/sessions/{session_id}/step")
    async def step(session_id: str, request: Request) -> Response:
        data = await body(request)
        adapter = session(session_id)
        if "actions" not in data:
            raise InvalidRequestError("step needs 'actions'", field="actions")
        result = await on_sim_thread(lambda: adapter.step(data["actions"]))
        return reply(encode_step(result))

    @app.delete("/v1/sessions/{session_id}")
    async def close(session_id: str) -> Response:
        adapter = sessions.pop(session_id, None)
        if adapter is not None:
            await on_sim_thread(adapter.close)
        return reply({})

    return app


def listening_socket(host: str, port: int) -> socket.socket:
    """A bound TCP socket whose accepted connections send small writes at once.

    uvicorn writes a response's head and body separately; with Nagle's algorithm on,
    the body then waits for the client's delayed ACK (~40 ms per call on keep-alive
    connections). Accepted sockets inherit ``TCP_NODELAY`` from the listener on Linux.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.bind((host, port))
    return sock


def serve_env(
    spec: EnvSpec,
    *,
    host: str = "127.0.0.1",
    port: int = 8765,
    sock: socket.socket | None = None,
) -> None:
    """Run the env server in the foreground (blocks); ``sock`` overrides host/port."""
    import uvicorn

    config = uvicorn.Config(create_env_server_app(spec), log_level="info")
    server = uvicorn.Server(config)
    server.run(sockets=[sock if sock is not None else listening_socket(host, port)])


class BackgroundEnvServer:
    """An env server on a loopback ephemeral port in a background thread.

    For tests, benchmarks and notebooks: ``with BackgroundEnvServer(spec) as url: ...``.
    """

    def __init__(self, spec: EnvSpec, *, host: str = "127.0.0.1") -> None:
        import uvicorn

        self._sock = listening_socket(host, 0)
        port = self._sock.getsockname()[1]
        self.url = f"http://{host}:{port}"
        config = uvicorn.Config(create_env_server_app(spec), log_level="warning", lifespan="on")
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [self._sock]}, daemon=True
        )

    def __enter__(self) -> str:
        self._thread.start()
        deadline = time.monotonic() + 30
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the background env server did not start")
            time.sleep(0.01)
        return self.url

    def __exit__(self, *exc: object) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=10)
        self._sock.close()
