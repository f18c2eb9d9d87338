"""The math benchmarks R^3 and DeepScaleR report: where each lives on the hub and in a local data folder.

Sizes are those of the evaluation sets the DeepScaleR / R^3 tables use: AIME 2024 (30), AMC 2022-23 (83), MATH-500
(500), Minerva Math (272), OlympiadBench (675, the English text-only open-ended maths part). AIME 2025 (30) is extra.

Two sources per benchmark:

- a local ``{name}.jsonl`` in a ``data_dir`` with rows ``{"id", "problem", "answer"}`` (optionally ``"answers"``,
  all accepted forms), the layout of the project's shared data folder. When a ``data_dir`` is given, the local file is
  the only source: a missing file is an error naming the path, never a silent hub download (an offline cluster would
  otherwise hang or evaluate something else than intended);
- otherwise the public Hugging Face hub copy below. These are the commonly used copies; they are not reachable in CI
  (no network), so tests only exercise local files.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from r3_rllib.envs.data import MathProblem, load_math_problems


@dataclass(frozen=True)
class Benchmark:
    """One evaluation set: hub location and field names, and the file name it has in a local data folder."""

    name: str
    description: str
    num_problems: int  # size of the full set, as published
    hub_name: str
    hub_split: str
    problem_key: str = "problem"
    answer_key: str = "answer"
    # A second column of accepted answers, merged with answer_key's; a row needs one of the two. It also absorbs
    # schema drift between revisions of a hub copy (see olympiadbench).
    answers_key: str = "answers"
    # Rows without this column get "<dataset name>:<row index>" ids (see r3_rllib.envs.data).
    id_key: str = "id"

    @property
    def local_file(self) -> str:
        return f"{self.name}.jsonl"


BENCHMARKS: dict[str, Benchmark] = {
    b.name: b
    for b in (
        Benchmark(
            name="aime24",
            description="AIME 2024 I and II",
            num_problems=30,
            hub_name="HuggingFaceH4/aime_2024",
            hub_split="train",
        ),
        Benchmark(
            name="amc",
            description="AMC 12 2022-2023, rewritten to integer answers (answers are floats on the hub)",
            num_problems=83,
            hub_name="AI-MO/aimo-validation-amc",
            hub_split="train",
        ),
        Benchmark(
            name="math500",
            description="MATH-500, the test subset of Lightman et al. (2023)",
            num_problems=500,
            hub_name="HuggingFaceH4/MATH-500",
            hub_split="test",
            id_key="unique_id",
        ),
        Benchmark(
            name="minerva",
            description="Minerva Math (OCWCourses), undergraduate science and maths",
            num_problems=272,
            hub_name="math-ai/minervamath",
            hub_split="test",
            problem_key="question",
        ),
        Benchmark(
            name="olympiadbench",
            description="OlympiadBench, English text-only open-ended maths competition problems",
            num_problems=675,
            # The OE_TO_maths_en_COMP subset of Hothan/OlympiadBench as one split, no config to pick.
            hub_name="math-ai/olympiadbench",
            hub_split="test",
            problem_key="question",
            answer_key="final_answer",  # a list of accepted forms, LaTeX in $...$ (the grader strips them)
            # The dataset card's schema names the column "answer" (the loaders that use this copy read
            # "final_answer"): accept either, so a revision of the hub copy does not turn into a load error.
            answers_key="answer",
        ),
        Benchmark(
            name="aime25",
            description="AIME 2025 I and II",
            num_problems=30,
            hub_name="math-ai/aime25",
            hub_split="test",
        ),
    )
}

# The set the paper's tables average over.
PAPER_BENCHMARKS: tuple[str, ...] = ("aime24", "amc", "math500", "minerva", "olympiadbench")

# Spellings people type; resolved before the unknown-name error.
ALIASES: dict[str, str] = {
    "aime": "aime24",
    "aime2024": "aime24",
    "aime_2024": "aime24",
    "aime2025": "aime25",
    "aime_2025": "aime25",
    "amc23": "amc",
    "math": "math500",
    "math-500": "math500",
    "math_500": "math500",
    "minerva_math": "minerva",
    "minervamath": "minerva",
    "olympiad": "olympiadbench",
    "olympiad_bench": "olympiadbench",
}


def get_benchmark(name: str) -> Benchmark:
    """The registry entry for ``name`` (case-insensitive, common aliases accepted); unknown names list the known."""
    key = name.strip().lower()
    key = ALIASES.get(key, key)
    if key in BENCHMARKS:
        return BENCHMARKS[key]
    known = sorted(BENCHMARKS)
    closest = difflib.get_close_matches(key, known + sorted(ALIASES), n=1, cutoff=0.0)
    hint = f" (closest: {ALIASES.get(closest[0], closest[0])!r})" if closest else ""
    raise ValueError(f"unknown benchmark {name!r}{hint}; known benchmarks: {', '.join(known)}")


def parse_benchmark_names(names: str | Iterable[str]) -> list[str]:
    """``"aime24,amc"`` or a list of names -> canonical names, order kept, duplicates dropped; checks every name."""
    items = names.split(",") if isinstance(names, str) else list(names)
    out: list[str] = []
    for item in items:
        if not item.strip():
            continue
        canonical = get_benchmark(item).name
        if canonical not in out:
            out.append(canonical)
    if not out:
        raise ValueError("no benchmark named; known benchmarks: " + ", ".join(sorted(BENCHMARKS)))
    return out


def local_path(name: str, data_dir: str | Path) -> Path:
    return Path(data_dir) / get_benchmark(name).local_file


def load_benchmark(
    name: str, *, data_dir: str | Path | None = None, max_problems: int | None = None
) -> list[MathProblem]:
    """The problems of benchmark ``name``: from ``data_dir/{name}.jsonl`` when ``data_dir`` is given, else the hub.

    ``max_problems`` keeps the first N rows (a quick smoke evaluation; the order is the file's).
    """
    bench = get_benchmark(name)
    if max_problems is not None and max_problems <= 0:
        raise ValueError(f"max_problems must be positive, got {max_problems}")
    if data_dir is not None:
        path = Path(data_dir) / bench.local_file
        if not path.is_file():
            raise FileNotFoundError(
                f"benchmark {bench.name!r}: {path} not found (with a data dir, benchmarks are read only from "
                f"local files named <benchmark>.jsonl; drop the data dir to load {bench.hub_name} from the hub)"
            )
        problems = load_math_problems(str(path), split="train", max_rows=max_problems)
    else:
        problems = load_math_problems(
            bench.hub_name,
            split=bench.hub_split,
            problem_key=bench.problem_key,
            answer_key=bench.answer_key,
            answers_key=bench.answers_key,
            id_key=bench.id_key,
            max_rows=max_problems,
        )
    if not problems:
        raise ValueError(f"benchmark {bench.name!r} has no problems")
    return problems


def describe_benchmarks(names: Sequence[str] | None = None) -> str:
    """A markdown table of the registry (for docs and ``--help``)."""
    rows = ["| name | problems | hub dataset | split | local file |", "|---|---|---|---|---|"]
    for name in names or list(BENCHMARKS):
        b = get_benchmark(name)
        rows.append(f"| {b.name} | {b.num_problems} | {b.hub_name} | {b.hub_split} | {b.local_file} |")
    return "\n".join(rows)
