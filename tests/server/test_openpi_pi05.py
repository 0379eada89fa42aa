"""A π0.5 tenant on the openpi port, asked by the stock ``openpi_client``.

The base is a tiny π0.5 saved by lerobot 0.6.1 (the reference environment,
:func:`joynexus.interop.tiny_pi.make_tiny_pi05`: 32 px cameras); the tenant's expert is
``pi05_expert`` with LIBERO's keys. The robot sends openpi's LIBERO example observation
as that client sends it (``observation/image`` and ``observation/wrist_image`` 224 × 224
uint8, ``observation/state`` 8 float64, ``prompt``): the frames are resized with padding
to the tenant's 32 px, not refused. What the tenant answers is what its twin (same spec
and seed, so the same first noise draw) predicts over HTTP for the frames resized with
padding beforehand. Without the reference environment or the openpi client venv the test
FAILS and says why.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from joynexus.bench.robots import serving
from joynexus.interop.reference import reference_problem
from joynexus.interop.tiny_pi import make_tiny_pi05
from joynexus.server.openpi import OPENPI, openpi_app
from joynexus.server.openpi.resize import resize_with_pad
from joynexus.wire import MSGPACK_MEDIA_TYPE, packb, unpackb
from tests.server.livesrv import make_live
from tests.server.test_openpi import _client_python, _open_tenant

ROBOT = Path(__file__).with_name("openpi_pi05_robot.py")
PROMPT = "put the bowl on the plate"
LIBERO = {
    "cameras": {"image": {"height": 32, "width": 32}, "wrist_image": {"height": 32, "width": 32}},
    "state_dim": 8,
    "action_dim": 7,
    "action_chunk": 4,
}


def _spec(tenant: str, model: str) -> dict[str, Any]:
    return {
        "tenant": tenant,
        "task": "custom",
        "base_model": {"id": model},
        "schema": LIBERO,
        "action_module": {"type": "pi05_expert"},
        "serving": {"openpi": {}},
    }


def _libero_observation() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(11)
    return {
        "observation/image": rng.integers(0, 256, (224, 224, 3), dtype=np.uint8),
        "observation/wrist_image": rng.integers(0, 256, (224, 224, 3), dtype=np.uint8),
        "observation/state": rng.normal(size=8),  # float64, as LIBERO's example sends it
    }


def test_openpi_client_reaches_a_pi05_tenant_with_libero_frames(tmp_path: Path) -> None:
    problem = reference_problem()
    if problem is not None:
        pytest.fail(problem)
    python = _client_python()
    model = str(make_tiny_pi05(tmp_path / "pi05"))
    srv = make_live(tmp_path / "run", model)
    admin = srv.tenants.create_admin_key().api_key
    state = srv.app.state.joynexus
    apps = [(srv.app, "on"), (openpi_app(state, state.service(OPENPI)), "off")]
    obs = _libero_observation()
    with (
        serving(apps) as ports,
        httpx.Client(base_url=f"http://127.0.0.1:{ports[0]}", timeout=120) as http,
    ):
        keys = {t: _open_tenant(http, admin, t, _spec(t, model)) for t in ("robot", "twin")}
        np.savez(tmp_path / "obs.npz", **obs)  # type: ignore[arg-type]
        cfg = {
            "url": f"ws://127.0.0.1:{ports[1]}",
            "key": keys["robot"],
            "obs": str(tmp_path / "obs.npz"),
            "prompt": PROMPT,
        }
        (tmp_path / "cfg.json").write_text(json.dumps(cfg))
        run = subprocess.run(
            [python, str(ROBOT), str(tmp_path / "cfg.json")],
            capture_output=True,
            text=True,
            timeout=240,
            check=False,
        )
        assert run.returncode == 0, run.stderr[-3000:]
        seen = json.loads(run.stdout)
        body = {
            "observations": {
                "cameras": {
                    c: resize_with_pad(obs[f"observation/{c}"], 32, 32)[None]
                    for c in ("image", "wrist_image")
                },
                "state": obs["observation/state"][None].astype(np.float32),
                "instructions": [PROMPT],
            },
            "mode": "mean",
        }
        r = http.post(
            "/v1/models/twin/predict",
            content=packb(body),
            headers={
                "Authorization": f"Bearer {keys['twin']}",
                "Content-Type": MSGPACK_MEDIA_TYPE,
                "Accept": MSGPACK_MEDIA_TYPE,
            },
        )
        assert r.status_code == 200, r.text
        expected = np.asarray(unpackb(r.content)["actions"][0])

    meta = seen["metadata"]
    assert meta["tenant_id"] == "robot" and meta["action_horizon"] == 4
    assert meta["action_dim"] == 7
    actions = np.asarray(seen["actions"])
    assert actions.shape == (4, 7) and seen["dtype"] == "float32"
    assert np.isfinite(actions).all()
    np.testing.assert_allclose(actions, expected, atol=1e-5, rtol=0)
