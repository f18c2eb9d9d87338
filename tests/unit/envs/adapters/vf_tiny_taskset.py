"""A verifiers taskset for the adapter tests: three one-line prompts and a rubric of two rewards (a 0.5 for any
reply, and 1.0 when the reply holds the task's letter), loadable as ``taskset.id = "vf_tiny_taskset"``."""

from __future__ import annotations

import verifiers.v1 as vf


class LetterData(vf.TaskData):
    letter: str = "a"


class LetterTask(vf.Task[LetterData]):
    @vf.reward(weight=0.5)
    async def replied(self, trace) -> float:
        return 1.0 if trace.assistant_messages else 0.0

    @vf.reward
    async def has_letter(self, trace) -> float:
        return 1.0 if self.data.letter in trace.last_reply else 0.0


class LetterTaskset(vf.Taskset[LetterTask]):
    def load(self):
        for letter in "abc":
            yield LetterTask(LetterData(prompt=f"say {letter}", letter=letter), self.config.task)


__all__ = ["LetterTaskset"]
