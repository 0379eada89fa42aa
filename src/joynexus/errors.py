"""The one error hierarchy of JoyNexus.

Every error the system raises on purpose derives from :class:`JoyNexusError`. Each
class carries a machine-readable ``code`` and the HTTP status the server maps it to,
so the API layer never has to guess (and never answers 500 for bad input)::

    JoyNexusError                      code                 http
    ├── InvalidRequestError            invalid_request      400
    │   ├── SpecError                  invalid_spec         422
    │   ├── SchemaMismatchError        schema_mismatch      422
    │   ├── DatasetError               invalid_dataset      422
    │   ├── PayloadTooLargeError       payload_too_large    413
    │   ├── LimitExceededError         limit_exceeded       422
    │   └── UnsupportedMediaTypeError  unsupported_media_type 415
    ├── AuthenticationError            unauthenticated      401
    ├── PermissionDeniedError          permission_denied    403
    ├── NotFoundError                  not_found            404
    │   ├── JobNotFoundError           job_not_found        404
    │   ├── PartitionNotFoundError     partition_not_found  404
    │   └── ModelNotFoundError         model_not_found      404
    ├── ConflictError                  conflict             409
    │   ├── IllegalTransitionError     illegal_transition   409
    │   ├── StaleLeaseError            stale_lease          409
    │   ├── RunDirInUseError           run_dir_in_use       409
    │   └── RunDirStateError           run_dir_state        409
    ├── CapacityError                  capacity_exceeded    429
    │   ├── QueueFullError             queue_full           429
    │   ├── MemoryCapExceededError     memory_cap_exceeded  429
    │   └── QuotaExceededError         quota_exceeded       429
    ├── DeadlineExceededError          deadline_exceeded    504
    ├── EnvironmentServiceError        environment_error    502
    │   └── SimulatorCrashedError      simulator_crashed    502
    ├── ServiceUnavailableError        unavailable          503
    │   └── StorageFullError           storage_full         507
    └── InternalError                  internal_error       500

Raise the most specific class; catch the most general one you can handle.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal


class JoyNexusError(Exception):
    """Base of every error JoyNexus raises on purpose.

    Args:
        message: A human sentence that says what went wrong and, where possible,
            what to do about it.
        **details: Machine-readable context (field names, ids, limits) that the
            API returns next to ``code`` and ``message``.
    """

    code: ClassVar[str] = "joynexus_error"
    http_status: ClassVar[int] = 500

    def __init__(self, message: str, **details: Any) -> None:
        super().__init__(message)
        self.message = message
        self.details: dict[str, Any] = details

    def to_dict(self) -> dict[str, Any]:
        """The JSON error body: ``{"code", "message", "details"}``."""
        return {"code": self.code, "message": self.message, "details": self.details}


class InvalidRequestError(JoyNexusError):
    """The caller sent something malformed: a bad field, shape, dtype or value."""

    code = "invalid_request"
    http_status = 400


class SpecError(InvalidRequestError):
    """A workload spec does not validate against the backend's capabilities."""

    code = "invalid_spec"
    http_status = 422


class SchemaMismatchError(InvalidRequestError):
    """Data does not match the tenant's schema (camera shape, state/action dim, ...)."""

    code = "schema_mismatch"
    http_status = 422


class DatasetError(InvalidRequestError):
    """A dataset on disk is malformed: a missing file or key, an unknown format version,
    or data that disagrees with its own ``meta/info.json`` (the message names the file
    or feature and what was expected)."""

    code = "invalid_dataset"
    http_status = 422


class PayloadTooLargeError(InvalidRequestError):
    """A request body is larger than the server accepts."""

    code = "payload_too_large"
    http_status = 413


class LimitExceededError(InvalidRequestError):
    """A well-formed request asks for more than one call may (indexes per read, bytes of
    an answer, rows or text of a prediction); the message names the server setting."""

    code = "limit_exceeded"
    http_status = 422


class UnsupportedMediaTypeError(InvalidRequestError):
    """A request body has a content type the endpoint does not read."""

    code = "unsupported_media_type"
    http_status = 415


class AuthenticationError(JoyNexusError):
    """No API key, or one the server does not know (or that was revoked)."""

    code = "unauthenticated"
    http_status = 401


class PermissionDeniedError(JoyNexusError):
    """A tenant touched something that belongs to another tenant."""

    code = "permission_denied"
    http_status = 403


class NotFoundError(JoyNexusError):
    """A named object does not exist."""

    code = "not_found"
    http_status = 404


class JobNotFoundError(NotFoundError):
    """No training job with this id is known to the Training Scheduler."""

    code = "job_not_found"


class PartitionNotFoundError(NotFoundError):
    """No Training Queue partition with this id exists (never created, or cleared)."""

    code = "partition_not_found"


class ModelNotFoundError(NotFoundError):
    """A base model id or path could not be resolved locally."""

    code = "model_not_found"


class ConflictError(JoyNexusError):
    """The request conflicts with the current state of an object."""

    code = "conflict"
    http_status = 409


class IllegalTransitionError(ConflictError):
    """A training job was asked to move along an edge that Table 4 does not allow."""

    code = "illegal_transition"


class StaleLeaseError(ConflictError):
    """A lease holder acted with an outdated ``lease_epoch`` (fencing)."""

    code = "stale_lease"


class RunDirInUseError(ConflictError):
    """Another process holds the run directory (one server per run directory)."""

    code = "run_dir_in_use"


class RunDirStateError(ConflictError):
    """The run directory's durable state is missing or damaged: starting over it would
    silently lose (or corrupt) what it holds."""

    code = "run_dir_state"


class CapacityError(JoyNexusError):
    """A bounded resource is full; retry later or raise the limit."""

    code = "capacity_exceeded"
    http_status = 429


class QueueFullError(CapacityError):
    """The Inference Queue is at its bound and rejected the request at once."""

    code = "queue_full"


class MemoryCapExceededError(CapacityError):
    """A Training Queue write would exceed the configured memory cap."""

    code = "memory_cap_exceeded"


class QuotaExceededError(CapacityError):
    """A tenant hit one of its quotas; ``details["reason"]`` names which one."""

    code = "quota_exceeded"


class DeadlineExceededError(JoyNexusError):
    """A request did not complete before its deadline."""

    code = "deadline_exceeded"
    http_status = 504


class EnvironmentServiceError(JoyNexusError):
    """An environment session could not serve the call."""

    code = "environment_error"
    http_status = 502


class SimulatorCrashedError(EnvironmentServiceError):
    """The simulator worker behind a session died or hung; only its sessions fail."""

    code = "simulator_crashed"


class ServiceUnavailableError(JoyNexusError):
    """A service or queue is not running (not started yet, stopping, or stopped)."""

    code = "unavailable"
    http_status = 503


class StorageFullError(ServiceUnavailableError):
    """A write failed because the disk (or the quota) is full; retried once space returns."""

    code = "storage_full"
    http_status = 507


class InternalError(JoyNexusError):
    """A bug: something that should not happen did. Please report it."""

    code = "internal_error"
    http_status = 500


#: The tenant-scoped ids a request can name (see :func:`unknown_id`).
IdKind = Literal["job", "workload", "session", "partition", "future", "artifact"]

_UNKNOWN: dict[str, tuple[type[NotFoundError], str, str]] = {
    # kind: (class, message with {id}, the details key naming the id)
    "job": (JobNotFoundError, "no training job {id}", "job_id"),
    "workload": (NotFoundError, "no workload {id}", "workload_id"),
    "session": (
        NotFoundError,
        "no environment session {id} (closed, reaped, or never created)",
        "session_id",
    ),
    "partition": (
        PartitionNotFoundError,
        "training-queue partition {id} does not exist (never written, or already cleared)",
        "partition_id",
    ),
    "future": (NotFoundError, "no future {id} (never created, expired, or deleted)", "future_id"),
    "artifact": (NotFoundError, "no artifact {id}", "path"),
}


def unknown_id(kind: IdKind, value: str) -> NotFoundError:
    """The one answer for an id the caller may not see: never issued, gone, or another
    tenant's. Services raise it for ids they do not know and the tenant gateway for
    another tenant's, so the two are the same status, code, message and details and
    nobody learns by probing which ids exist."""
    cls, message, key = _UNKNOWN[kind]
    return cls(message.format(id=repr(value)), **{key: value})
