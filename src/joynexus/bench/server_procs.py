"""The server processes of ``joynexus bench serving``: start, wait, measure, stop.

Every server is a ``joynexus serve`` subprocess on a free 127.0.0.1 port.
:func:`running_servers` starts them and always stops them (SIGTERM, then SIGKILL, then
whatever the server left behind), even on an error or Ctrl-C; :class:`Server` reads the
memory of a server's process tree (psutil) and :class:`RssSampler` its peak under load.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

__all__ = [
    "START_TIMEOUT_S",
    "STOP_TIMEOUT_S",
    "RssSampler",
    "Server",
    "free_port",
    "psutil_module",
    "running_servers",
    "start_server",
    "stop_servers",
    "wait_ready",
]

START_TIMEOUT_S = 180.0
STOP_TIMEOUT_S = 10.0


def psutil_module() -> Any:
    try:
        import psutil  # type: ignore[import-untyped,unused-ignore]  # stubs may be absent
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise RuntimeError("bench serving needs psutil (pip install psutil)") from exc
    return psutil


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _die_with_parent() -> None:  # pragma: no cover - runs in the child before exec
    """Linux: the server gets SIGKILL if the bench dies without cleaning up."""
    with suppress(Exception):
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


@dataclass
class Server:
    proc: subprocess.Popen[bytes]
    url: str
    run_dir: Path
    log: Path

    def tree(self) -> list[Any]:
        psutil = psutil_module()
        try:
            root = psutil.Process(self.proc.pid)
            return [root, *root.children(recursive=True)]
        except psutil.Error:
            return []

    def rss(self) -> int:
        psutil = psutil_module()
        total = 0
        for p in self.tree():
            with suppress(psutil.Error):
                total += int(p.memory_info().rss)
        return total

    def pss(self) -> int:
        """Proportional set size: pages shared between processes counted once overall."""
        psutil = psutil_module()
        total = 0
        for p in self.tree():
            with suppress(psutil.Error, AttributeError):
                total += int(p.memory_full_info().pss)
        return total

    def log_tail(self, chars: int = 2000) -> str:
        try:
            return self.log.read_text(errors="replace")[-chars:]
        except OSError:
            return ""


def start_server(run_dir: Path, model: str, threads: int, extra_args: Sequence[str] = ()) -> Server:
    port = free_port()
    run_dir.mkdir(parents=True, exist_ok=True)
    log = run_dir / "serve.log"
    exe = Path(sys.executable).with_name("joynexus")
    prog = [str(exe)] if exe.exists() else [sys.executable, "-m", "joynexus.cli.main"]
    cmd = [
        *prog,
        "serve",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--run-dir",
        str(run_dir),
        "--base-model",
        model,
        *extra_args,
    ]
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "OMP_NUM_THREADS": str(threads),
        "MKL_NUM_THREADS": str(threads),
    }
    with log.open("ab") as out:
        proc = subprocess.Popen(
            cmd,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,  # Ctrl-C reaches the bench, which stops them
            preexec_fn=_die_with_parent if sys.platform == "linux" else None,
        )
    return Server(proc, f"http://127.0.0.1:{port}", run_dir, log)


def stop_servers(servers: Sequence[Server]) -> None:
    """SIGTERM every server, SIGKILL what is left, then every descendant they left."""
    psutil = psutil_module()
    kids: list[Any] = []
    for s in servers:
        kids.extend(s.tree()[1:])
        if s.proc.poll() is None:
            with suppress(ProcessLookupError):
                s.proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + STOP_TIMEOUT_S
    for s in servers:
        try:
            s.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            s.proc.kill()
            s.proc.wait(timeout=STOP_TIMEOUT_S)
    _, alive = psutil.wait_procs(kids, timeout=3)
    for p in alive:
        with suppress(psutil.Error):
            p.kill()
    psutil.wait_procs(alive, timeout=3)
    for s in servers:  # the session's process group: anything that escaped the tree
        with suppress(ProcessLookupError, PermissionError):
            os.killpg(s.proc.pid, signal.SIGKILL)


@contextmanager
def running_servers(
    root: Path,
    names: Sequence[str],
    model: str,
    threads: int,
    extra_args: Sequence[str] = (),
    start_timeout_s: float = START_TIMEOUT_S,
) -> Iterator[list[Server]]:
    started: list[Server] = []
    try:
        for name in names:
            started.append(start_server(root / name, model, threads, extra_args))
        wait_ready(started, start_timeout_s)
        yield started
    finally:
        stop_servers(started)


def wait_ready(servers: Sequence[Server], timeout_s: float = START_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout_s
    pending = list(servers)
    while pending:
        for s in list(pending):
            if s.proc.poll() is not None:
                raise RuntimeError(f"server on {s.url} exited {s.proc.returncode}:\n{s.log_tail()}")
            with suppress(httpx.TransportError):
                if httpx.get(f"{s.url}/healthz", timeout=2).status_code == 200:
                    pending.remove(s)
        if pending and time.monotonic() > deadline:
            raise TimeoutError(f"{len(pending)} server(s) not ready after {timeout_s:g} s")
        if pending:
            time.sleep(0.2)


class RssSampler:
    """Peak summed RSS of the servers, sampled from a thread while the load runs."""

    def __init__(self, servers: Sequence[Server], period_s: float = 0.25) -> None:
        self.servers = servers
        self.period_s = period_s
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def sample(self) -> int:
        total = sum(s.rss() for s in self.servers)
        self.peak = max(self.peak, total)
        return total

    def _run(self) -> None:
        while not self._stop.wait(self.period_s):
            self.sample()

    def __enter__(self) -> RssSampler:
        self.sample()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.sample()
