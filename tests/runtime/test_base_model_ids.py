"""How a spec's base_model.id names a locally built model (tiny:<arch>, small:<arch>)."""

from __future__ import annotations

from pathlib import Path

import pytest

from joynexus.errors import SpecError
from joynexus.runtime.plane import load_base_model
from joynexus.spec.workload import BaseModelSpec


@pytest.mark.parametrize("prefix", ["tiny", "small"])
def test_an_unknown_architecture_lists_the_allowed_ids(prefix: str, tmp_path: Path) -> None:
    with pytest.raises(SpecError, match=f"unknown {prefix} architecture") as info:
        load_base_model(BaseModelSpec(id=f"{prefix}:nope"), tmp_path)
    assert f"'{prefix}:pi0'" in str(info.value)
    assert not any(tmp_path.iterdir())  # nothing was built
