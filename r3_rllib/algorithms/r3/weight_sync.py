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

import time
import warnings
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np
import torch

from r3_rllib.algorithms.r3.learner_calls import collective_results

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


@dataclass(frozen=True)
class LoraAdapterWeights:
    """A LoRA adapter on its way to the runners (``lora_rank > 0``): only the adapter's tensors travel, the base
    weights the runners loaded at start never change.

    ``weights`` holds the adapter tensors under peft's names without the adapter name (as
    ``peft.get_peft_model_state_dict`` returns them, e.g. ``base_model.model.model.layers.0.self_attn.q_proj.lora_A
    .weight``); ``rank``, ``alpha`` and ``target_modules`` (the module names peft resolved, e.g. ``("q_proj",
    "v_proj")``) are what an engine needs to rebuild the same adapter (a peft wrapper, a vLLM LoRA request, or a
    merge ``W + (alpha / rank) * B @ A`` into its base weights)."""

    weights: PackedWeights
    rank: int
    alpha: float
    target_modules: tuple[str, ...]

    @property
    def nbytes(self) -> int:
        return self.weights.nbytes


#: RLlib async-request tag of the weight load queued behind a runner's rollout (overlap_generation).
WEIGHTS_TAG = "r3_weights"


class PolicyWeights:
    """The driver's one record of the policy version, and the weight broadcast that sets it.

    The learners count updates (their version travels with their checkpoint); each :meth:`sync` puts learner rank
    0's state dict in the object store once, every runner loads it from there, and :attr:`version` becomes the
    version of those weights: the one the runners sample with next."""

    def __init__(self, learners, runners, board=None) -> None:
        self.learners = learners
        self.runners = runners
        self.board = board  # partial rollouts: the WeightBoard runners pull from between decoding steps
        self.version = 0
        self.loads_skipped = 0  # queued weight loads a runner refused (all its slots taken), over the run
        # (object ref, version) of the weights sent last: a runner whose rollout a crash lost samples it again with
        # the weights of the lost request (coordinator.py, runner_loss='reask'; overlap: one version back).
        self.sent: tuple | None = None

    def sync(
        self, remote_worker_ids: list[int] | None = None, block: bool = True, queued_loads: int = 1
    ) -> None:
        """Send the learners' weights to the runners (all, or ``remote_worker_ids``).

        ``block=False`` queues the load behind the rollouts a runner has been asked for (overlap_generation, or
        streaming rollouts): the driver goes on, and the runner's next call runs with the new weights.
        ``queued_loads``: how many loads may wait on one runner at once (1: the previous one is collected first, as
        overlap's long finished; streaming allows max_staleness of them, each behind its requests)."""
        weights_ref, version = self._publish()
        if block:
            load = _loader(weights_ref, version, newer_only=False)
            self.runners.foreach_env_runner(load, local_env_runner=False, remote_worker_ids=remote_worker_ids)
            return
        # A queued load of a version the runner already pulled mid-rollout is skipped (partial rollouts).
        load = _loader(weights_ref, version, newer_only=self.board is not None)
        # RLlib limits the requests in flight per runner and tag: collect the previous (long finished) load, or
        # with several allowed (streaming), the finished ones.
        self.runners.fetch_ready_async_reqs(
            tags=WEIGHTS_TAG, timeout_seconds=None if queued_loads <= 1 else 0.0
        )
        targets = remote_worker_ids or self.runners.healthy_worker_ids()
        sent = self.runners.foreach_env_runner_async(load, tag=WEIGHTS_TAG, remote_worker_ids=targets)
        # A runner with every load slot taken (one that stopped answering) gets the next version instead; the
        # samples it generates meanwhile carry their older version, and the staleness bound applies to them.
        self.loads_skipped += len(targets) - sent

    def start_sync(self, max_staleness: int) -> PendingSync:
        """The training loop's sync after an update. With ``max_staleness`` 0 (the synchronous loop) the runners
        start loading and the driver goes on: it logs the iteration meanwhile and calls :meth:`PendingSync.collect`
        before it asks for the next rollout. Otherwise (overlap, streaming) the loads queue behind the rollouts in
        flight, ``max_staleness`` of them at most per runner."""
        t0 = time.perf_counter()
        if max_staleness > 0:
            self.sync(block=False, queued_loads=max_staleness)
            return PendingSync(None, time.perf_counter() - t0)
        self.send()
        return PendingSync(self, time.perf_counter() - t0)

    def send(self) -> None:
        """A blocking :meth:`sync` in two halves, for the synchronous loop: the runners start loading the learners'
        weights and the driver goes on (it logs its iteration meanwhile); :meth:`wait_loads` waits for the loads. The
        loop asks for its next rollout after :meth:`wait_loads`, so every sample is drawn with these weights, as after
        a blocking sync."""
        weights_ref, version = self._publish()
        targets = self.runners.healthy_worker_ids()
        load = _loader(weights_ref, version, newer_only=False)
        sent = self.runners.foreach_env_runner_async(load, tag=WEIGHTS_TAG, remote_worker_ids=targets)
        if sent != len(targets):
            # A runner refused it for a request still in flight (RLlib's per-runner limit; one that timed out, say):
            # the blocking load, as before the split, for every runner.
            self.wait_loads()
            self.runners.foreach_env_runner(load, local_env_runner=False)

    def wait_loads(self) -> None:
        """Wait for the loads :meth:`send` started; a runner's error in its load is raised here (RLlib's fault
        tolerance decides, as for every runner call)."""
        self.runners.fetch_ready_async_reqs(tags=WEIGHTS_TAG, timeout_seconds=None)

    def _publish(self) -> tuple:
        """Learner rank 0's weights in the object store: (object ref, version); the version becomes ours."""
        # Gathering sharded weights is collective: a learner's failure (rank 0 out of memory) is seen at once.
        results = collective_results(self.learners, lambda learner: learner.weights_ref())
        refs = []
        for r in results:
            if not r.ok:
                raise r.get()
            if r.get()[0] is not None:
                refs.append(r.get())
        weights_ref, version = refs[0]
        self.version = version
        self.sent = (weights_ref, version)
        if self.board is not None:
            self.board.publish.remote(
                version, [weights_ref]
            )  # in a list: Ray passes the reference unresolved
        return weights_ref, version


@dataclass
class PendingSync:
    """A sync under way (:meth:`PolicyWeights.start_sync`): the loads to wait for, if any, and the driver's seconds
    in it so far."""

    weights: PolicyWeights | None
    send_s: float

    def collect(self) -> float:
        """Wait for the runners' loads (their errors are raised here); the driver's seconds in the sync, the send
        and this wait (the loads that ran while the driver did other work are not in it)."""
        if self.weights is None:
            return self.send_s  # nothing to wait for: the loads queued behind the rollouts
        t0 = time.perf_counter()
        self.weights.wait_loads()
        return self.send_s + time.perf_counter() - t0


def _loader(weights_ref, version: int, newer_only: bool):
    """The runner call that loads ``weights_ref`` as ``version`` (shipped to the runners by value)."""

    def load(r, _w=weights_ref, _v=version, _newer=newer_only):
        return r.update_weights(_w, _v, only_if_newer=_newer)

    return load
