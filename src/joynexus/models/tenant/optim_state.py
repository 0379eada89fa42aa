"""A tenant optimizer's state as named tensors (checkpoints, paper §4.1.2).

AdamW moments are stored under ``state.<parameter name>.<key>`` with the hyperparameters
as JSON, so a checkpoint is independent of parameter order.
"""

from __future__ import annotations

from typing import Any

import torch

from joynexus.errors import SchemaMismatchError
from joynexus.models.tenant.slots import TenantSlot

__all__ = ["optimizer_tensors", "restore_optimizer"]


def optimizer_tensors(slot: TenantSlot) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Flatten AdamW state to ``state.<param name>.<key>`` tensors + JSON hyperparameters.

    Parameters are identified by name, not by position, so a reordering of modules
    cannot silently attach moments to the wrong tensor.
    """
    names = {id(p): n for n, p in slot.named_parameters()}
    sd = slot.optimizer.state_dict()
    index_to_name: dict[int, str] = {}
    for group in slot.optimizer.param_groups:
        for p in group["params"]:
            index_to_name[len(index_to_name)] = names[id(p)]
    tensors: dict[str, torch.Tensor] = {}
    for idx, state in sd["state"].items():
        pname = index_to_name[int(idx)]
        for key, value in state.items():
            t = value if isinstance(value, torch.Tensor) else torch.tensor(value)
            # A copy even on the CPU: a checkpoint writes it while training goes on.
            tensors[f"state.{pname}.{key}"] = t.detach().to("cpu", copy=True).contiguous()
    groups = []
    for group, sd_group in zip(slot.optimizer.param_groups, sd["param_groups"], strict=True):
        hyper = {k: v for k, v in sd_group.items() if k != "params"}
        hyper["param_names"] = [names[id(p)] for p in group["params"]]
        groups.append(hyper)
    return tensors, {"type": type(slot.optimizer).__name__, "param_groups": groups}


def restore_optimizer(
    slot: TenantSlot, tensors: dict[str, torch.Tensor], meta: dict[str, Any]
) -> None:
    """Load :func:`optimizer_tensors`' output into ``slot``'s optimizer (by name).

    Raises:
        SchemaMismatchError: another optimizer type, group count or parameter names.
    """
    names = [n for n, _ in slot.named_parameters()]
    groups = meta.get("param_groups", [])
    if meta.get("type") != type(slot.optimizer).__name__ or len(groups) != len(
        slot.optimizer.param_groups
    ):
        raise SchemaMismatchError(
            f"optimizer checkpoint is {meta.get('type')} with {len(groups)} group(s); the "
            f"slot has {type(slot.optimizer).__name__} with "
            f"{len(slot.optimizer.param_groups)}",
            field="optimizer",
        )
    param_groups: list[dict[str, Any]] = []
    order: list[str] = []
    for g in groups:
        g = dict(g)
        gnames = list(g.pop("param_names"))
        g["params"] = list(range(len(order), len(order) + len(gnames)))
        order.extend(gnames)
        if "betas" in g:
            g["betas"] = tuple(g["betas"])
        param_groups.append(g)
    if sorted(order) != sorted(names):
        raise SchemaMismatchError(
            "optimizer checkpoint parameter names do not match the slot's action module",
            field="optimizer",
        )
    state: dict[int, dict[str, torch.Tensor]] = {}
    for idx, pname in enumerate(order):
        prefix = f"state.{pname}."
        entry = {k[len(prefix) :]: v for k, v in tensors.items() if k.startswith(prefix)}
        if entry:
            state[idx] = entry
    slot.optimizer.load_state_dict({"state": state, "param_groups": param_groups})
