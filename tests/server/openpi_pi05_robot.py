"""Robot side of tests/server/test_openpi_pi05.py, run in the openpi client venv.

Imports only the real ``openpi_client`` (and numpy): this file is executed by that venv's
python, never imported by the project's tests. Reads a JSON config (argv[1]): ``url``,
``key`` (the tenant's API key), ``obs`` (an .npz of openpi's LIBERO example observation
arrays) and ``prompt``; asks the policy once, prints one JSON object of what it saw.
"""

from __future__ import annotations

import json
import sys

import numpy as np
from openpi_client import websocket_client_policy


def main() -> None:
    with open(sys.argv[1]) as fh:
        cfg = json.load(fh)
    obs = dict(np.load(cfg["obs"]))
    obs["prompt"] = cfg["prompt"]
    policy = websocket_client_policy.WebsocketClientPolicy(cfg["url"], api_key=cfg["key"])
    answer = policy.infer(obs)
    print(
        json.dumps(
            {
                "metadata": policy.get_server_metadata(),
                "actions": np.asarray(answer["actions"]).tolist(),
                "dtype": str(answer["actions"].dtype),
            }
        )
    )


if __name__ == "__main__":
    main()
