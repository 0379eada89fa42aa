"""Robot clients of ``joynexus bench robots``: N robot loops on the real ``openpi_client``.

Run as a script by the openpi client venv's python (``openpi-client`` pins numpy < 2,
so it is not in the project's venv) — it imports nothing of joynexus::

    python openpi_robots.py CONFIG.json

CONFIG: ``url`` (ws://host:port), ``keys`` (one API key per tenant; robot i uses key
i mod len), ``robots``, ``requests`` (timed decisions per robot), ``warmup``,
``image_size`` and ``state_dim``. Each robot is one ``WebsocketClientPolicy`` in its own
thread that sends LIBERO-style observations (``observation/image``,
``observation/wrist_image``, ``observation/state``, ``prompt``) one after the other, as
a robot's control loop does. Prints one JSON object: per robot its tenant index,
latencies (ms) and actions received, and the wall time from the common start to the
last answer.
"""

from __future__ import annotations

import contextlib
import json
import sys
import threading
import time
from typing import Any

import numpy as np
from openpi_client import websocket_client_policy


def _observation(rng: np.random.Generator, size: int, state_dim: int) -> dict[str, Any]:
    return {
        "observation/image": rng.integers(0, 256, (size, size, 3), dtype=np.uint8),
        "observation/wrist_image": rng.integers(0, 256, (size, size, 3), dtype=np.uint8),
        "observation/state": rng.normal(size=state_dim).astype(np.float32),
        "prompt": "put the bowl on the plate",
    }


def main() -> None:
    with open(sys.argv[1]) as fh:
        cfg = json.load(fh)
    keys: list[str] = cfg["keys"]
    n: int = cfg["robots"]
    robots = [
        websocket_client_policy.WebsocketClientPolicy(cfg["url"], api_key=keys[i % len(keys)])
        for i in range(n)
    ]
    rng = np.random.default_rng(0)
    observations = [_observation(rng, cfg["image_size"], cfg["state_dim"]) for _ in range(n)]
    latencies: list[list[float]] = [[] for _ in range(n)]
    actions = [0] * n
    errors: list[str] = []
    ready = threading.Barrier(n + 1)
    ends = [0.0] * n

    def robot(i: int) -> None:
        try:
            for _ in range(cfg["warmup"]):
                robots[i].infer(observations[i])
            ready.wait()
            for _ in range(cfg["requests"]):
                t0 = time.perf_counter()
                answer = robots[i].infer(observations[i])
                latencies[i].append((time.perf_counter() - t0) * 1000.0)
                actions[i] += int(np.asarray(answer["actions"]).shape[0])
            ends[i] = time.perf_counter()
        except Exception as exc:  # reported, the bench fails with it
            errors.append(f"robot {i}: {exc!r}")
            ready.abort()

    threads = [threading.Thread(target=robot, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    with contextlib.suppress(threading.BrokenBarrierError):  # a robot failed: reported
        ready.wait()
    start = time.perf_counter()
    for t in threads:
        t.join()
    wall = max(ends) - start if not errors else 0.0
    out = {
        "robots": [
            {"tenant": i % len(keys), "latencies_ms": latencies[i], "actions": actions[i]}
            for i in range(n)
        ],
        "wall_s": wall,
        "errors": errors,
        "metadata": robots[0].get_server_metadata(),
    }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
