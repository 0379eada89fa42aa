"""Metadata records of the Training Queue's two-step interface (paper Appendix A.5).

``get_meta`` hands out a :class:`BatchMeta` — which samples of which partition, and
which fields — without touching tensors; ``get_data`` and ``put`` take it back. The
records are small pydantic models so they can cross a process or HTTP boundary.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class SampleMeta(BaseModel):
    """Identity carried by every model-facing sample.

    The actor checks these before training so a batch is never trained against the
    wrong tenant or interface; RL samples also carry the behavior-policy version used
    for the staleness check of Eq. (1).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    tenant_id: str = Field(min_length=1)
    schema_signature: str = Field(min_length=1)
    behavior_policy_version: int | None = None


class BatchMeta(BaseModel):
    """A handle to some samples of one partition, as returned by ``get_meta``.

    It holds everything ``get_data`` and ``put`` need: the partition, the sample
    indexes (in the order the consumer will see rows), the fields, and each sample's
    :class:`SampleMeta`. An empty ``indexes`` list means the task has consumed every
    ready sample.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    partition_id: str
    task_name: str
    indexes: list[int]
    fields: list[str]
    sample_meta: list[SampleMeta]

    @property
    def size(self) -> int:
        """Number of samples in this batch."""
        return len(self.indexes)

    @property
    def is_empty(self) -> bool:
        return not self.indexes


class PartitionInfo(BaseModel):
    """Listing entry for one partition: sample count, fields, bytes held, consumption."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    partition_id: str
    num_samples: int
    fields: list[str]
    nbytes: int
    consumed: dict[str, int] = Field(
        description="task_name -> number of samples that task has received so far"
    )
