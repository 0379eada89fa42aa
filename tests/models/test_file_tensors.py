"""``FileTensors``: a π checkpoint's expert read from its file when asked, never a view
that keeps the whole file's memory map alive (a real π0.5 resident held 7.6 GB for its
3.8 GB of parameters)."""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import save_file

from joynexus.models.archs.lerobot_pi.checkpoint import FileTensors, lerobot_names

NORM = "model.paligemma_with_expert.gemma_expert.model.norm.weight"
BIG = "model.paligemma_with_expert.paligemma.model.big"


def _file(tmp_path: Path) -> Path:
    path = tmp_path / "model.safetensors"
    save_file(
        {
            NORM: torch.arange(4.0),
            BIG: torch.ones(4096),
        },
        str(path),
    )
    return path


def test_each_tensor_is_its_own_copy_not_a_view_of_the_file(tmp_path: Path) -> None:
    path = _file(tmp_path)
    tensors = FileTensors(path, {"norm": NORM})
    assert list(tensors) == ["norm"] and len(tensors) == 1
    norm = tensors["norm"]
    assert torch.equal(norm, torch.arange(4.0))
    # Its storage holds its own 16 bytes, not the whole file's map (16 KB and more).
    assert norm.untyped_storage().nbytes() == 4 * 4
    # Writing to it never reaches the file or the next read.
    norm.add_(1)
    assert torch.equal(tensors["norm"], torch.arange(4.0))


def test_read_all_reads_every_tensor_under_our_names(tmp_path: Path) -> None:
    path = _file(tmp_path)
    names = lerobot_names({BIG: BIG})  # the renaming alone: no "model." prefix
    ours = BIG.removeprefix("model.")
    assert names == {ours: BIG}
    assert torch.equal(FileTensors(path, names).read_all()[ours], torch.ones(4096))
