"""Prometheus ``/metrics``, ``GET /v1/usage`` and ``joynexus usage --url``."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from joynexus.cli.main import app
from joynexus.control.scheduler import TrainingScheduler
from joynexus.metrics.events import MetricsService
from joynexus.metrics.prometheus import UsageCollector
from joynexus.metrics.usage import UsageMeter
from joynexus.queues.training import TrainingQueue
from joynexus.server import ServiceRegistry, TenantStore, create_app
from joynexus.server.routes import dashboard
from joynexus.server.routes import metrics as metrics_routes
from joynexus.services.environment import EnvironmentService
from joynexus.utils.clock import FakeClock
from tests.server.conftest import Server, run, server
from tests.server.livesrv import uvicorn_thread

ROUTERS = (metrics_routes.router, dashboard.router)


def _wire(srv: Server, *, auth: str = "none") -> tuple[MetricsService, UsageMeter]:
    """A Metrics Service (with the usage collector) and a meter holding two tenants."""
    metrics = MetricsService(flush_interval_s=3600)
    meter = UsageMeter(clock=FakeClock())
    assert metrics.prometheus is not None
    metrics.prometheus.registry.register(UsageCollector(meter))
    meter.record_inference({"alice": 3, "bob": 1}, 2.0)
    meter.record_request("alice", 2)
    meter.record_env("bob", 5, 0.5)
    metrics.emit_value("learning", "train.loss", 0.25, tenant_id="alice", step=3)
    metrics.emit_value("control", "inference_queue.depth", 4)
    metrics.drain()
    srv.services.extras.update({metrics_routes.METRICS: metrics, metrics_routes.USAGE: meter})
    srv.services.extras[metrics_routes.METRICS_AUTH] = auth
    return metrics, meter


def test_prometheus_endpoint_is_public_and_holds_only_aggregate_or_tenant_numbers() -> None:
    async def main() -> None:
        async with server(extra_routers=ROUTERS) as srv:
            r = await srv.client.get("/metrics")
            assert r.status_code == 503  # no Metrics Service on this server yet
            _wire(srv)
            r = await srv.client.get("/metrics")
            assert r.status_code == 200, r.text
            assert r.headers["content-type"].startswith("text/plain; version=0.0.4")
            text = r.text
            assert 'joynexus_learning_train_loss{tenant="alice"} 0.25' in text
            assert "joynexus_control_inference_queue_depth 4.0" in text
            assert 'tenant=""' not in text  # service-wide numbers have no tenant label
            # The usage meter, read at scrape time: 2 s split 3:1 by rows.
            assert (
                'joynexus_usage_device_seconds_total{service="inference",tenant="alice"} 1.5'
                in text
            )
            assert 'joynexus_usage_env_steps_total{tenant="bob"} 5.0' in text
            assert "joynexus_metrics_events_emitted_total 2.0" in text
            for secret in (srv.admin_key, *srv.keys.values()):
                assert secret not in text and secret.split("_")[1] not in text

    run(main)


def test_prometheus_endpoint_can_require_an_admin_key() -> None:
    async def main() -> None:
        async with server(extra_routers=ROUTERS) as srv:
            _wire(srv, auth="admin")
            r = await srv.client.get("/metrics")
            assert r.status_code == 401 and r.json()["code"] == "unauthenticated"
            r = await srv.client.get("/metrics", headers=srv.auth("alice"))
            assert r.status_code == 403 and r.json()["code"] == "permission_denied"
            r = await srv.client.get("/metrics", headers=srv.admin)
            assert r.status_code == 200 and "joynexus_usage_requests_total" in r.text

    run(main)


def test_usage_a_tenant_sees_only_its_own_and_an_admin_sees_all() -> None:
    async def main() -> None:
        async with server(extra_routers=ROUTERS) as srv:
            c = srv.client
            r = await c.get("/v1/usage", headers=srv.auth("alice"))
            assert r.status_code == 503 and r.json()["code"] == "unavailable"
            _wire(srv)
            assert (await c.get("/v1/usage")).status_code == 401

            r = await c.get("/v1/usage", headers=srv.auth("alice"))
            assert r.status_code == 200, r.text
            body = r.json()
            assert set(body["tenants"]) == {"alice"}
            alice = body["tenants"]["alice"]
            assert alice["device_seconds"]["inference"] == 1.5 and alice["requests"] == 2
            assert alice["inference_samples"] == 3
            # Service totals are the tenant's own: bob's load is not disclosed.
            assert body["service_seconds"] == alice["device_seconds"]

            r = await c.get("/v1/usage", headers=srv.auth("alice"), params={"tenant_id": "bob"})
            assert r.status_code == 403 and r.json()["details"]["field"] == "tenant_id"
            r = await c.get("/v1/usage", headers=srv.auth("alice"), params={"tenant_id": "alice"})
            assert set(r.json()["tenants"]) == {"alice"}

            r = await c.get("/v1/usage", headers=srv.admin)
            body = r.json()
            assert set(body["tenants"]) == {"alice", "bob"}
            assert body["service_seconds"]["inference"] == 2.0
            assert body["service_seconds"]["environment"] == 0.5
            r = await c.get("/v1/usage", headers=srv.admin, params={"tenant_id": "bob"})
            assert set(r.json()["tenants"]) == {"bob"}
            assert r.json()["tenants"]["bob"]["env_steps"] == 5

    run(main)


def test_usage_cli_reads_a_server_and_a_run_dir(tmp_path: Path) -> None:
    store = TenantStore.in_memory()
    keys = {t: (store.create_tenant(t), store.create_key(t).api_key)[1] for t in ("alice", "bob")}
    admin_key = store.create_admin_key().api_key
    services = ServiceRegistry(
        tenants=store,
        scheduler=TrainingScheduler.in_memory(),
        training_queue=TrainingQueue(),
        environment=EnvironmentService(),
    )
    meter = UsageMeter()
    meter.record_inference({"alice": 3, "bob": 1}, 2.0)
    services.extras[metrics_routes.USAGE] = meter
    runner = CliRunner()
    with uvicorn_thread(create_app(services=services, extra_routers=ROUTERS)) as url:
        report = tmp_path / "a.json"
        out = runner.invoke(
            app,
            ["usage", "--url", url, "--key", keys["alice"], "--json", str(report)],
            terminal_width=200,
        )
        assert out.exit_code == 0, out.output
        assert "alice" in out.output and "bob" not in out.output and "1.500" in out.output
        assert set(json.loads(report.read_text())["tenants"]) == {"alice"}

        out = runner.invoke(
            app, ["usage", "--url", url, "--api-key", admin_key], terminal_width=200
        )
        assert out.exit_code == 0 and "alice" in out.output and "bob" in out.output

        out = runner.invoke(app, ["usage", "--url", url, "--key", "jnx_0123456789abcdef_x"])
        assert out.exit_code == 1 and "unauthenticated" in out.output

    meter.save(tmp_path / "run" / "usage.json")
    out = runner.invoke(
        app, ["usage", "--run-dir", str(tmp_path / "run"), "--tenant", "bob"], terminal_width=200
    )
    assert out.exit_code == 0, out.output
    assert "bob" in out.output and "alice" not in out.output
