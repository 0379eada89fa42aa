"""A robot for tests/server/front/test_openpi.py, run in the openpi client venv.

Imports only the real ``openpi_client`` (and numpy, websockets it brings); executed by
that venv's python, never imported by the project's tests. argv: ``url key mode``.
It builds its observation from the metadata frame's ``observation_keys``, so it needs
no knowledge of the tenant. Modes: ``answers`` (two answers, a bad observation's error
text and close code), ``hold`` (one answer, prints ``ready``, waits for a line on
stdin, then tries again and reports whether it was answered or how the connection
ended). Prints one JSON line.
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
            obs[key] = (np.arange(np.prod(shape)) % 251).astype(np.uint8).reshape(shape)
        elif what.startswith("float"):
            n = int(what.split("[")[1].split("]")[0])
            obs[key] = np.linspace(-1.0, 1.0, n).astype(np.float32)
        else:
            obs[key] = "reach the target"
    return obs


def main() -> None:
    url, key, mode = sys.argv[1:4]
    robot = websocket_client_policy.WebsocketClientPolicy(url, api_key=key)
    meta = robot.get_server_metadata()
    obs = _observation(meta["observation_keys"])
    out: dict[str, object] = {"metadata": meta}
    out["actions"] = np.asarray(robot.infer(obs)["actions"]).tolist()
    if mode == "answers":
        out["again"] = np.asarray(robot.infer(obs)["actions"]).tolist()
        bad = dict(obs)
        bad.pop(next(k for k, v in meta["observation_keys"].items() if v.startswith("uint8")))
        try:
            robot.infer(bad)
            out["error"] = None
        except RuntimeError as exc:
            out["error"] = str(exc)
        try:
            robot._ws.recv(timeout=10)
        except websockets.exceptions.ConnectionClosed as exc:
            out["close_code"] = exc.rcvd.code if exc.rcvd else None
    else:
        print("ready", flush=True)
        sys.stdin.readline()
        started = time.monotonic()
        try:
            robot.infer(obs)
            out["after"] = "answered"
        except websockets.exceptions.ConnectionClosed as exc:
            out["after"] = f"closed {exc.rcvd.code if exc.rcvd else None}"
        except (RuntimeError, OSError) as exc:
            out["after"] = f"error {type(exc).__name__}"
        out["after_s"] = time.monotonic() - started
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
