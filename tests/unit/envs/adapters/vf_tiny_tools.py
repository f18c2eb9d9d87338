"""A verifiers taskset with a toolset for the adapter tests (``taskset.id = "vf_tiny_tools"``): one sum to work
out with a calculator tool (``Calc``, an MCP server verifiers starts per rollout as ``python -m vf_tiny_tools``
in a local subprocess runtime); the rubric is one reward, 1.0 when the last reply holds the sum, and a metric
counts the tool results the trace holds."""

from __future__ import annotations

import verifiers.v1 as vf


class Calc(vf.Toolset[vf.ToolsetConfig]):
    TOOL_PREFIX = "calc"

    @vf.tool
    async def add(self, a: int, b: int) -> int:
        """Add two integers."""
        return a + b


class SumData(vf.TaskData):
    answer: str = ""


class SumTask(vf.Task[SumData]):
    @classmethod
    def toolsets(cls, config):
        return [Calc(vf.ToolsetConfig())]

    @vf.reward
    async def correct(self, trace) -> float:
        return 1.0 if self.data.answer in trace.last_reply else 0.0

    @vf.metric
    async def tool_results(self, trace) -> float:
        return float(len(trace.tool_messages))


class SumTaskset(vf.Taskset[SumTask]):
    def load(self):
        yield SumTask(SumData(prompt="What is 2 + 3?", answer="5"), self.config.task)


__all__ = ["SumTaskset"]

if __name__ == "__main__":
    Calc.run()
