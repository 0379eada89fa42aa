"""openpi robots behind a front process: decoded in the front, answered the same.

Two real ``joynexus serve`` processes on the tiny backbone (``--front-procs 0`` and
``1``) and the real ``openpi_client`` (its own venv, see tests/server/test_openpi.py)
as the robot: the same metadata and actions, the same error text and close code for a
bad observation, every frame decoded in the front (the model process decoded none), a
robot held idle for several header timeouts still answered on every door (issue 43),
and a front killed mid-connection closes the robot's connection without a hang.
"""

from __future__ import annotations

import contextlib
import json
import re
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from joynexus.bench.robots import openpi_python
from joynexus.bench.server_procs import Server, free_port, running_servers
from joynexus.bench.serving import _open_tenant

psutil = pytest.importorskip("psutil")

MODEL = "tiny:qwen2_5_vl"
ROBOT = Path(__file__).with_name("openpi_robot.py")
#: Short connection limits, so a robot can be held past them: the header timeout a
#: websocket used to be cut at, and pings answered in the meantime.
HEADER_TIMEOUT_S = 1.0
LIMITS = ["--header-timeout", str(HEADER_TIMEOUT_S), "--ws-ping-interval", "0.5"]


def _python() -> Path:
    python = openpi_python()
    assert python.exists(), (
        f"no openpi client venv at {python}: build it with "
        "`bash scripts/install-python-extras.sh .venv/bin/python` (make install does)"
    )
    return python


def _open(root: Path, front_procs: int) -> Iterator[tuple[Server, str, int]]:
    """A server with its main port and an ``--openpi-port``; (server, key, openpi port)."""
    side = free_port()
    args = ["--front-procs", str(front_procs), "--openpi-port", str(side), *LIMITS]
    with running_servers(root, ["server"], MODEL, 1, args) as (server,):
        yield server, _open_tenant(server, "alice", MODEL), side


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    root = tmp_path_factory.mktemp("front-openpi")
    plain, front = _open(root / "plain", 0), _open(root / "front", 1)
    try:
        yield {"plain": next(plain), "front": next(front)}
    finally:
        for gen in (plain, front):
            gen.close()


def _robot(server: Server, key: str, mode: str, port: int | None = None) -> subprocess.Popen[str]:
    """A robot on the main port's ``/v1/openpi``, or on the openpi ``port``'s ``/``."""
    url = server.url.replace("http://", "ws://") + "/v1/openpi"
    if port is not None:
        url = f"ws://127.0.0.1:{port}"
    return subprocess.Popen(
        [str(_python()), str(ROBOT), url, key, mode],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )


def _decoded(server: Server) -> dict[str, float]:
    """Frames decoded per place (the predict-stage events on /metrics)."""
    text = httpx.get(f"{server.url}/metrics", timeout=30).text
    found = re.findall(r'predict_stage_events_total\{stage="(openpi_decode\w*)"\} (\S+)', text)
    return {stage: float(n) for stage, n in found}


@pytest.mark.timeout(300)
def test_a_front_decodes_openpi_frames_and_answers_the_same(pair: dict[str, Any]) -> None:
    seen = {}
    for name in ("plain", "front"):
        server, key, _ = pair[name]
        out, _ = _robot(server, key, "answers").communicate(timeout=120)
        seen[name] = json.loads(out.strip().splitlines()[-1])
    plain, front = seen["plain"], seen["front"]
    assert front["metadata"] == plain["metadata"]
    np.testing.assert_allclose(front["actions"], plain["actions"], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(front["again"], front["actions"], rtol=1e-5, atol=1e-6)
    assert front["error"] == plain["error"] and "expected keys" in str(plain["error"])
    assert front["close_code"] == plain["close_code"] == 1011
    # Decoded where it should be: in the front process (the 2 good frames), never in the model
    # process; without fronts, in the model process.
    assert _decoded(pair["plain"][0]) == {"openpi_decode": 2.0}
    assert _decoded(pair["front"][0]) == {"openpi_decode_front": 2.0}


@pytest.mark.timeout(300)
def test_the_openpi_port_is_decoded_in_the_front_and_answers_the_same(
    pair: dict[str, Any],
) -> None:
    seen = {}
    for name in ("plain", "front"):
        server, key, port = pair[name]
        assert httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=30).text == "OK\n"
        before = _decoded(server)
        out, _ = _robot(server, key, "answers", port).communicate(timeout=120)
        seen[name] = json.loads(out.strip().splitlines()[-1])
        after = _decoded(server)
        seen[name]["decoded"] = {k: after[k] - before.get(k, 0.0) for k in after}
    plain, front = seen["plain"], seen["front"]
    assert front["metadata"] == plain["metadata"]
    np.testing.assert_allclose(front["actions"], plain["actions"], rtol=1e-5, atol=1e-6)
    assert front["error"] == plain["error"] and "expected keys" in str(plain["error"])
    assert front["close_code"] == plain["close_code"] == 1011
    # The openpi port's two good frames: decoded in the model process without fronts,
    # in the front with one (the model process decoded none of them).
    assert plain["decoded"] == {"openpi_decode": 2.0}
    assert {k: v for k, v in front["decoded"].items() if v} == {"openpi_decode_front": 2.0}


@pytest.mark.timeout(300)
def test_a_robot_held_past_the_header_timeout_is_still_answered(pair: dict[str, Any]) -> None:
    """Every door (main port's /v1/openpi and the openpi port, with and without
    fronts) used to cut a robot's websocket at --header-timeout."""
    robots = {}
    for name in ("plain", "front"):
        server, key, port = pair[name]
        robots[f"{name} /v1/openpi"] = _robot(server, key, "hold")
        robots[f"{name} openpi port"] = _robot(server, key, "hold", port)
    for robot in robots.values():
        assert robot.stdout is not None
        assert robot.stdout.readline().strip() == "ready"
    time.sleep(HEADER_TIMEOUT_S * 4)  # idle, well past the header timeout
    seen = {}
    for door, robot in robots.items():
        out, _ = robot.communicate("go\n", timeout=120)
        seen[door] = json.loads(out.strip().splitlines()[-1])["after"]
    assert seen == dict.fromkeys(robots, "answered")


@pytest.mark.timeout(300)
def test_every_door_closes_a_connection_that_sends_no_headers(pair: dict[str, Any]) -> None:
    """With --front-procs 0 the openpi port had no header timeout (nor connection cap):
    half-open connections piled up until the descriptors ran out."""
    for name in ("plain", "front"):
        server, _, port = pair[name]
        main = int(server.url.rsplit(":", 1)[1])
        for door in (main, port):
            with socket.create_connection(("127.0.0.1", door)) as silent:
                silent.settimeout(60)  # bounds a failing run only
                with contextlib.suppress(ConnectionResetError):
                    assert silent.recv(1) == b"", (name, door)


def _fronts(server: Server) -> list[Any]:
    return [p for p in server.tree() if "joynexus.server.front.worker" in " ".join(p.cmdline())]


@pytest.mark.timeout(300)
def test_a_killed_front_closes_the_robots_connection(pair: dict[str, Any]) -> None:
    server, key, _ = pair["front"]
    robot = _robot(server, key, "hold")
    assert robot.stdout is not None and robot.stdin is not None
    assert robot.stdout.readline().strip() == "ready"
    (front,) = _fronts(server)
    front.kill()
    front.wait(timeout=30)
    robot.stdin.write("go\n")
    robot.stdin.flush()
    out, _ = robot.communicate(timeout=60)
    after = json.loads(out.strip().splitlines()[-1])
    assert after["after"] != "answered", after
    assert after["after_s"] < 30, after
