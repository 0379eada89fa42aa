"""What one training microbatch is, and its loss.

* :class:`TrainBatch`: a custom algorithm's update (``train_batch``), every field checked
  against the batch before anything runs;
* :func:`microbatch_loss`: the loss of a :class:`~joynexus.services.job_plan.Microbatch`
  (SFT: the head's supervised loss with padded chunk steps masked out; RL: PPO / GRPO /
  REINFORCE), the :data:`~joynexus.models.grouped_step.LossFn` the grouped step runs.

Partition fields that arrive as tensors stay tensors on their way to the device.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch

from joynexus.errors import InvalidRequestError, SchemaMismatchError
from joynexus.models.batch import ObservationBatch
from joynexus.models.execution.grouped_step import LossFn
from joynexus.models.types import BackboneOutput
from joynexus.services.job_plan import Microbatch
from joynexus.services.rl_loss import policy_loss
from joynexus.services.samples import FLOW_CHAIN, float_tensor

__all__ = ["TrainBatch", "microbatch_loss"]


@dataclass
class TrainBatch:
    """One custom-algorithm update (``train_batch``).

    Attributes:
        observations: The tenant's observations (with ``actions``).
        loss: ``sft`` | ``ppo`` | ``grpo`` | ``reinforce``.
        advantages: ``float32 [B]`` (RL).
        old_log_probs: ``float32 [B]`` behaviour log-probs (ppo, grpo).
        returns: ``float32 [B]`` value targets (ppo with a critic).
        action_is_pad: Optional ``bool [B, chunk]``; padded chunk steps do not count (SFT).
        flow_chain: ``float32 [B, steps + 1, chunk, A]`` the Flow-SDE chains that
            ``predict(mode="sample")`` drew (RL on a flow-matching head).
    """

    observations: ObservationBatch
    loss: Literal["sft", "ppo", "grpo", "reinforce"] = "sft"
    advantages: np.ndarray | None = None
    old_log_probs: np.ndarray | None = None
    returns: np.ndarray | None = None
    action_is_pad: np.ndarray | None = None
    flow_chain: np.ndarray | None = None

    def check(self) -> None:
        """Check every field against the batch before anything runs (no schema needed).

        ``B`` is the number of instructions: each camera, the state and the actions
        lead with ``B``; ``advantages``, ``old_log_probs`` and ``returns`` are
        ``float [B]`` and finite; ``action_is_pad`` is ``bool [B, chunk]`` with the
        actions' chunk. Fields the loss does not need are still checked when given.

        Raises:
            InvalidRequestError: a field the loss needs is missing (``actions``;
                ``advantages`` for RL losses; ``old_log_probs`` for ppo / grpo), or a
                value is NaN or inf.
            SchemaMismatchError: a field's shape or dtype does not fit the batch (the
                message names the field and the expected shape).
        """
        obs = self.observations
        b = obs.batch_size
        if obs.actions is None:
            raise InvalidRequestError("train_batch needs observations.actions", field="actions")
        for name, arr in (
            *((f"observations.cameras.{k}", v) for k, v in obs.cameras.items()),
            ("observations.state", obs.state),
            ("observations.actions", obs.actions),
        ):
            if not isinstance(arr, np.ndarray) or arr.ndim < 1 or arr.shape[0] != b:
                got = list(arr.shape) if isinstance(arr, np.ndarray) else type(arr).__name__
                raise SchemaMismatchError(
                    f"{name}: expected {b} rows (one per instruction, shape [B, ...] with "
                    f"B = {b}), got {got}",
                    field=name,
                    batch_size=b,
                )
        needed = _NEEDS.get(self.loss, ("advantages", "old_log_probs"))
        for name in needed:
            if getattr(self, name) is None:
                raise InvalidRequestError(
                    f"loss {self.loss!r} needs {name} float32 [B] (B = {b})", field=name
                )
        for name in ("advantages", "old_log_probs", "returns"):
            arr = getattr(self, name)
            if arr is not None:
                _check_field(name, arr, (b,), "float32 [B]", float_kind=True)
        if self.action_is_pad is not None:
            chunk = int(obs.actions.shape[1]) if obs.actions.ndim > 1 else 1
            _check_field("action_is_pad", self.action_is_pad, (b, chunk), "bool [B, chunk]")
        if self.flow_chain is not None:
            chain = self.flow_chain
            shape = (b, *chain.shape[1:]) if isinstance(chain, np.ndarray) else (b,)
            _check_field(
                "flow_chain", chain, shape, "float32 [B, steps + 1, chunk, A]", float_kind=True
            )


#: The fields each loss cannot do without (ppo and grpo: advantages and old_log_probs).
_NEEDS: dict[str, tuple[str, ...]] = {"sft": (), "reinforce": ("advantages",)}


def _check_field(
    name: str, arr: Any, expected: tuple[int, ...], form: str, *, float_kind: bool = False
) -> None:
    if not isinstance(arr, np.ndarray):
        raise SchemaMismatchError(
            f"{name}: expected a numpy array {form} = {list(expected)}, got {type(arr).__name__}",
            field=name,
        )
    if tuple(arr.shape) != expected:
        raise SchemaMismatchError(
            f"{name}: expected shape {form} = {list(expected)} for this batch, got "
            f"{list(arr.shape)}",
            field=name,
            expected_shape=list(expected),
            shape=list(arr.shape),
        )
    if float_kind:
        if arr.dtype.kind != "f":
            raise SchemaMismatchError(
                f"{name}: expected a float dtype ({form}), got {arr.dtype}",
                field=name,
                dtype=str(arr.dtype),
            )
        if not bool(np.isfinite(arr).all()):
            raise InvalidRequestError(
                f"{name}: contains NaN or infinite values; expected finite numbers",
                field=name,
            )
    elif arr.dtype.kind != "b" and not (
        arr.dtype.kind in "iu" and bool(np.isin(arr, (0, 1)).all())
    ):
        raise SchemaMismatchError(
            f"{name}: expected {form} (true marks a padded step), got {arr.dtype}",
            field=name,
            dtype=str(arr.dtype),
        )


def microbatch_loss(item: Microbatch) -> LossFn:
    """The tenant's loss on its rows of the shared forward (see module docstring)."""
    slot, data, batch = item.slot, item.data, item.batch
    device = slot.base.device
    state = torch.from_numpy(batch.state).to(device)
    assert batch.actions is not None  # training batches are read with actions
    actions = torch.from_numpy(batch.actions).to(device)
    if item.plan_loss == "sft":
        mask = None
        if "action_is_pad" in data:
            pad = torch.as_tensor(data["action_is_pad"]).to(device=device, dtype=torch.bool)
            mask = (~pad).unsqueeze(-1)

        def sft(features: BackboneOutput) -> tuple[torch.Tensor, dict[str, float]]:
            return slot.loss(features, state, actions, mask), {}

        return sft
    old = data.get("actor_log_probs", data.get("log_probs"))
    algorithm = item.plan_loss

    def rl(features: BackboneOutput) -> tuple[torch.Tensor, dict[str, float]]:
        return policy_loss(
            slot,
            features,
            state,
            actions,
            algorithm=algorithm,
            advantages=float_tensor(data["advantages"], device),
            old_log_probs=None if old is None else float_tensor(old, device),
            returns=float_tensor(data["returns"], device) if "returns" in data else None,
            config=item.config.algorithm,
            chain=float_tensor(data[FLOW_CHAIN], device) if FLOW_CHAIN in data else None,
        )

    return rl
