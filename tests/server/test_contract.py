"""The API contract: the committed OpenAPI snapshot and the spec CLI.

That the server imports no torch is checked with the other import rules in
tests/test_layering.py.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from fastapi.routing import APIRoute
from typer.testing import CliRunner

from joynexus.cli.main import app
from joynexus.server.openapi import openapi_document, render
from joynexus.server.routers import CORE_ROUTERS, live_routers

ROOT = Path(__file__).resolve().parents[2]
SNAPSHOT = ROOT / "docs" / "openapi.json"


def test_live_openapi_document_equals_the_committed_snapshot() -> None:
    live = render(openapi_document())
    assert live == SNAPSHOT.read_text(), (
        "docs/openapi.json is not the document the server's routes generate; if the API "
        "change is deliberate, regenerate the snapshot with "
        "`.venv/bin/python -m joynexus.server.openapi > docs/openapi.json` and commit the diff"
    )
    document = json.loads(live)
    assert all(p.startswith("/v1/") or p in ("/healthz", "/readyz") for p in document["paths"])
    # Built from the one list of routers that create_app and joynexus serve mount: every
    # HTTP route a live server answers is in the document.
    served = {
        re.sub(r":\w+}", "}", route.path)  # {path:path} is documented as {path}
        for router in (*CORE_ROUTERS, *live_routers())
        for route in router.routes
        if isinstance(route, APIRoute) and route.include_in_schema
    }
    assert served == set(document["paths"]), served ^ set(document["paths"])
    assert "/v1/admin/engines" in document["paths"]
    assert document["components"]["securitySchemes"]["HTTPBearer"]["scheme"] == "bearer"


def test_spec_schema_and_check(tmp_path: Path) -> None:
    runner = CliRunner()
    result = runner.invoke(app, ["spec", "schema"])
    assert result.exit_code == 0, result.output
    assert "tenant" in json.loads(result.output)["properties"]

    result = runner.invoke(app, ["spec", "check", str(ROOT / "examples/workloads/eval-pusht.yaml")])
    assert result.exit_code == 0, result.output
    assert "pusht-train: rl" in result.output and "pusht-eval: eval" in result.output

    bad = tmp_path / "bad.yaml"
    bad.write_text("tenant: ../x\ntask: rl\nbase_model: {id: tiny}\n")
    result = runner.invoke(app, ["spec", "check", str(bad)])
    assert result.exit_code == 1
    assert "tenant" in result.output
