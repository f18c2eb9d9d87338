"""What the config's ``reward_models`` list holds: one :class:`RewardModelSpec` per reward term beside the env's own
reward (a rule function, a scalar reward model, a generative judge, a group judge)."""

from __future__ import annotations

from dataclasses import dataclass

#: The scorer types a spec may name (``type:``), each built by :func:`r3_rllib.reward_models.build_scorer`.
SCORER_TYPES = ("rule", "scalar", "judge", "group_judge")


@dataclass(frozen=True)
class RewardModelSpec:
    """One reward term of the config's ``reward_models`` list.

    ``type`` picks the scorer: ``rule`` (a Python function ``function: "module:name"`` called as
    ``fn(prompt_text, response_text, gold) -> float``), ``scalar`` (a sequence-classification model at ``model``,
    one logit per response), ``judge`` (a generative judge: the causal LM at ``model`` run by the ``engine``, HF or
    vLLM, prompted with ``rubric``, its verdict parsed), ``group_judge`` (a judge that sees all the responses to one
    prompt and scores them against each other, RULER-style).
    """

    name: str
    """The term's name: its metrics (``reward_server/<name>_mean``) and its key in each sample's reward parts."""
    type: str
    weight: float = 1.0
    """The term's weight in the composed reward (``env_reward_weight * env reward + sum of weight * score``)."""
    gate: bool = False
    """A gate term (e.g. "format first"): when its score is below ``gate_threshold`` the composed reward is
    ``gate_reward`` whatever the other terms say; a gate adds nothing to the weighted sum."""
    gate_threshold: float = 0.5
    gate_reward: float = 0.0
    model: str | None = None
    """The model's path (or a named model) for ``scalar``, ``judge`` and ``group_judge``."""
    function: str | None = None
    """``"module:name"`` of a ``rule`` term's function."""
    engine: str = "hf"
    """The judge's generation engine (``hf`` or ``vllm``, as the runners' ``engine`` setting)."""
    rubric: str | None = None
    """The judge's prompt template (``{question}``, ``{response}``, ``{gold}`` are filled in); None: the scorer's
    default rubric."""
    max_new_tokens: int = 256
    """Tokens a judge may write before its verdict."""
    temperature: float = 0.0
    """The judge's sampling temperature (0: greedy, reproducible)."""
    batch_size: int = 32
    """Requests per forward (scalar) or per engine call (judges)."""
