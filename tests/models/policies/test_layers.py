"""A head's layers read one module at a time and stacked across heads agree."""

from __future__ import annotations

import copy

import torch
from torch import nn

from joynexus.models.policies.base import ResidualMLPBlock
from joynexus.models.policies.layers import (
    ModuleLayers,
    StackedLayers,
    module_layers,
    residual_mlp,
)


class _Net(nn.Module):
    def __init__(self, seed: int) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.norm = nn.LayerNorm(6)
        self.bare_norm = nn.LayerNorm(6, elementwise_affine=False)
        self.proj = nn.Linear(6, 5)
        self.no_bias = nn.Linear(6, 3, bias=False)
        self.block = ResidualMLPBlock(5)
        with torch.no_grad():  # non-trivial affines, so a mixed-up owner shows
            self.norm.weight.uniform_(0.5, 1.5)
            self.norm.bias.uniform_(-0.5, 0.5)


def _heads(n: int) -> list[_Net]:
    return [_Net(seed) for seed in range(n)]


def test_stacked_rows_read_their_owners_weights() -> None:
    heads = _heads(3)
    owner = [2, 0, 0, 1, 2]
    x = torch.randn(len(owner), 6)
    stacked = StackedLayers(heads, owner)
    for name in ("norm", "bare_norm", "proj", "no_bias"):
        want = torch.cat(
            [ModuleLayers(heads[o]).linear(name, x[r : r + 1]) for r, o in enumerate(owner)]
        )
        got = stacked.linear(name, x) if "norm" not in name else stacked.layer_norm(name, x)
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6, msg=name)
    # Rows really take different weights: reading all with head 0's differs.
    assert not torch.allclose(stacked.linear("proj", x), heads[0].proj(x))


def test_residual_block_is_the_same_read_either_way() -> None:
    heads = _heads(2)
    owner = [1, 0]
    x = torch.randn(2, 5)
    want = torch.cat([heads[o].block(x[r : r + 1]) for r, o in enumerate(owner)])
    got = residual_mlp(StackedLayers(heads, owner), "block.", x)
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)


def test_dropout_applies_only_on_the_module_path() -> None:
    block = ResidualMLPBlock(4, dropout=0.9).train()
    x = torch.randn(64, 4)
    assert not torch.allclose(block(x), block.eval()(x))
    stacked = StackedLayers([block], [0] * 64)
    torch.testing.assert_close(residual_mlp(stacked, "", x), block(x), rtol=1e-6, atol=1e-6)


def test_a_deep_copy_reads_its_own_weights() -> None:
    net = _Net(0)
    x = torch.randn(2, 6)
    before = module_layers(net).linear("proj", x)  # the map is cached on the module
    clone = copy.deepcopy(net)
    with torch.no_grad():
        net.proj.weight.add_(1.0)
    torch.testing.assert_close(module_layers(clone).linear("proj", x), before)
    assert not torch.allclose(module_layers(net).linear("proj", x), before)
