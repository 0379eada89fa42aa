"""The paper's Figure 12, stricter: grouped training reproduces serial training exactly.

Four tenants (two LIBERO-schema, two CALVIN-schema; the schemas' dims and camera sets,
with small images to keep CI fast) train for 50 steps twice from identical initial
states and identical synthetic data: once with ONE shared backbone forward per step over
all tenants (grouped), once with one forward per tenant (serial). Every per-step loss
must agree within 1e-4 relative in fp32, for both head types, and the tenants' final
parameters and versions must match too.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
import torch

from joynexus.models.backbone import ResidentBaseModel
from joynexus.models.batch import ObservationBatch
from joynexus.models.grouped import GroupedExecutor
from joynexus.models.heads import FlowMatchingHeadConfig, OFTHeadConfig
from joynexus.models.schema import CALVIN, LIBERO, CameraSpec, DataSchema
from joynexus.models.slots import OptimizerConfig, TenantSlot
from tests.models.conftest import TinyBackbone

STEPS = 50
BATCH = 2
REL_TOL = 1e-4

LIBERO_SMALL = LIBERO.model_copy(
    update={
        "cameras": {
            "image": CameraSpec(height=32, width=32),
            "wrist_image": CameraSpec(height=32, width=32),
        }
    }
)
CALVIN_SMALL = CALVIN.model_copy(
    update={
        "cameras": {
            "rgb_static": CameraSpec(height=40, width=40),
            "rgb_gripper": CameraSpec(height=16, width=16),
        }
    }
)
TENANTS: list[tuple[str, DataSchema]] = [
    ("libero-a", LIBERO_SMALL),
    ("libero-b", LIBERO_SMALL),
    ("calvin-a", CALVIN_SMALL),
    ("calvin-b", CALVIN_SMALL),
]


@pytest.fixture(autouse=True, scope="module")
def _one_thread() -> Iterator[None]:
    # Tiny matmuls on a shared 2-core box: extra intra-op threads only spin and contend.
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


def _executor(
    base: ResidentBaseModel, head: OFTHeadConfig | FlowMatchingHeadConfig
) -> GroupedExecutor:
    return GroupedExecutor(
        base,
        [
            TenantSlot(tid, schema, base, head, seed=i, optimizer=OptimizerConfig(lr=1e-3))
            for i, (tid, schema) in enumerate(TENANTS)
        ],
    )


def _batches(step: int) -> dict[str, ObservationBatch]:
    return {
        tid: ObservationBatch.synthetic(schema, BATCH, seed=1000 * i + step)
        for i, (tid, schema) in enumerate(TENANTS)
    }


@pytest.mark.parametrize(
    "head",
    [
        OFTHeadConfig(hidden_dim=64),
        FlowMatchingHeadConfig(hidden_dim=32, num_layers=2, num_heads=4),
    ],
    ids=["oft", "flow_matching"],
)
def test_grouped_training_matches_serial_per_step(
    head: OFTHeadConfig | FlowMatchingHeadConfig, tiny_backbone: TinyBackbone
) -> None:
    base = tiny_backbone("qwen2_5_vl")
    assert {s.name for _, s in TENANTS} == {"libero", "calvin"}
    grouped, serial = _executor(base, head), _executor(base, head)
    losses: dict[str, list[tuple[float, float]]] = {tid: [] for tid, _ in TENANTS}
    started = time.perf_counter()
    for step in range(STEPS):
        batches = _batches(step)
        g = grouped.train_step(batches)
        s = serial.serial_train_step(batches)
        for tid in batches:
            losses[tid].append((g[tid].loss, s[tid].loss))
            assert g[tid].policy_version == s[tid].policy_version == step + 1
    elapsed = time.perf_counter() - started

    for tid, pairs in losses.items():
        for step, (lg, ls) in enumerate(pairs):
            assert abs(lg - ls) <= REL_TOL * abs(ls), (
                f"{head.type}/{tid} step {step}: grouped loss {lg} vs serial {ls}"
            )
        # Training did something: the curves are not flat (so agreement is not trivial).
        assert len({round(lg, 6) for lg, _ in pairs}) > STEPS // 2
        for (name, pg), (_, ps) in zip(
            grouped.slot(tid).named_parameters(), serial.slot(tid).named_parameters(), strict=True
        ):
            torch.testing.assert_close(pg, ps, rtol=1e-4, atol=1e-5, msg=f"{tid}/{name}")
    # Tenants learned separately: same-schema tenants ended with different weights.
    pairs_ab = zip(
        grouped.slot("libero-a").parameters(), grouped.slot("libero-b").parameters(), strict=True
    )
    assert any(not torch.equal(pa, pb) for pa, pb in pairs_ab)
    print(f"figure12 {head.type}: {STEPS} grouped+serial steps in {elapsed:.1f}s")
