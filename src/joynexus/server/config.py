"""Server configuration and per-tenant quotas (plain pydantic data, no services)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "DEFAULT_SERVE_MAX_WAIT_MS",
    "DEFAULT_SERVE_TENANT_BATCH_ROWS",
    "MAX_API_INT",
    "RUNTIME_PREDICT_DEADLINE_S",
    "ServerConfig",
    "TenantQuotas",
]

#: Largest integer any API field accepts (2^53 - 1: exact in every JSON implementation,
#: and far inside SQLite's signed 64-bit INTEGER).
MAX_API_INT = 2**53 - 1
#: ``joynexus serve``'s T (``--max-wait-ms``). A served policy's callers are closed loops
#: that wait for each answer, so T is paid on every step; the serving bench's tiny load
#: served about 6 % more at 2 ms than at the in-process runs' 5 ms (docs/RESULTS.md §8.1.10).
DEFAULT_SERVE_MAX_WAIT_MS = 2.0
#: ``joynexus serve``'s C (``--tenant-batch-rows``): the most rows of one tenant in one
#: grouped batch, so another tenant's request waits at most one batch holding C of its
#: rows (a large predict runs as C-row pieces). 16: the largest C whose victim p99 under
#: a flood stayed within 3x its quiet p99 on the tiny model (2.5x; 32 gave 3.1-3.6x,
#: 8 gave 1.5-1.7x for a flooder's 25 % fewer rows/s than 16: docs/RESULTS.md §8.1.11).
DEFAULT_SERVE_TENANT_BATCH_ROWS = 16
#: ``RuntimeConfig.predict_deadline_s``'s default and ``serve --predict-deadline-s``'s,
#: which also bounds T (checked before the runtime is imported).
RUNTIME_PREDICT_DEADLINE_S = 60.0


class TenantQuotas(BaseModel):
    """Limits one tenant runs under; exceeding one answers 429 with its ``reason``.

    Args:
        max_sessions: Open (or starting) environment sessions.
        max_inflight_jobs: Nonterminal training jobs in the Training Scheduler.
        max_queue_bytes: Bytes held in the Training Queue partitions the tenant owns.
        max_partitions: Training Queue partitions the tenant owns at once (a
            ``queue_put`` that would create one more answers 429, reason ``partitions``).
        requests_per_s: Sustained request rate (token-bucket refill rate).
        burst: Requests allowed at once on top of the sustained rate (bucket size).
        max_pending_futures: Long operations submitted and not finished yet.
        read_bytes_per_s: Sustained bytes of tensors ``get_data`` may answer the tenant
            per second (byte token-bucket refill rate): 429 ``read_bytes`` past it.
        read_burst_bytes: Bytes ``get_data`` may answer at once (bucket size); a single
            read larger than this can never pass (422: page it).
        max_disk_bytes: Bytes the tenant's files (checkpoints, workload folders) may
            take on the server's disk; past it a submit or ``save`` answers 429, reason
            ``disk_bytes``, and a running workload's checkpoints wait (status ``fault``)
            until it is under the quota again.
    """

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    max_sessions: int = Field(default=4, ge=0, le=1024)
    max_inflight_jobs: int = Field(default=64, ge=0, le=1_000_000)
    max_queue_bytes: int = Field(default=2 << 30, ge=0, le=MAX_API_INT)
    max_partitions: int = Field(default=256, ge=0, le=1_000_000)
    requests_per_s: float = Field(default=200.0, gt=0, le=1e9)
    burst: int = Field(default=400, ge=1, le=1_000_000_000)
    max_pending_futures: int = Field(default=16, ge=0, le=10_000)
    read_bytes_per_s: float = Field(default=float(128 << 20), gt=0, le=1e15)
    read_burst_bytes: int = Field(default=256 << 20, ge=1, le=MAX_API_INT)
    max_disk_bytes: int = Field(default=64 << 30, ge=0, le=MAX_API_INT)


class ServerConfig(BaseModel):
    """What the HTTP server enforces on every request.

    Args:
        default_quotas: Quotas of tenants created without their own.
        max_body_bytes: Largest request body of a route that carries tensors (msgpack
            or JSON tensors: queue puts, env steps, model primitives); 413 above it.
        max_json_body_bytes: Largest request body of every other route (JSON control
            messages: jobs, leases, sessions, tenants); 413 above it. Both limits hold
            with or without a ``Content-Length`` (chunked bodies are counted as read).
        max_tensor_bytes: Largest single tensor in a body.
        max_job_metadata_bytes: Largest ``metadata`` of a training job (its serialized
            JSON, after a ``complete`` merges into it); 413 above it. The scheduler
            stores it with the job for good.
        max_drain_bytes: Most bytes of a refused (413) body the server reads and
            discards so that a client still sending it can read the 413; past it, the
            connection is closed.
        max_get_data_indexes: Sample indexes one ``get_data`` may name (repeats
            count); 422 ``limit_exceeded`` above it: page the read.
        max_response_bytes: Bytes of tensors one ``get_data`` may return (indexes ×
            bytes per sample of the fields asked for, known before anything is read);
            422 ``limit_exceeded`` above it: page the read.
        max_predict_rows: Observations (rows) one ``predict`` may carry; 422 above it.
            The Inference Queue still splits a request into batch-sized pieces so other
            tenants' requests run between them.
        max_predict_text_chars: Characters of instructions (all rows together) one
            ``predict`` may carry; 422 above it. Text becomes backbone tokens: this
            bounds the tokens one request makes the shared backbone process.
        max_reserved_jobs_per_tenant: Jobs one tenant may hold in ``reserved`` through
            the scheduler primitives at once (429 ``quota_exceeded`` above it). They do
            not count against the Master's bounds on active rollouts (§5.1), which
            cover the workloads' own jobs, so they cannot keep other tenants' workloads
            from being admitted.
        queue_memory_cap_bytes: Bytes the Training Queue may hold in total (all
            tenants) before a tenant's write over HTTP answers 429
            ``memory_cap_exceeded``; None: no server-wide bound.
        max_long_poll_s: Upper bound on ``?wait=`` of future polls and lease waits.
        future_retention_s: How long a finished future nobody has read stays readable.
        future_read_retention_s: How long a finished future stays readable after its
            result was first read (or after it was cancelled); ``DELETE`` forgets it
            at once.
        max_futures_per_tenant: Futures one tenant holds (pending + finished). Only
            pending ones count against the tenant's ``max_pending_futures`` quota: when
            a new future would pass this bound, the oldest finished ones are forgotten.
        denied_env_kinds: Environment kinds tenants may not open over HTTP. ``remote``
            is denied by default because it makes the server connect to a URL the
            tenant chooses.
        gym_allowed_ids: Gymnasium ids tenants may open with ``kind: gym`` (sessions and
            workloads). None (default): any id gymnasium has registered in the server,
            but never a ``module:Env-v0`` id, which would make gymnasium import
            ``module``.
        gym_allowed_imports: Modules tenants may have the server import first
            (``options.imports`` of a ``kind: gym`` spec); default none. Importing a
            module runs its code in the server.
        gym_allowed_make_kwargs: Keyword arguments tenants may pass to
            ``gymnasium.make`` (keys of ``options.make_kwargs``); default none.
        expose_docs: Serve the interactive docs at ``/docs`` (the schema is always at
            ``/openapi.json``).
    """

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    default_quotas: TenantQuotas = Field(default_factory=TenantQuotas)
    max_body_bytes: int = Field(default=256 << 20, gt=0)
    max_json_body_bytes: int = Field(default=4 << 20, gt=0)
    max_tensor_bytes: int = Field(default=128 << 20, gt=0)
    max_job_metadata_bytes: int = Field(default=64 << 10, gt=0)
    max_drain_bytes: int = Field(default=128 << 20, ge=0)
    max_get_data_indexes: int = Field(default=16_384, ge=1)
    max_response_bytes: int = Field(default=256 << 20, gt=0)
    max_predict_rows: int = Field(default=256, ge=1)
    max_predict_text_chars: int = Field(default=262_144, ge=1)
    max_reserved_jobs_per_tenant: int = Field(default=8, ge=1)
    queue_memory_cap_bytes: int | None = Field(default=8 << 30, gt=0)
    max_long_poll_s: float = Field(default=30.0, ge=0)
    future_retention_s: float = Field(default=3600.0, gt=0)
    future_read_retention_s: float = Field(default=60.0, ge=0)
    max_futures_per_tenant: int = Field(default=256, ge=1)
    denied_env_kinds: list[str] = Field(default_factory=lambda: ["remote"])
    gym_allowed_ids: list[str] | None = None
    gym_allowed_imports: list[str] = Field(default_factory=list)
    gym_allowed_make_kwargs: list[str] = Field(default_factory=list)
    expose_docs: bool = True
