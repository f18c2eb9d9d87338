"""A two-turn verifiers env for the adapter tests (``taskset.id = "vf_tiny_multiturn"``): the task asks for a
letter, the env answers the reply with a second user turn asking for the next letter (``Interaction.turn``), and
the rubric scores both replies: 0.5 when both turns were answered, 1.0 per reply holding its letter."""

from __future__ import annotations

import verifiers.v1 as vf


def next_letter(letter: str) -> str:
    return chr(ord(letter) + 1)


class LetterData(vf.TaskData):
    letter: str = "a"


class TwoLetterTask(vf.Task[LetterData]):
    @vf.reward(weight=0.5)
    async def answered_both(self, trace) -> float:
        return 1.0 if len(trace.assistant_messages) == 2 else 0.0

    @vf.reward
    async def letters(self, trace) -> float:
        wanted = (self.data.letter, next_letter(self.data.letter))
        replies = [m.content or "" for m in trace.assistant_messages]
        return float(sum(w in r for w, r in zip(wanted, replies, strict=False)))


class TwoLetterTaskset(vf.Taskset[TwoLetterTask]):
    def load(self):
        for letter in "ax":
            yield TwoLetterTask(LetterData(prompt=f"say {letter}", letter=letter), self.config.task)


class TwoTurnEnv(vf.Env[vf.SingleAgentEnvConfig]):
    """The task's prompt opens; the env's second user turn asks for the next letter."""

    async def run(self, task, agents):
        async with agents.agent.interaction(task) as chat:
            await chat.turn()
            await chat.turn(f"now say {next_letter(task.data.letter)}")


__all__ = ["TwoLetterTaskset", "TwoTurnEnv"]
