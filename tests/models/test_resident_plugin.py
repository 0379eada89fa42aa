"""A resident architecture and a policy family with its own checkpoint, each added by its
folder and one registry line (tests/models/plugin_arch, tests/models/plugin_family):
the backbone and the services name neither, and a tenant of the family is served."""

from __future__ import annotations

import ast
import re
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from joynexus.errors import SpecError
from joynexus.models.archs import registry as archs
from joynexus.models.archs.paligemma.pi0 import Pi0Checkpoint
from joynexus.models.backbone import ResidentBaseModel
from joynexus.models.batch import ObservationBatch
from joynexus.models.execution.grouped import GroupedExecutor, ServeRequest
from joynexus.models.normalization import FeatureNormStats, NormalizationStats
from joynexus.models.policies import OFTHeadConfig
from joynexus.models.policies import registry as policies
from joynexus.models.schema import LIBERO, PUSHT
from joynexus.models.tenant.slots import TenantSlot
from joynexus.services.tenancy import TenantConfig, build_slot
from tests.models import plugin_arch, plugin_family
from tests.models.conftest import TinyBackbone, TinyModelDir

SRC = Path(__file__).resolve().parents[2] / "src" / "joynexus"
#: Names of the built-in architectures and the families that bring a checkpoint.
NAMED = re.compile(r"pi0|π0|smolvla|smolvlm|paligemma|qwen|idefics", re.IGNORECASE)


def _stats(dim: int, center: float) -> FeatureNormStats:
    return FeatureNormStats(
        mean=[center] * dim, std=[2.0] * dim, q01=[center - 1] * dim, q99=[center + 1] * dim
    )


STATS = NormalizationStats(state=_stats(LIBERO.state_dim, 0.5), action=_stats(7, -0.25))


@pytest.fixture
def registered() -> Iterator[None]:
    archs.register_arch(plugin_arch.ARCH)  # the architecture's one registry line
    policies.register_policy(plugin_family.FAMILY)  # the family's one registry line
    try:
        yield
    finally:
        archs.unregister_arch(plugin_arch.ARCH.name)
        policies.unregister_policy(plugin_family.FAMILY.type)


@pytest.fixture
def packaged(tiny_model_dir: TinyModelDir, tiny_backbone: TinyBackbone, tmp_path: Path) -> Path:
    """The tiny PaliGemma packaged with a pretrained OFT head (one seeded at 7)."""
    out = tmp_path / "packaged"
    shutil.copytree(tiny_model_dir("paligemma"), out)
    pretrained = TenantSlot("pre", LIBERO, tiny_backbone("paligemma"), OFTHeadConfig(), seed=7)
    plugin_arch.package(out, pretrained.action_module.state_dict(), STATS)
    return out


def _code_names(path: Path) -> set[str]:
    """What ``path``'s code names: identifiers, attributes, imported modules and string
    constants (docstrings and comments excluded)."""
    tree = ast.parse(path.read_text())
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            names.add(node.id)
        elif isinstance(node, ast.Attribute):
            names.add(node.attr)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
        elif isinstance(node, ast.alias):
            names.add(node.name)
        elif (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and id(node) not in docstrings
        ):
            names.add(node.value)
    return names


def test_the_backbone_and_the_services_name_no_architecture_or_family() -> None:
    sources = [SRC / "models" / "backbone.py", *sorted((SRC / "services").rglob("*.py"))]
    named = {
        f"{path.relative_to(SRC)}: {name}"
        for path in sources
        for name in _code_names(path)
        if NAMED.search(name)
    }
    assert named == set()


def test_a_packaged_checkpoint_is_not_claimed_without_its_architecture(packaged: Path) -> None:
    base = ResidentBaseModel.from_pretrained(str(packaged))
    assert base.arch == "paligemma"
    assert base.extension(plugin_arch.PackagedHead) is None


def test_a_registered_architecture_loads_its_checkpoint_and_serves_its_familys_tenant(
    registered: None, packaged: Path, tiny_backbone: TinyBackbone
) -> None:
    base = ResidentBaseModel.from_pretrained(str(packaged))
    assert base.arch == "packaged_paligemma"
    assert base.extension(Pi0Checkpoint) is None
    extension = base.extension(plugin_arch.PackagedHead)
    assert extension is not None and extension.normalization == STATS

    # The family's head starts from the package's; the tenant takes its statistics.
    config = TenantConfig(tenant_id="pkg", schema=LIBERO, head=plugin_family.PackagedOFTConfig())
    slot = build_slot(config, base)
    assert slot.normalization == STATS
    for name, tensor in slot.action_module.state_dict().items():
        assert torch.equal(tensor, extension.state[name]), name
    own = NormalizationStats(state=_stats(LIBERO.state_dim, 3.0), action=_stats(7, 1.0))
    assert build_slot(config.model_copy(update={"normalization": own}), base).normalization == own

    # Served through the grouped path, it answers as the same head on the stock
    # PaliGemma arch does: the plug-in feeds the model exactly like the built-in.
    stock = tiny_backbone("paligemma")
    reference = TenantSlot("pre", LIBERO, stock, OFTHeadConfig(), seed=7)
    obs = ObservationBatch.synthetic(LIBERO, 2, seed=3, with_actions=False)
    executor = GroupedExecutor(base)
    executor.add_slot(slot)
    (answer,) = executor.run_requests([ServeRequest("pkg", obs)])
    stock_executor = GroupedExecutor(stock)
    stock_executor.add_slot(reference)
    (want,) = stock_executor.run_requests([ServeRequest("pre", obs)])
    assert answer.actions.shape == (2, LIBERO.action_chunk, LIBERO.action_dim)
    torch.testing.assert_close(
        torch.as_tensor(answer.actions), torch.as_tensor(want.actions), rtol=1e-5, atol=1e-6
    )


def test_the_family_refuses_a_base_without_its_extension(
    registered: None, tiny_backbone: TinyBackbone
) -> None:
    config = plugin_family.PackagedOFTConfig()
    with pytest.raises(SpecError, match="needs a packaged base model"):
        config.check_base(tiny_backbone("paligemma"), PUSHT)
    with pytest.raises(SpecError, match="needs a packaged base model"):
        TenantSlot("t", PUSHT, tiny_backbone("paligemma"), config)
