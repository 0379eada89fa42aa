"""Action modules: shapes, masked losses, padding invariance, Gaussian policy, flow matching."""

from __future__ import annotations

import math

import pytest
import torch
from pydantic import TypeAdapter, ValidationError

from joynexus.errors import InvalidRequestError, SchemaMismatchError
from joynexus.models.policies import (
    FlowMatchingHead,
    FlowMatchingHeadConfig,
    HeadConfig,
    OFTHead,
    OFTHeadConfig,
    ValueHead,
    ValueHeadConfig,
    build_action_module,
)
from joynexus.models.policies.base import ActionModule
from joynexus.models.schema import LIBERO
from joynexus.models.types import BackboneOutput

D, S, A, CHUNK = 16, 5, 3, 4


def _features(b: int = 3, length: int = 7, seed: int = 0) -> BackboneOutput:
    g = torch.Generator().manual_seed(seed)
    hs = torch.randn(b, length, D, generator=g)
    mask = torch.ones(b, length, dtype=torch.long)
    mask[0, :3] = 0  # left padding on one row
    return BackboneOutput(hidden_states=hs, attention_mask=mask)


def _pad_more(f: BackboneOutput, extra: int) -> BackboneOutput:
    """Left-pad with garbage tokens that the mask marks as padding (a grouped batch)."""
    b = f.hidden_states.shape[0]
    junk = torch.full((b, extra, D), 1e3)
    return BackboneOutput(
        hidden_states=torch.cat([junk, f.hidden_states], dim=1),
        attention_mask=torch.cat(
            [torch.zeros(b, extra, dtype=f.attention_mask.dtype), f.attention_mask], dim=1
        ),
    )


def _oft(**kw: object) -> OFTHead:
    torch.manual_seed(0)
    return OFTHead(
        OFTHeadConfig(hidden_dim=32, **kw),  # type: ignore[arg-type]
        hidden_size=D,
        state_dim=S,
        action_dim=A,
        action_chunk=CHUNK,
    )


def _fm(**kw: object) -> FlowMatchingHead:
    torch.manual_seed(0)
    return FlowMatchingHead(
        FlowMatchingHeadConfig(hidden_dim=32, num_heads=4, **kw),  # type: ignore[arg-type]
        hidden_size=D,
        state_dim=S,
        action_dim=A,
        action_chunk=CHUNK,
    )


def _gen(seed: int = 7) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


@pytest.mark.parametrize(
    "make", [_oft, lambda: _oft(pooling="attention"), lambda: _oft(pooling="positional"), _fm]
)
def test_predict_shape_and_padding_invariance(make: object) -> None:
    head: ActionModule = make()  # type: ignore[operator]
    f = _features()
    state = torch.randn(3, S)
    actions = torch.randn(3, CHUNK, A)
    pred = head.predict(f, state, generator=_gen())
    assert pred.shape == (3, CHUNK, A)
    padded = _pad_more(f, 5)
    torch.testing.assert_close(head.predict(padded, state, generator=_gen()), pred)
    loss = head.loss(f, state, actions, generator=_gen())
    loss_padded = head.loss(padded, state, actions, generator=_gen())
    assert loss.dim() == 0
    torch.testing.assert_close(loss_padded, loss)


@pytest.mark.parametrize("make", [_oft, _fm])
def test_loss_counts_only_valid_action_entries(make: object) -> None:
    head: ActionModule = make()  # type: ignore[operator]
    f, state = _features(), torch.randn(3, S)
    actions = torch.randn(3, CHUNK, A)
    mask = torch.ones(A)
    mask[-1] = 0  # last action dim is padding
    base = head.loss(f, state, actions, mask, generator=_gen())
    changed = actions.clone()
    changed[..., -1] += 100.0
    assert torch.equal(head.loss(f, state, changed, mask, generator=_gen()), base)
    # Without the mask the change must matter: the assertion above can fail.
    assert not torch.equal(head.loss(f, state, changed, None, generator=_gen()), base)


def test_bad_mask_and_bad_state_name_the_field() -> None:
    head = _oft()
    f = _features()
    with pytest.raises(SchemaMismatchError, match=r"state: expected \[3, 5\]"):
        head.predict(f, torch.randn(3, S + 1))
    for h in (head, _fm()):
        with pytest.raises(SchemaMismatchError, match="action_mask"):
            h.loss(f, torch.randn(3, S), torch.randn(3, CHUNK, A), torch.ones(A + 2))
    with pytest.raises(SchemaMismatchError, match="actions"):
        head.loss(f, torch.randn(3, S), torch.randn(3, CHUNK + 1, A))


def test_gaussian_policy_matches_torch_distributions() -> None:
    head = _oft(init_log_std=-0.5)
    f, state = _features(), torch.randn(3, S)
    actions = torch.randn(3, CHUNK, A)
    mu = head.mean(f, state)
    dist = torch.distributions.Normal(mu, torch.exp(head.log_std).expand_as(mu))
    expected = dist.log_prob(actions).flatten(1).sum(-1)
    torch.testing.assert_close(head.log_prob(f, state, actions), expected)
    torch.testing.assert_close(head.entropy(), dist.entropy()[0].sum())
    sampled, logp, _ = head.sample(f, state, generator=_gen(3))
    again = head.sample(f, state, generator=_gen(3)).actions
    assert torch.equal(sampled, again)
    torch.testing.assert_close(logp, head.log_prob(f, state, sampled))
    # log-std is learnable: the entropy has a gradient into it.
    head.entropy().backward()
    assert head.log_std.grad is not None and torch.all(head.log_std.grad != 0)


def test_log_prob_ignores_masked_entries() -> None:
    head = _oft()
    f, state = _features(), torch.randn(3, S)
    actions = torch.randn(3, CHUNK, A)
    mask = torch.ones(CHUNK, A)
    mask[-1] = 0  # last chunk step is past the episode end
    lp = head.log_prob(f, state, actions, mask)
    changed = actions.clone()
    changed[:, -1] = 50.0
    torch.testing.assert_close(head.log_prob(f, state, changed, mask), lp)


@pytest.mark.parametrize("make", [_oft, _fm])
def test_head_learns_a_fixed_mapping(make: object) -> None:
    head: ActionModule = make()  # type: ignore[operator]
    f, state = _features(b=4, seed=1), torch.randn(4, S)
    target = torch.tanh(torch.randn(4, CHUNK, A))
    opt = torch.optim.AdamW(head.parameters(), lr=3e-3)
    g = _gen(0)
    losses = []
    for _ in range(150):
        opt.zero_grad()
        loss = head.loss(f, state, target, generator=g)
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    assert sum(losses[-10:]) / 10 < 0.3 * sum(losses[:10]) / 10
    err = (head.predict(f, state, generator=_gen(1)) - target).abs().mean()
    # The regressed/integrated chunk lands near the data (t=1 is data).
    assert float(err) < 0.35


def test_flow_matching_sampling_is_seeded_and_uses_n_steps() -> None:
    head = _fm(num_inference_steps=3)
    f, state = _features(), torch.randn(3, S)
    a = head.predict(f, state, generator=_gen(5))
    assert torch.equal(a, head.predict(f, state, generator=_gen(5)))
    assert not torch.equal(a, head.predict(f, state, generator=_gen(6)))
    calls = 0
    original = head.conditioned_velocity  # one call per Euler step

    def counting(*args: object, **kwargs: object) -> torch.Tensor:
        nonlocal calls
        calls += 1
        return original(*args, **kwargs)  # type: ignore[arg-type]

    head.conditioned_velocity = counting  # type: ignore[method-assign]
    head.predict(f, state, generator=_gen(5))
    assert calls == 3
    head.predict(f, state, generator=_gen(5), num_steps=7)
    assert calls == 10


def test_flow_matching_times_follow_the_convention() -> None:
    head_beta, head_uniform = _fm(), _fm(time_sampling="uniform")
    kw = {"device": torch.device("cpu"), "dtype": torch.float32}
    t_beta = head_beta.sample_times(20000, generator=_gen(0), **kw)  # type: ignore[arg-type]
    t_uni = head_uniform.sample_times(20000, generator=_gen(0), **kw)  # type: ignore[arg-type]
    assert float(t_beta.min()) >= 0.0 and float(t_beta.max()) <= 0.999
    # Beta(1.5, 1) flipped: mass towards t=0 (the noisy end); E[t] = 0.999 * (1 - 0.6).
    assert abs(float(t_beta.mean()) - 0.999 * 0.4) < 0.01
    assert abs(float(t_uni.mean()) - 0.5) < 0.01


def test_flow_matching_loss_matches_velocity_target() -> None:
    """Recompute the loss by hand from the documented convention."""
    head = _fm(time_sampling="uniform")
    f, state = _features(), torch.randn(3, S)
    actions = torch.randn(3, CHUNK, A)
    loss = head.loss(f, state, actions, generator=_gen(9))
    g = _gen(9)
    noise = torch.randn(actions.shape, generator=g)
    t = torch.rand(3, generator=g)
    x_t = (1 - t[:, None, None]) * noise + t[:, None, None] * actions
    expected = (head.velocity(f, state, x_t, t) - (actions - noise)).pow(2).mean()
    torch.testing.assert_close(loss, expected)


def test_value_head() -> None:
    torch.manual_seed(0)
    vh = ValueHead(ValueHeadConfig(hidden_dim=32), hidden_size=D, state_dim=S)
    f, state = _features(), torch.randn(3, S)
    v = vh(f, state)
    assert v.shape == (3,)
    torch.testing.assert_close(vh(_pad_more(f, 4), state), v)
    returns = torch.tensor([1.0, -2.0, 0.5])
    opt = torch.optim.Adam(vh.parameters(), lr=1e-2)
    first = float(vh.loss(f, state, returns).detach())
    for _ in range(100):
        opt.zero_grad()
        vh.loss(f, state, returns).backward()
        opt.step()
    assert float(vh.loss(f, state, returns).detach()) < 0.05 * first
    with pytest.raises(SchemaMismatchError):
        vh(f, torch.randn(3, S + 2))


def test_configs_validate_and_discriminate() -> None:
    adapter: TypeAdapter[OFTHeadConfig | FlowMatchingHeadConfig] = TypeAdapter(HeadConfig)
    cfg = adapter.validate_python({"type": "flow_matching", "hidden_dim": 48, "num_heads": 4})
    assert isinstance(cfg, FlowMatchingHeadConfig)
    assert isinstance(adapter.validate_python({"type": "oft"}), OFTHeadConfig)
    with pytest.raises(ValidationError, match="divisible"):
        FlowMatchingHeadConfig(hidden_dim=30, num_heads=4)
    with pytest.raises(ValidationError):
        OFTHeadConfig(hidden_dim=32, unknown=1)  # type: ignore[call-arg]
    with pytest.raises(ValidationError):
        adapter.validate_python({"type": "diffusion"})
    head = build_action_module(OFTHeadConfig(), hidden_size=D, schema=LIBERO)
    assert (head.state_dim, head.action_dim, head.action_chunk) == (8, 7, 8)
    assert math.isfinite(float(head.predict(_features(b=2), torch.zeros(2, 8)).sum()))


def test_positional_pooling_tells_where_a_token_is_and_the_others_do_not() -> None:
    # Two observations with the same tokens in another order (the goal's patch at
    # another place in the frame): a mean or one query over the token set cannot tell
    # them apart, the positional pooling can.
    f = _features(b=1, length=7, seed=3)
    hs = f.hidden_states
    swapped = BackboneOutput(
        hidden_states=hs[:, [0, 1, 2, 3, 5, 4, 6]], attention_mask=f.attention_mask
    )
    state = torch.zeros(1, S)
    for pooling in ("mean", "attention"):
        head = _oft(pooling=pooling)
        torch.testing.assert_close(head.mean(f, state), head.mean(swapped, state))
    head = _oft(pooling="positional")
    with torch.no_grad():  # a trained output layer (the initial one is ~0)
        head.out_proj.weight.normal_()
    assert not torch.allclose(head.mean(f, state), head.mean(swapped, state), atol=1e-4)


def _full(f: BackboneOutput) -> BackboneOutput:
    """The same tokens with every one valid (one canonical size: one token count)."""
    return BackboneOutput(
        hidden_states=f.hidden_states, attention_mask=torch.ones_like(f.attention_mask)
    )


def test_flatten_pooling_reads_each_token_in_its_place_and_ignores_padding() -> None:
    f = _full(_features(b=3, length=7, seed=3))
    state = torch.randn(3, S)
    head = _oft(pooling="flatten", flatten_tokens=7)
    head.eval()
    with torch.no_grad():
        head.out_proj.weight.normal_()
    pred = head.predict(f, state)
    assert pred.shape == (3, CHUNK, A)
    # Another tenant's longer rows in the same batch only add left padding.
    torch.testing.assert_close(head.predict(_pad_more(f, 5), state), pred)
    swapped = BackboneOutput(
        hidden_states=f.hidden_states[:, [0, 1, 2, 3, 5, 4, 6]], attention_mask=f.attention_mask
    )
    assert not torch.allclose(head.predict(swapped, state), pred, atol=1e-4)
    # Gradients reach the read of every token (the probe's linear map).
    head.train()
    head.loss(f, state, torch.randn(3, CHUNK, A)).backward()
    assert head.pool is not None
    grad = head.pool.read.weight.grad  # type: ignore[union-attr]
    assert grad is not None and bool((grad.view(D, 7, D).abs().sum((0, 2)) > 0).all())


def test_flatten_pooling_refuses_another_token_count_and_a_missing_count() -> None:
    head = _oft(pooling="flatten", flatten_tokens=6)
    with pytest.raises(InvalidRequestError, match=r"exactly 6 tokens.*\[7\]"):
        head.predict(_full(_features(length=7)), torch.zeros(3, S))
    with pytest.raises(InvalidRequestError, match="flatten_tokens"):
        head.predict(_features(length=7), torch.zeros(3, S))  # one row padded: 4 and 7
    with pytest.raises(ValidationError, match="flatten_tokens"):
        OFTHeadConfig(pooling="flatten")
    with pytest.raises(ValidationError, match="flatten_tokens"):
        OFTHeadConfig(pooling="mean", flatten_tokens=4)
