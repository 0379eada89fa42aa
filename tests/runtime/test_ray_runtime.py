"""The Ray placement: same workloads, same invariants as the in-process end-to-end test.

The workloads run on an in-process Master (:class:`~joynexus.master.run.LocalRun`) whose
plane is built with a :class:`RayPlacement`. The checks that call into the actors run
before the run is closed (closing kills the actors and releases the placement group).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from joynexus.control.job import JobState
from joynexus.master.run import LocalRun
from joynexus.runtime.ray_hosting import RayHosting, RayPlacement
from joynexus.runtime.ray_proxy import ActorProxy
from joynexus.workflows.summary import RunSummary, TenantProgress
from tests.runtime.ray_helpers import run_checked
from tests.workflows.helpers import rl_spec, spec

pytestmark = pytest.mark.ray


def _sft(tenant: str, base: str, demos: Path, out: Path, target: int) -> Any:
    return spec(
        {
            "tenant": tenant,
            "task": "sft",
            "base_model": {"id": base},
            "dataset": {"path": str(demos), "heldout_fraction": 0.2},
            "action_module": {"type": "oft", "hidden_dim": 64, "num_blocks": 1},
            "algorithm": {"name": "sft", "samples_per_job": 32, "microbatch_size": 16},
            "scheduling": {"completion_target": target, "prefetch": 2},
            "output_dir": str(out),
        }
    )


def test_rl_and_sft_run_on_ray_actors_like_in_process(
    ray_cluster: None, tmp_path: Path, tiny_model: str, reach2d_demos: Path
) -> None:
    import ray

    out = tmp_path / "out"
    specs = [
        rl_spec("reach-rl", tiny_model, out, target=2, horizon=6, num_envs=2, episode_steps=6),
        _sft("reach-sft", tiny_model, reach2d_demos, out, target=2),
    ]

    def check(run: LocalRun, summary: RunSummary) -> None:
        s = summary.tenants
        assert run.plane is not None
        sched = run.plane.scheduler
        assert {t.state for t in s.values()} == {"completed"}, {t: x.errors for t, x in s.items()}

        # The services really were actors in the layout's placement group.
        hosting = run.plane.hosting
        assert isinstance(hosting, RayHosting) and hosting.group is not None
        assert hosting.group.layout.bundles() == [{"GPU": 2.0}, {"GPU": 2.0}, {"GPU": 4.0}]
        training = run.plane.training
        assert isinstance(training, ActorProxy)
        for svc in (run.plane.queue, run.plane.env):
            assert isinstance(svc, ActorProxy), svc
        gpus = ray.get(training.actor.__ray_call__.remote(lambda _svc: ray.get_gpu_ids()))
        assert len(gpus) == 2

        # All jobs terminal and completed; nothing failed.
        for tenant in ("reach-rl", "reach-sft"):
            jobs = sched.list_jobs(tenant_id=tenant)
            assert jobs and all(j.is_terminal for j in jobs)
            done = [j for j in jobs if j.state is JobState.COMPLETED]
            assert len(done) == s[tenant].jobs_completed >= 2
        assert sched.counters()["by_state"].get("failed", 0) == 0

        # Partitions cleared: the queue actor holds nothing, in the index or the store.
        assert run.plane.queue.partitions() == []
        assert run.plane.queue.nbytes == 0

        # Versions advanced per tenant, independently (same rule as in process).
        assert s["reach-rl"].final_version == s["reach-rl"].jobs_completed
        assert s["reach-sft"].final_version == 2 * s["reach-sft"].jobs_completed
        assert s["reach-sft"].sft_heldout_error_final is not None
        # Semantic change: checkpoints live in <run_dir>/outputs/<tenant> (the specs'
        # output_dir is ignored).
        for tenant in ("reach-rl", "reach-sft"):
            assert any((run.run_dir / "outputs" / tenant).glob("step_*/manifest.json"))

    run_checked(specs, LocalRun(tmp_path / "run", placement=RayPlacement(layout="2-2-4")), check)


def test_layouts_place_on_fake_gpus_and_an_oversized_one_is_refused(ray_cluster: None) -> None:
    import ray

    from joynexus.errors import CapacityError, SpecError
    from joynexus.runtime.placement import Layout, build_placement

    isolated = build_placement(Layout.parse("isolated"), timeout_s=10)
    try:
        assert str(isolated.layout) == "1-1-2"

        @ray.remote
        def gpus() -> int:
            return len(ray.get_gpu_ids())

        env_gpus = gpus.options(**isolated.actor_options("environment")).remote()
        assert ray.get(env_gpus) == 2
        # 1-1-2 holds 4 of the 8 GPUs: a 2-2-4 next to it cannot be placed.
        with pytest.raises(CapacityError, match="needs 8 GPUs"):
            build_placement(Layout.parse("2-2-4"), timeout_s=2)
    finally:
        isolated.remove()
    with pytest.raises(SpecError):
        Layout.parse("2-2")


def test_killed_inference_actor_is_restarted_and_the_workload_completes(
    ray_cluster: None, tmp_path: Path, tiny_model: str, reach2d_demos: Path
) -> None:
    out = tmp_path / "out"
    specs = [
        # One rollout in flight at a time: exactly one job can be caught by the kill.
        rl_spec(
            "rl", tiny_model, out, target=3, horizon=6, num_envs=2, episode_steps=6, max_in_flight=1
        ),
        _sft("sft", tiny_model, reach2d_demos, out, target=2),
    ]
    run = LocalRun(tmp_path / "run", placement=RayPlacement(layout="2-2-4"), health_check_s=0.2)
    killed: list[bool] = []

    def on_progress(rows: list[TenantProgress]) -> None:
        rl = next(r for r in rows if r.tenant == "rl")
        if not killed and rl.completed >= 1:
            killed.append(True)
            assert run.plane is not None and isinstance(run.plane.hosting, RayHosting)
            run.plane.hosting.kill_engine(0)

    def check(run: LocalRun, summary: RunSummary) -> None:
        assert killed
        kinds = [e.kind for e in run.health.events_of("inference/0")]
        assert "restarted" in kinds and run.health.escalated is None
        s = summary.tenants
        assert {t.state for t in s.values()} == {"completed"}, {t: x.errors for t, x in s.items()}
        assert run.plane is not None
        for tid in ("rl", "sft"):
            assert all(j.is_terminal for j in run.plane.scheduler.list_jobs(tenant_id=tid))
        assert s["rl"].jobs_completed >= 3 and s["sft"].jobs_completed >= 2
        assert s["sft"].jobs_failed == 0 and s["rl"].jobs_failed <= 1
        assert s["rl"].final_version == s["rl"].jobs_completed
        assert run.plane.queue.partitions() == [] and run.plane.queue.nbytes == 0

    run_checked(specs, run, check, on_progress)
