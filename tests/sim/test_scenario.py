from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from joynexus.errors import SpecError
from joynexus.sim.scenario import (
    expand,
    load_scenario,
    preset,
    scenario_from_dict,
    scenario_to_yaml,
)

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "scenarios" / "paper-5.1.yaml"


def test_example_yaml_equals_builtin_preset() -> None:
    assert load_scenario(EXAMPLE) == preset("paper-5.1")


def test_yaml_round_trip() -> None:
    for name in ("paper-5.1", "scale-64"):
        sc = preset(name)
        assert scenario_from_dict(yaml.safe_load(scenario_to_yaml(sc))) == sc


def test_paper_preset_matches_section_5_1_knobs() -> None:
    sc = preset("paper-5.1")
    assert sc.multi_tenant.total_gpus == 8
    assert (sc.multi_tenant.actor_gpus, sc.multi_tenant.inference_gpus) == (2, 2)
    assert sc.isolated.total_gpus == 4
    assert sc.actor.per_gpu_microbatch * sc.multi_tenant.actor_gpus == 256
    assert sc.inference.max_batch_samples == 128
    assert sc.scheduler.staleness_bound == 128
    assert sc.scheduler.rl_max_in_flight == 2
    assert sc.scheduler.max_active_rollouts == 3
    assert sc.scheduler.max_active_rollouts_per_tenant == 1
    assert sc.scheduler.sft_max_in_flight == 16
    assert sc.scheduler.rl_priority > sc.scheduler.sft_priority
    assert len(sc.rl_tenants) == 3 and len(sc.sft_tenants) == 1
    pools = {t.tenant_id: t.pool for t in sc.rl_tenants}
    assert pools["libero"] == pools["maniskill-1"] != pools["maniskill-2"]
    assert sc.window_s == 90 * 60


def test_scale_64_has_64_tenants_on_64_gpus_with_unique_names() -> None:
    dep = expand(preset("scale-64"))
    assert dep.total_gpus == 64
    ids = [s.tenant.tenant_id for s in dep.rl] + [s.tenant.tenant_id for s in dep.sft]
    assert len(ids) == 64 == len(set(ids))
    assert len(set(dep.replicas)) == 8
    pool_names = {p.name for p in dep.pools}
    assert all(s.tenant.pool in pool_names for s in dep.rl)


def test_unknown_preset_and_missing_file() -> None:
    with pytest.raises(SpecError, match=r"presets: paper-5\.1, scale-64"):
        preset("nope")
    with pytest.raises(SpecError, match="neither a preset"):
        load_scenario("does-not-exist.yaml")


def test_invalid_scenarios_name_the_problem(tmp_path: Path) -> None:
    data = preset("paper-5.1").model_dump(mode="json")
    data["actor"]["per_gpu_microbatch"] = 0
    with pytest.raises(SpecError, match=r"actor\.per_gpu_microbatch"):
        scenario_from_dict(data)

    data = preset("paper-5.1").model_dump(mode="json")
    data["rl_tenants"][0]["pool"] = "pool-9"
    with pytest.raises(SpecError, match="pool-9"):
        scenario_from_dict(data)

    data = preset("paper-5.1").model_dump(mode="json")
    data["multi_tenant"]["env_gpus"] = 6
    with pytest.raises(SpecError, match="env_gpus"):
        scenario_from_dict(data)

    data = preset("paper-5.1").model_dump(mode="json")
    data["surprise"] = 1
    with pytest.raises(SpecError, match="surprise"):
        scenario_from_dict(data)

    bad = tmp_path / "bad.yaml"
    bad.write_text("name: [unclosed\n")
    with pytest.raises(SpecError, match="not valid YAML"):
        load_scenario(bad)
