"""openpi's websocket policy protocol, driven by the real ``openpi_client`` package.

``openpi-client`` pins numpy < 2, so it lives in its own venv (``.venv-openpi``, built by
``make install`` through scripts/install-python-extras.sh); the robot side runs there as
a subprocess (tests/server/openpi_scenarios.py) against a served JoyNexus (tiny
backbone) on real sockets. Without that venv the test fails and says how to build it.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from joynexus.bench.robots import openpi_python, serving
from joynexus.errors import (
    AuthenticationError,
    InvalidRequestError,
    QuotaExceededError,
    SchemaMismatchError,
)
from joynexus.models.schema import CameraSpec, DataSchema
from joynexus.server.openpi import OPENPI, openpi_app
from joynexus.server.openpi.codec import packb as openpi_packb
from joynexus.server.openpi.codec import unpackb as openpi_unpackb
from joynexus.server.openpi.observations import ObservationAdapter
from joynexus.server.openpi.refusal import MAX_CLOSE_REASON_BYTES, close_code, close_reason
from joynexus.server.openpi.resize import resize_with_pad
from joynexus.spec.serving import OpenPIServing
from joynexus.wire import MSGPACK_MEDIA_TYPE, packb, unpackb
from tests.server.livesrv import make_live

SCENARIOS = Path(__file__).with_name("openpi_scenarios.py")
PROMPT = "put the bowl on the plate"

ALICE = {  # LIBERO's keys: observation/image, observation/wrist_image, observation/state
    "cameras": {"image": {"height": 32, "width": 32}, "wrist_image": {"height": 32, "width": 32}},
    "state_dim": 8,
    "action_dim": 7,
    "action_chunk": 4,
}
BOB = {  # DROID-style keys, mapped by serving.openpi
    "cameras": {"exterior": {"height": 24, "width": 32}},
    "state_dim": 8,
    "action_dim": 8,
    "action_chunk": 2,
}
BOB_KEYS = {
    "cameras": {"exterior": "observation/exterior_image_1_left"},
    "state": ["observation/joint_position", "observation/gripper_position"],
}


def _spec(tenant: str, model: str, schema: dict[str, Any], **serving: Any) -> dict[str, Any]:
    return {
        "tenant": tenant,
        "task": "custom",
        "base_model": {"id": model},
        "schema": schema,
        "action_module": {"type": "oft", "hidden_dim": 32, "num_blocks": 1},
        "serving": {"openpi": serving},
    }


def _client_python() -> str:
    """The openpi client venv's python; the test FAILS (never skips) without it."""
    python = openpi_python()
    probe = (
        subprocess.run(
            [str(python), "-c", "import openpi_client.websocket_client_policy"],
            capture_output=True,
            text=True,
            check=False,
        )
        if python.is_file()
        else None
    )
    if probe is None or probe.returncode != 0:
        why = "missing" if probe is None else probe.stderr.strip()[-400:]
        pytest.fail(
            f"the openpi client venv at {python} cannot run openpi_client ({why}); build it "
            "with `bash scripts/install-python-extras.sh .venv/bin/python` (make install does)"
        )
    return str(python)


def _open_tenant(http: httpx.Client, admin: str, tenant: str, spec: dict[str, Any]) -> str:
    r = http.post(
        "/v1/tenants", json={"tenant_id": tenant}, headers={"Authorization": f"Bearer {admin}"}
    )
    assert r.status_code == 201, r.text
    key = str(r.json()["api_key"])
    auth = {"Authorization": f"Bearer {key}"}
    r = http.post("/v1/workloads", json=spec, headers=auth)
    assert r.status_code in (200, 201, 202), r.text
    wid = r.json()["workload_id"]
    for _ in range(600):  # polls readiness of a real server; no timing asserted
        st = http.get(f"/v1/workloads/{wid}/status", headers=auth).json()
        if st["state"] == "running":
            return key
        assert st["state"] not in ("failed", "cancelled"), st
        import time

        time.sleep(0.05)
    raise AssertionError(f"{tenant}: workload never ran")


def _observations() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(7)
    return {
        "alice/observation/image": rng.integers(0, 256, (32, 32, 3), dtype=np.uint8),
        "alice/observation/wrist_image": rng.integers(0, 256, (32, 32, 3), dtype=np.uint8),
        # float64, as LIBERO's example concatenates it: served as float32
        "alice/observation/state": rng.normal(size=8).astype(np.float32).astype(np.float64),
        # openpi's LIBERO example: 224x224 frames whatever the policy's input size
        "libero/observation/image": rng.integers(0, 256, (224, 224, 3), dtype=np.uint8),
        "libero/observation/wrist_image": rng.integers(0, 256, (224, 224, 3), dtype=np.uint8),
        "libero/observation/state": rng.normal(size=8),
        "bob/observation/exterior_image_1_left": rng.integers(0, 256, (24, 32, 3), np.uint8),
        "bob/observation/joint_position": rng.normal(size=7).astype(np.float32),
        "bob/observation/gripper_position": np.array([0.5], dtype=np.float32),
    }


def test_openpi_client_reaches_each_tenants_batched_policy(tmp_path: Path, tiny_model: str) -> None:
    python = _client_python()
    srv = make_live(tmp_path / "run", tiny_model)
    admin = srv.tenants.create_admin_key().api_key
    state = srv.app.state.joynexus
    apps = [(srv.app, "on"), (openpi_app(state, state.service(OPENPI)), "off")]
    with (
        serving(apps) as ports,
        httpx.Client(base_url=f"http://127.0.0.1:{ports[0]}", timeout=60) as http,
    ):
        base, side = (f"http://127.0.0.1:{p}" for p in ports)
        keys = {
            "alice": _open_tenant(http, admin, "alice", _spec("alice", tiny_model, ALICE)),
            "bob": _open_tenant(http, admin, "bob", _spec("bob", tiny_model, BOB, **BOB_KEYS)),
            "carol": _open_tenant(
                http, admin, "carol", _spec("carol", tiny_model, ALICE, max_connections=1)
            ),
        }
        assert httpx.get(f"{side}/healthz").status_code == 200
        arrays = _observations()
        np.savez(tmp_path / "obs.npz", **arrays)  # type: ignore[arg-type]
        cfg = {
            "url": side.replace("http://", "ws://"),
            "main_url": base.replace("http://", "ws://") + "/v1/openpi",
            "keys": keys,
            "obs": str(tmp_path / "obs.npz"),
            "prompt": PROMPT,
        }
        (tmp_path / "cfg.json").write_text(json.dumps(cfg))
        run = subprocess.run(
            [python, str(SCENARIOS), str(tmp_path / "cfg.json")],
            capture_output=True,
            text=True,
            timeout=240,
            check=False,
        )
        assert run.returncode == 0, run.stderr[-3000:]
        seen = json.loads(run.stdout)

        # The same observations over HTTP predict (mode mean); LIBERO's 224 px frames
        # resized with padding to alice's 32 px here, as the openpi door does.
        expected = _predict(http, keys["alice"], arrays, "alice")
        libero_expected = _predict(
            http,
            keys["alice"],
            {k: resize_with_pad(v, 32, 32) if "image" in k else v for k, v in arrays.items()},
            "libero",
        )
    histogram = srv.plane.inference.metrics.batch_size_histogram

    meta = seen["alice_metadata"]
    assert meta["tenant_id"] == "alice" and meta["policy_version"] == 0
    assert meta["action_horizon"] == 4 and meta["action_dim"] == 7
    assert set(meta["observation_keys"]) == {
        "observation/image",
        "observation/wrist_image",
        "observation/state",
        "prompt",
    }
    actions = np.asarray(seen["alice_actions"])
    assert actions.shape == (4, 7) and seen["alice_actions_dtype"] == "float32"
    np.testing.assert_allclose(actions, expected, atol=1e-5, rtol=0)
    np.testing.assert_allclose(np.asarray(seen["main_port_actions"]), expected, atol=1e-5, rtol=0)
    assert {"actions", "policy_timing", "server_timing"} <= set(seen["alice_answer_keys"])
    assert seen["alice_server_timing"] == ["infer_ms"]
    assert seen["alice_second_timing"] == ["infer_ms", "prev_total_ms"]

    libero_actions = np.asarray(seen["libero_actions"])
    assert libero_actions.shape == (4, 7)
    np.testing.assert_allclose(libero_actions, libero_expected, atol=1e-5, rtol=0)
    four = seen["four_channel_error"]
    assert four is not None and "'observation/image' has shape [224, 224, 4]" in four
    assert "3 channel(s) expected" in four and "convert the camera's image to RGB" in four

    error = seen["wrong_key_error"]
    assert error is not None and "missing ['observation/image']" in error
    assert "observation/image: uint8 [32, 32, 3]" in error  # names expected keys and shapes
    assert seen["wrong_key_close_code"] == 1011

    assert seen["bob_metadata"]["tenant_id"] == "bob"
    assert seen["bob_metadata"]["action_dim"] == 8
    assert seen["bob_actions_shape"] == [2, 8]
    assert "observation/exterior_image_1_left" in seen["bob_with_alice_obs_error"]
    # The refusal's reason is in the text of the exception openpi_client raises (a close
    # frame of code 4000 + the HTTP status, docs/OPENPI.md), not only in a response body.
    assert seen["bad_key_code"] == 4401
    assert seen["bad_key_text"].startswith(
        "received 4401 (private use) invalid or revoked API key"
    ), seen["bad_key_text"]
    code, text = seen["carol_second"]
    assert code == 4429 and "max_connections" in text and "close one or raise" in text

    assert seen["concurrent_errors"] == []
    assert [len(s) for s in seen["concurrent_shapes"]] == [3] * 8
    assert all(
        s == ([4, 7] if i % 2 == 0 else [2, 8])
        for i, r in enumerate(seen["concurrent_shapes"])
        for s in r
    )
    assert max(histogram) > 1, histogram  # robots of two tenants shared forwards


def _predict(http: httpx.Client, key: str, arrays: dict[str, np.ndarray], of: str) -> np.ndarray:
    """Actions for ``of``'s observation (an alice-shaped one) over HTTP predict."""
    body = {
        "observations": {
            "cameras": {
                "image": arrays[f"{of}/observation/image"][None],
                "wrist_image": arrays[f"{of}/observation/wrist_image"][None],
            },
            "state": arrays[f"{of}/observation/state"][None].astype(np.float32),
            "instructions": [PROMPT],
        },
        "mode": "mean",
    }
    r = http.post(
        "/v1/models/alice/predict",
        content=packb(body),
        headers={
            "Authorization": f"Bearer {key}",
            "Content-Type": MSGPACK_MEDIA_TYPE,
            "Accept": MSGPACK_MEDIA_TYPE,
        },
    )
    assert r.status_code == 200, r.text
    return np.asarray(unpackb(r.content)["actions"][0])


def test_refusals_fit_a_close_frame() -> None:
    assert close_code(AuthenticationError("x")) == 4401
    assert close_code(QuotaExceededError("x", reason="openpi_connections")) == 4429
    short = "invalid or revoked API key"
    assert close_reason(short) == short
    long = "tenant 'é" + "x" * 200 + "' has no model slot;\nsubmit a workload first"
    cut = close_reason(long)
    assert len(cut.encode()) <= MAX_CLOSE_REASON_BYTES and cut.endswith("…")
    assert cut.startswith("tenant 'éxxx") and "\n" not in cut
    multibyte = close_reason("é" * 100)  # 200 bytes: cut between characters, not inside
    assert multibyte == "é" * 60 + "…" and len(multibyte.encode()) == 123


def test_codec_speaks_openpis_msgpack_numpy() -> None:
    arr = np.arange(6, dtype=np.float32).reshape(2, 3)
    frame = openpi_packb({"a": arr, "s": np.float32(1.5), "n": 3})  # float64 is a float
    # openpi's unpacker looks for these bytes keys
    import msgpack

    raw = msgpack.unpackb(frame, raw=False)
    assert raw["a"][b"__ndarray__"] is True and raw["a"][b"dtype"] == "<f4"
    assert raw["a"][b"shape"] == [2, 3] and raw["s"][b"__npgeneric__"] is True
    back = openpi_unpackb(frame, max_bytes=1 << 20)
    np.testing.assert_array_equal(back["a"], arr)
    assert back["s"] == 1.5 and back["s"].dtype == np.float32 and back["n"] == 3

    lying = msgpack.packb(
        {"x": {b"__ndarray__": True, b"data": b"\0" * 7, b"dtype": "<f4", b"shape": [2]}}
    )
    with pytest.raises(InvalidRequestError, match="needs 8 bytes, got 7"):
        openpi_unpackb(lying, max_bytes=1 << 20)
    obj = msgpack.packb({"x": {b"__ndarray__": True, b"data": b"", b"dtype": "|O", b"shape": [0]}})
    with pytest.raises(InvalidRequestError, match="not a plain number type"):
        openpi_unpackb(obj, max_bytes=1 << 20)
    with pytest.raises(InvalidRequestError, match="over the limit"):
        openpi_unpackb(frame, max_bytes=8)
    with pytest.raises(InvalidRequestError, match="not one msgpack map"):
        openpi_unpackb(b"\xc1", max_bytes=8)


def test_adapter_maps_keys_and_names_what_it_expects() -> None:
    schema = DataSchema(cameras={"image": CameraSpec(height=4, width=6)}, state_dim=3, action_dim=2)
    adapter = ObservationAdapter(
        schema, OpenPIServing(state=["observation/joints", "observation/gripper"])
    )
    chw = np.zeros((3, 4, 6), dtype=np.uint8)
    batch = adapter.batch(
        {
            "observation/image": chw,
            "observation/joints": np.array([1.0, 2.0]),
            "observation/gripper": np.float64(3.0),
            "prompt": "go",
            "extra/ignored": 1,
        }
    )
    batch.validate(schema)
    assert batch.cameras["image"].shape == (1, 4, 6, 3)
    np.testing.assert_array_equal(batch.state, [[1.0, 2.0, 3.0]])
    float_img = adapter.batch(
        {
            "observation/image": np.ones((4, 6, 3), np.float32),
            "observation/joints": [1, 2],
            "observation/gripper": [0],
            "prompt": "go",
        }
    ).cameras["image"]
    assert float_img.dtype == np.uint8 and int(float_img.max()) == 255
    with pytest.raises(SchemaMismatchError, match=r"has 2 \+ 2 values, not 3"):
        adapter.batch(
            {
                "observation/image": chw,
                "observation/joints": [1, 2],
                "observation/gripper": [0, 1],
                "prompt": "go",
            }
        )
    # Another size is resized with padding (tests/server/test_openpi_resize.py), not refused.
    resized = adapter.batch(
        {
            "observation/image": np.full((4, 4, 3), 9, np.uint8),
            "observation/joints": [1, 2],
            "observation/gripper": [0],
            "prompt": "go",
        }
    ).cameras["image"][0]
    assert (resized[:, 1:5] == 9).all() and not resized[:, [0, 5]].any()
