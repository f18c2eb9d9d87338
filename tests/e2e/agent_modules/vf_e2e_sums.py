"""A verifiers 0.4 taskset for the e2e agent tests (taskset id ``vf_e2e_sums``): the 8 sums ``"i+(i+1)="`` of
tests/e2e/test_agent_training.py's TASKS; the rubric is 1.0 when the reply holds the sum, plus 0.1 per digit in it
(partial credit: the untrained tiny model's groups rarely tie). The runners import it by name from PYTHONPATH."""

from __future__ import annotations

import verifiers.v1 as vf


class SumData(vf.TaskData):
    answer: str = ""


class SumTask(vf.Task[SumData]):
    @vf.reward
    async def correct(self, trace) -> float:
        return 1.0 if self.data.answer in trace.last_reply else 0.0

    @vf.reward(weight=0.1)
    async def digits(self, trace) -> float:
        return float(sum(c.isdigit() for c in trace.last_reply))


class SumTaskset(vf.Taskset[SumTask]):
    def load(self):
        for i in range(8):
            yield SumTask(SumData(prompt=f"{i}+{i + 1}=", answer=str(2 * i + 1)), self.config.task)


__all__ = ["SumTaskset"]
