"""A robot's control loop held for minutes on the real ``openpi_client``: the
reproducer of issue 43's first finding (every websocket was cut at ``--header-timeout``).

Run by the openpi client venv's python (``openpi-client`` pins numpy < 2)::

    .venv-openpi/bin/python scripts/openpi_soak.py URL API_KEY SECONDS [HZ]

One ``WebsocketClientPolicy`` sends an observation built from the server's metadata
every 1/HZ seconds (10 Hz by default) for SECONDS; a connection that closes is counted
and opened again. Prints one JSON line: answers, disconnects (with when and how), and
the worst answer time.
"""

from __future__ import annotations

import json
import re
import sys
import time

import numpy as np
import websockets.exceptions
from openpi_client import websocket_client_policy


def _observation(keys: dict[str, str]) -> dict[str, object]:
    obs: dict[str, object] = {}
    for key, what in keys.items():
        if what.startswith("uint8"):
            shape = [int(x) for x in re.findall(r"\d+", what.split("[")[1].split("]")[0])]
            obs[key] = np.zeros(shape, dtype=np.uint8)
        elif what.startswith("float"):
            obs[key] = np.zeros(int(what.split("[")[1].split("]")[0]), dtype=np.float32)
        else:
            obs[key] = "reach the target"
    return obs


def main() -> None:
    url, key, seconds = sys.argv[1], sys.argv[2], float(sys.argv[3])
    period = 1.0 / (float(sys.argv[4]) if len(sys.argv) > 4 else 10.0)
    start = time.monotonic()
    answers, worst_ms, disconnects = 0, 0.0, []
    while time.monotonic() - start < seconds:
        robot = websocket_client_policy.WebsocketClientPolicy(url, api_key=key)
        obs = _observation(robot.get_server_metadata()["observation_keys"])
        try:
            next_at = time.monotonic()
            while time.monotonic() - start < seconds:
                sent = time.monotonic()
                robot.infer(obs)
                answers += 1
                worst_ms = max(worst_ms, (time.monotonic() - sent) * 1e3)
                next_at += period
                time.sleep(max(0.0, next_at - time.monotonic()))
        except websockets.exceptions.ConnectionClosed as exc:
            at = round(time.monotonic() - start, 1)
            disconnects.append({"at_s": at, "error": f"{type(exc).__name__}: {exc}"})
        finally:
            robot._ws.close()
    out = {"seconds": seconds, "answers": answers, "disconnects": len(disconnects)}
    out["worst_ms"], out["first_disconnects"] = round(worst_ms, 1), disconnects[:5]
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
