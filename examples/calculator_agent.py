"""An agent program written against the OpenAI SDK, trained as it is (``env: agent``; examples/openai_agent_cpu.yaml).

The EnvRunner hands ``run`` an ``openai.AsyncOpenAI`` bound to one session of its rollout gateway: every call is
recorded token for token, and the trajectory trained on is assembled from those records (the tool message is context,
masked out of the loss). The program asks the model, runs a calculator on the first ``a+b`` of its reply (OpenAI
``tool_calls`` when the model writes them, else the text), answers with a tool message, asks again, and grades the
final reply against the task's answer.
"""

from __future__ import annotations

import json
import re

CALL = re.compile(r"(-?\d+)\s*([+*-])\s*(-?\d+)")
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "calculator",
            "description": "Compute a + b, a - b or a * b.",
            "parameters": {
                "type": "object",
                "properties": {"expression": {"type": "string"}},
                "required": ["expression"],
            },
        },
    }
]


def calculator(expression: str) -> str:
    """The first ``a op b`` of ``expression`` computed, else an error text the model reads."""
    m = CALL.search(expression)
    if m is None:
        return "error: write an expression like 12+7"
    a, op, b = int(m.group(1)), m.group(2), int(m.group(3))
    return str(a + b if op == "+" else a - b if op == "-" else a * b)


async def run(client, task, model):
    """One episode on ``task`` ({"question", "answer"}): reward 1 when the final reply holds the answer."""
    question = (
        task.get("reflection") or f"{task['question']} Use the calculator, then answer with the number."
    )
    messages = [{"role": "user", "content": question}]
    reply = await client.chat.completions.create(model=model, messages=messages, tools=TOOLS, timeout=120)
    message = reply.choices[0].message
    calls = message.tool_calls or []
    expression = (
        json.loads(calls[0].function.arguments).get("expression", "") if calls else message.content or ""
    )
    messages.append(message.model_dump(exclude_none=True))
    tool = {"role": "tool", "content": calculator(str(expression))}
    messages.append(tool | ({"tool_call_id": calls[0].id} if calls else {}))
    reply = await client.chat.completions.create(model=model, messages=messages, tools=TOOLS, timeout=120)
    answer = reply.choices[0].message.content or ""
    numbers = re.findall(r"-?\d+", answer)
    return {"reward": float(bool(numbers) and numbers[-1] == task["answer"]), "answer": answer}
