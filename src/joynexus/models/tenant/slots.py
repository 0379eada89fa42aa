"""TenantSlot: everything one tenant owns next to the shared resident base model.

A slot holds the tenant's action module (and optional value head), its own AdamW
optimizer, its own random generator, its schema and schema signature, and its policy
version. The base model is held *by reference*: N tenants cost the base once plus the
sum of their slots (see :func:`unique_parameter_bytes`). Nothing in a slot is ever
shared with, or averaged against, another tenant's slot (paper Appendix A.6).
"""

from __future__ import annotations

import copy
import math
import re
from collections.abc import Hashable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from pydantic import BaseModel, ConfigDict, Field
from torch import nn

from joynexus.errors import InvalidRequestError
from joynexus.models.lora import VISION_FAMILIES, LoRAAdapter, LoRAConfig
from joynexus.models.normalization import NormalizationStats
from joynexus.models.policies.base import PolicyConfig, PolicyHead, PolicySample
from joynexus.models.policies.registry import build_action_module
from joynexus.models.policies.value import ValueHead, ValueHeadConfig
from joynexus.models.schema import DataSchema
from joynexus.models.types import BackboneOutput

_TENANT_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")

ACTION_MODULE_PREFIX = "action_module."
VALUE_HEAD_PREFIX = "value_head."
LORA_PREFIX = "lora."


def validate_tenant_id(tenant_id: str) -> str:
    """Return ``tenant_id`` if it is safe as a path component, else raise.

    Raises:
        InvalidRequestError: unless it is 1–128 chars of letters, digits, ``_ . -``,
            starts with a letter or digit and contains no ``..``.
    """
    if not isinstance(tenant_id, str) or not _TENANT_ID.match(tenant_id) or ".." in tenant_id:
        raise InvalidRequestError(
            f"tenant_id {tenant_id!r} is invalid: expected 1-128 characters of letters, "
            "digits, '_', '.', '-', starting with a letter or digit, without '..'",
            field="tenant_id",
        )
    return tenant_id


class BaseModelRef(Protocol):
    """What a slot needs to know about the resident base model it is attached to."""

    @property
    def model_id(self) -> str: ...

    @property
    def hidden_size(self) -> int: ...

    @property
    def device(self) -> torch.device: ...

    def signature_for(self, schema: DataSchema) -> str: ...

    def default_normalization(self, schema: DataSchema) -> NormalizationStats | None:
        """What a tenant of ``schema`` without statistics of its own normalizes by."""
        ...


class OptimizerConfig(BaseModel):
    """Per-tenant AdamW settings."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    lr: float = Field(default=1e-4, gt=0, le=10.0)
    weight_decay: float = Field(default=0.01, ge=0, le=1.0)
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = Field(default=1e-8, gt=0)
    grad_clip: float | None = Field(
        default=1.0,
        gt=0,
        description=(
            "Max grad norm, applied to each tenant module (action module, value head) "
            "separately; None disables clipping."
        ),
    )


@dataclass(frozen=True)
class StepResult:
    """Outcome of one optimizer step on one tenant slot.

    Attributes:
        loss: The tenant's loss before the step.
        policy_version: The tenant's version *after* the step.
        grad_norm: Global gradient norm before clipping.
    """

    loss: float
    policy_version: int
    grad_norm: float


class TenantSlot:
    """One tenant's private training/serving state on top of a shared base model.

    Args:
        tenant_id: The tenant (validated: it becomes a checkpoint directory name).
        schema: The tenant's data schema.
        base: The resident base model; referenced, never copied.
        head: Action module config (any registered policy family).
        optimizer: AdamW settings for this tenant alone.
        value_head: Optional critic config (RL).
        seed: Seeds the module initialisation and the tenant's own generator, so two
            slots built with equal arguments are identical.
        dtype: Parameter dtype of the tenant modules (fp32 by default, also when the
            base runs in bf16).

    Raises:
        InvalidRequestError: on a bad tenant id.
    """

    def __init__(
        self,
        tenant_id: str,
        schema: DataSchema,
        base: BaseModelRef,
        head: PolicyConfig,
        *,
        optimizer: OptimizerConfig | None = None,
        value_head: ValueHeadConfig | None = None,
        seed: int = 0,
        dtype: torch.dtype = torch.float32,
    ):
        self.tenant_id = validate_tenant_id(tenant_id)
        self.schema = schema
        self.base = base
        self.head_config = head
        self.value_head_config = value_head
        self.optimizer_config = optimizer or OptimizerConfig()
        self.schema_signature = base.signature_for(schema)
        self.base_model_id = base.model_id
        self.seed = seed
        self.policy_version = 0
        # The tenant's state/action normalization (SFT on a dataset): the slot computes
        # in normalized units; serving converts env units in and out with these stats,
        # and payloads and checkpoints carry them so an exported module stays usable.
        self.normalization: NormalizationStats | None = None
        device = base.device
        # Initialise on CPU under a private RNG so the global RNG (and other tenants)
        # neither influence nor observe this tenant's initial weights.
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            module = build_action_module(
                head, hidden_size=base.hidden_size, schema=schema, base=base
            )
            critic = (
                ValueHead(
                    value_head,
                    hidden_size=base.hidden_size,
                    state_dim=schema.state_dim,
                    num_cameras=len(schema.cameras),
                )
                if value_head is not None
                else None
            )
            # After the head and critic, so a LoRA tenant's head starts exactly like
            # the same tenant's head without LoRA.
            adapter = _build_adapter(tenant_id, head.lora, base)
        self.lora_config: LoRAConfig | None = head.lora
        self.lora: LoRAAdapter | None = (
            adapter.to(device=device, dtype=dtype) if adapter is not None else None
        )
        self.action_module: PolicyHead = module.to(device=device, dtype=dtype)
        self.action_module.use_lora(self.lora)
        # The frozen policy RL is anchored to (algorithm.kl_coef): set by
        # freeze_reference when the slot starts from another policy (init_from). Not a
        # module of the slot: never trained, checkpointed or sent.
        self.reference_module: PolicyHead | None = None
        self.value_head: ValueHead | None = (
            critic.to(device=device, dtype=dtype) if critic is not None else None
        )
        # Separate streams: serving draws must never shift the training noise sequence.
        self.generator = torch.Generator(device=device)
        self.generator.manual_seed(seed + 1)
        self.inference_generator = torch.Generator(device=device)
        self.inference_generator.manual_seed(seed + 2)
        cfg = self.optimizer_config
        self.optimizer = torch.optim.AdamW(
            list(self.parameters()),
            lr=cfg.lr,
            betas=cfg.betas,
            eps=cfg.eps,
            weight_decay=cfg.weight_decay,
        )

    # --- parameters ------------------------------------------------------------------

    def modules(self) -> dict[str, nn.Module]:
        """The tenant's modules by payload prefix (``action_module``, ``value_head``,
        ``lora``)."""
        out: dict[str, nn.Module] = {"action_module": self.action_module}
        if self.value_head is not None:
            out["value_head"] = self.value_head
        if self.lora is not None:
            out["lora"] = self.lora
        return out

    def parameters(self) -> Iterator[nn.Parameter]:
        for module in self.modules().values():
            yield from module.parameters()

    def named_parameters(self) -> Iterator[tuple[str, nn.Parameter]]:
        """Parameters with payload names (``action_module.<name>``, ``value_head.<name>``)."""
        for prefix, module in self.modules().items():
            for name, p in module.named_parameters():
                yield f"{prefix}.{name}", p

    def state_tensors(self) -> dict[str, torch.Tensor]:
        """Every tensor of the tenant's modules (parameters and buffers) by payload name."""
        out: dict[str, torch.Tensor] = {}
        for prefix, module in self.modules().items():
            for name, t in module.state_dict().items():
                out[f"{prefix}.{name}"] = t
        return out

    def parameter_bytes(self) -> int:
        """Bytes held by this tenant's parameters (its share of resident memory)."""
        return unique_parameter_bytes(self.parameters())

    def training_bytes(self) -> int:
        """Parameters plus AdamW's two moments per parameter: the tenant's training
        footprint (adapter, head, critic and their optimizer state; never the base)."""
        return 3 * self.parameter_bytes()

    def freeze_reference(self) -> None:
        """Keep a frozen copy of the current action module as the reference policy of
        the KL anchor (the SFT policy an RL tenant starts from). It costs one more copy
        of the head's weights, and no optimizer state."""
        reference = copy.deepcopy(self.action_module)
        reference.requires_grad_(False)
        self.reference_module = reference.eval()

    # --- compute ---------------------------------------------------------------------

    def _state_tensor(self, state: torch.Tensor) -> torch.Tensor:
        p = next(self.action_module.parameters())
        return state.to(device=p.device, dtype=p.dtype)

    def loss(
        self,
        features: BackboneOutput,
        state: torch.Tensor,
        actions: torch.Tensor,
        action_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """The action module's supervised loss, drawing randomness from this tenant's RNG."""
        self.action_module.train()
        state = self._state_tensor(state)
        return self.action_module.loss(
            features, state, actions.to(state), action_mask, generator=self.generator
        )

    def check_loss(self, loss: torch.Tensor) -> float:
        """The loss value; raises unless ``loss`` is a finite scalar."""
        if loss.dim() != 0:
            raise InvalidRequestError(
                f"loss must be a scalar tensor, got shape {list(loss.shape)}", field="loss"
            )
        value = float(loss.detach())
        if not math.isfinite(value):
            raise InvalidRequestError(
                f"tenant {self.tenant_id!r}: loss is {value}; refusing to step", field="loss"
            )
        return value

    def step_optimizer(self, value: float) -> StepResult:
        """Clip this slot's gradients per module, step AdamW, bump the version."""
        clip = self.optimizer_config.grad_clip
        norms: list[torch.Tensor] = []
        for module in self.modules().values():
            params = [p for p in module.parameters() if p.grad is not None]
            if params:
                norms.append(
                    torch.nn.utils.clip_grad_norm_(
                        params, max_norm=clip if clip is not None else math.inf
                    )
                )
        grad_norm = torch.linalg.vector_norm(torch.stack(norms)) if norms else torch.zeros(())
        self.optimizer.step()
        self.policy_version += 1
        return StepResult(
            loss=value, policy_version=self.policy_version, grad_norm=float(grad_norm)
        )

    @torch.no_grad()
    def predict(
        self,
        features: BackboneOutput,
        state: torch.Tensor,
        *,
        generator: torch.Generator | None = None,
    ) -> torch.Tensor:
        """The action chunk ``[B, chunk, A]`` for each row."""
        self._serving_mode()
        return self.action_module.predict(features, self._state_tensor(state), generator=generator)

    def group_key(self) -> Hashable | None:
        """Slots with equal keys predict in one pass (:meth:`predict_group`); ``None``:
        this slot's head predicts alone (:meth:`PolicyHead.group_key`)."""
        return self.action_module.group_key()

    @staticmethod
    def predict_group(
        slots: Sequence[TenantSlot],
        features: BackboneOutput,
        state: torch.Tensor,
        owner: Sequence[int],
    ) -> torch.Tensor:
        """:meth:`predict` of several slots of one :meth:`group_key` at once.

        Args:
            slots: The slots.
            features: Every row of every slot.
            state: ``[R, state_dim]``.
            owner: For each row, the index of its slot in ``slots``.

        Returns:
            ``[R, chunk, A]``: row ``r`` as ``slots[owner[r]].predict`` gives it.
        """
        family, heads, state = TenantSlot._group_heads(slots, state)
        return family.predict_group(heads, features, state, owner)

    @staticmethod
    def sample_group(
        slots: Sequence[TenantSlot],
        features: BackboneOutput,
        state: torch.Tensor,
        owner: Sequence[int],
    ) -> PolicySample:
        """:meth:`sample` of several slots of one :meth:`group_key` at once, each slot's
        rows (contiguous, in slot order) drawn from its inference generator."""
        family, heads, state = TenantSlot._group_heads(slots, state)
        generators = [slot.inference_generator for slot in slots]
        return family.sample_group(heads, features, state, owner, generators)

    @staticmethod
    def _group_heads(
        slots: Sequence[TenantSlot], state: torch.Tensor
    ) -> tuple[type[PolicyHead], list[PolicyHead], torch.Tensor]:
        """A group's head family, its heads in serving mode, and ``state`` in their
        device and dtype."""
        for slot in slots:
            slot._serving_mode()
        lead = slots[0]
        heads = [slot.action_module for slot in slots]
        return type(lead.action_module), heads, lead._state_tensor(state)

    def _serving_mode(self) -> None:
        # Only the whole module is ever switched (train() for a step, eval() here), so
        # the root's flag speaks for every submodule: skip the tree walk when it is set.
        if self.action_module.training:
            self.action_module.eval()

    @torch.no_grad()
    def sample(
        self,
        features: BackboneOutput,
        state: torch.Tensor,
        *,
        generator: torch.Generator | None = None,
    ) -> PolicySample:
        """Stochastic actions for RL rollouts with their log-probs (see
        :meth:`PolicyHead.sample`: a Gaussian head samples its policy, a flow head a
        Flow-SDE chain it also returns, a head without a density its prediction)."""
        self._serving_mode()
        return self.action_module.sample(features, self._state_tensor(state), generator=generator)

    @torch.no_grad()
    def value(self, features: BackboneOutput, state: torch.Tensor) -> torch.Tensor | None:
        """Critic values ``[B]``, or ``None`` when the slot has no value head."""
        if self.value_head is None:
            return None
        out: torch.Tensor = self.value_head(features, self._state_tensor(state))
        return out


def _build_adapter(
    tenant_id: str, config: LoRAConfig | None, base: BaseModelRef
) -> LoRAAdapter | None:
    if config is None:
        return None
    host: Any = getattr(base, "lora", None)
    if host is None:
        raise InvalidRequestError(
            f"tenant {tenant_id!r}: base model {base.model_id!r} does not support LoRA adapters",
            tenant_id=tenant_id,
            field="action_module.lora",
        )
    if (config.vision and not host.vision_modules) or (
        config.vision_projection and not host.projection_modules
    ):
        what = (
            "lora.vision" if config.vision and not host.vision_modules else "lora.vision_projection"
        )
        raise InvalidRequestError(
            f"tenant {tenant_id!r}: {what} is not available on base model "
            f"{base.model_id!r}: no vision layers of a supported family found (vision LoRA "
            f"supports {list(VISION_FAMILIES)})",
            tenant_id=tenant_id,
            field=f"action_module.{what}",
        )
    shapes = host.shapes(config.targets, vision=config.vision, projection=config.vision_projection)
    if not shapes:
        raise InvalidRequestError(
            f"tenant {tenant_id!r}: base model {base.model_id!r} has no layer named by "
            f"lora.targets {list(config.targets)}",
            tenant_id=tenant_id,
            field="action_module.lora.targets",
        )
    return LoRAAdapter(config, shapes)


def unique_parameter_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """Bytes of the distinct storages behind ``tensors``.

    Tensors that share storage (tied weights, the same base referenced by many slots)
    count once, so ``unique_parameter_bytes(base + all slots)`` is the real resident
    footprint.
    """
    seen: dict[tuple[str, int], int] = {}
    for t in tensors:
        storage = t.untyped_storage()
        key = (str(t.device), storage.data_ptr())
        seen[key] = max(seen.get(key, 0), storage.nbytes())
    return sum(seen.values())
