"""Weights as numpy arrays through the object store: exact round trips in every dtype, zero-copy on arrival."""

from __future__ import annotations

import warnings

import numpy as np
import torch

from r3_rllib.algorithms.r3.weight_sync import PackedWeights, named_tensors, pack_weights, unpack_weights


def _state() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    embed = torch.randn(11, 4, generator=g)
    return {
        "model.embed_tokens.weight": embed,
        "lm_head.weight": embed,  # tied, as the learner adds it for vLLM
        "model.norm.weight": torch.randn(4, generator=g).to(torch.bfloat16),
        "model.layers.0.mlp.up_proj.weight": torch.randn(6, 4, generator=g).to(torch.float16),
        "step": torch.tensor([7, -3], dtype=torch.int64),
    }


def _assert_same(got: list[tuple[str, torch.Tensor]], want: dict[str, torch.Tensor]) -> None:
    assert [n for n, _ in got] == list(want)
    for name, tensor in got:
        assert tensor.dtype == want[name].dtype and tensor.shape == want[name].shape, name
        assert torch.equal(tensor, want[name]), name  # bit for bit (bf16 travels as int16 bits)


def test_round_trip_every_dtype_without_copies():
    state = _state()
    packed = pack_weights(state)
    assert packed.dtypes == ("float32", "float32", "bfloat16", "float16", "int64")
    assert packed.arrays[2].dtype == np.int16  # numpy has no bfloat16: the bits travel as int16
    # CPU tensors are not copied by packing: ray.put makes the one copy.
    assert np.shares_memory(packed.arrays[0], state["model.embed_tokens.weight"].numpy())
    assert packed.nbytes == sum(t.numel() * t.element_size() for t in state.values())
    _assert_same(unpack_weights(packed), state)


def test_named_tensors_takes_packed_or_plain():
    state = _state()
    _assert_same(list(named_tensors(pack_weights(state))), state)
    _assert_same(list(named_tensors(state)), state)


def test_through_the_object_store_zero_copy(ray_session):
    ray = ray_session
    state = {"w": torch.arange(300_000, dtype=torch.float32).reshape(600, 500), "b": torch.ones(3).bfloat16()}
    got = ray.get(ray.put(pack_weights(state)))
    assert isinstance(got, PackedWeights)
    # Arrived as a read-only view of the object store (out-of-band buffer), not a deserialised copy.
    assert not got.arrays[0].flags.writeable
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        tensors = unpack_weights(got)
    assert not [str(w.message) for w in caught]  # torch's non-writable-array warning is expected and silenced
    _assert_same(tensors, state)
