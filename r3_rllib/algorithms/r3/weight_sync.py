"""Policy weights on their way from the learner to the EnvRunners' engines, as numpy arrays in Ray's object store.

Ray serialises numpy arrays out of band (pickle protocol 5): `ray.put` is one copy into shared memory and `ray.get`
on the same node maps that memory without copying. A dict of torch tensors takes the generic pickle path instead:
every storage is written into a byte stream on `put` and read back into new memory on `get`. For a 19M-parameter
state dict, from the learner's parameters to a loaded HF engine in another process, the tensor path measured 0.32 s
and the array path 0.04 s (`python bench/bench_weight_sync.py`, BENCHMARKS.md section 4).

numpy has no bfloat16 (nor float8): such tensors travel as integers of the same width and are viewed back as their
dtype on arrival, bit for bit. Arrays arriving through `ray.get` are read-only views of the object store: the
tensors made from them must only be read (engines copy them into their own parameters).
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np
import torch

# Same-width integer carriers for dtypes numpy cannot represent.
_CARRIERS: dict[int, torch.dtype] = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


@dataclass(frozen=True)
class PackedWeights:
    """A state dict as parallel tuples: names, numpy arrays, and each tensor's torch dtype name."""

    names: tuple[str, ...]
    arrays: tuple[np.ndarray, ...]
    dtypes: tuple[str, ...]

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.arrays)


def _to_array(tensor: torch.Tensor) -> np.ndarray:
    t = tensor.detach().to("cpu").contiguous()
    try:
        return t.numpy()
    except TypeError:  # bfloat16, float8, ...: ship the bits
        return t.view(_CARRIERS[t.element_size()]).numpy()


def pack_weights(state_dict: Mapping[str, torch.Tensor]) -> PackedWeights:
    """Arrays sharing memory with CPU tensors (no copy: `ray.put` makes the one copy); device tensors are copied
    to CPU first."""
    names = tuple(state_dict)
    return PackedWeights(
        names=names,
        arrays=tuple(_to_array(state_dict[n]) for n in names),
        dtypes=tuple(str(state_dict[n].dtype).removeprefix("torch.") for n in names),
    )


def unpack_weights(packed: PackedWeights) -> list[tuple[str, torch.Tensor]]:
    """(name, tensor) pairs viewing the arrays' memory, in their original dtypes. Read the tensors, never write
    them: after `ray.get` the memory is the object store's and read-only."""
    out = []
    with warnings.catch_warnings():
        # torch warns that it cannot mark a tensor read-only; the engines only copy from these tensors.
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        for name, array, dtype_name in zip(packed.names, packed.arrays, packed.dtypes, strict=True):
            dtype = getattr(torch, dtype_name)
            tensor = torch.from_numpy(array)
            out.append((name, tensor if tensor.dtype == dtype else tensor.view(dtype)))
    return out


def named_tensors(weights: PackedWeights | Mapping[str, torch.Tensor]) -> Iterable[tuple[str, torch.Tensor]]:
    """What an engine's `update_weights` takes, from packed weights or a plain state dict."""
    if isinstance(weights, PackedWeights):
        return unpack_weights(weights)
    return weights.items()
