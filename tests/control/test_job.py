"""The job descriptor and the Table 4 transition table."""

from __future__ import annotations

import itertools

import pytest

from joynexus.control.job import (
    ALLOWED_TRANSITIONS,
    LEASE_RETURN,
    TERMINAL_STATES,
    JobState,
    TaskType,
    TrainingJob,
    check_transition,
    derive_partition_id,
    is_stale,
)
from joynexus.control.scheduler import TrainingScheduler
from joynexus.errors import IllegalTransitionError, InvalidRequestError

from .conftest import reserve

S = JobState

SFT_PATH = [S.RESERVED, S.READY, S.LEASED, S.COMPLETED]
RL_PATH = [
    S.RESERVED,
    S.COMPUTING_ACTOR_FORWARD,
    S.NEEDS_ADVANTAGES,
    S.COMPUTING_ADVANTAGES,
    S.READY,
    S.LEASED,
    S.COMPLETED,
]


def _edges(task: TaskType) -> set[tuple[JobState, JobState]]:
    return {(a, b) for a, targets in ALLOWED_TRANSITIONS[task].items() for b in targets}


def test_table_4_edges_exactly() -> None:
    nonterminal = set(JobState) - TERMINAL_STATES
    sft_expected = set(itertools.pairwise(SFT_PATH))
    sft_expected |= {(s, S.FAILED) for s in (S.RESERVED, S.READY, S.LEASED)}
    assert _edges(TaskType.SFT) == sft_expected

    rl_expected = set(itertools.pairwise(RL_PATH)) | {(S.RESERVED, S.NEEDS_ADVANTAGES)}
    rl_expected |= {(s, S.FAILED) for s in nonterminal}
    rl_expected |= {(S.READY, S.DROPPED), (S.LEASED, S.DROPPED)}
    assert _edges(TaskType.RL) == rl_expected
    for task in TaskType:
        for terminal in TERMINAL_STATES:
            assert ALLOWED_TRANSITIONS[task][terminal] == frozenset()


def test_lease_return_targets_are_predecessors() -> None:
    for leased, back in LEASE_RETURN.items():
        assert leased in ALLOWED_TRANSITIONS[TaskType.RL][back]


@pytest.mark.parametrize(
    ("task", "src", "dst"),
    [
        (TaskType.SFT, S.RESERVED, S.NEEDS_ADVANTAGES),
        (TaskType.SFT, S.READY, S.DROPPED),
        (TaskType.RL, S.RESERVED, S.READY),
        (TaskType.RL, S.NEEDS_ADVANTAGES, S.READY),
        (TaskType.RL, S.COMPLETED, S.READY),
        (TaskType.RL, S.NEEDS_ADVANTAGES, S.DROPPED),
        (TaskType.RL, S.LEASED, S.READY),
        (TaskType.SFT, S.FAILED, S.FAILED),
    ],
)
def test_illegal_edges_raise_with_clear_message(
    task: TaskType, src: JobState, dst: JobState
) -> None:
    with pytest.raises(IllegalTransitionError) as info:
        check_transition("job-x", task, src, dst)
    err = info.value
    assert "job-x" in err.message and f"'{src.value}'" in err.message
    assert f"'{dst.value}'" in err.message
    assert err.details["allowed"] == sorted(t.value for t in ALLOWED_TRANSITIONS[task][src])
    assert err.code == "illegal_transition" and err.http_status == 409


def test_every_sft_edge_works_through_the_scheduler(sched: TrainingScheduler) -> None:
    job = reserve(sched, task="sft")
    assert job.state is S.RESERVED and job.lease_epoch == 1
    job = sched.mark(job.job_id, "ready", lease_epoch=job.lease_epoch)
    assert job.state is S.READY and job.ready_seq == 1 and job.ready_at is not None
    leased = sched.lease_next("actor", ["vla"])
    assert leased is not None and leased.state is S.LEASED and leased.leased_at is not None
    done = sched.complete(leased.job_id, leased.lease_epoch, metadata={"actor_versions": {"t1": 1}})
    assert done.state is S.COMPLETED and done.finished_at is not None
    assert done.metadata["actor_versions"] == {"t1": 1}
    assert done.metadata["schema_signature"] == "sig-a"
    assert done.lease_expires_at is None and done.is_terminal


def test_every_rl_edge_works_through_the_scheduler(sched: TrainingScheduler) -> None:
    job = reserve(sched, task="rl", behavior_policy_version=3, max_policy_staleness=1)
    job = sched.hand_off(job.job_id, job.lease_epoch)
    assert job.state is S.RESERVED and not job.has_lease
    fwd = sched.lease_stage("reserved", "actor", "vla", "computing_actor_forward")
    assert fwd is not None and fwd.state is S.COMPUTING_ACTOR_FORWARD and fwd.lease_epoch == 2
    job = sched.mark(job.job_id, "needs_advantages", lease_epoch=fwd.lease_epoch)
    adv = sched.lease_stage("needs_advantages", "actor", "vla", "computing_advantages")
    assert adv is not None and adv.state is S.COMPUTING_ADVANTAGES and adv.lease_epoch == 3
    job = sched.mark(job.job_id, "ready", lease_epoch=adv.lease_epoch)
    assert job.state is S.READY
    leased = sched.lease_next("actor", ["vla"])
    assert leased is not None and leased.lease_epoch == 4
    assert sched.complete(leased.job_id, leased.lease_epoch).state is S.COMPLETED


def test_rl_without_actor_forward_marks_needs_advantages_directly(
    sched: TrainingScheduler,
) -> None:
    job = reserve(sched, task="rl")
    assert sched.mark(job.job_id, "needs_advantages").state is S.NEEDS_ADVANTAGES


@pytest.mark.parametrize("state", [S.RESERVED, S.NEEDS_ADVANTAGES, S.READY, S.LEASED])
def test_any_nonterminal_state_can_fail(sched: TrainingScheduler, state: JobState) -> None:
    job = reserve(sched, task="rl")
    if state is not S.RESERVED:
        sched.mark(job.job_id, "needs_advantages")
    if state in (S.READY, S.LEASED):
        staged = sched.lease_stage("needs_advantages", "actor", "vla", "computing_advantages")
        assert staged is not None
        sched.mark(job.job_id, "ready")
    if state is S.LEASED:
        assert sched.lease_next("actor", "vla") is not None
    assert sched.get(job.job_id).state is state
    failed = sched.fail(job.job_id, "env crashed")
    assert failed.state is S.FAILED and failed.terminal_reason == "env crashed"
    with pytest.raises(IllegalTransitionError):
        sched.fail(job.job_id, "again")


def test_stale_rl_job_is_dropped_but_sft_cannot_be(sched: TrainingScheduler) -> None:
    rl = reserve(sched, task="rl", behavior_policy_version=1, max_policy_staleness=0)
    sched.mark(rl.job_id, "needs_advantages")
    assert sched.lease_stage("needs_advantages", "actor", "vla", "computing_advantages")
    sched.mark(rl.job_id, "ready")
    dropped = sched.drop(rl.job_id, "policy_stale")
    assert dropped.state is S.DROPPED and dropped.terminal_reason == "policy_stale"
    sft = reserve(sched, task="sft")
    sched.mark(sft.job_id, "ready")
    with pytest.raises(IllegalTransitionError, match="sft task"):
        sched.drop(sft.job_id, "policy_stale")


def test_mark_into_a_lease_state_points_to_lease_calls(sched: TrainingScheduler) -> None:
    job = reserve(sched, task="rl")
    sched.mark(job.job_id, "needs_advantages")
    with pytest.raises(IllegalTransitionError, match="lease_stage"):
        sched.mark(job.job_id, "computing_advantages")
    assert sched.get(job.job_id).state is S.NEEDS_ADVANTAGES


def test_staleness_predicate_eq_1(sched: TrainingScheduler) -> None:
    rl = reserve(sched, task="rl", behavior_policy_version=5, max_policy_staleness=2)
    assert not is_stale(rl, 7) and TrainingScheduler.is_stale(rl, 8)
    assert not TrainingScheduler.is_stale(rl, 5)
    unbounded = reserve(sched, task="rl", behavior_policy_version=5)
    assert not TrainingScheduler.is_stale(unbounded, 1000)
    unversioned = reserve(sched, task="rl", max_policy_staleness=0)
    assert not TrainingScheduler.is_stale(unversioned, 1000)
    sft = reserve(sched, task="sft", behavior_policy_version=0, max_policy_staleness=0)
    assert not TrainingScheduler.is_stale(sft, 1000)


def test_snapshot_is_a_valid_model_and_supports_item_access(sched: TrainingScheduler) -> None:
    job = reserve(sched, task="rl", behavior_policy_version=2)
    again = TrainingJob.model_validate(job.model_dump())
    assert again == job and again.model_dump_json() == job.model_dump_json()
    assert job["partition_id"] == job.partition_id and job["created_at"] == job.created_at
    assert job.schema_signature == "sig-a"
    with pytest.raises(KeyError):
        job["nope"]
    with pytest.raises(ValueError):
        TrainingJob.model_validate({**job.model_dump(), "unexpected": 1})


def test_partition_ids_are_deterministic_and_unique(sched: TrainingScheduler) -> None:
    a = derive_partition_id("job-1", "vla", "t1", TaskType.RL)
    assert a == derive_partition_id("job-1", "vla", "t1", TaskType.RL)
    assert (
        len(
            {
                a,
                derive_partition_id("job-1", "vla", "t1", TaskType.SFT),
                derive_partition_id("job-1", "vla", "t2", TaskType.RL),
                derive_partition_id("job-1", "sim", "t1", TaskType.RL),
                derive_partition_id("job-2", "vla", "t1", TaskType.RL),
            }
        )
        == 5
    )
    jobs = [reserve(sched, tenant=f"t{i % 3}", task="sft") for i in range(50)]
    assert len({j.partition_id for j in jobs}) == 50
    for j in jobs:
        assert j.partition_id == derive_partition_id(j.job_id, j.domain, j.tenant_id, j.task_type)


def test_metadata_nested_past_the_limit_is_refused_before_it_is_stored(
    sched: TrainingScheduler,
) -> None:
    """The scheduler's own backstop (callers other than the HTTP API)."""
    deep: dict[str, object] = {"leaf": 1}
    for _ in range(299):
        deep = {"a": deep}
    with pytest.raises(InvalidRequestError, match="more than 32 levels") as refused:
        reserve(sched, metadata=deep)
    assert refused.value.details["field"] == "metadata"
    assert sched.list_jobs("t1") == []
    job = reserve(sched)
    sched.mark(job.job_id, S.READY)
    leased = sched.lease_next("actor", ["vla"])
    assert leased is not None
    with pytest.raises(InvalidRequestError, match="more than 32 levels"):
        sched.complete(job.job_id, leased.lease_epoch, {"more": deep})
    assert sched.get(job.job_id).metadata == {"schema_signature": "sig-a"}
