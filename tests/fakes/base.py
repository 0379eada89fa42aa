"""What the fake services share: the fake resident base model and the constants of
the fake weights and checkpoints."""

from __future__ import annotations

import asyncio
import re

from joynexus.models.schema import DataSchema, schema_signature

FAKE_BASE_ID = "fake-base"
#: The one tensor of a fake action module (what payloads and checkpoints carry).
WEIGHT = "action_module.weight"
WEIGHT_SIZE = 4
STATE_FILE = "fake_slot.json"
OPTIMIZER_FILE = "fake_optimizer.json"
TRAIN_TASK = "train"
ACTOR_FORWARD_TASK = "actor_forward"
_STEP_DIR = re.compile(r"^step_(\d+)$")


async def _thread_hop() -> None:
    """Where the real service returns from its worker thread: the loop runs others."""
    await asyncio.sleep(0)


class FakeBase:
    """What the Master and the workflows read of the resident base model:
    ``num_camera_slots`` (``SpecCompiler.compile``) and ``signature_for`` (manifests,
    evaluation tenants); the fake services also use ``model_id``."""

    model_id = FAKE_BASE_ID
    num_camera_slots = 2
    canonical_image_size = 16

    def signature_for(self, schema: DataSchema) -> str:
        return schema_signature(
            schema, base_model_id=self.model_id, canonical_image_size=self.canonical_image_size
        )
