"""The one flow-matching loss serves both time conventions (DiT: noise at t = 0; π0:
noise at t = 1) and masks what each family masks."""

from __future__ import annotations

import torch

from joynexus.models.policies.flow import flow_matching_loss


def _data(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    actions, noise = torch.randn(3, 4, 2, generator=g), torch.randn(3, 4, 2, generator=g)
    t = torch.rand(3, generator=g)
    weight = torch.randn(2, 2, generator=g)
    return actions, noise, t, weight


def test_a_perfect_velocity_has_zero_loss_in_both_conventions() -> None:
    actions, noise, t, _ = _data()
    assert float(flow_matching_loss(lambda x, tt: actions - noise, actions, noise, t, None)) == 0
    pi0 = flow_matching_loss(
        lambda x, tt: noise - actions, actions, noise, t, None, noise_at_one=True
    )
    assert float(pi0) == 0


def test_the_conventions_are_mirror_images() -> None:
    # π0 at time t sees the DiT's point at 1 - t and regresses the negated velocity.
    actions, noise, t, weight = _data(1)

    def dit(x: torch.Tensor, tt: torch.Tensor) -> torch.Tensor:
        return x @ weight + tt[:, None, None]

    def pi0(x: torch.Tensor, tt: torch.Tensor) -> torch.Tensor:
        return -dit(x, 1.0 - tt)

    a = flow_matching_loss(dit, actions, noise, 1.0 - t, None)
    b = flow_matching_loss(pi0, actions, noise, t, None, noise_at_one=True)
    torch.testing.assert_close(a, b)


def test_masked_entries_neither_count_nor_leak_when_inputs_are_masked() -> None:
    actions, noise, t, weight = _data(2)
    mask = torch.ones(3, 4, 1)
    mask[:, 2:] = 0

    def velocity(x: torch.Tensor, tt: torch.Tensor) -> torch.Tensor:
        return x.sum(dim=1, keepdim=True).expand_as(x) @ weight  # every entry sees all

    changed = actions.clone()
    changed[:, 2:] += 5.0
    masked = [
        flow_matching_loss(velocity, a, noise, t, mask, mask_inputs=True)
        for a in (actions, changed)
    ]
    torch.testing.assert_close(masked[0], masked[1])
    leaky = [flow_matching_loss(velocity, a, noise, t, mask) for a in (actions, changed)]
    assert not torch.allclose(leaky[0], leaky[1])
