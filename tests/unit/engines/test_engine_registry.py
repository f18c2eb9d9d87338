"""The engine registry: capabilities read without importing an engine, names from built-ins, registrations and
entry points, errors that list the registered engines, and every registered class satisfying the interface."""

from __future__ import annotations

import importlib.util
import inspect
import json
import subprocess
import sys
from importlib.metadata import EntryPoint
from types import SimpleNamespace

import pytest
from repo_paths import REPO

from r3_rllib.config.rules import (
    lora_needs_an_engine_that_applies_adapters,
    partial_rollouts_need_overlap_and_a_stepping_engine,
    rollout_head_needs_an_engine_with_a_head,
    setting_error,
)
from r3_rllib.engines import registry
from r3_rllib.engines.base import GenerationEngine
from r3_rllib.engines.options import EngineOptions
from r3_rllib.engines.registry import (
    ENGINE_KINDS,
    ENTRY_POINT_GROUP,
    EngineCapabilities,
    EngineSpec,
    default_engine,
    engine_capabilities,
    engine_class,
    engine_spec,
    register_engine,
    registered_engines,
)

PLAIN = EngineCapabilities(exact_entropies=True, partial_rollouts=False, rollout_head=False, lora_modes=())
PLAIN_SPEC = EngineSpec(name="plain", engine_class="r3_rllib.engines.hf_engine:HFEngine", capabilities=PLAIN)


@pytest.fixture
def clean_registry(monkeypatch):
    """The registry with no registrations and no entry points but those a test adds (`set_entry_points`)."""
    monkeypatch.setattr(registry, "_REGISTERED", {})
    monkeypatch.setattr(registry, "_FROM_ENTRY_POINTS", {})
    monkeypatch.setattr(registry, "_entry_points", dict)

    def set_entry_points(**values: str) -> None:
        eps = {
            name: EntryPoint(name=name, value=value, group=ENTRY_POINT_GROUP)
            for name, value in values.items()
        }
        monkeypatch.setattr(registry, "_entry_points", lambda: eps)

    return set_entry_points


def test_capabilities_are_read_without_importing_torch_or_an_engine():
    code = (
        "import json, sys\n"
        "from r3_rllib.engines.registry import engine_capabilities, registered_engines, default_engine\n"
        "from r3_rllib.engines.options import EngineOptions\n"
        "caps = {n: engine_capabilities(n).exact_entropies for n in registered_engines()}\n"
        "EngineOptions(kind='vllm', model_path=None).capabilities\n"
        "default_engine(False)\n"
        "heavy = [m for m in ('torch', 'transformers', 'vllm', 'r3_rllib.engines.base') if m in sys.modules]\n"
        "print(json.dumps([caps, heavy]))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300, check=True
    )
    caps, heavy = json.loads(out.stdout.strip().splitlines()[-1])
    assert heavy == []
    assert caps["hf"] is True and caps["vllm"] is False


def test_built_in_engines_and_what_they_declare():
    assert registered_engines()[:2] == ("hf", "vllm")
    assert "hf" in ENGINE_KINDS and "tgi" not in ENGINE_KINDS and ["hf"] not in ENGINE_KINDS
    hf, vllm = engine_capabilities("hf"), engine_capabilities("vllm")
    assert hf.exact_entropies and not vllm.exact_entropies
    assert hf.partial_rollouts and vllm.partial_rollouts and vllm.out_of_process and not hf.out_of_process
    assert hf.lora_modes == ("merge",) and set(vllm.lora_modes) == {"adapter", "merge"}
    assert vllm.default_on_gpu and not hf.default_on_gpu
    assert engine_spec("vllm").requires == ("vllm",) and engine_spec("hf").requires == ()


def test_unknown_engine_errors_list_the_registered_engines(clean_registry):
    clean_registry(plain="pkg:SPEC")
    with pytest.raises(
        ValueError, match=r"unknown engine kind 'sglang'; registered engines: hf, vllm, plain"
    ):
        engine_capabilities("sglang")
    with pytest.raises(ValueError, match="registered engines: hf, vllm, plain"):
        EngineOptions(kind="sglang", model_path=None)
    message = setting_error("engine", "sglang")
    assert message is not None and "['hf', 'vllm', 'plain']" in message
    # Where another package's engine comes from:
    assert "entry point in the group 'r3_rllib.engines'" in message


def test_an_entry_point_declares_an_engine(clean_registry, tmp_path, monkeypatch):
    (tmp_path / "outside_engine_spec.py").write_text(
        "from r3_rllib.engines.registry import EngineCapabilities, EngineSpec\n"
        "SPEC = EngineSpec(name='outside', engine_class='r3_rllib.engines.hf_engine:HFEngine',\n"
        "    capabilities=EngineCapabilities(exact_entropies=True, partial_rollouts=False, rollout_head=False))\n"
        "NOT_A_SPEC = 3\n"
        "OTHER_NAME = EngineSpec(name='other', engine_class='m:C', capabilities=SPEC.capabilities)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    clean_registry(
        outside="outside_engine_spec:SPEC",
        broken="outside_engine_spec:NOT_A_SPEC",
        renamed="outside_engine_spec:OTHER_NAME",
    )
    assert registered_engines() == ("hf", "vllm", "broken", "outside", "renamed")
    assert "outside" in ENGINE_KINDS and setting_error("engine", "outside") is None
    assert not engine_capabilities("outside").partial_rollouts
    assert EngineOptions(kind="outside", model_path=None).capabilities == engine_capabilities("outside")
    assert engine_class("outside").__name__ == "HFEngine"
    with pytest.raises(TypeError, match="not an EngineSpec"):
        engine_spec("broken")
    with pytest.raises(ValueError, match="declares the engine 'other'"):
        engine_spec("renamed")


def test_register_engine_in_this_process(clean_registry):
    register_engine(PLAIN_SPEC)
    register_engine(PLAIN_SPEC)  # the same spec again: nothing changes
    assert registered_engines() == ("hf", "vllm", "plain")
    with pytest.raises(ValueError, match="already registered"):
        register_engine(EngineSpec(name="plain", engine_class="m:C", capabilities=PLAIN))
    with pytest.raises(ValueError, match="built in"):
        register_engine(EngineSpec(name="hf", engine_class="m:C", capabilities=PLAIN))
    with pytest.raises(TypeError, match="EngineSpec"):
        register_engine("plain")  # type: ignore[arg-type]
    register_engine(EngineSpec(name="bad_class", engine_class="builtins:dict", capabilities=PLAIN))
    with pytest.raises(TypeError, match="not a GenerationEngine subclass"):
        engine_class("bad_class")
    with pytest.raises(ValueError, match="no rollout-head variant"):
        engine_class("plain", rollout_head=True)


def test_specs_refuse_inconsistent_declarations():
    with pytest.raises(ValueError, match="rollout_head_class=None"):
        EngineSpec(
            name="x", engine_class="m:C", capabilities=EngineCapabilities(True, True, rollout_head=True)
        )
    with pytest.raises(ValueError, match="'module:Class'"):
        EngineSpec(name="x", engine_class="m.C", capabilities=PLAIN)
    with pytest.raises(ValueError, match="without ':'"):
        EngineSpec(name="a:b", engine_class="m:C", capabilities=PLAIN)


def test_config_rules_ask_capabilities(clean_registry):
    register_engine(PLAIN_SPEC)
    config = SimpleNamespace(
        engine="plain",
        engine_kwargs={},
        partial_rollouts=True,
        overlap_generation=False,
        max_staleness=1,
        lora_rank=4,
        rollout_head=True,
    )
    assert "does not pause between decoding steps to load weights (engines that do: hf, vllm)" in (
        partial_rollouts_need_overlap_and_a_stepping_engine(config) or ""
    )
    assert "no rollout-head variant (engines that have one: hf, vllm)" in (
        rollout_head_needs_an_engine_with_a_head(config) or ""
    )
    assert "applies no LoRA adapters" in (lora_needs_an_engine_that_applies_adapters(config) or "")
    vllm = SimpleNamespace(
        **{**vars(config), "engine": "vllm", "rollout_head": False, "engine_kwargs": {"in_process": False}}
    )
    assert (
        "needs the engine core in the runner's process"
        in partial_rollouts_need_overlap_and_a_stepping_engine(vllm)
    )
    vllm.engine_kwargs = {}
    assert "lora_mode']='merge'" in partial_rollouts_need_overlap_and_a_stepping_engine(vllm)
    hf = SimpleNamespace(**{**vars(config), "engine": "hf", "rollout_head": False})
    assert (
        partial_rollouts_need_overlap_and_a_stepping_engine(hf) is None
    )  # the HF engine only merges adapters
    unknown = SimpleNamespace(**{**vars(config), "engine": "sglang"})
    assert rollout_head_needs_an_engine_with_a_head(unknown) is None  # the engine field's rule names it


def test_default_engine(monkeypatch):
    assert default_engine(False) == "hf"
    if importlib.util.find_spec("vllm") is not None:
        assert default_engine(True) == "vllm"
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else real(name, *a)
    )
    assert default_engine(True) == "hf"


@pytest.mark.parametrize("name", registered_engines())
def test_every_registered_engine_class_satisfies_the_interface(name):
    spec = engine_spec(name)
    if any(importlib.util.find_spec(m) is None for m in spec.requires):
        pytest.skip(f"engine {name!r} needs {spec.requires}")
    classes = [engine_class(name)]
    if spec.capabilities.rollout_head:
        classes.append(engine_class(name, rollout_head=True))
    for cls in classes:
        assert issubclass(cls, GenerationEngine) and not inspect.isabstract(cls), cls
        for method in (
            "generate",
            "update_weights",
            "update_adapter",
            "set_between_steps",
            "set_rollout_logits",
        ):
            assert callable(getattr(cls, method)), (cls, method)
    plain = classes[0]
    assert not plain.supports_rollout_logits
    if spec.capabilities.rollout_head:
        head = classes[1]
        assert issubclass(head, plain) and head.supports_rollout_logits
        assert head.set_rollout_logits is not GenerationEngine.set_rollout_logits
    if spec.capabilities.lora_modes:
        assert plain.update_adapter is not GenerationEngine.update_adapter, (
            "declares LoRA but inherits the refusal"
        )
    options = plain.evaluation_kwargs(
        seed=1, max_new_tokens=8, gpu_memory_utilization=0.5, tensor_parallel_size=1
    )
    assert isinstance(options, dict)


def test_evaluation_options_of_the_built_in_engines():
    assert (
        engine_class("hf").evaluation_kwargs(
            seed=1, max_new_tokens=8, gpu_memory_utilization=0.5, tensor_parallel_size=1
        )
        == {}
    )
    from r3_rllib.engines.vllm_engine import VLLMEngine  # imports no vllm module

    options = VLLMEngine.evaluation_kwargs(
        seed=3, max_new_tokens=8, gpu_memory_utilization=0.5, tensor_parallel_size=2
    )
    assert options["logprobs_k"] == 0 and options["seed"] == 3 and options["tensor_parallel_size"] == 2
    assert options["budget"].max_sequence_tokens == 4096 + 8


def test_the_base_class_declares_partial_rollouts_and_rollout_logits(tiny_random_model):
    engine = engine_class("hf").build(tiny_random_model, budget=None, lora_rank=4)
    assert (
        engine.supports_partial_rollouts and not engine.supports_rollout_logits and not engine.rollout_logits
    )
    engine.set_rollout_logits(False)  # off is what a plain engine samples anyway
    with pytest.raises(NotImplementedError, match="no rollout head"):
        engine.set_rollout_logits(True)
    hook = lambda: None  # noqa: E731
    engine.set_between_steps(hook, every=2)
    assert engine.between_steps is hook and engine.between_steps_every == 2
    engine.set_between_steps(None)
    assert engine.between_steps is None and engine.between_steps_every == 2
    with pytest.raises(ValueError, match="between_steps_every"):
        engine.set_between_steps(hook, every=0)


def test_the_hf_engine_options_a_config_may_set_are_its_constructors():
    """`engine_kwargs_error` checks engine='hf' options against a written-out list (validating imports no
    transformers): it must stay the constructor's keyword options but those the runner passes itself."""
    import inspect

    from r3_rllib.engines.hf_engine import HFEngine
    from r3_rllib.engines.options import HF_ENGINE_OPTIONS, engine_kwargs_error

    runner_sets = {"self", "model", "tokenizer", "dtype"}
    assert set(inspect.signature(HFEngine.__init__).parameters) - runner_sets == set(HF_ENGINE_OPTIONS)
    assert engine_kwargs_error("hf", {"kv_cache": "dynamic", "max_batch_size": 4}) is None
    assert "not options of the 'hf' engine" in engine_kwargs_error("hf", {"tensor_parallel_size": 2})
    assert engine_kwargs_error("vllm", {"tensor_parallel_size": 2}) is None  # vLLM names its own unknowns
    assert "may not set ['lora_rank']" in engine_kwargs_error("vllm", {"lora_rank": 8})
