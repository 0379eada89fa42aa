"""Remote envs: env-server protocol, RemoteEnvAdapter, and the generic gymnasium kind."""

from __future__ import annotations

import numpy as np
import pytest
from starlette.testclient import TestClient

from joynexus.envs import EnvSpec, make_env
from joynexus.envs.env_server import create_env_server_app, env_server_spec
from joynexus.envs.remote import RemoteEnvAdapter
from joynexus.envs.wire import packb, unpackb
from joynexus.errors import (
    CapacityError,
    EnvironmentServiceError,
    NotFoundError,
    SchemaMismatchError,
    SpecError,
)


def _remote(client: TestClient, **kw: object) -> RemoteEnvAdapter:
    spec = EnvSpec(kind="remote", options={"url": "http://testserver"}, **kw)  # type: ignore[arg-type]
    return RemoteEnvAdapter(spec, client=client)


def test_remote_adapter_behaves_like_the_local_env() -> None:
    served = EnvSpec(kind="fake", image_size=6, options={"episode_len": 2})
    local = make_env(served.model_copy(update={"num_envs": 2}))
    with TestClient(create_env_server_app(served, max_sessions=1)) as client:
        info = unpackb(client.get("/v1/info").content)
        assert info["kind"] == "fake" and info["schema"]["action_dim"] == 2
        remote = _remote(client, num_envs=2)
        assert remote.schema == local.schema
        o_remote, o_local = remote.reset(seed=4), local.reset(seed=4)
        np.testing.assert_array_equal(o_remote.state, o_local.state)
        np.testing.assert_array_equal(o_remote.cameras["cam"], o_local.cameras["cam"])
        actions = np.array([[1.0, 0.0], [-1.0, 0.0]], np.float32)
        for _ in range(2):
            s_remote, s_local = remote.step(actions), local.step(actions)
        for field in ("reward", "terminated", "truncated", "success"):
            np.testing.assert_array_equal(getattr(s_remote, field), getattr(s_local, field))
        np.testing.assert_array_equal(
            s_remote.info["final_observation"].state, s_local.info["final_observation"].state
        )
        with pytest.raises(SchemaMismatchError):
            remote.step(np.zeros((2, 5)))
        with pytest.raises(CapacityError, match="at most 1"):
            _remote(client)
        remote.close()
        with pytest.raises(NotFoundError):
            remote._http.call("POST", "/v1/sessions/remote-1/reset", {"seed": 0})
        bad = client.post("/v1/sessions", content=b"\xc1")
        assert bad.status_code == 400 and unpackb(bad.content)["code"] == "invalid_request"


def test_remote_resizes_images_to_the_requested_size() -> None:
    with TestClient(create_env_server_app(EnvSpec(kind="fake", image_size=8))) as client:
        remote = _remote(client, image_size=4)
        assert remote.schema.cameras["cam"].shape == (4, 4, 3)
        assert remote.reset().cameras["cam"].shape == (1, 4, 4, 3)
        assert remote.step(np.zeros((1, 2))).observation.cameras["cam"].shape == (1, 4, 4, 3)
        remote.close()


def test_remote_spec_errors_and_unreachable_server() -> None:
    with pytest.raises(SpecError, match=r"options\.url"):
        make_env(EnvSpec(kind="remote"))
    # Port 9 on loopback (discard) is closed on test machines: a connection error.
    spec = EnvSpec(kind="remote", options={"url": "http://127.0.0.1:9", "timeout_s": 2})
    with pytest.raises(EnvironmentServiceError, match="cannot reach"):
        make_env(spec)


def test_env_server_serves_any_gymnasium_id() -> None:
    pytest.importorskip("gymnasium")
    spec = env_server_spec("CartPole-v1", image_size=16)
    assert spec.kind == "gym" and spec.task == "CartPole-v1"
    assert env_server_spec("pusht").kind == "pusht"
    with TestClient(create_env_server_app(spec)) as client:
        remote = _remote(client, num_envs=2)
        assert remote.schema.state_dim == 4 and remote.schema.action_dim == 1
        obs = remote.reset(seed=0)
        assert obs.cameras["render"].shape == (2, 16, 16, 3)
        step = remote.step(np.array([[1.0], [0.0]], np.float32))
        assert step.reward.tolist() == [1.0, 1.0]
        remote.close()


def test_wire_roundtrip_keeps_dtypes_and_shapes() -> None:
    payload = {"a": np.arange(6, dtype=np.int16).reshape(2, 3), "b": np.float32(1.5), "c": [1]}
    back = unpackb(packb(payload))
    assert back["a"].dtype == np.int16 and back["a"].shape == (2, 3)
    np.testing.assert_array_equal(back["a"], payload["a"])
    assert back["b"] == 1.5 and back["c"] == [1]
