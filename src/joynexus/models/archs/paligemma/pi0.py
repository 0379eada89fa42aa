"""π0 as a resident base model: a shared PaliGemma prefix and tenant-private action experts.

``transformers`` ships π0 as ``PI0ForConditionalGeneration``: a PaliGemma VLM turns the
cameras and the instruction into a *prefix* whose per-layer keys and values (the prefix
KV cache) a narrower Gemma *action expert* attends to while it denoises the state and a
noisy action chunk (flow matching). JoyNexus splits the checkpoint along that seam:

* the PaliGemma part is the resident frozen backbone; one prefix forward over every
  tenant's rows builds the KV cache, returned in
  :attr:`~joynexus.models.types.BackboneOutput.prefix_kv` and split by rows like the
  hidden states;
* the expert (the Gemma ``dit`` with the action/time embedding and the output
  projection) is a tenant's action module,
  :class:`~joynexus.models.policies.pi0_expert.module.Pi0Expert`, initialised from the
  checkpoint's expert weights, which :class:`Pi0Checkpoint` keeps once (the π0
  resident's extension a ``pi0_expert`` asks for);
* :func:`~joynexus.models.checkpoints.pi0_export.export_pi0` puts the two halves
  back together as a complete
  ``PI0ForConditionalGeneration`` directory that plain ``transformers`` loads.
"""

from __future__ import annotations

import importlib
from typing import Any

import torch
from torch import nn

from joynexus.errors import SpecError
from joynexus.models.schema import DataSchema
from joynexus.models.types import BackboneOutput

PI0_MODEL_TYPE = "pi0"
#: State-dict prefixes of the action expert inside ``PI0ForConditionalGeneration``.
EXPERT_PREFIXES = ("model.dit.", "embed_action_time.", "action_out_proj.")
#: The expert's token embedding: π0 feeds the expert embeddings, never token ids, so
#: tenants do not carry it (it is vocabulary × width); export restores the checkpoint's.
EXPERT_EMBED_KEY = "model.dit.embed_tokens.weight"
VLM_PREFIX = "model.vlm."


def hf_pi0() -> Any:
    """``transformers.models.pi0.modeling_pi0`` (typed ``Any``, like the other HF calls)."""
    return importlib.import_module("transformers.models.pi0.modeling_pi0")


class Pi0Checkpoint:
    """The parts of a loaded π0 checkpoint that are not the resident prefix.

    Built from a loaded ``PI0ForConditionalGeneration``, which it strips down to the
    prefix: the expert's weights move into :attr:`expert_state` (the template every
    ``pi0_expert`` tenant starts from) and the expert modules leave the policy, so the
    resident model holds the VLM and one copy of the pretrained expert, nothing else.

    Attributes:
        config: The checkpoint's ``PI0Config`` (``chunk_size``, ``max_state_dim``,
            ``max_action_dim``, ``num_inference_steps``, the ``dit_config``...).
        expert_state: The pretrained expert's tensors by their checkpoint names.
        prefix: The stripped ``PI0Model`` (its ``vlm``; ``embed_prefix``).
    """

    def __init__(self, policy: nn.Module):
        self.config: Any = policy.config
        state = policy.state_dict()
        self.expert_state: dict[str, torch.Tensor] = {
            k: v.detach().clone() for k, v in state.items() if k.startswith(EXPERT_PREFIXES)
        }
        prefix: Any = policy.model
        del prefix.dit
        self.prefix = prefix

    @property
    def vlm(self) -> nn.Module:
        """The PaliGemma model: the resident frozen backbone."""
        vlm: nn.Module = self.prefix.vlm
        return vlm

    @property
    def chunk_size(self) -> int:
        return int(self.config.chunk_size)

    @property
    def max_action_dim(self) -> int:
        return int(self.config.max_action_dim)

    @property
    def max_state_dim(self) -> int:
        return int(self.config.max_state_dim)

    @property
    def num_inference_steps(self) -> int:
        return int(self.config.num_inference_steps)

    def encode(self, model_inputs: dict[str, torch.Tensor]) -> BackboneOutput:
        """The prefix forward exactly as ``PI0ForConditionalGeneration.sample_actions``
        runs it: image + text embeddings, positions from the attention mask, all prefix
        tokens bidirectional, cache kept.

        Returns:
            Last hidden state (zero at padding), mask and the per-layer prefix KV.
        """
        mask = model_inputs["attention_mask"]
        embeds = self.prefix.embed_prefix(
            model_inputs["input_ids"],
            model_inputs["pixel_values"],
            model_inputs["pixel_attention_mask"],
        )
        out = self.prefix.vlm(
            inputs_embeds=embeds,
            attention_mask=mask,
            position_ids=mask.cumsum(-1) - 1,
            token_type_ids=torch.zeros_like(embeds)[:, :, 0],
            use_cache=True,
        )
        hidden = out.last_hidden_state.masked_fill(~mask.bool().unsqueeze(-1), 0.0)
        kv = tuple((layer.keys, layer.values) for layer in out.cache.layers)
        return BackboneOutput(hidden_states=hidden, attention_mask=mask, prefix_kv=kv)

    def schema_problems(
        self, *, state_dim: int, action_dim: int, action_chunk: int
    ) -> list[tuple[str, str]]:
        """``(field, message)`` for each way a schema does not fit this checkpoint's
        expert (wider state or action than it pads to, a longer chunk than it predicts),
        and for a checkpoint whose training-time distribution the expert cannot draw."""
        problems: list[tuple[str, str]] = []
        beta = float(getattr(self.config, "time_sampling_beta_beta", 1.0))
        if beta != 1.0:
            problems.append(
                (
                    "action_module.type",
                    "this π0 checkpoint trains on flow times drawn from "
                    f"Beta(alpha, beta={beta:g}); a 'pi0_expert' draws Beta(alpha, 1) only "
                    "(from the tenant's own seeded generator): use a checkpoint with "
                    "time_sampling_beta_beta 1, or a fresh 'oft'/'flow_matching' head",
                )
            )
        checks = (
            ("schema.action_dim", action_dim, self.max_action_dim, "max_action_dim"),
            ("schema.action_chunk", action_chunk, self.chunk_size, "chunk_size"),
            ("schema.state_dim", state_dim, self.max_state_dim, "max_state_dim"),
        )
        for name, value, limit, key in checks:
            if value > limit:
                problems.append(
                    (
                        name,
                        f"{value} exceeds the π0 checkpoint's {key} of {limit}; use a schema "
                        f"with at most {limit} (or a fresh 'oft'/'flow_matching' head)",
                    )
                )
        return problems

    def check_schema(self, schema: DataSchema) -> None:
        """Raise unless a ``pi0_expert`` for ``schema`` fits this checkpoint.

        Raises:
            SpecError: naming each offending schema field and the checkpoint's limit.
        """
        self.check_dims(
            schema.name,
            state_dim=schema.state_dim,
            action_dim=schema.action_dim,
            action_chunk=schema.action_chunk,
        )

    def check_dims(self, name: str, *, state_dim: int, action_dim: int, action_chunk: int) -> None:
        """:meth:`check_schema` on bare dims (``name`` labels the message)."""
        problems = self.schema_problems(
            state_dim=state_dim, action_dim=action_dim, action_chunk=action_chunk
        )
        if problems:
            raise SpecError(
                f"a 'pi0_expert' for schema {name!r} does not fit this π0 checkpoint:\n"
                + "\n".join(f"  {f}: {m}" for f, m in problems),
                fields=[f for f, _ in problems],
                problems=dict(problems),
            )
