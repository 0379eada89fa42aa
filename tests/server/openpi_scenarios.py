"""Robot-side scenarios for tests/server/test_openpi.py, run in the openpi client venv.

Imports only the real ``openpi_client`` (and numpy, websockets it brings): this file is
executed by that venv's python, never imported by the project's tests. Reads a JSON
config (argv[1]): ``url`` (ws://host:port), ``main_url`` (ws://host:port/v1/openpi),
``keys`` (tenant -> API key), ``obs`` (an .npz of observation arrays per tenant, keys
'<tenant>/<request key>'), ``prompt``; prints one JSON object of what each scenario saw.
"""

from __future__ import annotations

import json
import sys
import threading

import numpy as np
import websockets.exceptions
from openpi_client import websocket_client_policy


def _obs(arrays, tenant, prompt):
    out = {k.split("/", 1)[1]: v for k, v in arrays.items() if k.startswith(tenant + "/")}
    out["prompt"] = prompt
    return out


def alice_again(url, keys):
    """A new connection of alice's (the one before was closed by its error)."""
    return websocket_client_policy.WebsocketClientPolicy(url, api_key=keys["alice"])


def main() -> None:
    with open(sys.argv[1]) as fh:
        cfg = json.load(fh)
    url, keys, prompt = cfg["url"], cfg["keys"], cfg["prompt"]
    arrays = dict(np.load(cfg["obs"]))
    out = {}

    alice = websocket_client_policy.WebsocketClientPolicy(url, api_key=keys["alice"])
    out["alice_metadata"] = alice.get_server_metadata()
    answer = alice.infer(_obs(arrays, "alice", prompt))
    out["alice_actions"] = np.asarray(answer["actions"]).tolist()
    out["alice_actions_dtype"] = str(answer["actions"].dtype)
    out["alice_answer_keys"] = sorted(answer)
    out["alice_server_timing"] = sorted(answer["server_timing"])
    second = alice.infer(_obs(arrays, "alice", prompt))  # the connection stays usable
    out["alice_second_timing"] = sorted(second["server_timing"])

    # A wrong observation key: the server answers a text frame, which infer raises.
    wrong = _obs(arrays, "alice", prompt)
    wrong["observation/img"] = wrong.pop("observation/image")
    try:
        alice.infer(wrong)
        out["wrong_key_error"] = None
    except RuntimeError as exc:
        out["wrong_key_error"] = str(exc)
    try:  # ... and closed the connection with 1011
        alice._ws.recv(timeout=10)
    except websockets.exceptions.ConnectionClosed as exc:
        out["wrong_key_close_code"] = exc.rcvd.code if exc.rcvd else None

    # openpi's LIBERO example observation, as that client sends it: 224x224 uint8 frames
    # (alice's cameras are 32x32) and 8 float64 state values; resized with padding.
    libero = _obs(arrays, "libero", prompt)
    out["libero_actions"] = np.asarray(alice_again(url, keys).infer(libero)["actions"]).tolist()
    four = dict(libero, **{"observation/image": np.zeros((224, 224, 4), np.uint8)})
    try:  # ... but 4 channels cannot be mapped onto RGB: the reason is in the exception
        alice_again(url, keys).infer(four)
        out["four_channel_error"] = None
    except RuntimeError as exc:
        out["four_channel_error"] = str(exc)

    # The same endpoint under a path of the main port.
    main = websocket_client_policy.WebsocketClientPolicy(cfg["main_url"], api_key=keys["alice"])
    out["main_port_actions"] = np.asarray(
        main.infer(_obs(arrays, "alice", prompt))["actions"]
    ).tolist()

    # Another tenant's key reaches that tenant's policy (DROID-style keys, its own dims).
    bob = websocket_client_policy.WebsocketClientPolicy(url, api_key=keys["bob"])
    out["bob_metadata"] = bob.get_server_metadata()
    out["bob_actions_shape"] = list(bob.infer(_obs(arrays, "bob", prompt))["actions"].shape)
    try:  # alice's observation keys are not bob's
        bob.infer(_obs(arrays, "alice", prompt))
        out["bob_with_alice_obs_error"] = None
    except RuntimeError as exc:
        out["bob_with_alice_obs_error"] = str(exc)

    # A bad key is refused at the handshake: a close frame whose reason is the
    # server's, so the exception the stock client raises says why.
    try:
        websocket_client_policy.WebsocketClientPolicy(url, api_key="jnx_not_a_key")
        out["bad_key_code"] = None
    except websockets.exceptions.ConnectionClosed as exc:
        out["bad_key_code"] = exc.rcvd.code if exc.rcvd else None
        out["bad_key_text"] = str(exc)

    # carol allows one connection: a second is refused with 4429 and the reason.
    carol = websocket_client_policy.WebsocketClientPolicy(url, api_key=keys["carol"])
    try:
        websocket_client_policy.WebsocketClientPolicy(url, api_key=keys["carol"])
        out["carol_second"] = None
    except websockets.exceptions.ConnectionClosed as exc:
        out["carol_second"] = [exc.rcvd.code if exc.rcvd else None, str(exc)]
    carol._ws.close()

    # Eight robots at once, four per tenant, each a few decisions.
    robots = [
        websocket_client_policy.WebsocketClientPolicy(url, api_key=keys[t])
        for t in ["alice", "bob"] * 4
    ]
    start = threading.Barrier(len(robots))
    shapes = [[] for _ in robots]
    errors = []

    def drive(i: int, robot) -> None:
        tenant = "alice" if i % 2 == 0 else "bob"
        try:
            start.wait(timeout=60)
            for _ in range(3):
                shapes[i].append(list(robot.infer(_obs(arrays, tenant, prompt))["actions"].shape))
        except Exception as exc:
            errors.append(repr(exc))

    threads = [threading.Thread(target=drive, args=(i, r)) for i, r in enumerate(robots)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    out["concurrent_shapes"] = shapes
    out["concurrent_errors"] = errors
    print(json.dumps(out))


if __name__ == "__main__":
    main()
