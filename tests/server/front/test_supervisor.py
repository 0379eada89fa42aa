"""A front process killed under load is restarted; nothing hangs."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from joynexus.bench.server_procs import Server, running_servers
from joynexus.bench.serving import _open_tenant, predict_body
from joynexus.wire import MSGPACK_MEDIA_TYPE
from tests.server.subproc import Served, serve

psutil = pytest.importorskip("psutil")

MODEL = "tiny:qwen2_5_vl"
CLIENT_TIMEOUT_S = 60.0  # a request that takes longer than this has hung
WAIT_S = 90.0


def _fronts(server: Server) -> set[int]:
    out = set()
    for p in server.tree()[1:]:
        try:
            front = "joynexus.server.front.worker" in " ".join(p.cmdline())
            if front and p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                out.add(p.pid)
        except psutil.Error:
            continue
    return out


def _poll(what: str, probe, timeout_s: float = WAIT_S):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while True:
        value = probe()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


@pytest.mark.timeout(300)
def test_a_killed_front_is_restarted_and_nothing_hangs(tmp_path: Path) -> None:
    with running_servers(tmp_path, ["server"], MODEL, 1, ["--front-procs", "2"]) as (server,):
        key = _open_tenant(server, "alice", MODEL)
        headers = {
            "Authorization": f"Bearer {key}",
            "Content-Type": MSGPACK_MEDIA_TYPE,
            "Accept": MSGPACK_MEDIA_TYPE,
        }
        url = f"{server.url}/v1/models/alice/predict"
        before = _poll("two front processes", lambda: (f := _fronts(server)) and len(f) == 2 and f)
        outcomes: list[str] = []
        stop = threading.Event()

        def client() -> None:
            # A fresh connection per request: the kernel spreads them over both fronts.
            while not stop.is_set():
                try:
                    r = httpx.post(
                        url, content=predict_body(1), headers=headers, timeout=CLIENT_TIMEOUT_S
                    )
                    outcomes.append(str(r.status_code))
                except httpx.TimeoutException:
                    outcomes.append("timeout")
                except httpx.TransportError:
                    outcomes.append("closed")

        threads = [threading.Thread(target=client, daemon=True) for _ in range(4)]
        for t in threads:
            t.start()
        _poll("requests under load", lambda: outcomes.count("200") >= 8)
        victim = min(before)
        os.kill(victim, signal.SIGKILL)
        after = _poll(
            "a new front process",
            lambda: (f := _fronts(server)) and len(f) == 2 and victim not in f and f,
        )
        assert len(after - before) == 1
        served = outcomes.count("200")
        _poll("requests served after the restart", lambda: outcomes.count("200") >= served + 8)
        stop.set()
        for t in threads:
            t.join(timeout=CLIENT_TIMEOUT_S + 10)
        assert not any(t.is_alive() for t in threads), "a client hung"
        # Requests in flight on the killed front end cleanly; none hangs or fails otherwise.
        assert set(outcomes) <= {"200", "503", "closed"}, sorted(set(outcomes))
        # New requests succeed, on whichever front takes them.
        for _ in range(6):
            r = httpx.post(url, content=predict_body(2), headers=headers, timeout=CLIENT_TIMEOUT_S)
            assert r.status_code == 200, r.text
        log = server.log_tail(200_000)
        assert "starting a new one" in log
        # The hub dropped the dead front's answers quietly: no error in either process.
        assert "Traceback" not in log, log[-4000:]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["sigterm", "sigint"])
def test_a_stop_unlinks_every_block_and_leaks_nothing(tmp_path: Path, sig: int) -> None:
    """Regression: every stop printed ``resource_tracker: There appear to be N leaked
    shared_memory objects``: uvicorn re-raised its signal, killing the model process
    while the supervisor still waited for the fronts, before it unlinked their blocks."""
    log = tmp_path / "serve.log"
    with serve(tmp_path / "run", log, "--front-procs", "2") as srv:
        with httpx.Client(base_url=srv.url, timeout=CLIENT_TIMEOUT_S) as c:
            assert c.get("/healthz").status_code == 200
        blocks = {
            p.name
            for p in Path("/dev/shm").glob("psm_*")
            if any(p.name in " ".join(f.cmdline()) for f in _server_fronts(srv))
        }
        assert len(blocks) == 2, blocks  # one per front, named on its command line
        srv._stop(sig)
        text = srv.own_log()
    assert "leaked shared_memory" not in text, text[-3000:]
    assert "resource_tracker" not in text, text[-3000:]
    assert not any((Path("/dev/shm") / name).exists() for name in blocks)


def _server_fronts(srv: Served) -> list[Any]:
    kids = srv.descendants()
    return [p for p in kids if "joynexus.server.front.worker" in " ".join(p.cmdline())]
