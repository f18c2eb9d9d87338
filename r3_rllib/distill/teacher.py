"""The on-policy distillation teacher: a rollout stage (``TeacherStage``, name ``distill``) that has the teacher
model score every response token the policy sampled, served by Ray actors of its own (``TeacherScorer``).

What a token gets: the teacher's log-prob of the sampled token given the prompt and the response tokens before it,
under the teacher's logits divided by the rollout temperature ``T`` (``softmax(logits / T)``, as the engines sample
and the learner scores the policy): the learner's term then compares the two tempered distributions, the reverse
``KL(pi_student^T || pi_teacher^T)`` (:mod:`r3_rllib.core.distill`). One forward per micro-batch of
``micro_batch_size`` rows, no gradient; fp32 on CPU, bf16 autocast on CUDA (``distill_num_gpus_per_worker`` > 0). A
tool token (``loss_mask`` False) gets none (NaN): the policy did not sample it.

The teacher must share the policy's vocabulary: its tokenizer's ``get_vocab()`` must equal the policy's (same token
ids); another is refused when the stage is built (before any training) with :class:`TeacherVocabularyError`, naming
both models and the first token id that differs.

Failures: a rollout's samples are split among the ``distill_workers`` actors; a part whose actor raised, or that
has not answered ``distill_timeout_s`` after the rollout was submitted, leaves its samples without teacher log-probs
(they get no distillation term; the stage counts them in ``unscored_samples``, ``errors`` and ``timeouts``), and the
run goes on. A late or dead actor is replaced by a new one before the next rollout.

With R^2PO's rollout head the teacher scores only the rollouts of stage B iterations: stage A trains the head alone,
with no distillation term (``r3_rllib.algorithms.r3.learner_distill``), so its rollouts are not sent (logged as
``distill/skipped``).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import ray
import torch

from r3_rllib.actor_start import remote_outside_trial, wait_until_started
from r3_rllib.core.logprobs import token_logprobs
from r3_rllib.core.method import TrainingPhase
from r3_rllib.models.hub import policy_path
from r3_rllib.models.tiny import load_tokenizer
from r3_rllib.types.samples import Group, Sample

#: One row to score: prompt ids, response ids, and the response's loss mask (None: every token sampled).
Row = tuple[Sequence[int], Sequence[int], Sequence[bool] | None]


class TeacherVocabularyError(ValueError):
    """The teacher's tokenizer does not have the policy's vocabulary (see the module docstring)."""


def first_vocabulary_difference(student: dict[str, int], teacher: dict[str, int]) -> str | None:
    """Where two ``get_vocab()`` maps differ, in words (the lowest token id whose token differs, or a size
    difference); None when they are equal."""
    if student == teacher:
        return None
    by_id_s = {i: t for t, i in student.items()}
    by_id_t = {i: t for t, i in teacher.items()}
    for i in sorted(set(by_id_s) | set(by_id_t)):
        if by_id_s.get(i) != by_id_t.get(i):
            return f"token id {i} is {by_id_s.get(i)!r} for the policy and {by_id_t.get(i)!r} for the teacher"
    return f"the vocabularies differ ({len(student)} tokens for the policy, {len(teacher)} for the teacher)"


def check_teacher_vocabulary(student_path: str, teacher_path: str) -> None:
    """Refuse a teacher whose tokenizer's vocabulary is not the policy's (:class:`TeacherVocabularyError`)."""
    difference = first_vocabulary_difference(
        load_tokenizer(student_path).get_vocab(), load_tokenizer(teacher_path).get_vocab()
    )
    if difference is not None:
        raise TeacherVocabularyError(
            f"distill_teacher {teacher_path!r} has another vocabulary than the policy {student_path!r}: {difference}. "
            "On-policy distillation scores the policy's own token ids with the teacher, so both must share one "
            "tokenizer vocabulary"
        )


def pad_rows(rows: Sequence[Row], pad_id: int) -> dict[str, torch.Tensor]:
    """Rows right-padded for one forward: ``input_ids`` / ``attention_mask`` ``[B, W]`` and ``response_mask``
    ``[B, W - 1]`` (position t scores token t + 1; set on the response tokens the policy sampled)."""
    width = max(len(p) + len(r) for p, r, _ in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    attention = torch.zeros((len(rows), width), dtype=torch.long)
    scored = torch.zeros((len(rows), width - 1), dtype=torch.bool)
    for b, (prompt, response, mask) in enumerate(rows):
        n_p, n_r = len(prompt), len(response)
        ids[b, : n_p + n_r] = torch.tensor([*prompt, *response], dtype=torch.long)
        attention[b, : n_p + n_r] = 1
        sampled = (
            torch.ones(n_r, dtype=torch.bool) if mask is None else torch.tensor(list(mask), dtype=torch.bool)
        )
        scored[b, n_p - 1 : n_p - 1 + n_r] = sampled
    return {"input_ids": ids, "attention_mask": attention, "response_mask": scored}


class TeacherScorer:
    """The teacher model, loaded once (see the module docstring); a Ray actor in a run (``TeacherStage``), a plain
    object in tests."""

    def __init__(self, path: str, *, temperature: float, micro_batch_size: int, threads: int = 1) -> None:
        from transformers import AutoModelForCausalLM

        self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        if self.device.type == "cpu":
            torch.set_num_threads(max(1, int(threads)))
        from r3_rllib.models.progress_bars import no_progress_bars

        with no_progress_bars():
            self.model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).to(self.device)
        self.model.eval().requires_grad_(False)
        self.temperature = float(temperature) if temperature > 0 else 1.0
        self.micro_batch_size = max(1, int(micro_batch_size))
        self.pad_id = int(getattr(self.model.config, "pad_token_id", None) or 0)

    def ready(self) -> bool:
        """True once the teacher is loaded (the stage waits for it before training)."""
        return True

    @torch.no_grad()
    def score(self, rows: Sequence[Row]) -> list[np.ndarray]:
        """Per row, the teacher's log-prob of each response token (float32; NaN on a token the policy did not
        sample), one forward per ``micro_batch_size`` rows."""
        out: list[np.ndarray] = []
        for start in range(0, len(rows), self.micro_batch_size):
            chunk = rows[start : start + self.micro_batch_size]
            packed = {k: v.to(self.device) for k, v in pad_rows(chunk, self.pad_id).items()}
            with torch.autocast("cuda", dtype=torch.bfloat16, enabled=self.device.type == "cuda"):
                logp = token_logprobs(
                    self.model,
                    packed["input_ids"],
                    packed["attention_mask"],
                    response_mask=packed["response_mask"],
                    temperature=self.temperature,
                )[0]
            logp = logp.float().cpu().numpy()
            for b, (prompt, response, mask) in enumerate(chunk):
                values = logp[b, len(prompt) - 1 : len(prompt) - 1 + len(response)].astype(np.float32)
                if mask is not None:
                    values = np.where(np.asarray(mask, dtype=bool), values, np.nan).astype(np.float32)
                out.append(values)
        return out


@dataclass
class _Pending:
    """What :meth:`TeacherStage.submit` sent: per actor part, the samples' (group, sample) positions and the ref."""

    parts: list[tuple[list[tuple[int, int]], Any, int]]  # (positions, ObjectRef, actor index)
    deadline: float
    started: float


class TeacherStage:
    """The distillation teacher as a rollout stage (see the module docstring and
    :mod:`r3_rllib.algorithms.r3.rollout_stages`)."""

    name = "distill"

    def __init__(
        self, scorer_args: dict[str, Any], *, workers: int, options: dict[str, Any], timeout_s: float
    ):
        self._args = scorer_args
        self._actor_class = remote_outside_trial(TeacherScorer, **options)
        self._timeout_s = float(timeout_s)
        self._actors = [self._start_actor() for _ in range(int(workers))]
        # Loaded before training: a teacher that cannot be loaded, or actors Ray cannot place, stop the run here
        # with what they wait for, rather than leaving every rollout unscored after distill_timeout_s.
        wait_until_started(
            [a.ready.remote() for a in self._actors],
            what="distillation teacher worker(s)",
            asks=(
                f"{options['num_cpus']} CPU / {options['num_gpus']} GPU "
                "(distill_num_cpus_per_worker / distill_num_gpus_per_worker)"
            ),
        )

    @classmethod
    def from_config(cls, config: Any) -> TeacherStage:
        """The stage ``config`` asks for (``distill_*`` fields), after the vocabulary check (which raises)."""
        teacher = policy_path(config.distill_teacher)
        student = policy_path(getattr(config, "tokenizer_path", None) or config.model_path)
        check_teacher_vocabulary(student, teacher)
        cpus = float(config.distill_num_cpus_per_worker)
        args = {
            "path": teacher,
            "temperature": float(config.temperature),
            "micro_batch_size": int(config.micro_batch_size),
            "threads": max(1, int(cpus)),
        }
        options = {"num_cpus": cpus, "num_gpus": float(config.distill_num_gpus_per_worker)}
        return cls(args, workers=config.distill_workers, options=options, timeout_s=config.distill_timeout_s)

    def _start_actor(self) -> Any:
        return self._actor_class.remote(**self._args)

    def needed_in(self, phase: TrainingPhase | None) -> bool:
        """Not in a phase that distils nothing (R^2PO's stage A: ``TrainingPhase.distills``), where the teacher's
        log-probs would be computed for no term."""
        return phase is None or phase.distills

    def submit(self, groups: Sequence[Group]) -> _Pending:
        """Send the groups' samples to the actors (contiguous shares, one call each) without waiting."""
        positions = [(g, s) for g, group in enumerate(groups) for s in range(len(group.samples))]
        shares = np.array_split(np.arange(len(positions)), len(self._actors))
        parts = []
        for a, share in enumerate(shares):
            if not len(share):
                continue
            mine = [positions[i] for i in share]
            rows = [_row(groups[g].samples[s]) for g, s in mine]
            parts.append((mine, self._actors[a].score.remote(rows), a))
        now = time.monotonic()
        return _Pending(parts=parts, deadline=now + self._timeout_s, started=now)

    def resolve(self, pending: _Pending, groups: Sequence[Group]) -> tuple[list[Group], dict[str, float]]:
        """Wait (until the deadline) for the actors' answers and attach them as ``Sample.teacher_logprobs``."""
        t0 = time.monotonic()
        refs = [ref for _, ref, _ in pending.parts]
        ready, _ = ray.wait(
            refs, num_returns=len(refs), timeout=max(0.0, pending.deadline - time.monotonic())
        )
        ready_ids = {r.hex() for r in ready}
        found: dict[tuple[int, int], np.ndarray] = {}
        counts = {"errors": 0.0, "timeouts": 0.0}
        for mine, ref, actor in pending.parts:
            values = self._answer(ref, ref.hex() in ready_ids, actor, counts)
            if values is not None:
                found.update(zip(mine, values, strict=True))
        out = [_with_teacher(group, g, found) for g, group in enumerate(groups)]
        metrics = _metrics(out, counts)
        metrics["wait_s"] = time.monotonic() - t0
        metrics["teacher_s"] = time.monotonic() - pending.started
        return out, metrics

    def _answer(self, ref: Any, ready: bool, actor: int, counts: dict[str, float]) -> list[np.ndarray] | None:
        """One part's answer, or None (counted) when its actor raised or is late: the actor is then replaced (the
        kill ends a late call too)."""
        if ready:
            try:
                return ray.get(ref)
            except Exception:  # an actor error of any kind leaves this part unscored, never the run dead
                counts["errors"] += 1
        else:
            counts["timeouts"] += 1
        ray.kill(self._actors[actor], no_restart=True)
        self._actors[actor] = self._start_actor()
        return None

    def stop(self) -> None:
        """Release the actors."""
        for actor in self._actors:
            ray.kill(actor, no_restart=True)
        self._actors = []


def _row(sample: Sample) -> Row:
    mask = None if sample.loss_mask is None else [bool(x) for x in sample.loss_mask]
    return (list(sample.prompt_ids), list(sample.response_ids), mask)


def _with_teacher(group: Group, g: int, found: dict[tuple[int, int], np.ndarray]) -> Group:
    """``group`` with its samples' teacher log-probs attached (the samples without an answer as they were)."""
    samples = [
        dataclasses.replace(s, teacher_logprobs=found[(g, i)]) if (g, i) in found else s
        for i, s in enumerate(group.samples)
    ]
    return dataclasses.replace(group, samples=samples)


def _metrics(groups: Sequence[Group], counts: dict[str, float]) -> dict[str, float]:
    """The stage's metrics: samples scored and not, failed parts, and the reverse KL estimate (mean over the scored
    sampled tokens of the sampler's log-prob minus the teacher's; 0 when none was scored: see ``scored_tokens``)."""
    samples = [s for g in groups for s in g.samples]
    scored = [s for s in samples if s.teacher_logprobs is not None]
    diffs = [
        np.asarray(s.behavior_logprobs, np.float64)[: len(s.response_ids)] - s.teacher_logprobs
        for s in scored
    ]
    flat = np.concatenate(diffs) if diffs else np.zeros(0)
    flat = flat[np.isfinite(flat)]
    return {
        "scored_samples": float(len(scored)),
        "unscored_samples": float(len(samples) - len(scored)),
        "scored_tokens": float(flat.size),
        "reverse_kl": float(flat.mean()) if flat.size else 0.0,
        **counts,
    }
