"""Field names of Training Queue partitions and their conversion to model batches.

One sample is one decision of one env (RL) or one demonstration frame (SFT). The layout
is the contract between producers (rollout, SFT producer), preprocessing stages
(actor forward, advantages) and the actor's ``train_job``:

* observation: ``obs.<camera>`` uint8 ``[H, W, C]``, ``state`` float32 ``[S]``,
  ``instruction`` numpy ``<U256``;
* SFT: ``actions`` float32 ``[chunk, A]``, ``action_is_pad`` bool ``[chunk]``;
* RL: ``actions``, ``log_probs``, ``values``, ``rewards``, ``dones``, ``t``, ``env``,
  ``bootstrap_values`` (scalars per sample), derived ``advantages`` / ``returns`` and
  optionally ``actor_log_probs`` / ``actor_values``; a flow-matching head's rollouts add
  ``flow_chain`` float32 ``[steps + 1, chunk, A]`` (its Flow-SDE chain, model units); a
  grouped rollout (GRPO with ``algorithm.group_size``) adds ``group`` int64, the group of
  the sample's env (its sub-envs started from one initial state).

``state`` and ``actions`` are in the tenant's model units: normalized for a tenant with
``NormalizationStats`` (:func:`~joynexus.services.serving.model_state`,
:func:`~joynexus.services.serving.model_actions`), env units otherwise.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from joynexus.errors import SchemaMismatchError
from joynexus.models.batch import ObservationBatch

# Re-exported: the services name it with the other partition fields.
from joynexus.models.policies.flow import FLOW_CHAIN as FLOW_CHAIN
from joynexus.models.schema import DataSchema

INSTRUCTION_DTYPE = "<U256"
SFT_FIELDS = ("actions", "action_is_pad")
GROUP = "group"
RL_FIELDS = (
    "actions",
    "log_probs",
    "values",
    "rewards",
    "dones",
    "t",
    "env",
    "bootstrap_values",
)


def camera_field(camera: str) -> str:
    """Partition field of one schema camera."""
    return f"obs.{camera}"


def observation_fields(schema: DataSchema) -> list[str]:
    """The observation fields of ``schema``'s samples."""
    return [camera_field(c) for c in schema.camera_names] + ["state", "instruction"]


def instructions_array(texts: list[str]) -> np.ndarray:
    """Instructions as the fixed-width unicode array every partition stores."""
    return np.asarray(texts, dtype=np.str_).astype(INSTRUCTION_DTYPE)


def as_numpy(value: Any) -> np.ndarray:
    """A partition array as numpy (torch fields are moved to the CPU)."""
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().numpy()
    return np.asarray(value)


def observation_batch(
    schema: DataSchema, data: Mapping[str, Any], *, with_actions: bool
) -> ObservationBatch:
    """Rows of a ``get_data`` result as an :class:`ObservationBatch` of ``schema``.

    Raises:
        SchemaMismatchError: a field of the schema is missing from ``data``.
    """
    missing = [f for f in observation_fields(schema) if f not in data]
    if with_actions and "actions" not in data:
        missing.append("actions")
    if missing:
        raise SchemaMismatchError(
            f"partition data lacks field(s) {missing} required by schema {schema.name!r}",
            field=missing[0],
        )
    actions = as_numpy(data["actions"]).astype(np.float32, copy=False) if with_actions else None
    return ObservationBatch(
        cameras={c: as_numpy(data[camera_field(c)]) for c in schema.camera_names},
        state=as_numpy(data["state"]).astype(np.float32, copy=False),
        instructions=[str(t) for t in as_numpy(data["instruction"]).tolist()],
        actions=actions,
    )


def float_tensor(value: Any, device: torch.device) -> torch.Tensor:
    """A float32 tensor on ``device`` from a partition field (a tensor stays a tensor:
    no round trip through numpy)."""
    if isinstance(value, torch.Tensor):
        return value.detach().to(device=device, dtype=torch.float32)
    return torch.as_tensor(np.asarray(value), dtype=torch.float32).to(device)
