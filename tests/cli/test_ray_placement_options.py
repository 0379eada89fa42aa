"""`joynexus run --runtime ray` placement options: strategy, role resources, ranks."""

from __future__ import annotations

import pytest

from joynexus.cli.ray_cmds import make_placement
from joynexus.errors import SpecError

pytest.importorskip("ray")


def test_ray_options_become_the_placement() -> None:
    from joynexus.runtime.ray_hosting import RayPlacement

    placement = make_placement(
        "ray",
        layout="2-2-4",
        strategy="spread",
        role_resources="actor=trainer, inference=rollout",
        training_ranks=2,
    )
    assert isinstance(placement, RayPlacement)
    assert placement.strategy == "SPREAD" and placement.training_ranks == 2
    assert placement.role_resources == {"actor": "trainer", "inference": "rollout"}


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"strategy": "scatter"}, "--placement-strategy 'scatter'"),
        ({"role_resources": "learner=trainer"}, "ROLE=RESOURCE"),
        ({"role_resources": "actor"}, "ROLE=RESOURCE"),
        ({"training_ranks": 3}, "at most one rank per actor GPU"),
    ],
)
def test_bad_ray_options_say_what_to_fix(options: dict[str, object], message: str) -> None:
    with pytest.raises(SpecError, match=message):
        make_placement("ray", layout="2-2-4", **options)  # type: ignore[arg-type]
