"""Whether a ``base_model.id`` names a backbone this machine can load, asked offline.

``spec check`` and ``run`` ask before anything loads: an unknown ``tiny:<arch>`` is
refused with every valid tiny id (from the registries, not a hand list), and a hub id
with no copy in the local Hugging Face cache is said to be unavailable here instead of
being found out by the hub client's network retries.
"""

from __future__ import annotations

import os
from pathlib import Path

from joynexus.errors import SpecError
from joynexus.interop.lerobot import TINY_ID as TINY_LEROBOT_ID
from joynexus.models.tiny import ARCHES

__all__ = ["SMALL_PREFIX", "TINY_PREFIX", "check_base_model", "known_ids"]

TINY_PREFIX = "tiny:"
#: ``small:<arch>``: the same real architecture at ``make-tiny --size small``.
SMALL_PREFIX = "small:"
#: The file every loadable checkpoint has (transformers' and LeRobot's alike).
CONFIG_FILE = "config.json"


def known_ids(prefix: str) -> list[str]:
    """Every built-in id of ``prefix`` (``tiny:`` or ``small:``): the tiny architectures'
    registry, plus the tiny LeRobot SmolVLA for ``tiny:``."""
    ids = [prefix + arch for arch in ARCHES]
    if prefix == TINY_PREFIX:
        ids.append(TINY_LEROBOT_ID)
    return ids


def _hub_cached(repo_id: str) -> bool:
    """Whether the local Hugging Face cache holds ``repo_id`` (no network)."""
    from huggingface_hub import try_to_load_from_cache
    from huggingface_hub.errors import HFValidationError

    try:
        found = try_to_load_from_cache(repo_id, CONFIG_FILE)
    except HFValidationError as exc:
        raise SpecError(
            f"base_model.id {repo_id!r} is neither a local directory, a hub id "
            f"(owner/name) nor a built-in id ({exc})",
            field="base_model.id",
        ) from None
    return isinstance(found, str)


def _offline() -> bool:
    # The rule ResidentBaseModel.from_pretrained loads by: any value but empty or 0.
    return os.environ.get("HF_HUB_OFFLINE", "") not in ("", "0")


def check_base_model(model_id: str, *, require_local: bool = True) -> None:
    """Refuse a ``base_model.id`` that cannot be loaded here; never touches the network.

    Args:
        model_id: The spec's ``base_model.id``.
        require_local: Refuse a hub id missing from the local cache even when the hub
            could be reached (``spec check``); ``False`` refuses it only under
            ``HF_HUB_OFFLINE`` (``run`` downloads it otherwise).

    Raises:
        SpecError: an unknown built-in id (naming the valid ones), a malformed id, or a
            hub id with no local copy.
    """
    for prefix in (TINY_PREFIX, SMALL_PREFIX):
        if model_id.startswith(prefix):
            valid = known_ids(prefix)
            if model_id not in valid:
                raise SpecError(
                    f"base_model.id {model_id!r} is no built-in model; the {prefix}<arch> "
                    f"ids are {valid}",
                    field="base_model.id",
                )
            return
    if Path(os.path.expanduser(model_id)).is_dir():
        return
    if _hub_cached(model_id):
        return
    offline = _offline()
    if not (require_local or offline):
        return
    why = "HF_HUB_OFFLINE is set" if offline else "nothing was downloaded"
    raise SpecError(
        f"base_model.id {model_id!r} is not available locally: no such directory, and "
        f"the Hugging Face cache holds no copy ({why}); download it first "
        f"(`hf download {model_id}`), name a local checkpoint directory, or use a "
        f"built-in id ({known_ids(TINY_PREFIX)[0]!r}, ...)",
        field="base_model.id",
    )
