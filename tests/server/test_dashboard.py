"""The dashboard's feed (bounded curves, utilization ring), its state endpoint and page."""

from __future__ import annotations

import math

import pytest

from joynexus.metrics.events import MetricEvent, MetricsService
from joynexus.metrics.usage import UsageMeter
from joynexus.runtime.health import HealthManager
from joynexus.server import ServiceRegistry
from joynexus.server.dashboard import DashboardFeed
from joynexus.server.routes import dashboard
from joynexus.server.routes import metrics as metrics_routes
from joynexus.utils.clock import FakeClock
from tests.server.conftest import run, server

ROUTERS = (metrics_routes.router, dashboard.router)


def _loss(tenant: str | None, step: int, value: float, name: str = "train.loss") -> MetricEvent:
    return MetricEvent(
        category="learning", name=name, value=value, tenant_id=tenant, step=step, timestamp=step
    )


def test_curves_keep_tenant_learning_events_and_stay_bounded() -> None:
    feed = DashboardFeed(max_points=8)
    feed.handle([_loss("alice", s, 1.0 / (s + 1)) for s in range(100)])
    feed.handle(
        [
            _loss(None, 1, 5.0),  # service-wide: no tenant curve
            _loss("alice", 1, math.nan),  # not plottable
            _loss("bob", 1, 2.0, name="train.grad_norm"),  # not a dashboard curve
            MetricEvent(category="system", name="train.loss", value=1.0, tenant_id="bob"),
            _loss("bob", 4, 7.5, name="rollout.mean_return"),
        ]
    )
    alice = feed.curves("alice")["train.loss"]
    assert len(alice) <= 9  # max_points + the latest point
    steps = [p.step or 0 for p in alice]
    assert steps[0] == 0 and steps[-1] == 99 and steps == sorted(steps)
    # Decimation spreads the kept points over the whole run, not just its tail.
    assert any(s < 50 for s in steps[1:-1])
    assert feed.curves("bob") == {"rollout.mean_return": feed.curves("bob")["rollout.mean_return"]}
    assert [p.value for p in feed.curves("bob")["rollout.mean_return"]] == [7.5]
    assert feed.curves("nobody") == {}


def test_utilization_buckets_are_usage_deltas_in_a_bounded_ring() -> None:
    clock = FakeClock(1000.0)
    t0 = clock.wall()  # 1000 s past a whole bucket of 10 s
    meter = UsageMeter(clock=clock)
    feed = DashboardFeed(bucket_s=10.0, max_buckets=3)
    meter.record_inference({"alice": 1}, 5.0)  # before the first sample: baseline
    feed.sample_usage(meter.snapshot())
    assert feed.utilization().buckets == []
    meter.record_inference({"alice": 1, "bob": 3}, 2.0)
    meter.record_env("bob", 4, 1.0)
    clock.advance(3)
    feed.sample_usage(meter.snapshot())
    clock.advance(10)
    meter.record_device("training", "alice", 4.0)
    feed.sample_usage(meter.snapshot())

    timeline = feed.utilization()
    assert [b.start - t0 for b in timeline.buckets] == [0.0, 10.0]
    first, second = timeline.buckets
    assert first.seconds["inference"] == pytest.approx(2.0)
    assert first.seconds["environment"] == pytest.approx(1.0)
    assert second.seconds == {"training": 4.0, "inference": 0.0, "environment": 0.0}
    bob = feed.utilization("bob").buckets
    assert bob[0].seconds["inference"] == pytest.approx(1.5) and bob[1].seconds["training"] == 0

    for _ in range(5):
        clock.advance(10)
        meter.record_device("training", "alice", 1.0)
        feed.sample_usage(meter.snapshot())
    starts = [b.start for b in feed.utilization().buckets]
    assert len(starts) == 3 and starts == sorted(starts) and starts[-1] - t0 == 60.0


def test_feed_rejects_bad_bounds() -> None:
    with pytest.raises(ValueError, match="max_points"):
        DashboardFeed(max_points=1)
    with pytest.raises(ValueError, match="bucket_s"):
        DashboardFeed(bucket_s=0)


def _reserve(services: ServiceRegistry, tenant: str) -> None:
    job = services.scheduler.reserve(
        policy_key="p",
        domain="d",
        tenant_id=tenant,
        task_type="sft",
        sample_count=2,
        producer_role="prod",
        consumer_role="cons",
    )
    assert job is not None


def test_state_is_scoped_to_the_viewer() -> None:
    async def main() -> None:
        async with server(tenants=("alice", "bob"), extra_routers=ROUTERS) as srv:
            c = srv.client
            assert (await c.get("/v1/dashboard/state")).status_code == 401
            # Without metrics, usage, feed or Master the page still gets a state.
            r = await c.get("/v1/dashboard/state", headers=srv.auth("alice"))
            assert r.status_code == 200, r.text
            assert r.json()["utilization"] is None and r.json()["tenants"][0]["usage"] is None

            metrics = MetricsService(flush_interval_s=3600)
            feed = DashboardFeed()
            metrics.subscribe(feed, categories=["learning"])
            metrics.emit(_loss("alice", 1, 0.5))
            metrics.emit(_loss("alice", 2, 0.4))
            metrics.emit(_loss("bob", 1, 9.0))
            metrics.emit_value("control", "inference_queue.depth", 3)
            metrics.drain()
            meter = UsageMeter()
            meter.record_request("bob")
            health = HealthManager(FakeClock(), heartbeat_timeout_s=None)

            async def restart() -> None:
                return None

            health.register("inference/0", restart)
            await health.report_error("inference/0", "worker died")
            srv.services.extras.update(
                {
                    metrics_routes.METRICS: metrics,
                    metrics_routes.USAGE: meter,
                    dashboard.DASHBOARD: feed,
                    dashboard.HEALTH: health,
                }
            )
            for tenant in ("alice", "alice", "bob"):
                _reserve(srv.services, tenant)

            r = await c.get("/v1/dashboard/state", headers=srv.auth("alice"))
            body = r.json()
            assert body["viewer"] == "tenant" and body["tenant_id"] == "alice"
            assert [t["tenant_id"] for t in body["tenants"]] == ["alice"]
            alice = body["tenants"][0]
            assert [p["value"] for p in alice["curves"]["train.loss"]] == [0.5, 0.4]
            assert (
                alice["jobs_by_state"]["reserved"] == 2 and body["jobs_by_state"]["reserved"] == 2
            )
            assert alice["usage"]["requests"] == 0
            assert body["queues"]["inference_queue_depth"] == 3
            assert body["health"] is None  # operators' data: admins only
            assert "bob" not in r.text

            r = await c.get(
                "/v1/dashboard/state", headers=srv.auth("alice"), params={"tenant_id": "bob"}
            )
            assert r.status_code == 403

            r = await c.get("/v1/dashboard/state", headers=srv.admin)
            body = r.json()
            assert body["viewer"] == "admin" and body["tenant_id"] is None
            assert [t["tenant_id"] for t in body["tenants"]] == ["alice", "bob"]
            assert body["jobs_by_state"]["reserved"] == 3
            assert body["tenants"][1]["usage"]["requests"] == 1
            kinds = [e["kind"] for e in body["health"]["events"]]
            assert kinds[:2] == ["registered", "error_reported"] and "restarted" in kinds
            assert body["health"]["roles"][0]["restarts"] == 1
            r = await c.get("/v1/dashboard/state", headers=srv.admin, params={"tenant_id": "bob"})
            assert [t["tenant_id"] for t in r.json()["tenants"]] == ["bob"]

    run(main)


def test_page_is_public_self_contained_and_locked_down() -> None:
    async def main() -> None:
        async with server(extra_routers=ROUTERS) as srv:
            c = srv.client
            r = await c.get("/dashboard")
            assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
            csp = r.headers["content-security-policy"]
            assert "script-src 'self'" in csp and "connect-src 'self'" in csp
            assert r.headers["referrer-policy"] == "no-referrer"
            page = r.text
            assert "/dashboard/static/app.js" in page and "<script>" not in page
            assert "http://" not in page and "https://" not in page  # no CDN
            js = await c.get("/dashboard/static/app.js")
            assert js.status_code == 200 and "javascript" in js.headers["content-type"]
            assert "/v1/dashboard/state" in js.text and "innerHTML" not in js.text
            assert "https://" not in js.text
            css = await c.get("/dashboard/static/style.css")
            assert css.status_code == 200 and "url(" not in css.text
            for bad in ("index.html", "feed.py", "..%2Ffeed.py", "nope.js"):
                r = await c.get(f"/dashboard/static/{bad}")
                assert r.status_code == 404, bad

    run(main)
