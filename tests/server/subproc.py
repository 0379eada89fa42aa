"""``joynexus serve`` as a real subprocess, for the fault tests (restart, chaos).

:func:`serve` starts the server on 127.0.0.1 and a free port over a given run
directory (tiny backbone, offline), waits for ``/healthz`` and always kills the whole
process tree on exit. :meth:`Served.sigkill` and :meth:`Served.sigterm` stop it the way
a crash or an operator would; the simulator workers it spawned (children of its
multiprocessing fork server) are listed with :meth:`Served.env_workers`.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import httpx

try:  # psutil is not a declared dependency: without it nothing is reaped or listed
    import psutil  # type: ignore[import-untyped,unused-ignore]
except ImportError:  # pragma: no cover - depends on the environment
    psutil = None

from joynexus.bench.server_procs import free_port
from joynexus.control.job import TrainingJob
from joynexus.control.scheduler import TrainingScheduler

__all__ = [
    "BASE",
    "Served",
    "checkpoint_versions",
    "free_port",
    "latest_ledger",
    "scheduler_jobs",
    "serve",
    "wait_for",
]

BASE = "tiny:qwen2_5_vl"
START_TIMEOUT_S = 90.0
WAIT_TIMEOUT_S = 90.0
STOP_TIMEOUT_S = 30.0

T = TypeVar("T")


def wait_for(what: str, probe: Callable[[], T | None], timeout_s: float = WAIT_TIMEOUT_S) -> T:
    """Poll ``probe`` until it returns a value (real server: real time, bounded)."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = probe()
        if value is not None:
            return value
        assert time.monotonic() < deadline, f"timed out after {timeout_s:g} s waiting for {what}"
        time.sleep(0.1)


@dataclass
class Served:
    """A running ``joynexus serve`` subprocess."""

    url: str
    proc: subprocess.Popen[bytes]
    run_dir: Path
    log: Path
    log_offset: int = 0

    @property
    def admin_key(self) -> str:
        return (self.run_dir / "admin.key").read_text().strip()

    def client(self, timeout_s: float = 30.0) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=timeout_s)

    def create_tenant(self, tenant_id: str) -> dict[str, str]:
        """Create ``tenant_id``; its ``Authorization`` header."""
        r = httpx.post(
            f"{self.url}/v1/tenants",
            json={"tenant_id": tenant_id},
            headers={"Authorization": f"Bearer {self.admin_key}"},
            timeout=30,
        )
        assert r.status_code == 201, r.text
        return {"Authorization": f"Bearer {r.json()['api_key']}"}

    def descendants(self) -> list[Any]:
        """The server's child processes, recursively (psutil ``Process`` objects)."""
        if psutil is None:
            return []
        try:
            kids: list[Any] = psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return []
        return kids

    def env_workers(self) -> list[Any]:
        """The simulator worker processes (one per open session), oldest first.

        Workers are started with the ``forkserver`` context (``spawn`` where there is
        none): they are the fork server's children, or the server's direct ``spawn``
        children; the fork server and the resource tracker themselves are not workers.
        """
        out = []
        for p in self.descendants():
            try:
                cmd = " ".join(p.cmdline())
                parent = p.parent()
                parent_cmd = " ".join(parent.cmdline()) if parent is not None else ""
                if not p.is_running() or p.status() == psutil.STATUS_ZOMBIE:
                    continue
            except psutil.Error:
                continue
            if "forkserver" in parent_cmd or "multiprocessing.spawn" in cmd:
                out.append(p)
        return sorted(out, key=lambda p: p.create_time())

    def sigkill(self) -> None:
        """SIGKILL the server (a crash), then reap what it left behind."""
        self._stop(signal.SIGKILL)

    def sigterm(self) -> None:
        """SIGTERM the server (a clean shutdown); it must exit by itself, in time.

        uvicorn shuts the app down (lifespan: the Master's loops stop, usage is saved),
        then re-raises the signal, so the exit status is 0 or -SIGTERM.
        """
        self._stop(signal.SIGTERM)
        assert self.proc.returncode in (0, -signal.SIGTERM), (
            f"server exited {self.proc.returncode} after SIGTERM: {self.log_tail()}"
        )
        assert "Application shutdown complete" in self.own_log(), self.log_tail()

    def _stop(self, sig: int) -> None:
        kids = self.descendants()
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            self.proc.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=STOP_TIMEOUT_S)
            raise AssertionError(f"server ignored signal {sig}: {self.log_tail()}") from None
        _reap(kids)

    def own_log(self) -> str:
        """What this server process wrote to the (shared, appended) log."""
        with self.log.open("rb") as f:
            f.seek(self.log_offset)
            return f.read().decode(errors="replace")

    def log_tail(self, chars: int = 4000) -> str:
        return self.own_log()[-chars:]


def _reap(procs: Sequence[Any]) -> None:
    """Give the processes a dead server left a moment to exit, then kill the rest."""
    if psutil is None or not procs:
        return
    _, alive = psutil.wait_procs(list(procs), timeout=5)
    for p in alive:
        with suppress(psutil.NoSuchProcess):
            p.kill()
    psutil.wait_procs(alive, timeout=5)


@contextmanager
def serve(run_dir: Path, log: Path, *extra_args: str) -> Iterator[Served]:
    """``joynexus serve`` on ``run_dir`` as a subprocess; always killed on exit."""
    port = free_port()
    cmd = [
        str(Path(sys.executable).with_name("joynexus")),
        "serve",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--run-dir",
        str(run_dir),
        "--base-model",
        BASE,
        *extra_args,
    ]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    with log.open("ab") as out:
        offset = out.tell()
        out.write(f"\n=== {' '.join(cmd)}\n".encode())
        out.flush()
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
    served = Served(f"http://127.0.0.1:{port}", proc, run_dir, log, offset)
    try:

        def ready() -> bool | None:
            assert proc.poll() is None, f"server exited {proc.returncode}: {served.log_tail()}"
            try:
                return httpx.get(f"{served.url}/healthz", timeout=2).status_code == 200 or None
            except httpx.TransportError:
                return None

        wait_for("the server to answer /healthz", ready, START_TIMEOUT_S)
        yield served
    finally:
        kids = served.descendants()
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=STOP_TIMEOUT_S)
        _reap(kids)


def scheduler_jobs(run_dir: Path, into: Path) -> list[TrainingJob]:
    """Every job in the run's scheduler file, read from a copy (the original untouched)."""
    into.mkdir(parents=True)
    for f in run_dir.glob("scheduler.sqlite*"):
        shutil.copy2(f, into / f.name)
    sched = TrainingScheduler.open(into / "scheduler.sqlite")
    try:
        return sched.list_jobs()
    finally:
        sched.close()


def checkpoint_versions(run_dir: Path, tenant: str) -> list[int]:
    """The tenant's complete checkpoints (those with a manifest), by version."""
    root = run_dir / "outputs" / tenant
    return sorted(
        int(p.parent.name.removeprefix("step_")) for p in root.glob("step_*/manifest.json")
    )


def latest_ledger(run_dir: Path, tenant: str) -> dict[str, Any]:
    """The ledger of the tenant's latest checkpoint (``{}`` when it has none)."""
    from joynexus.models.checkpoints.payload import find_latest_checkpoint, read_manifest

    latest = find_latest_checkpoint(run_dir / "outputs", tenant)
    return {} if latest is None else dict(read_manifest(latest).ledger)
