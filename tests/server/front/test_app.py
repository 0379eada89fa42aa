"""Front processes answer every predict error exactly as the single-process server.

Two real ``joynexus serve`` processes on the tiny backbone, one with ``--front-procs
0`` (today's single process) and one with a front process; the same requests (good,
and every way a predict can be refused, in the orders that matter) must get the same
status, error body and error headers from both.
"""

from __future__ import annotations

import re
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import numpy as np
import pytest

from joynexus.bench.server_procs import Server, running_servers
from joynexus.bench.serving import _open_tenant, _scrape, predict_body
from joynexus.server.front.app import upstream_target
from joynexus.wire import MSGPACK_MEDIA_TYPE, packb, unpackb

pytest.importorskip("psutil")

MODEL = "tiny:qwen2_5_vl"
MSGPACK = {"Content-Type": MSGPACK_MEDIA_TYPE, "Accept": MSGPACK_MEDIA_TYPE}


def _open(root: Path, front_procs: int) -> Iterator[tuple[Server, dict[str, str]]]:
    with running_servers(root, ["server"], MODEL, 1, ["--front-procs", str(front_procs)]) as (
        server,
    ):
        keys = {t: _open_tenant(server, t, MODEL) for t in ("alice", "bob")}
        yield server, keys


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    root = tmp_path_factory.mktemp("front-contract")
    plain = _open(root / "plain", 0)
    front = _open(root / "front", 1)
    try:
        yield {"plain": next(plain), "front": next(front)}
    finally:
        for gen in (plain, front):
            gen.close()


def _obs(**change: Any) -> dict[str, Any]:
    obs: dict[str, Any] = {
        "cameras": {"top": np.zeros((1, 32, 32, 3), np.uint8)},
        "state": np.zeros((1, 4), np.float32),
        "instructions": ["reach the target"],
    }
    obs.update(change)
    return obs


def _cases(keys: dict[str, str]) -> list[tuple[str, dict[str, str], bytes]]:
    alice = {"Authorization": f"Bearer {keys['alice']}", **MSGPACK}
    bad_key = {"Authorization": "Bearer jnx_bad.key", **MSGPACK}
    return [
        ("alice", alice, predict_body(0)),
        ("alice", MSGPACK, predict_body(0)),  # no key
        ("alice", bad_key, predict_body(0)),  # bad key, good body
        ("alice", bad_key, b"\xc1 not msgpack"),  # bad key and bad body: the key first
        ("bob", alice, predict_body(0)),  # another tenant's slot
        ("alice", alice, b"\xc1 not msgpack"),
        ("alice", {**alice, "Content-Type": "text/plain"}, predict_body(0)),
        ("alice", alice, packb({"observations": {"state": np.zeros((1, 4), np.float32)}})),
        ("alice", alice, packb({"observations": _obs(state=np.full((1, 4), np.nan, np.float32))})),
        ("alice", alice, packb({"observations": _obs(instructions=["x"] * 300)})),
        ("alice", alice, packb({"observations": _obs(), "mode": "greedy"})),
        ("alice", {**alice, "X-Request-ID": "abc123"}, packb({"observations": _obs()})),
        ("al ice", alice, predict_body(0)),  # a path name that is not a name
    ]


def _answer(server: Server, tenant: str, headers: dict[str, str], body: bytes) -> Any:
    r = httpx.post(
        f"{server.url}/v1/models/{tenant}/predict", content=body, headers=headers, timeout=60
    )
    if r.status_code == 200:
        out = unpackb(r.content)
        content: Any = {k: np.asarray(v).shape for k, v in out.items() if v is not None}
    else:
        content = r.json()
        content.get("details", {}).pop("request_id", None)
        content["message"] = content["message"].split(" quote request id")[0]
    kept = ("content-type", "www-authenticate", "retry-after")
    rid = r.headers.get("x-request-id") if headers.get("X-Request-ID") else None
    return r.status_code, content, {k: r.headers.get(k) for k in kept}, rid


@pytest.mark.timeout(300)
def test_predict_answers_and_errors_are_the_same_through_a_front(pair: dict[str, Any]) -> None:
    (plain, plain_keys), (front, front_keys) = pair["plain"], pair["front"]
    statuses = []
    for i, (p_case, f_case) in enumerate(zip(_cases(plain_keys), _cases(front_keys), strict=True)):
        want, got = _answer(plain, *p_case), _answer(front, *f_case)
        assert got == want, f"case {i}: {got} != {want}"
        statuses.append(got[0])
    # The cases do cover the contract: success and each kind of refusal.
    assert {200, 400, 401, 403, 415, 422} <= set(statuses), statuses


@pytest.mark.timeout(300)
def test_other_routes_are_forwarded_unchanged(pair: dict[str, Any]) -> None:
    for name in ("plain", "front"):
        server, _ = pair[name]
        admin = {"Authorization": f"Bearer {(server.run_dir / 'admin.key').read_text().strip()}"}
        r = httpx.get(f"{server.url}/v1/tenants", headers=admin, timeout=30)
        assert r.status_code == 200 and {t["tenant_id"] for t in r.json()} == {"alice", "bob"}
        r = httpx.get(f"{server.url}/v1/nowhere", timeout=30)
        assert r.status_code == 404 and r.json()["code"] == "not_found"
        r = httpx.get(f"{server.url}/healthz", timeout=30)
        assert r.status_code == 200


def _paused_predict(server: Server, key: str, pause_s: float) -> bytes:
    """A predict whose client sends its headers, waits ``pause_s``, then its body."""
    url = urlsplit(server.url)
    body = predict_body(0)
    head = (
        f"POST /v1/models/alice/predict HTTP/1.1\r\nHost: {url.netloc}\r\n"
        f"Authorization: Bearer {key}\r\nContent-Type: {MSGPACK_MEDIA_TYPE}\r\n"
        f"Accept: {MSGPACK_MEDIA_TYPE}\r\nContent-Length: {len(body)}\r\n"
        "Connection: close\r\n\r\n"
    )
    with socket.create_connection((url.hostname, url.port), timeout=60) as sock:
        sock.sendall(head.encode())
        time.sleep(pause_s)
        sock.sendall(body)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    return answer


@pytest.mark.timeout(300)
def test_the_wait_for_a_body_is_metered_apart_from_decoding(pair: dict[str, Any]) -> None:
    """A client that pauses between its headers and its body: the pause is ``http_read``
    (the client's time), never ``http_decode`` (the service's own work)."""
    pause = 0.3
    for name in ("plain", "front"):
        server, keys = pair[name]
        before = _scrape([server])
        answer = _paused_predict(server, keys["alice"], pause)
        assert answer.startswith(b"HTTP/1.1 200"), (name, answer[:200])
        # Metered before the answer left: the front's seconds ride on its frame.
        after = _scrape([server])
        read = after["http_read_s"] - before["http_read_s"]
        decode = after["http_decode_s"] - before["http_decode_s"]
        assert after["http_read_n"] - before["http_read_n"] == 1, name
        assert read >= pause * 0.9, (name, read)
        assert 0 < decode < pause / 3, (name, decode)


def _openpi_handshake(server: Server, headers: dict[str, str]) -> Any:
    from websockets.exceptions import ConnectionClosed
    from websockets.sync.client import connect

    url = server.url.replace("http://", "ws://") + "/v1/openpi"
    try:
        with connect(url, additional_headers=headers, open_timeout=30, proxy=None) as ws:
            return "metadata", unpackb(ws.recv(timeout=30))
    except ConnectionClosed as exc:  # a refusal: its code and reason (server/openpi/refusal)
        return (exc.rcvd.code, exc.rcvd.reason) if exc.rcvd else None


@pytest.mark.timeout(300)
def test_the_openpi_websocket_is_relayed(pair: dict[str, Any]) -> None:
    answers = {}
    for name in ("plain", "front"):
        server, keys = pair[name]
        answers[name] = [
            _openpi_handshake(server, {}),
            _openpi_handshake(server, {"Authorization": "Api-Key jnx_bad.key"}),
            _openpi_handshake(server, {"Authorization": f"Api-Key {keys['alice']}"}),
        ]
    assert answers["front"] == answers["plain"]
    assert answers["plain"][0][0] == 4401 and "missing API key" in answers["plain"][0][1]


#: Paths a front once answered 500 (httpx refused the decoded control character) or
#: decoded twice (``%2541`` reached the model process as ``A``); the last one's decoded
#: newline started a forged line in the front's error log.
_ODD_PATHS = [
    ("GET", "/v1/workloads/%0B/status"),
    ("POST", "/v1/models/%0B/predict"),
    ("GET", "/v1/scheduler/jobs/%1B%5B2J"),
    ("GET", "/v1/workloads/wl-%2541bc/status"),
    ("GET", "/dashboard/static/a%2541b.js"),
    ("GET", "/v1/workloads/x%0AFORGED%20line/status"),
]


def _odd_answer(client: httpx.Client, key: str, method: str, path: str) -> tuple[int, Any]:
    headers = {"Authorization": f"Bearer {key}", **MSGPACK}
    r = client.request(method, path, headers=headers, content=predict_body(0))
    body = r.json()
    body.get("details", {}).pop("request_id", None)
    return r.status_code, body


@pytest.mark.timeout(300)
def test_a_path_reaches_the_model_process_decoded_once_and_bad_ones_are_4xx(
    pair: dict[str, Any],
) -> None:
    answers: dict[str, list[tuple[int, Any]]] = {}
    for name in ("plain", "front"):
        server, keys = pair[name]
        start = server.log.stat().st_size
        # One keep-alive client: a refused path must not cost the next request its
        # connection.
        with httpx.Client(base_url=server.url, timeout=60) as client:
            answers[name] = []
            for method, path in _ODD_PATHS:
                answers[name].append(_odd_answer(client, keys["alice"], method, path))
                assert client.get("/healthz").status_code == 200, (name, path)
        log = server.log.read_bytes()[start:]
        # No raw control character of a path reaches the log, and no forged line.
        assert re.search(rb"[\x00-\x08\x0b-\x1f\x7f]", log) is None, (name, log[-2000:])
        assert b"\nFORGED" not in log, (name, log[-2000:])
    assert answers["front"] == answers["plain"]
    statuses = [status for status, _ in answers["front"]]
    assert all(400 <= s < 500 for s in statuses), answers["front"]
    # Decoded once: the dashboard names the file as the client spelled it after one
    # decoding, and the workload id is refused as not a name (not found as "wl-Abc").
    assert "'a%41b.js'" in answers["front"][4][1]["message"]
    assert answers["front"][3][0] == 422 and "wl-Abc" not in str(answers["front"][3][1])


@pytest.mark.parametrize(
    ("raw_path", "query", "sent"),
    [
        (b"/v1/workloads/%0B/status", b"", b"/v1/workloads/%0B/status"),
        (
            b"/v1/workloads/wl-%2541bc/status",
            b"k=%41&a=1",
            b"/v1/workloads/wl-%2541bc/status?k=%41&a=1",
        ),
        (b"/v1/a%2Fb", b"", b"/v1/a%2Fb"),
        # Raw bytes a lenient parser let through are escaped, never decoded again.
        (b"/x/y\x0b\xe9", b"q=a b#c", b"/x/y%0B%E9?q=a%20b%23c"),
    ],
)
def test_the_upstream_target_is_what_the_client_sent(
    raw_path: bytes, query: bytes, sent: bytes
) -> None:
    scope = {"raw_path": raw_path, "path": "(decoded, unused)", "query_string": query}
    assert upstream_target(scope).raw_path == sent
