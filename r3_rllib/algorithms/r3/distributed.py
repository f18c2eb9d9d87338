"""Collectives of the learner ranks (torch.distributed over gloo or NCCL): FSDP2 sharding of the policy, gradient
averaging and the initial broadcast of replicated learners, and metric reductions."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import torch
import torch.distributed as dist

#: Gradient elements per all-reduce of replicated learners (100 MB of fp32): large enough for few collectives,
#: small enough that the flat fp32 copy adds little to the learner's peak memory.
GRAD_BUCKET_NUMEL = 25_000_000


def _buckets(tensors: Sequence[torch.Tensor], max_numel: int) -> list[list[torch.Tensor]]:
    """Consecutive groups of `tensors` of at most `max_numel` elements each (a larger tensor forms its own)."""
    out: list[list[torch.Tensor]] = []
    size = 0
    for t in tensors:
        if not out or size + t.numel() > max_numel:
            out.append([])
            size = 0
        out[-1].append(t)
        size += t.numel()
    return out


def average_gradients(params, world: int, *, bucket_numel: int = GRAD_BUCKET_NUMEL) -> None:
    """Replace each parameter's gradient by its mean over the `world` ranks of the default process group (gloo
    or NCCL), in place. Collective: every rank must call it with gradients on the same parameters.

    Gradients travel flattened in fp32 buckets (one all-reduce per `bucket_numel` elements, as FSDP2 reduces in
    fp32 here), then are written back in their own dtype. Parameters without a gradient (frozen ones) are skipped;
    a rank whose set of gradients differs from the others' raises instead of mixing unrelated tensors.
    """
    grads = [p.grad for p in params if p.grad is not None]
    local = torch.tensor(
        [len(grads), sum(g.numel() for g in grads)], dtype=torch.int64, device=_device_of(grads)
    )
    bounds = torch.cat([local, -local])
    dist.all_reduce(bounds, op=dist.ReduceOp.MAX)  # max and -min of the count and size in one call
    if not torch.equal(bounds[:2], -bounds[2:]):
        raise RuntimeError(
            f"replicated learners hold gradients on different parameters (this rank: {len(grads)} tensors, "
            f"{int(local[1])} elements; max over ranks {bounds[:2].tolist()}, min {(-bounds[2:]).tolist()})"
        )
    with torch.no_grad():
        for bucket in _buckets(grads, bucket_numel):
            flat = torch.cat([g.reshape(-1).float() for g in bucket])
            dist.all_reduce(flat)
            flat /= world
            offset = 0
            for g in bucket:
                g.copy_(flat[offset : offset + g.numel()].view_as(g))
                offset += g.numel()


def broadcast_module(module: torch.nn.Module, src: int = 0) -> None:
    """Copy rank `src`'s parameters and buffers into every rank's `module` (same architecture). Collective."""
    with torch.no_grad():
        for t in [*module.parameters(), *module.buffers()]:
            dist.broadcast(t.data, src=src)


def _device_of(tensors: Sequence[torch.Tensor]) -> torch.device:
    # NCCL needs the count on the GPU; with no gradient at all on a rank, the process group's own device decides.
    if tensors:
        return tensors[0].device
    return (
        torch.device("cuda", torch.cuda.current_device())
        if dist.get_backend() == "nccl"
        else torch.device("cpu")
    )


def local_tensor(t: torch.Tensor) -> torch.Tensor:
    """This rank's part of `t` (a DTensor's local shard, else `t`)."""
    return t.to_local() if hasattr(t, "to_local") else t


def decoder_layers(model) -> list[torch.nn.Module]:
    """The decoder layers of a transformers causal LM (the units FSDP2 shards one by one), also through a peft
    wrapper (``base_model.model``; a LoRA policy's adapter layers sit inside the decoder layers, sharded with
    them)."""
    if hasattr(model, "get_base_model"):  # a PeftModel
        model = model.get_base_model()
    for attr in ("model.layers", "transformer.h", "gpt_neox.layers"):
        obj = model
        try:
            for part in attr.split("."):
                obj = getattr(obj, part)
        except AttributeError:
            continue
        return list(obj)
    raise ValueError(f"Cannot find the decoder layers of {type(model).__name__} for FSDP sharding")


def shard_policy(policy: torch.nn.Module, device, world: int, param_dtype: torch.dtype) -> None:
    """FSDP2: `fully_shard` each decoder layer, then the root, over one mesh of the `world` ranks; parameters
    gathered in `param_dtype`, gradients reduced in fp32. Collective."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mesh = init_device_mesh(torch.device(device).type, (world,))
    mp = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32)
    for layer in decoder_layers(policy):
        fully_shard(layer, mesh=mesh, mp_policy=mp)
    fully_shard(policy, mesh=mesh, mp_policy=mp)


def autocast_policy(policy: torch.nn.Module, device, compute_dtype: torch.dtype) -> None:
    """Mixed precision without sharding (one learner, or replicated ones): the parameters, their gradients and the
    AdamW state stay fp32 (the master copy) and every forward of `policy` runs under autocast in `compute_dtype`.

    Why not cast the parameters to bf16: bf16 keeps 8 significant bits, so an update smaller than half an ulp of its
    weight is rounded away (for a weight of 0.02 anything below ~6e-5), and an AdamW step moves a weight by about
    the learning rate: at lr 1e-6 no weight would ever change. FSDP2's `MixedPrecisionPolicy` (`shard_policy`)
    keeps fp32 shards for the same reason. Autocast also covers activation-checkpointing recomputes (the checkpoint
    restores the autocast state of its forward)."""
    if compute_dtype == torch.float32:
        return
    autocast = torch.autocast(device_type=torch.device(device).type, dtype=compute_dtype)
    policy.forward = autocast(policy.forward)


def all_reduce_dict(values: dict[str, float], world: int, device, op=dist.ReduceOp.SUM) -> dict[str, float]:
    """`values` reduced over the ranks with `op` (fp64, one collective); `values` itself with one rank."""
    if world == 1:
        return values
    keys = sorted(values)
    t = torch.tensor([values[k] for k in keys], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=op)
    return dict(zip(keys, t.tolist(), strict=True))


def global_sum(parts: Iterable[torch.Tensor], sharded: bool) -> float:
    """The sum of this rank's fp64 scalar `parts`, summed over ranks when the tensors are `sharded` (collective
    then); replicated tensors are whole on every rank already."""
    total = torch.zeros((), dtype=torch.float64)
    for part in parts:
        total += part
    if sharded:
        dist.all_reduce(total)
    return float(total)


def accumulate_metrics(acc: dict[str, torch.Tensor | float], metrics: dict[str, Any], weight: float) -> None:
    """Add `metrics` times `weight` to `acc` in fp64; tensors stay on their device (read once per step, by
    `metrics_as_floats`, instead of one host sync per metric and pass)."""
    for k, v in metrics.items():
        term = v.detach().double() * weight if isinstance(v, torch.Tensor) else float(v) * weight
        acc[k] = acc[k] + term if k in acc else term


def metrics_as_floats(acc: dict[str, torch.Tensor | float]) -> dict[str, float]:
    """`acc`'s values as Python floats, its tensors read in one transfer."""
    tensors = [k for k, v in acc.items() if isinstance(v, torch.Tensor)]
    read: dict[str, float] = {}
    if tensors:
        device = acc[tensors[0]].device
        values = torch.stack([acc[k].to(device) for k in tensors]).tolist()
        read = dict(zip(tensors, values, strict=True))
    return {k: read[k] if k in read else float(v) for k, v in acc.items()}
