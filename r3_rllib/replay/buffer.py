"""A prioritized per-query replay buffer for R^3 (pure Python + numpy; no Ray).

R^3 keeps, for every query, recent *correct* and *incorrect* responses of the policy. When a fresh group is
degenerate (all responses wrong, or all right) and so carries no gradient, a few samples of the *opposite* outcome
are replayed into it, restoring a reward contrast; wrong answers also seed self-reflection prompts. The buffer
stores both outcome classes per query, bounded per query and in total, and drops samples older than
``max_age`` policy versions.

Priority design (which samples are worth replaying), implemented by the ``"recency_length"`` entry of
:data:`PRIORITY_FNS`; the weight of a candidate is the product of:

- **recency** ``recency_decay ** lag`` with ``lag = current_version - policy_version``: a replayed sample is
  corrected by a truncated importance weight ``min(pi_now / pi_behaviour, cap)``; the smaller the lag, the closer the
  weight stays to 1 (low variance, little truncation bias). It also favours behaviour the current policy can still
  reach. Applies to both classes.
- **length**, correct samples only: ``(L_min / L_i) ** correct_length_power`` with ``L_min`` the shortest candidate
  response. Among right answers, the shorter ones reinforce concise reasoning (the length bonus R^3 rewards), cost
  fewer learner tokens, and multiply fewer per-token ratios (less IS variance). Relative to the shortest candidate,
  the factor is scale free. Wrong answers get ``incorrect_length_power`` (default 0: no length preference).
- **truncation** ``truncated_priority`` for truncated responses: a cut-off response has no final answer, so it is
  a poor wrong answer to reflect on and a poor example to contrast with.

``k`` samples are drawn without replacement with probability proportional to weight (successive sampling: the
first pick has probability ``w_i / sum(w)``, the next is drawn from the rest, and so on), via exponential races
``E_i = Exp(1) / w_i`` on a seeded ``numpy.random.Generator`` (``k`` smallest ``E_i``), which is exact and needs one
vectorised draw per call. Weight 0 means "never replay".

Bounds. Per query, each outcome class keeps at most ``max_per_query`` samples (the oldest go first). In total at most
``max_total_samples`` (the globally oldest go first, through an insertion-ordered index, O(1) per eviction).
With ``dedupe`` (default), adding a response whose tokens equal a stored one of the same query and class replaces
it (fresher version and log-probs, one copy): replaying duplicates adds no contrast.

Age. A sample with ``policy_version < current_version - max_age`` is never returned: ``sample_*`` drop
stale candidates of the query they look at, and :meth:`QueryReplayBuffer.evict_stale` drops stale samples from the
old end of the insertion order (samples arrive in roughly version order, so this is O(evicted); an out-of-order old
sample is caught by the next ``sample_*`` of its query). Once a current version is known, samples already stale on
arrival are not stored.

Query statistics (``n_seen``, ``n_correct``, mean reward) are running sums over every sample ever added, evicted
or not: they drive the choice of queries for reflection.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any, NamedTuple

import numpy as np

from r3_rllib.core.registry import Registry
from r3_rllib.types.samples import ReplaySample


def _concat(arrays: list[np.ndarray], dtype: type) -> np.ndarray:
    return np.concatenate(arrays).astype(dtype, copy=False) if arrays else np.zeros(0, dtype=dtype)


def to_columns(samples: Sequence[ReplaySample]) -> dict[str, Any]:
    """Columnar form of a list of samples: a few large arrays instead of thousands of small objects.

    Pickling (and so shipping through Ray) a list of dataclasses holding small numpy arrays costs tens of
    microseconds per sample, mostly per-array overhead; the packed form costs about a microsecond. Equal prompts
    (the G samples of a group) are stored once. Inverse: :func:`from_columns`.
    """
    by_id: dict[int, int] = {}  # id(prompt array) -> index: samples from the buffer share prompt objects
    by_bytes: dict[bytes, int] = {}
    prompts: list[np.ndarray] = []
    p_idx, qids, texts, resp, lps, masks = [], [], [], [], [], []
    rewards, correct, versions, truncated = [], [], [], []
    for s in samples:
        p = s.prompt_ids
        j = by_id.get(id(p))
        if j is None:
            key = p.tobytes()
            j = by_bytes.get(key)
            if j is None:
                j = by_bytes[key] = len(prompts)
                prompts.append(p)
            by_id[id(p)] = j
        p_idx.append(j)
        qids.append(s.query_id)
        texts.append(s.response_text)
        resp.append(s.response_ids)
        lps.append(s.behavior_logprobs)
        masks.append(np.ones(s.response_ids.size, dtype=bool) if s.loss_mask is None else s.loss_mask)
        rewards.append(s.reward)
        correct.append(s.correct)
        versions.append(s.policy_version)
        truncated.append(s.truncated)
    return {
        "query_id": qids,
        "prompt_lens": np.array([p.size for p in prompts], dtype=np.int64),
        "prompts": _concat(prompts, np.int32),
        "prompt_index": np.array(p_idx, dtype=np.int64),
        "response_lens": np.array([r.size for r in resp], dtype=np.int64),
        "response_ids": _concat(resp, np.int32),
        "behavior_logprobs": _concat(lps, np.float32),
        "reward": np.array(rewards, dtype=np.float64),
        "correct": np.array(correct, dtype=bool),
        "policy_version": np.array(versions, dtype=np.int64),
        "truncated": np.array(truncated, dtype=bool),
        "response_text": texts,
        # Only when some sample has tool tokens: the packed form of single-turn samples stays as it was.
        "loss_mask": _concat(masks, bool) if any(s.loss_mask is not None for s in samples) else None,
    }


def from_columns(packed: dict[str, Any]) -> list[ReplaySample]:
    """Inverse of :func:`to_columns`. Arrays are copied out of the packed buffers (a stored sample must not keep
    a whole batch alive); samples of one prompt share one prompt array."""
    p_off = np.concatenate([[0], np.cumsum(packed["prompt_lens"])])
    prompts = [packed["prompts"][p_off[j] : p_off[j + 1]].copy() for j in range(len(packed["prompt_lens"]))]
    r_off = np.concatenate([[0], np.cumsum(packed["response_lens"])]).tolist()
    ids, lps, masks = packed["response_ids"], packed["behavior_logprobs"], packed.get("loss_mask")
    rewards = packed["reward"].tolist()
    correct = packed["correct"].tolist()
    versions = packed["policy_version"].tolist()
    truncated = packed["truncated"].tolist()
    p_idx = packed["prompt_index"].tolist()
    out = []
    for i, qid in enumerate(packed["query_id"]):
        a, b = r_off[i], r_off[i + 1]
        out.append(
            ReplaySample(
                query_id=qid,
                prompt_ids=prompts[p_idx[i]],
                response_ids=ids[a:b].copy(),
                behavior_logprobs=lps[a:b].copy(),
                reward=rewards[i],
                correct=correct[i],
                policy_version=versions[i],
                truncated=truncated[i],
                response_text=packed["response_text"][i],
                loss_mask=None if masks is None else masks[a:b].copy(),
            )
        )
    return out


class QueryStats(NamedTuple):
    """Running statistics of one query over every sample ever added."""

    n_seen: int
    n_correct: int
    mean_reward: float  # NaN when n_seen == 0


class SampleRequest(NamedTuple):
    """One request of :meth:`QueryReplayBuffer.sample_batch`."""

    query_id: str
    want_correct: bool
    k: int
    current_version: int


@dataclass
class ReplayConfig:
    """Bounds and priority settings of :class:`QueryReplayBuffer` (see the module docstring for the design)."""

    max_per_query: int = 16  # per outcome class (correct / incorrect)
    max_total_samples: int = 200_000
    max_age: int | None = 8  # in policy versions; None: no limit
    priority: str = "recency_length"  # key of PRIORITY_FNS
    recency_decay: float = 0.8  # priority factor per policy version of lag
    correct_length_power: float = 1.0  # prefer shorter correct responses: (L_min / L) ** power
    incorrect_length_power: float = 0.0  # 0: no length preference among wrong ones
    truncated_priority: float = 0.1  # priority factor of truncated responses (0: never replay them)
    dedupe: bool = True  # an identical response of the same query and outcome replaces the stored one
    seed: int = 0  # of the numpy Generator that draws samples

    def __post_init__(self) -> None:
        if self.max_per_query < 1:
            raise ValueError(f"max_per_query must be >= 1, got {self.max_per_query}")
        if self.max_total_samples < 1:
            raise ValueError(f"max_total_samples must be >= 1, got {self.max_total_samples}")
        if self.max_age is not None and self.max_age < 0:
            raise ValueError(f"max_age must be >= 0 or None, got {self.max_age}")
        if not 0.0 < self.recency_decay <= 1.0:
            raise ValueError(f"recency_decay must be in (0, 1], got {self.recency_decay}")
        if self.correct_length_power < 0 or self.incorrect_length_power < 0:
            raise ValueError("length powers must be >= 0")
        if not 0.0 <= self.truncated_priority <= 1.0:
            raise ValueError(f"truncated_priority must be in [0, 1], got {self.truncated_priority}")
        if not PRIORITY_FNS.resolves(self.priority):
            raise ValueError(f"unknown priority {self.priority!r}; known: {sorted(PRIORITY_FNS)}")

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> ReplayConfig:
        """The config that ``values`` (``asdict`` of one: a replay state, the actor's arguments) describes; a field
        under its former name (:data:`RENAMED_REPLAY_FIELDS`, in states saved by older versions) is read as its
        current one."""
        values = dict(values)
        for old, new in RENAMED_REPLAY_FIELDS.items():
            if old in values and new not in values:
                values[new] = values.pop(old)
        return cls(**values)


#: Former :class:`ReplayConfig` field names -> current ones.
RENAMED_REPLAY_FIELDS = {"max_staleness": "max_age"}


PriorityFn = Callable[[Sequence[ReplaySample], int, bool, ReplayConfig], list[float]]

#: Name -> ``fn(candidates, current_version, want_correct, config) -> weights`` (one float >= 0 per candidate).
PRIORITY_FNS = Registry("priority")


def register_priority(name: str) -> Callable[[PriorityFn], PriorityFn]:
    """Decorator adding a priority function to :data:`PRIORITY_FNS` under ``name`` (names are unique).

    Register it in a module that the replay actor's process imports too: the actor resolves the name itself. Or
    name it by path (``replay_priority="my_pkg.replay:my_priority"``): the actor imports that module itself.
    """
    return PRIORITY_FNS.register(name)


@register_priority("uniform")
def uniform_priority(
    candidates: Sequence[ReplaySample], current_version: int, want_correct: bool, config: ReplayConfig
) -> list[float]:
    """Every candidate equally likely."""
    return [1.0] * len(candidates)


@register_priority("recency_length")
def recency_length_priority(
    candidates: Sequence[ReplaySample], current_version: int, want_correct: bool, config: ReplayConfig
) -> list[float]:
    """``decay**lag * (L_min / L)**power * (truncated_priority if truncated)``; see the module docstring."""
    decay = config.recency_decay
    power = config.correct_length_power if want_correct else config.incorrect_length_power
    trunc = config.truncated_priority
    out = []
    for s in candidates:
        lag = current_version - s.policy_version
        w = decay**lag if lag > 0 else 1.0
        out.append(w * trunc if s.truncated else w)
    if power:
        lens = [len(s.response_ids) or 1 for s in candidates]  # an empty response counts as length 1
        lmin = min(lens)
        out = [w * (lmin / n) ** power for w, n in zip(out, lens, strict=True)]
    return out


class _QueryEntry:
    """Stored samples of one query: per outcome class, response key -> (uid, sample), oldest first."""

    __slots__ = ("classes", "prompt", "prompt_key")

    def __init__(self) -> None:
        # [incorrect, correct]: response key -> (uid, sample), oldest first
        self.classes: tuple[dict[bytes | int, tuple[int, ReplaySample]], ...] = ({}, {})
        self.prompt: np.ndarray | None = None  # shared prompt array of this query's samples
        self.prompt_key = b""  # its bytes, for a cheap equality test


class QueryReplayBuffer:
    """Prioritized per-query replay of correct and incorrect responses (see the module docstring).

    Samples are stored and returned by reference, not copied: treat them as read-only once added. Not thread-safe
    (the Ray actor wrapper runs one call at a time).
    """

    def __init__(self, config: ReplayConfig | None = None, **overrides: Any) -> None:
        base = config if config is not None else ReplayConfig()
        self.config = ReplayConfig(**{**asdict(base), **overrides}) if overrides else base
        self._priority_fn = PRIORITY_FNS.get_fn(self.config.priority)
        self._rng = np.random.default_rng(self.config.seed)
        self._queries: dict[str, _QueryEntry] = {}
        # uid -> (query_id, class index, response key); insertion order = age (oldest first).
        self._order: OrderedDict[int, tuple[str, int, bytes | int]] = OrderedDict()
        self._next_uid = 0
        self._nbytes = 0
        self._current_version: int | None = None  # highest version seen in sample_*/evict_stale
        # query_id -> [n_seen, n_correct, reward_sum] over every sample ever added.
        self._stats: dict[str, list] = {}
        self._counters = {
            "added": 0,
            "deduplicated": 0,
            "sample_calls": 0,
            "hits": 0,
            "misses": 0,
            "reflection_hits": 0,
            "reflection_misses": 0,
            "evicted_per_query": 0,
            "evicted_total": 0,
            "evicted_stale": 0,
        }

    # -- insertion --------------------------------------------------------------------------------------------------
    def add(self, samples: Iterable[ReplaySample]) -> int:
        """Store samples and count them in the query statistics.

        Returns how many were accepted (all but those already stale on arrival); the bounds may then evict older
        samples, so ``len`` can grow by less.
        """
        cfg = self.config
        max_pq = cfg.max_per_query
        min_version = self._min_version()
        stored = 0
        for s in samples:
            qid = s.query_id
            st = self._stats.get(qid)
            if st is None:
                st = self._stats[qid] = [0, 0, 0.0]
            st[0] += 1
            st[1] += bool(s.correct)
            st[2] += float(s.reward)
            self._counters["added"] += 1
            if min_version is not None and s.policy_version < min_version:
                self._counters["evicted_stale"] += 1
                continue
            entry = self._queries.get(qid)
            if entry is None:
                entry = self._queries[qid] = _QueryEntry()
            # Share one prompt array per query (the G samples of a group carry equal prompts).
            prompt = s.prompt_ids
            if entry.prompt is None:
                entry.prompt = prompt
                entry.prompt_key = prompt.tobytes()
                self._nbytes += prompt.nbytes
            elif prompt is not entry.prompt and prompt.tobytes() == entry.prompt_key:
                s.prompt_ids = entry.prompt
            cls_idx = 1 if s.correct else 0
            bucket = entry.classes[cls_idx]
            uid = self._next_uid
            self._next_uid += 1
            key: bytes | int = s.response_ids.tobytes() if cfg.dedupe else uid
            old = bucket.pop(key, None)
            if old is not None:
                del self._order[old[0]]
                self._nbytes -= self._sample_bytes(old[1], entry)
                self._counters["deduplicated"] += 1
            bucket[key] = (uid, s)
            self._order[uid] = (qid, cls_idx, key)
            self._nbytes += self._sample_bytes(s, entry)
            stored += 1
            if len(bucket) > max_pq:
                old_key = next(iter(bucket))
                self._remove(qid, cls_idx, old_key)
                self._counters["evicted_per_query"] += 1
        while len(self._order) > cfg.max_total_samples:
            _, (qid, cls_idx, key) = self._order.popitem(last=False)
            self._remove(qid, cls_idx, key, in_order=False)
            self._counters["evicted_total"] += 1
        return stored

    @staticmethod
    def _sample_bytes(s: ReplaySample, entry: _QueryEntry) -> int:
        n = s.nbytes()
        return n - s.prompt_ids.nbytes if s.prompt_ids is entry.prompt else n

    def _remove(self, qid: str, cls_idx: int, key: bytes | int, *, in_order: bool = True) -> None:
        entry = self._queries[qid]
        uid, s = entry.classes[cls_idx].pop(key)
        if in_order:
            del self._order[uid]
        self._nbytes -= self._sample_bytes(s, entry)
        if not entry.classes[0] and not entry.classes[1]:
            if entry.prompt is not None:
                self._nbytes -= entry.prompt.nbytes
            del self._queries[qid]

    # -- age --------------------------------------------------------------------------------------------------------
    def _min_version(self) -> int | None:
        if self.config.max_age is None or self._current_version is None:
            return None
        return self._current_version - self.config.max_age

    def _see_version(self, current_version: int) -> int | None:
        if self._current_version is None or current_version > self._current_version:
            self._current_version = int(current_version)
        if self.config.max_age is None:
            return None
        return current_version - self.config.max_age

    def evict_stale(self, current_version: int) -> int:
        """Drop samples older than ``max_age`` versions from the old end of the buffer; returns how many."""
        min_version = self._see_version(current_version)
        if min_version is None:
            return 0
        n = 0
        while self._order:
            uid, (qid, cls_idx, key) = next(iter(self._order.items()))
            if self._queries[qid].classes[cls_idx][key][1].policy_version >= min_version:
                break
            self._remove(qid, cls_idx, key)
            n += 1
        self._counters["evicted_stale"] += n
        return n

    # -- sampling ---------------------------------------------------------------------------------------------------
    def _candidates(self, query_id: str, cls_idx: int, current_version: int) -> list[ReplaySample]:
        min_version = self._see_version(current_version)
        entry = self._queries.get(query_id)
        if entry is None:
            return []
        bucket = entry.classes[cls_idx]
        if min_version is not None:
            stale = [key for key, (_, s) in bucket.items() if s.policy_version < min_version]
            for key in stale:
                self._remove(query_id, cls_idx, key)
            self._counters["evicted_stale"] += len(stale)
            if stale and query_id not in self._queries:
                return []
        return [s for _, s in bucket.values()]

    def _draw(
        self, cands: list[ReplaySample], k: int, current_version: int, want_correct: bool
    ) -> list[ReplaySample]:
        if k <= 0 or not cands:
            return []
        w = self._priority_fn(cands, current_version, want_correct, self.config)
        # Exponential races: the k smallest Exp(1)/w_i are a weighted sample without replacement. Candidates are few
        # (<= max_per_query), so plain Python beats numpy's per-call overhead here; one vectorised RNG draw.
        e = self._rng.standard_exponential(len(cands)).tolist()
        races = sorted((e[i] / wi, i) for i, wi in enumerate(w) if wi > 0)
        return [cands[i] for _, i in races[:k]]

    def sample_opposite(
        self, query_id: str, *, want_correct: bool, k: int, current_version: int
    ) -> list[ReplaySample]:
        """Up to ``k`` distinct stored samples of ``query_id`` with ``correct == want_correct``, drawn by priority.

        Returns fewer when fewer are available. Counts ``hits`` (samples returned) and ``misses`` (requested but not
        available).
        """
        if k < 0:
            raise ValueError(f"k must be >= 0, got {k}")
        cands = self._candidates(query_id, 1 if want_correct else 0, current_version)
        out = self._draw(cands, k, current_version, want_correct)
        self._counters["sample_calls"] += 1
        self._counters["hits"] += len(out)
        self._counters["misses"] += k - len(out)
        return out

    def sample_batch(self, requests: Iterable[SampleRequest | tuple]) -> list[list[ReplaySample]]:
        """:meth:`sample_opposite` for each ``(query_id, want_correct, k, current_version)`` request, in order."""
        out = []
        for r in requests:
            qid, want_correct, k, current_version = r
            out.append(
                self.sample_opposite(qid, want_correct=want_correct, k=k, current_version=current_version)
            )
        return out

    def sample_wrong_answer(self, query_id: str, current_version: int) -> ReplaySample | None:
        """One stored incorrect sample of ``query_id`` for a reflection prompt (by the incorrect-class priority)."""
        out = self._draw(self._candidates(query_id, 0, current_version), 1, current_version, False)
        self._counters["reflection_hits" if out else "reflection_misses"] += 1
        return out[0] if out else None

    def sample_wrong_answers(
        self, query_ids: Iterable[str], current_version: int
    ) -> list[ReplaySample | None]:
        """:meth:`sample_wrong_answer` for each query, in order."""
        return [self.sample_wrong_answer(q, current_version) for q in query_ids]

    # -- statistics -------------------------------------------------------------------------------------------------
    def query_stats(self, query_ids: Iterable[str]) -> dict[str, QueryStats]:
        """Statistics over all samples ever added; unknown queries get ``QueryStats(0, 0, nan)``."""
        out = {}
        for q in query_ids:
            st = self._stats.get(q)
            out[q] = QueryStats(0, 0, math.nan) if st is None else QueryStats(st[0], st[1], st[2] / st[0])
        return out

    def mean_past_rewards(self, query_ids: Iterable[str] | None = None) -> dict[str, float]:
        """``query_id -> mean reward`` over all samples ever added, for queries with history only (all if None)."""
        ids = self._stats.keys() if query_ids is None else query_ids
        return {q: st[2] / st[0] for q in ids if (st := self._stats.get(q)) is not None}

    def num_stored(self, query_id: str) -> tuple[int, int]:
        """``(n_incorrect, n_correct)`` currently stored for ``query_id`` (stale ones included until dropped)."""
        entry = self._queries.get(query_id)
        return (0, 0) if entry is None else (len(entry.classes[0]), len(entry.classes[1]))

    def __len__(self) -> int:
        return len(self._order)

    def nbytes(self) -> int:
        """Approximate memory of the stored samples (arrays, text, per-sample overhead; shared prompts once)."""
        return self._nbytes

    def metrics(self) -> dict[str, float]:
        """Size, memory and lifetime counters (hits/misses of ``sample_*``, evictions by cause)."""
        c = self._counters
        return {
            "size": len(self._order),
            "num_queries": len(self._queries),
            "bytes": self._nbytes,
            **c,
            "evictions": c["evicted_per_query"] + c["evicted_total"] + c["evicted_stale"],
        }

    # -- state ------------------------------------------------------------------------------------------------------
    def get_state(self) -> dict[str, Any]:
        """Plain picklable dict of everything: samples oldest first (:func:`to_columns` form), query stats,
        counters, RNG state."""
        samples = [self._queries[qid].classes[c][key][1] for qid, c, key in self._order.values()]
        return {
            "version": 1,
            "config": asdict(self.config),
            "samples": to_columns(samples),  # columnar: fast to pickle and to ship through Ray
            "stats": {q: list(v) for q, v in self._stats.items()},
            "counters": dict(self._counters),
            "rng_state": self._rng.bit_generator.state,
            "current_version": self._current_version,
            "next_uid": self._next_uid,
        }

    def set_state(self, state: dict[str, Any]) -> None:
        """Restore from :meth:`get_state` (the config in the state replaces the current one)."""
        if state.get("version") != 1:
            raise ValueError(f"unsupported replay buffer state version {state.get('version')!r}")
        self.__init__(ReplayConfig.from_dict(state["config"]))
        # Re-adding with no current version stores everything, in the original (age) order.
        self.add(from_columns(state["samples"]))
        self._stats = {q: list(v) for q, v in state["stats"].items()}
        self._counters = dict(state["counters"])
        self._rng.bit_generator.state = state["rng_state"]
        self._current_version = state["current_version"]
        self._next_uid = max(self._next_uid, int(state["next_uid"]))
