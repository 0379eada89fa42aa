"""The channel between front processes and the model process.

Messages are frames on a Unix stream socket: a 4-byte big-endian length and a pickle
(protocol 5) of a tuple. Decoded observation tensors do not travel in the frame: the
front copies them into a slot of a shared-memory ring (:class:`SlotRing`, one
``multiprocessing.shared_memory`` block per front, created and unlinked by the model
process) and frames only a descriptor (name, dtype, shape, offset); the model process
copies them out (:func:`take_arrays`) as it reads the frame, and the slot is the front's
again once the answer came back. An observation that does not fit a slot, or one that
finds every slot taken, travels pickled in the frame instead. ``joynexus bench
front-channel`` measured both (docs/RESULTS.md §8.1): the slots were faster at every
image size (1.2x at 32x32, 8x at 480x640), so they are the path taken.

Pickle is safe here because both ends are ours: the socket lives in a directory only
the server's user can open (mode 0700), created by the model process for its fronts.
"""

from __future__ import annotations

import asyncio
import pickle
import struct
from multiprocessing import resource_tracker, shared_memory
from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = [
    "FRONT_TOKEN_ENV",
    "ArrayRef",
    "SlotRing",
    "decode_frame_body",
    "encode_frame",
    "read_frame",
    "take_arrays",
]

#: Where one array lies in the block: (name, dtype string, shape, byte offset).
ArrayRef = tuple[str, str, tuple[int, ...], int]
_ALIGN = 64

_HEADER = struct.Struct("!I")
#: The environment variable a front reads the openpi gateway's front token from (the
#: environment, not the command line, which every local user can read).
FRONT_TOKEN_ENV = "JOYNEXUS_FRONT_TOKEN"
#: A frame's bound (a decoded predict is bounded by the server's body limits far below).
MAX_FRAME_BYTES = 2**31 - 1


def encode_frame(message: tuple[Any, ...]) -> bytes:
    """``message`` as one frame (length prefix + pickle)."""
    data = pickle.dumps(message, protocol=5)
    return _HEADER.pack(len(data)) + data


async def read_frame(reader: asyncio.StreamReader) -> tuple[Any, ...]:
    """The next frame's message.

    Raises:
        asyncio.IncompleteReadError: the peer closed the connection.
    """
    (size,) = _HEADER.unpack(await reader.readexactly(_HEADER.size))
    message = pickle.loads(
        await reader.readexactly(size)
    )  # our own peer (see the module docstring)
    assert isinstance(message, tuple)
    return message


def decode_frame_body(data: bytes) -> tuple[Any, ...]:
    """A frame's message from its body (without the length prefix)."""
    message = pickle.loads(data)  # our own peer (see the module docstring)
    assert isinstance(message, tuple)
    return message


def attach(name: str) -> shared_memory.SharedMemory:
    """Open the model process's block ``name`` without owning it: Python 3.11's resource
    tracker would otherwise unlink it when this process exits."""
    shm = shared_memory.SharedMemory(name)
    resource_tracker.unregister(shm._name, "shared_memory")  # type: ignore[attr-defined]  # private
    return shm


class SlotRing:
    """A front's shared-memory block cut into ``slots`` equal slots."""

    def __init__(self, shm: shared_memory.SharedMemory, slots: int) -> None:
        self.shm = shm
        self.slot_bytes = shm.size // slots
        self._free = list(range(slots))

    def put(self, arrays: dict[str, npt.NDArray[Any]]) -> tuple[int, list[ArrayRef]] | None:
        """Copy ``arrays`` into a free slot: the slot and the descriptors, or None
        when no slot is free or they do not fit one (send them in the frame)."""
        need = sum(a.nbytes + (-a.nbytes % _ALIGN) for a in arrays.values())
        if not self._free or need > self.slot_bytes:
            return None
        slot = self._free.pop()
        offset = slot * self.slot_bytes
        refs: list[ArrayRef] = []
        for key, a in arrays.items():
            np.ndarray(a.shape, a.dtype, buffer=self.shm.buf, offset=offset)[...] = a
            refs.append((key, a.dtype.str, tuple(a.shape), offset))
            offset += a.nbytes + (-a.nbytes % _ALIGN)
        return slot, refs

    def release(self, slot: int) -> None:
        self._free.append(slot)


def take_arrays(shm: shared_memory.SharedMemory, refs: list[ArrayRef]) -> dict[str, Any]:
    """Copies of the arrays ``refs`` describe (the slot is reused once answered)."""
    return {
        key: np.array(np.ndarray(shape, np.dtype(dtype), buffer=shm.buf, offset=offset))
        for key, dtype, shape, offset in refs
    }
