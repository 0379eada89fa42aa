"""LoRA specs over HTTP: a bad ``action_module.lora`` is a 422 naming the valid targets;
a vision LoRA spec is accepted."""

from __future__ import annotations

import asyncio
from pathlib import Path

from tests.server.livesrv import live, reach_custom, tiny_model  # noqa: F401


def test_bad_lora_specs_are_422_and_a_lora_slot_is_created(
    tmp_path: Path,
    tiny_model: str,  # noqa: F811
) -> None:
    async def main() -> None:
        async with live(tmp_path, tiny_model) as lv:
            bad = reach_custom("alice", tiny_model)
            bad["action_module"] = {"type": "oft", "lora": {"targets": ["q_proj", "qkv"]}}
            r = await lv.submit("alice", bad)
            assert r.status_code == 422, r.text
            assert "valid targets" in r.text and "gate_proj" in r.text, r.text
            bad["action_module"] = {"type": "oft", "lora": {"vision_tower": True}}
            r = await lv.submit("alice", bad)
            assert r.status_code == 422 and "vision_tower" in r.text, r.text

            # LoRA on the language model, the vision tower and its projection.
            good = reach_custom("alice", tiny_model)
            lora = {"rank": 4, "vision": True, "vision_projection": True}
            good["action_module"] = {"type": "oft", "hidden_dim": 32, "lora": lora}
            r = await lv.submit("alice", good)
            assert r.status_code in (200, 201, 202), r.text

    asyncio.run(main())
