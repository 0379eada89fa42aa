"""Chaos test: ``joynexus serve`` SIGKILLed three times, and two simulator workers killed.

The server runs as a real subprocess (127.0.0.1, a free port, a tmp run directory, the
tiny backbone) with two tenants: alice trains a reach2d RL policy and evaluates it
with an evaluation workload of her own; bob fine-tunes on recorded reach2d demos (SFT).
A seeded ``random.Random`` decides the moments:

1. while alice's RL trains alone, her simulator worker (a child of the server's
   multiprocessing fork server, found with psutil) is SIGKILLed; once the Health
   Manager recreated her session, bob's SFT and alice's evaluation are submitted and
   her RL worker is SIGKILLed again;
2. the server is SIGKILLed three times at random moments while the workloads run,
   and each time restarted on the same run directory. Nobody resubmits anything.

Then every workload must have reached its target by itself, each job completed exactly
once (and the jobs a kill left in flight settled against the checkpoint ledger), the
final weights hold exactly ``completion_target`` updates (the ledger and the version
say so), the versions served to each tenant never went back, and the usage the API
reported (device-seconds, samples) never decreased across the restarts.

One known bug can break the last property (usage shown right before a SIGKILL but never
persisted, see :func:`test_usage_shown_is_usage_persisted`): when the evidence is
exactly that, the test ends ``xfail`` with it, after every other check passed.
"""

from __future__ import annotations

import itertools
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from joynexus.api import UsageReport, WorkloadState, WorkloadStatus
from joynexus.client import APIError, Client, RetryPolicy
from joynexus.control.job import JobState, TrainingJob
from joynexus.master.store import SQLiteWorkloadStore, WorkloadRecord
from tests.server.livesrv import reach_rl, reach_sft, tenant_dataset_root
from tests.server.subproc import (
    BASE,
    Served,
    latest_ledger,
    scheduler_jobs,
    serve,
    wait_for,
)

SEED = 20250607
# RL_TARGET leaves room past the last kill cap (10): the resumed RL trains on while the
# evaluation's session restarts, and with 18 it still once finished its last jobs before
# the third kill could find it running. The evaluation's fourth run keeps it live until
# kill 1 while bob's SFT starts (with three it once completed first).
RL_TARGET, SFT_TARGET, EVAL_RUNS = 26, 10, 4
#: horizon 16 x 2 envs = 32 samples per RL job, microbatches of 16: two optimizer steps
#: (two versions) per job; SFT jobs of 48 samples: three.
RL_STEPS_PER_JOB, SFT_STEPS_PER_JOB = 2, 3
#: Server kill k comes at a random moment after the workloads run again, at the latest
#: once alice's RL (bob's SFT) has completed this many jobs: every kill hits them live.
RL_KILL_CAPS, SFT_KILL_CAPS = (7, 9, 10), (4, 6, 8)
KILL_DELAY_S = (0.3, 1.5)
ENV_KILL_DELAY_S = (0.0, 0.5)
DONE_TIMEOUT_S = 150.0
POLL_S = 0.1

#: What a reach2d policy reads (any values: only the answering version matters).
CAMERAS = {"top": np.zeros((1, 32, 32, 3), np.uint8)}
STATE = np.zeros((1, 4), np.float32)
INSTRUCTION = ["Move the red point to the green goal."]

LIVE = (WorkloadState.STARTING, WorkloadState.RUNNING, WorkloadState.PAUSED)
USAGE_FIELDS = ("requests", "inference_samples", "samples_trained", "env_steps")


@dataclass
class Workload:
    name: str
    tenant: str
    wid: str
    spec: dict[str, Any]


@dataclass
class Kill:
    """What a server SIGKILL left on disk (read after the process died)."""

    number: int
    jobs: list[TrainingJob]
    records: dict[str, WorkloadRecord]
    ledgers: dict[str, dict[str, Any]]
    #: ``usage.json`` as the dead server left it (what the next one resumes from).
    usage: UsageReport


@dataclass
class Chaos:
    tmp: Path
    rng: random.Random
    keys: dict[str, str] = field(default_factory=dict)
    workloads: dict[str, Workload] = field(default_factory=dict)
    life: int = 0
    srv: Served | None = None
    clients: dict[str, Client] = field(default_factory=dict)
    last: dict[str, WorkloadStatus] = field(default_factory=dict)
    #: (life, version) answered by ``predict`` / the trainer's version in the status.
    served: dict[str, list[tuple[int, int]]] = field(default_factory=dict)
    trainer: dict[str, list[tuple[int, int]]] = field(default_factory=dict)
    usage: list[tuple[int, UsageReport]] = field(default_factory=list)
    kills: list[Kill] = field(default_factory=list)
    env_kills: list[dict[str, Any]] = field(default_factory=list)
    figures: dict[str, Any] = field(default_factory=dict)

    # ------------------------------------------------------------------ servers

    def attach(self, srv: Served) -> None:
        """A (re)started server: fresh clients, and the workloads back by themselves."""
        self.close_clients()
        self.life += 1
        self.srv = srv
        retry = RetryPolicy(max_retries=3, backoff_s=0.1)
        self.clients = {
            t: Client(srv.url, key, timeout=30, retry=retry) for t, key in self.keys.items()
        }
        self.clients["admin"] = Client(srv.url, srv.admin_key, timeout=30, retry=retry)
        if self.life > 1:
            self.check_resumed()

    def close_clients(self) -> None:
        for c in self.clients.values():
            c.close()
        self.clients = {}

    def add_tenant(self, tenant: str) -> None:
        assert self.srv is not None
        header = self.srv.create_tenant(tenant)
        self.keys[tenant] = header["Authorization"].removeprefix("Bearer ")
        retry = RetryPolicy(max_retries=3, backoff_s=0.1)
        self.clients[tenant] = Client(self.srv.url, self.keys[tenant], timeout=30, retry=retry)

    def submit(self, name: str, tenant: str, spec: dict[str, Any]) -> None:
        st = self.clients[tenant].submit(spec)
        self.workloads[name] = Workload(name, tenant, st.workload_id, spec)

    def check_resumed(self) -> None:
        """Every workload is listed again, unchanged in number (none resubmitted), and
        counts the restarts it lived through."""
        for tenant in self.keys:
            listed = {w.workload_id: w for w in self.clients[tenant].list_workloads()}
            mine = {w.wid for w in self.workloads.values() if w.tenant == tenant}
            assert set(listed) == mine, f"life {self.life}: {tenant} lists {sorted(listed)}"
            for w in self.workloads.values():
                if w.tenant != tenant:
                    continue
                st = listed[w.wid]
                assert st.error is None, f"{w.name} after restart: {st}"
                assert st.restarts == self.expected_restarts(w), (w.name, st, self.kills)

    def expected_restarts(self, w: Workload) -> int:
        """Kills that found the workload live (its durable record said so)."""
        return sum(1 for k in self.kills if k.records[w.wid].state in LIVE)

    # ---------------------------------------------------------------- observing

    def observe(self) -> dict[str, WorkloadStatus]:
        """One look at everything through the API: statuses, served versions, usage."""
        out = {}
        for name, w in self.workloads.items():
            st = self.clients[w.tenant].status(w.wid)
            assert st.state not in (WorkloadState.FAILED, WorkloadState.CANCELLED), (
                f"life {self.life}: {name} ended {st.state.value}: {st.error}"
            )
            out[name] = st
            if st.task != "eval" and st.policy_version is not None:
                self.trainer.setdefault(w.tenant, []).append((self.life, st.policy_version))
        for tenant in {w.tenant for w in self.workloads.values() if w.name != "eval"}:
            try:
                p = self.clients[tenant].predict(tenant, CAMERAS, STATE, INSTRUCTION)
            except APIError as exc:  # no slot yet (a workload still starting)
                assert exc.status in (404, 409), exc
                continue
            self.served.setdefault(tenant, []).append((self.life, p.policy_version))
        self.usage.append((self.life, self.clients["admin"].usage()))
        self.last = out
        return out

    def wait(
        self,
        what: str,
        done: Callable[[dict[str, WorkloadStatus]], bool],
        timeout_s: float = 90.0,
    ) -> dict[str, WorkloadStatus]:
        def probe() -> dict[str, WorkloadStatus] | None:
            st = self.observe()
            return st if done(st) else None

        return wait_for(f"life {self.life}: {what}", probe, timeout_s)

    def live(self) -> list[str]:
        return [n for n, st in self.last.items() if st.state in LIVE]

    # ----------------------------------------------------------- env workers

    def kill_env_worker(self, victim: Any) -> None:
        """SIGKILL alice's RL simulator worker; wait until her session is recreated
        (one worker per live session again) and her RL made progress again."""
        assert self.srv is not None
        time.sleep(self.rng.uniform(*ENV_KILL_DELAY_S))
        rl = self.observe()["rl"]
        assert rl.state is WorkloadState.RUNNING and rl.session_id is not None, rl
        assert victim.is_running(), "the RL simulator worker exited by itself"
        victim.kill()
        self.env_kills.append(
            {"life": self.life, "pid": victim.pid, "session": rl.session_id, "at": rl}
        )
        old = rl.session_id

        def recovered(st: dict[str, WorkloadStatus]) -> bool:
            new = st["rl"].session_id
            sessions = sum(1 for s in st.values() if s.state in LIVE and s.task != "sft")
            return (
                new is not None
                and new != old
                and st["rl"].jobs_completed > rl.jobs_completed
                and len(self.srv.env_workers()) == sessions  # type: ignore[union-attr]
            )

        self.wait("alice's session recreated after the worker kill", recovered)

    # -------------------------------------------------------------- server kill

    def kill_server(self) -> None:
        """SIGKILL the server at a random moment while the workloads run."""
        assert self.srv is not None
        number = len(self.kills) + 1
        self.wait(
            "every live workload running",
            lambda st: all(
                s.state is WorkloadState.RUNNING for s in st.values() if s.state in LIVE
            ),
        )
        started = time.monotonic()
        delay = self.rng.uniform(*KILL_DELAY_S)
        rl_cap, sft_cap = RL_KILL_CAPS[number - 1], SFT_KILL_CAPS[number - 1]
        while True:
            st = self.observe()
            sft_live = "sft" in st and st["sft"].state in LIVE
            if (
                time.monotonic() - started >= delay
                or st["rl"].jobs_completed >= rl_cap
                or (sft_live and st["sft"].jobs_completed >= sft_cap)
            ):
                break
            time.sleep(POLL_S)
        assert st["rl"].state in LIVE, f"kill {number}: alice's RL already ended: {st['rl']}"
        self.srv.sigkill()
        self.close_clients()
        snap = self.tmp / f"kill{number}"
        jobs = scheduler_jobs(self.srv.run_dir, snap)
        records = {r.workload_id: r for r in _records(snap / "scheduler.sqlite")}
        ledgers = {t: latest_ledger(self.srv.run_dir, t) for t in self.keys}
        usage = UsageReport.load(self.srv.run_dir / "usage.json")
        self.kills.append(Kill(number, jobs, records, ledgers, usage))


def _records(db: Path) -> list[WorkloadRecord]:
    store = SQLiteWorkloadStore(db)
    try:
        return store.load()
    finally:
        store.close()


def _monotone(points: list[tuple[int, int]]) -> list[tuple[tuple[int, int], tuple[int, int]]]:
    """The consecutive observations where the value went down (empty: monotone)."""
    return [(a, b) for a, b in itertools.pairwise(points) if b[1] < a[1]]


def _usage_decreases(usage: list[tuple[int, UsageReport]]) -> list[str]:
    """Every per-tenant usage figure that went down between two observations."""
    out = []
    for (la, a), (lb, b) in itertools.pairwise(usage):
        out += _decreases(f"life {la}->{lb}", a, b)
    return out


def _decreases(where: str, a: UsageReport, b: UsageReport) -> list[str]:
    """The per-tenant figures of ``a`` that ``b`` reports lower."""
    out = []
    for tid, ua in a.tenants.items():
        ub = b.tenants.get(tid)
        if ub is None:
            out.append(f"{where}: tenant {tid} vanished from the usage")
            continue
        pairs = [
            (f"{s} s", ua.device_seconds[s], ub.device_seconds.get(s, 0.0))
            for s in ua.device_seconds
        ]
        pairs += [(f, getattr(ua, f), getattr(ub, f)) for f in USAGE_FIELDS]
        out += [f"{where}: {tid} {name} {va} -> {vb}" for name, va, vb in pairs if vb < va]
    return out


def _jobs_of(jobs: list[TrainingJob], wid: str) -> list[TrainingJob]:
    return [j for j in jobs if j.metadata.get("workload_id") == wid]


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_chaos_kills_server_and_workers_every_workload_completes(
    tmp_path: Path, reach_demos: Path
) -> None:
    pytest.importorskip("psutil", reason="the simulator workers are found with psutil")
    t0 = time.monotonic()
    run_dir, log = tmp_path / "run", tmp_path / "serve.log"
    root = tenant_dataset_root(tmp_path / "datasets", reach_demos, "bob")
    args = ("--dataset-root", str(root))
    chaos = Chaos(tmp_path, random.Random(SEED))
    rl = reach_rl("alice", BASE, target=RL_TARGET, horizon=16)
    sft = reach_sft("bob", BASE, Path(reach_demos.name), target=SFT_TARGET)
    sft["algorithm"]["samples_per_job"] = 16 * SFT_STEPS_PER_JOB
    ev = {
        "tenant": "alice",
        "task": "eval",
        "base_model": {"id": BASE},
        "env": {"kind": "reach2d", "num_envs": 1, "image_size": 32, "max_episode_steps": 6},
        "evaluation": {"targets": ["alice"], "episodes": 2, "interval_s": 2.0, "runs": EVAL_RUNS},
    }

    try:
        # --- life 1: alice's RL alone; her simulator worker killed twice; then kill 1.
        with serve(run_dir, log, *args) as srv:
            chaos.attach(srv)
            chaos.add_tenant("alice")
            chaos.add_tenant("bob")
            chaos.submit("rl", "alice", rl)
            chaos.wait(
                "alice's RL running with its one simulator worker",
                lambda st: st["rl"].jobs_completed >= 1 and len(srv.env_workers()) == 1,
            )
            chaos.kill_env_worker(srv.env_workers()[0])
            rl_worker = srv.env_workers()[0]  # the recreated session's worker
            chaos.submit("eval", "alice", ev)
            chaos.wait(
                "alice's evaluation running (two simulator workers)",
                lambda st: (
                    st["eval"].state is WorkloadState.RUNNING
                    and {p.pid for p in srv.env_workers()} > {rl_worker.pid}
                ),
            )
            # The worker alive before the evaluation started is the RL session's.
            chaos.kill_env_worker(rl_worker)
            chaos.submit("sft", "bob", sft)  # no simulator: starts right before kill 1
            ready = httpx.get(f"{srv.url}/readyz", timeout=30)
            assert ready.status_code == 200, f"two session restarts are within budget: {ready.text}"
            events = chaos.clients["admin"].dashboard_state()["health"]["events"]
            env_events = [e["kind"] for e in events if e["role"] == "environment"]
            assert env_events.count("restarted") == 2, events
            chaos.kill_server()
        first = chaos.kills[0].records
        for name in ("rl", "sft", "eval"):  # kill 1 hit every workload live
            assert first[chaos.workloads[name].wid].state in LIVE, (name, first)

        # --- lives 2 and 3: resumed by themselves, killed again at random moments.
        for _ in range(2):
            with serve(run_dir, log, *args) as srv:
                chaos.attach(srv)
                chaos.kill_server()

        # --- life 4: everything finishes by itself.
        with serve(run_dir, log, *args) as srv:
            chaos.attach(srv)
            final = chaos.wait(
                "every workload completed",
                lambda st: all(s.state is WorkloadState.COMPLETED for s in st.values()),
                DONE_TIMEOUT_S,
            )
            ready = httpx.get(f"{srv.url}/readyz", timeout=30)
            assert ready.status_code == 200, ready.text
            alice, bob = chaos.clients["alice"], chaos.clients["bob"]
            evals = alice.metrics(chaos.workloads["eval"].wid, kind="eval").records
            trains = {
                "rl": alice.metrics(chaos.workloads["rl"].wid, kind="train").records,
                "sft": bob.metrics(chaos.workloads["sft"].wid, kind="train").records,
            }
            chaos.close_clients()
            srv.sigterm()
    finally:
        chaos.close_clients()

    jobs = scheduler_jobs(run_dir, tmp_path / "final")
    ledgers = {t: latest_ledger(run_dir, t) for t in ("alice", "bob")}
    wl = chaos.workloads

    # Every workload reached its target by itself (one workload each: none resubmitted).
    rl_st, sft_st, ev_st = final["rl"], final["sft"], final["eval"]
    assert (rl_st.jobs_completed, rl_st.jobs_target) == (RL_TARGET, RL_TARGET), rl_st
    assert (sft_st.jobs_completed, sft_st.jobs_target) == (SFT_TARGET, SFT_TARGET), sft_st
    assert ev_st.eval_runs_completed == ev_st.eval_runs_target == EVAL_RUNS, ev_st
    assert sorted(r["run"] for r in evals) == list(range(EVAL_RUNS)), evals
    for name, st in final.items():
        assert st.error is None and st.stalled is None, st
        assert st.restarts == chaos.expected_restarts(wl[name]), (name, st)
    assert rl_st.restarts == len(chaos.kills) == 3

    # Each job completed exactly once; every job a kill left in flight was settled
    # against the checkpoint ledger (completed iff its update is in the weights).
    by_id = {j.job_id: j for j in jobs}
    assert all(j.is_terminal for j in jobs), [j for j in jobs if not j.is_terminal]
    for kill in chaos.kills:
        for j in kill.jobs:
            if j.is_terminal:
                assert by_id[j.job_id].state is j.state, (kill.number, j, by_id[j.job_id])
            elif j.job_id == kill.ledgers[j.tenant_id].get("job_id"):
                assert by_id[j.job_id].state is JobState.COMPLETED, (kill.number, by_id[j.job_id])
            else:
                assert by_id[j.job_id].state is JobState.FAILED, (kill.number, by_id[j.job_id])
                assert by_id[j.job_id].terminal_reason == "runtime_restarted", by_id[j.job_id]
    for name, target, tenant, steps in (
        ("rl", RL_TARGET, "alice", RL_STEPS_PER_JOB),
        ("sft", SFT_TARGET, "bob", SFT_STEPS_PER_JOB),
    ):
        mine = _jobs_of(jobs, wl[name].wid)
        completed = [j for j in mine if j.state is JobState.COMPLETED]
        assert len(completed) == target, (name, len(completed))
        trained = [r["job_id"] for r in trains[name]]
        assert len(trained) == len(set(trained)), f"{name}: a job trained twice: {trained}"
        assert set(trained) <= {j.job_id for j in completed}, name
        # The final weights hold exactly the target's updates, each applied once.
        ledger = ledgers[tenant]
        assert ledger["workload_id"] == wl[name].wid, ledger
        assert ledger["jobs_applied"] == target == len(completed), (name, ledger)
        assert final[name].policy_version == target * steps, (name, final[name])
        failed = [j for j in mine if j.state is JobState.FAILED]
        others = [j for j in failed if j.terminal_reason != "runtime_restarted"]
        # Only alice's two simulator crashes may cost a job (one each), nothing else.
        assert len(others) <= (len(chaos.env_kills) if name == "rl" else 0), others
        chaos.figures[name] = {
            "completed": len(completed),
            "failed_restarted": len(failed) - len(others),
            "failed_other": len(others),
            "dropped": sum(1 for j in mine if j.state is JobState.DROPPED),
            "version": final[name].policy_version,
            "restarts": final[name].restarts,
        }

    # The versions served to each tenant never went back, across every restart.
    for tenant in ("alice", "bob"):
        seen = chaos.served.get(tenant, [])
        assert {life for life, _ in seen} == {1, 2, 3, 4}, f"{tenant} not served: {seen}"
        assert not _monotone(seen), f"{tenant}'s served version went back: {_monotone(seen)}"
        assert max(v for _, v in seen) <= ledgers[tenant]["jobs_applied"] * (
            RL_STEPS_PER_JOB if tenant == "alice" else SFT_STEPS_PER_JOB
        )
    eval_versions = [r["version"] for r in sorted(evals, key=lambda r: r["run"])]
    assert eval_versions == sorted(eval_versions), evals

    # Usage as the API reported it never decreased while a server lived, and each
    # restarted server resumed from what the dead one had persisted.
    within = [
        d
        for (la, a), (lb, b) in itertools.pairwise(chaos.usage)
        if la == lb
        for d in _decreases(f"life {la}", a, b)
    ]
    assert not within, within
    shown_lost = []
    for kill in chaos.kills:
        shown = [u for life, u in chaos.usage if life == kill.number][-1]
        resumed = next(u for life, u in chaos.usage if life == kill.number + 1)
        assert not _decreases(f"kill {kill.number}", kill.usage, resumed), kill.number
        shown_lost += _decreases(f"kill {kill.number}: shown -> persisted", shown, kill.usage)
    last = chaos.usage[-1][1].tenants
    assert last["alice"].samples_trained > 0 and last["bob"].samples_trained > 0, last
    assert last["alice"].device_seconds["environment"] > 0, last

    chaos.figures.update(
        eval_runs=ev_st.eval_runs_completed,
        eval_restarts=ev_st.restarts,
        served_final={t: chaos.served[t][-1][1] for t in ("alice", "bob")},
        trainer_regressions={t: _monotone(v) for t, v in chaos.trainer.items()},
        env_kills=len(chaos.env_kills),
        server_kills=len(chaos.kills),
        usage={t: (u.total_device_seconds, u.samples_trained) for t, u in last.items()},
        observations=len(chaos.usage),
        wall_s=round(time.monotonic() - t0, 1),
    )
    print(f"chaos figures: {chaos.figures}")
    # What the API showed right before a SIGKILL was persisted, so it never decreases.
    assert not shown_lost, shown_lost
    assert not _usage_decreases(chaos.usage), _usage_decreases(chaos.usage)
