"""Decoding a grouped forward's rows: heads of one architecture in one stacked pass,
every other head alone, each row answered as its own slot would."""

from __future__ import annotations

import pytest
import torch

from joynexus.models.execution.decode import DecodeGroup, decode_groups
from joynexus.models.policies import FlowMatchingHeadConfig, OFTHeadConfig, ValueHeadConfig
from joynexus.models.policies.oft.module import OFTHead
from joynexus.models.schema import LIBERO, PUSHT
from joynexus.models.tenant.slots import TenantSlot
from joynexus.models.types import BackboneOutput

HIDDEN = 64


class _Base:
    """What a slot needs of its base to build a head (no backbone runs here)."""

    model_id = "decode-test"
    hidden_size = HIDDEN
    device = torch.device("cpu")

    def signature_for(self, schema: object) -> str:
        return "sig"


def _slot(tid: str, head: object, schema: object = LIBERO, **kw: object) -> TenantSlot:
    return TenantSlot(tid, schema, _Base(), head, seed=sum(map(ord, tid)), **kw)  # type: ignore[arg-type]


OFT = OFTHeadConfig(hidden_dim=32, num_blocks=1)


def _features(rows: int, length: int = 7) -> BackboneOutput:
    g = torch.Generator().manual_seed(rows)
    mask = torch.ones(rows, length, dtype=torch.long)
    mask[0, :3] = 0  # left padding on one row
    return BackboneOutput(torch.randn(rows, length, HIDDEN, generator=g), mask)


def _groups(slots_rows: list[tuple[TenantSlot, int, str]]) -> list[DecodeGroup]:
    out, row = [], 0
    for slot, n, mode in slots_rows:
        state = torch.randn(n, slot.schema.state_dim, generator=torch.Generator().manual_seed(row))
        out.append(DecodeGroup(slot, mode, row, row + n, state))  # type: ignore[arg-type]
        row += n
    return out


def _alone(group: DecodeGroup, features: BackboneOutput) -> torch.Tensor:
    return group.slot.predict(features.rows(group.start, group.stop), group.state)


def _count_group_calls(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """Record the heads of each stacked OFT pass (by tenant, via their slots)."""
    calls: list[list[str]] = []
    real = OFTHead.predict_group.__func__  # type: ignore[attr-defined]

    def counting(cls: type, heads: list[OFTHead], *args: object) -> torch.Tensor:
        calls.append([getattr(h, "_test_tenant", "?") for h in heads])
        return real(cls, heads, *args)  # type: ignore[no-any-return]

    monkeypatch.setattr(OFTHead, "predict_group", classmethod(counting))
    return calls


def _tag(slots: list[TenantSlot]) -> None:
    for s in slots:
        s.action_module._test_tenant = s.tenant_id  # type: ignore[assignment]


def test_heads_of_one_architecture_decode_in_one_pass_as_each_alone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    slots = [_slot(f"t{i}", OFT) for i in range(4)]
    groups = _groups(
        [(slots[0], 2, "mean"), (slots[1], 1, "mean"), (slots[2], 3, "mean"), (slots[3], 1, "mean")]
    )
    features = _features(7)
    _tag(slots)
    calls = _count_group_calls(monkeypatch)
    decoded = decode_groups(groups, features)
    assert calls == [["t0", "t1", "t2", "t3"]]
    for group, got in zip(groups, decoded, strict=True):
        torch.testing.assert_close(got.actions, _alone(group, features), rtol=1e-6, atol=1e-6)
        assert got.log_probs is None and got.values is None
    # Each tenant's own weights: two tenants given the same rows answer differently.
    assert not torch.allclose(
        decoded[0].actions[:1], slots[1].predict(features.rows(0, 1), groups[0].state[:1])
    )


def test_heads_that_cannot_stack_decode_alone_and_the_rest_still_group(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    flow = FlowMatchingHeadConfig(hidden_dim=32, num_layers=1, num_heads=2, num_inference_steps=2)
    slots = [
        _slot("a", OFT),
        _slot("attn", OFTHeadConfig(hidden_dim=32, num_blocks=1, pooling="attention")),
        _slot("flow", flow),
        _slot("wide", OFTHeadConfig(hidden_dim=48, num_blocks=1)),
        _slot("b", OFT),
        _slot("pusht", OFT, PUSHT),  # another state/action width: another key
        _slot("critic", OFT, value_head=ValueHeadConfig(hidden_dim=16)),
    ]
    _tag(slots)
    assert slots[1].group_key() is None and slots[2].group_key() is None
    assert len({s.group_key() for s in (slots[0], slots[3], slots[5])}) == 3
    groups = _groups([(s, 1 + i % 2, "mean") for i, s in enumerate(slots)])
    features = _features(groups[-1].stop)
    calls = _count_group_calls(monkeypatch)
    slots[2].inference_generator.manual_seed(3)  # the flow head integrates from noise
    decoded = decode_groups(groups, features)
    assert calls == [["a", "b", "critic"]]  # "wide" and "pusht" have no partner
    slots[2].inference_generator.manual_seed(3)
    for group, got in zip(groups, decoded, strict=True):
        want = group.slot.predict(
            features.rows(group.start, group.stop),
            group.state,
            generator=group.slot.inference_generator,
        )
        torch.testing.assert_close(got.actions, want, rtol=1e-6, atol=1e-6)
    critic = groups[-1]
    values = critic.slot.value(features.rows(critic.start, critic.stop), critic.state)
    assert values is not None and decoded[-1].values is not None
    torch.testing.assert_close(decoded[-1].values, values)


def test_sampling_stacks_and_draws_from_each_slots_own_generator(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A sampling group of one key draws, for each tenant's rows, exactly what that
    tenant's slot draws alone from its inference generator (a mean decode of the same
    tenants is a group of its own)."""
    slots = [_slot("a", OFT), _slot("b", OFT), _slot("c", OFT)]
    with torch.no_grad():  # another policy spread, so a mixed-up log-std shows
        slots[1].action_module.log_std.fill_(-2.0)  # type: ignore[operator]
    groups = _groups(
        [
            (slots[0], 2, "sample"),
            (slots[1], 1, "sample"),
            (slots[2], 3, "mean"),
            (slots[0], 1, "mean"),
        ]
    )
    features = _features(7)
    calls: list[str] = []
    real = OFTHead.sample_group.__func__  # type: ignore[attr-defined]

    def counting(cls: type, heads: list[OFTHead], *args: object) -> object:
        calls.append(f"sample x{len(heads)}")
        return real(cls, heads, *args)

    monkeypatch.setattr(OFTHead, "sample_group", classmethod(counting))
    for s in slots:
        s.inference_generator.manual_seed(7)
    decoded = decode_groups(groups, features)
    assert calls == ["sample x2"]
    for s in slots:
        s.inference_generator.manual_seed(7)
    for group, got in zip(groups, decoded, strict=True):
        rows = features.rows(group.start, group.stop)
        if group.mode == "mean":
            torch.testing.assert_close(got.actions, group.slot.predict(rows, group.state))
            assert got.log_probs is None
            continue
        drawn = group.slot.sample(rows, group.state, generator=group.slot.inference_generator)
        assert drawn.log_probs is not None and got.log_probs is not None
        torch.testing.assert_close(got.actions, drawn.actions, rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(got.log_probs, drawn.log_probs, rtol=1e-6, atol=1e-6)
    # The two tenants' draws differ (their own generators, their own spreads).
    assert not torch.allclose(decoded[0].log_probs[:1], decoded[1].log_probs)  # type: ignore[index]
