"""A verifiers 0.4 taskset (``verifiers.v1``) of 2-digit sums, for ``examples/verifiers_sums.yaml`` (env
``verifiers``, ``taskset.id: vf_sums``): 256 sums drawn with a fixed seed, each prompt ``"12+7="``; the rubric is
one reward, 1.0 when the reply starts with the sum.

verifiers finds a taskset by its id as an importable module exporting one ``Taskset`` subclass in ``__all__``:

    PYTHONPATH=examples r3 train examples/verifiers_sums.yaml     # this module must be importable by the runners
"""

from __future__ import annotations

import random

import verifiers.v1 as vf

NUM_SUMS = 256


class SumData(vf.TaskData):
    answer: str = ""


def leading_number(text: str) -> str:
    """The digits ``text`` starts with (after spaces)."""
    digits = ""
    for ch in text.strip():
        if not ch.isdigit():
            break
        digits += ch
    return digits


class SumTask(vf.Task[SumData]):
    @vf.reward
    async def correct(self, trace) -> float:
        return 1.0 if leading_number(trace.last_reply) == self.data.answer else 0.0


class SumTaskset(vf.Taskset[SumTask]):
    def load(self):
        rng = random.Random(0)
        for _ in range(NUM_SUMS):
            a, b = rng.randint(10, 99), rng.randint(10, 99)
            yield SumTask(SumData(prompt=f"{a}+{b}=", answer=str(a + b)), self.config.task)


__all__ = ["SumTaskset"]
