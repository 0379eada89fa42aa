"""Resident architectures as plug-ins, one folder per architecture.

* :mod:`~joynexus.models.archs.base`: the :class:`ResidentArch` / :class:`Resident`
  contract (load, canonical input, shared forward, default normalization, images per
  row, the typed extension a policy family may ask for);
* :mod:`~joynexus.models.archs.registry`: architectures by name and by checkpoint;
* folders: ``qwen_vl/`` (Qwen2.5-VL, Qwen3-VL), ``paligemma/`` (PaliGemma, π0),
  ``smolvlm/`` (SmolVLM, LeRobot SmolVLA).
"""
