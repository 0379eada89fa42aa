"""A tenant's private state on the shared base model: its slot (schema, action module,
optimizer, critic, LoRA adapter, normalization, version) and its optimizer state's
tensors (the LoRA adapters themselves live in :mod:`joynexus.models.lora`, which the
backbone hosts)."""
