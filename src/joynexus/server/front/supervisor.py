"""``joynexus serve --front-procs N``: the model process and its front processes.

:func:`serve_with_fronts` binds the public port itself, serves the live app on a
loopback port (the internal server the fronts forward non-predict routes to) with the
:class:`~joynexus.server.front.hub.FrontHub` beside it in the same event loop, and,
once the app started, starts N front processes that all accept on the public socket
(and on the ``--openpi-port`` socket, when there is one).

:class:`FrontSupervisor` keeps N of them: a front that exits or is killed is started
again (a fresh shared-memory block, so nothing of the dead one's slots is read twice);
the requests it had in flight end with their connections (the client sees a closed
connection), and the hub drops their answers. Fronts also die with the model process
(Linux: ``PR_SET_PDEATHSIG``), and are stopped (SIGTERM, then SIGKILL) when it shuts
down.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from multiprocessing import shared_memory
from pathlib import Path
from typing import Any

import uvicorn
from uvicorn.server import HANDLED_SIGNALS

from joynexus.server.config import ServerConfig
from joynexus.server.connections import ConnectionLimits
from joynexus.server.front.channel import FRONT_TOKEN_ENV
from joynexus.server.front.hub import FrontHub
from joynexus.server.openpi.app import OPENPI
from joynexus.server.openpi.gateway import OpenPIGateway
from joynexus.server.state import ServerState

__all__ = ["FrontSupervisor", "default_front_procs", "serve_with_fronts"]

log = logging.getLogger("joynexus.server.front")

#: Slots of a front's shared-memory block and the bytes of each (an observation that
#: does not fit travels in the frame): pages are only used once touched.
SLOTS = 16
SLOT_BYTES = 4 << 20
STOP_TIMEOUT_S = 5.0
POLL_S = 0.1
#: A front that exits within this many seconds of its start is restarted with a delay
#: doubling up to MAX_DELAY_S.
QUICK_EXIT_S = 5.0
MAX_DELAY_S = 10.0


def default_front_procs() -> int:
    """Cores this process may run on, less one for the model process; at least 1."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        cores = os.cpu_count() or 1
    return max(1, cores - 1)


def _die_with_parent() -> None:  # pragma: no cover - runs in the child before exec
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


@dataclass
class FrontSupervisor:
    """Keeps ``count`` front processes running on ``public``."""

    count: int
    public: socket.socket
    hub: FrontHub
    hub_path: Path
    loopback: str
    config: ServerConfig
    limits: ConnectionLimits
    #: The openpi gateway's front token (fronts decode openpi frames); "": they relay.
    front_token: str = ""
    #: The ``--openpi-port`` listening socket, which the fronts accept on too.
    openpi: socket.socket | None = None
    procs: dict[int, subprocess.Popen[bytes]] = field(default_factory=dict)
    blocks: dict[int, shared_memory.SharedMemory] = field(default_factory=dict)
    restarts: int = 0
    _started: dict[int, float] = field(default_factory=dict)
    _delay: dict[int, float] = field(default_factory=dict)

    def start(self) -> None:
        for index in range(self.count):
            self._spawn(index)

    def _spawn(self, index: int) -> None:
        old = self.blocks.pop(index, None)
        block = shared_memory.SharedMemory(create=True, size=SLOTS * SLOT_BYTES)
        self.blocks[index] = block
        self.hub.set_block(index, block)
        if old is not None:
            _unlink(old)
        cmd = [
            sys.executable,
            "-m",
            "joynexus.server.front.worker",
            "--fd",
            str(self.public.fileno()),
            "--hub",
            str(self.hub_path),
            "--index",
            str(index),
            "--shm",
            block.name,
            "--slots",
            str(SLOTS),
            "--loopback",
            self.loopback,
            "--config",
            self.config.model_dump_json(),
            "--limits",
            self.limits.model_dump_json(),
        ]
        fds = [self.public.fileno()]
        if self.openpi is not None:
            fds.append(self.openpi.fileno())
            cmd += ["--openpi-fd", str(self.openpi.fileno())]
        self._started[index] = time.monotonic()
        self.procs[index] = subprocess.Popen(
            cmd,
            pass_fds=tuple(fds),
            env={**os.environ, FRONT_TOKEN_ENV: self.front_token},
            stdin=subprocess.DEVNULL,
            # Its own session: a terminal's Ctrl-C reaches the model process, which stops
            # the fronts itself (a front stopped first would only be restarted).
            start_new_session=True,
            preexec_fn=_die_with_parent if sys.platform == "linux" else None,
        )

    async def watch(self) -> None:
        """Restart every front that exited, forever (polled: cheap, and no SIGCHLD
        handler to share with the simulators' process pools)."""
        while True:
            now = time.monotonic()
            for index, proc in list(self.procs.items()):
                if proc.poll() is None:
                    continue
                # One that dies soon after its start (a broken environment) is started
                # again with a growing delay, not in a tight loop.
                quick = now - self._started[index] < QUICK_EXIT_S
                delay = min(MAX_DELAY_S, 2 * self._delay.get(index, POLL_S)) if quick else 0.0
                if now < self._started[index] + delay:
                    continue
                self._delay[index] = delay or POLL_S
                log.warning(
                    "front process %d (pid %d) exited with %s; starting a new one",
                    index,
                    proc.pid,
                    proc.returncode,
                )
                self.restarts += 1
                self._spawn(index)
            await asyncio.sleep(POLL_S)

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.send_signal(signal.SIGTERM)
        for proc in self.procs.values():
            try:
                proc.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=STOP_TIMEOUT_S)
        for block in self.blocks.values():
            _unlink(block)
        self.blocks.clear()


def _unlink(block: shared_memory.SharedMemory) -> None:
    block.close()
    with contextlib.suppress(FileNotFoundError):
        block.unlink()


class _Server(uvicorn.Server):
    """uvicorn's server whose signal is raised again only once the fronts are cleaned up.

    uvicorn re-raises the SIGTERM / SIGINT it shut down on as soon as its own shutdown
    ends, which killed this process while :meth:`FrontSupervisor.stop` was still waiting
    for the fronts: the shared-memory blocks were never unlinked, and the resource
    tracker reported them as leaked on every stop. :func:`serve_with_fronts` raises
    :attr:`received` itself, after the cleanup.
    """

    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self.received: list[int] = []

    def handle_exit(self, sig: int, frame: Any) -> None:
        self.received.append(sig)
        super().handle_exit(sig, frame)

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        """uvicorn's handlers while serving, without its re-raise at the end."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        original = {sig: signal.signal(sig, self.handle_exit) for sig in HANDLED_SIGNALS}
        try:
            yield
        finally:
            for sig, handler in original.items():
                signal.signal(sig, handler)


def serve_with_fronts(
    app: Any,
    *,
    host: str,
    port: int,
    fronts: int,
    options: dict[str, Any],
    limits: ConnectionLimits,
    openpi_port: int | None = None,
) -> None:
    """Serve ``app`` (the live app) behind ``fronts`` front processes on host:port.

    Args:
        options: uvicorn options of the public connections (the fronts rebuild them from
            ``limits``); the loopback server gets them too.
        openpi_port: ``--openpi-port``: the fronts accept there too and decode its
            websocket, as they do the main port's ``/v1/openpi``.
    """
    state = app.state.joynexus
    assert isinstance(state, ServerState)
    public = socket.create_server((host, port), backlog=2048)
    public.set_inheritable(True)
    openpi = None
    if openpi_port is not None:
        openpi = socket.create_server((host, openpi_port), backlog=2048)
        openpi.set_inheritable(True)
    internal = socket.create_server(("127.0.0.1", 0))
    loopback = f"http://127.0.0.1:{internal.getsockname()[1]}"
    with tempfile.TemporaryDirectory(prefix="joynexus-front-") as tmp:  # mode 0700
        hub_path = Path(tmp) / "hub.sock"
        hub = FrontHub(state)
        # The fronts write each public request's access-log line; the loopback does not.
        config = uvicorn.Config(app, log_level="info", access_log=False, **options)
        server = _Server(config)
        gateway = state.services.extras.get(OPENPI)
        token = ""
        if isinstance(gateway, OpenPIGateway):
            token = gateway.front_token = secrets.token_urlsafe(32)
        supervisor = FrontSupervisor(
            fronts, public, hub, hub_path, loopback, state.config, limits, token, openpi
        )
        asyncio.run(_run(server, internal, hub, hub_path, supervisor))
    # Every block unlinked and the hub's directory removed: now the signal's default
    # action (uvicorn's exit status), as uvicorn would have raised it.
    for sig in reversed(server.received):
        signal.raise_signal(sig)


async def _run(
    server: uvicorn.Server,
    internal: socket.socket,
    hub: FrontHub,
    hub_path: Path,
    supervisor: FrontSupervisor,
) -> None:
    await hub.start(hub_path)
    serving = asyncio.create_task(server.serve(sockets=[internal]))
    watching: asyncio.Task[None] | None = None
    try:
        while not server.started and not serving.done():
            await asyncio.sleep(POLL_S)
        if server.started:
            supervisor.start()
            log.info("%d front process(es) accept on the public port", supervisor.count)
            watching = asyncio.create_task(supervisor.watch())
        while not server.should_exit and not serving.done():
            await asyncio.sleep(POLL_S)
        # Shutting down: the fronts stop first (they finish what they hold), then the app.
        if watching is not None:
            watching.cancel()
        await asyncio.to_thread(supervisor.stop)
        await asyncio.gather(serving, return_exceptions=True)
    finally:
        if watching is not None:
            watching.cancel()
        supervisor.stop()
        await hub.close()
