"""A ``lerobot/...`` hub id names its family; π0-FAST is not π0 with a suffix."""

import pytest

from joynexus.errors import SpecError
from joynexus.interop.lerobot import SchemaDims, check_lerobot_base, hub_family


@pytest.mark.parametrize(
    "model_id", ["lerobot/pi0_fast_libero", "lerobot/pi0-fast-base", "lerobot/pi0fast_base"]
)
def test_pi0_fast_hub_ids_are_refused_at_spec_time(model_id: str) -> None:
    assert hub_family(model_id) == "pi0fast"
    with pytest.raises(SpecError, match="pi0fast"):
        check_lerobot_base(model_id, SchemaDims(state_dim=6, action_dim=6, action_chunk=4))


def test_pi0_hub_ids_stay_pi0() -> None:
    assert hub_family("lerobot/pi0_base") == "pi0"
    assert hub_family("lerobot/pi0_libero_finetuned") == "pi0"
