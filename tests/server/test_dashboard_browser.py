"""The dashboard in a real browser: Debian's chromium driven by playwright (python).

A live server (tiny backbone, real services, uvicorn on 127.0.0.1) runs a small reach2d
RL workload; headless chromium opens ``/dashboard#key=...`` and must show, rendered by
the page's own script from live data, the workload's row and its learning curves (a
chart with at least two points) and the utilization timeline. The screenshot goes to
the test's tmp dir, and to ``docs/results/dashboard.png`` (the picture in the docs) only
when ``JOYNEXUS_UPDATE_DOCS=1``: a test run leaves the checkout as it found it.

playwright's own browser download does not work offline, so the test points
``executable_path`` at the distribution's chromium; without it the test is skipped.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from joynexus.client import Client
from tests.server.livesrv import make_live, reach_rl, uvicorn_thread

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
LAUNCH_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--no-first-run",
    "--disable-component-update",
    "--disable-sync",
    "--disable-quic",
]

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not Path(CHROMIUM).is_file(),
        reason="needs the Debian package 'chromium' (scripts/install-system-deps.sh)",
    ),
]

_CURVE_READY = """([series, n]) => {
  const svg = document.querySelector(`svg[data-series="${series}"]`);
  return svg !== null && Number(svg.dataset.points) >= n;
}"""


def _points(page: Any, series: str) -> int:
    value = page.get_attribute(f'svg[data-series="{series}"]', "data-points")
    return int(value or 0)


def test_dashboard_shows_a_running_workload_and_its_curves(tmp_path: Path, tiny_model: str) -> None:
    sync_api = pytest.importorskip(
        "playwright.sync_api", reason="needs the python package 'playwright' (dev extra)"
    )
    srv = make_live(tmp_path / "run", tiny_model)
    admin_key = srv.tenants.create_admin_key().api_key
    with uvicorn_thread(srv.app) as url:
        with Client(url, admin_key) as admin:
            keys = {t: admin.create_tenant(t)["api_key"] for t in ("alice", "bob")}
        with Client(url, keys["alice"]) as alice:
            wid = alice.submit(reach_rl("alice", tiny_model, target=3)).workload_id

        with sync_api.sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, args=LAUNCH_FLAGS)
            try:
                page = browser.new_page(viewport={"width": 1280, "height": 900})
                errors: list[str] = []
                page.on("pageerror", lambda exc: errors.append(str(exc)))
                page.goto(f"{url}/dashboard?interval=300#key={admin_key}")
                page.wait_for_selector(f'tr[data-workload-id="{wid}"]', timeout=60_000)
                assert "key=" not in page.url  # the script moved the key to sessionStorage
                page.wait_for_function(_CURVE_READY, arg=["alice/train.loss", 2], timeout=180_000)
                page.wait_for_selector(
                    f'tr[data-workload-id="{wid}"][data-state="completed"]', timeout=180_000
                )
                page.wait_for_function(
                    _CURVE_READY, arg=["alice/rollout.mean_return", 2], timeout=60_000
                )
                page.wait_for_selector("svg.util-svg rect[data-service]", timeout=60_000)

                assert _points(page, "alice/train.loss") >= 2
                row = page.inner_text(f'tr[data-workload-id="{wid}"]')
                assert "alice" in row and "rl" in row and "completed" in row and "/3" in row
                assert page.inner_text("#viewer").startswith("admin")
                assert page.is_visible('tr[data-tenant="bob"]')  # bob: no workloads yet
                assert page.is_visible("#health-section") is False  # no Health Manager here
                page.screenshot(path=str(tmp_path / "dashboard.png"), full_page=True)
                if os.environ.get("JOYNEXUS_UPDATE_DOCS") == "1":
                    results = ROOT / "docs" / "results"
                    results.mkdir(parents=True, exist_ok=True)
                    page.screenshot(path=str(results / "dashboard.png"), full_page=True)

                # A tenant key: bob sees only bob, never alice's workload. An old ?key=
                # link still works: the server moves the key into the fragment.
                other = browser.new_page()
                other.goto(f"{url}/dashboard?key={keys['bob']}&interval=300")
                other.wait_for_selector('tr[data-tenant="bob"]', timeout=30_000)
                assert "key=" not in other.url
                assert other.inner_text("#viewer") == "tenant bob"
                assert other.query_selector(f'tr[data-workload-id="{wid}"]') is None
                assert other.query_selector('svg[data-series^="alice/"]') is None

                # A bad key lands on the login form.
                bad = browser.new_page()
                bad.goto(f"{url}/dashboard#key=jnx_0123456789abcdef_nope")
                bad.wait_for_selector("#login:not([hidden])", timeout=30_000)
                assert "invalid" in bad.inner_text("#status")
                assert errors == []
            finally:
                browser.close()
    assert (tmp_path / "dashboard.png").stat().st_size > 10_000
