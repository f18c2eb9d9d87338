"""``r3 samples RUN``: the recorded completions of a run (records.py), filtered and printed.

RUN is an experiment folder (``runs/<name>``: every trial in it), a trial folder, a ``samples`` folder, or one
``iter_NNNNNN.parquet`` file. Filters: ``--iteration`` (negative: from the last), ``--min-reward`` /
``--max-reward`` (the env's reward), ``--reason`` (the env's grade reason, or correct / wrong where it gives
none), ``--group`` (``I:G`` or the index G within each iteration). Prints one line per row (``--full``: the whole
texts), at most ``-n`` rows per trial. A ``--reason`` or ``--group`` that no row read has is answered with what the
rows do have (:func:`missing_filter_hints`): the grade reasons with their counts, the groups recorded.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from r3_rllib.rollout.records import (
    FILE_PREFIX,
    SAMPLES_DIR,
    format_row,
    preview,
    read_rows,
    reason_of,
    row_label,
    row_outcome,
)

#: The columns printing and filtering read (the token and log-prob lists stay on disk).
COLUMNS = (
    "iteration",
    "group",
    "sample",
    "query_id",
    "prompt_text",
    "response_text",
    "reward",
    "correct",
    "grade_reason",
    "trained",
    "advantage",
    "replayed",
    "reflection",
    "ranked",
)


def record_files(run: str | Path) -> dict[Path, list[Path]]:
    """The records files under ``run``, by the folder of the trial they belong to (its ``samples`` folder's
    parent), each list in iteration order."""
    run = Path(run)
    files = [run] if run.is_file() else sorted(run.rglob(f"{FILE_PREFIX}*.parquet"))
    by_trial: dict[Path, list[Path]] = {}
    for f in files:
        if not f.name.startswith("."):
            folder = f.parent.parent if f.parent.name == SAMPLES_DIR else f.parent
            by_trial.setdefault(folder, []).append(f)
    return {k: sorted(v, key=iteration_of) for k, v in sorted(by_trial.items())}


def iteration_of(path: Path) -> int:
    """The iteration of a records file, from its name (``iter_000012.parquet`` -> 12)."""
    stem = path.name.removeprefix(FILE_PREFIX).removesuffix(".parquet")
    return int(stem) if stem.isdigit() else -1


def readable_rows(
    files: Sequence[Path], columns: Sequence[str] | None = None, *, limit: int | None = None
) -> tuple[list[dict[str, Any]], list[str]]:
    """The rows of ``files`` (stopping once ``limit`` rows are read) and one line for each file that cannot be read
    as records (cut short by a full disk or a copy, or not a records file): a damaged file is left out, naming it,
    rather than ending the listing, or the report of a whole run, in pyarrow's traceback."""
    rows: list[dict[str, Any]] = []
    damaged: list[str] = []
    for f in files:
        if limit is not None and len(rows) >= limit:
            break
        try:
            rows += read_rows(str(f), columns)
        except (OSError, ValueError) as e:  # pyarrow's ArrowInvalid is a ValueError, ArrowIOError an OSError
            damaged.append(f"{f}: not a readable records file, left out ({type(e).__name__}: {e})")
    return rows, damaged


def select_files(files: Sequence[Path], iteration: int | None) -> list[Path]:
    """``files`` of ``iteration`` (negative: counted from the last one; None: all)."""
    if iteration is None:
        return list(files)
    if iteration < 0:
        return list(files[iteration : len(files) + iteration + 1] if -iteration <= len(files) else [])
    return [f for f in files if iteration_of(f) == iteration]


def matches(
    row: dict[str, Any],
    *,
    min_reward: float | None = None,
    max_reward: float | None = None,
    reason: str | None = None,
    group: str | None = None,
) -> bool:
    """Whether ``row`` passes the filters (None: no filter on that)."""
    if min_reward is not None and not row["reward"] >= min_reward:
        return False
    if max_reward is not None and not row["reward"] <= max_reward:
        return False
    if reason is not None and reason_of(row) != reason:
        return False
    if group is not None:
        wanted = group.split(":") if ":" in group else [None, group]
        if wanted[0] is not None and str(row["iteration"]) != wanted[0].strip():
            return False
        if str(row["group"]) != wanted[1].strip():
            return False
    return True


#: Most groups a hint lists (a run records at most ``sample_log_max_groups`` per iteration, 8 by default).
HINT_MAX_GROUPS = 20


def missing_filter_hints(
    rows: Sequence[dict[str, Any]], *, reason: str | None = None, group: str | None = None
) -> list[str]:
    """For a ``--reason`` or ``--group`` that matches none of ``rows`` (the rows read, before any filter), a line
    saying what the rows have instead: their grade reasons with counts, or the groups recorded (in the iteration
    ``I`` of ``I:G``). A filter that some row passes gets no line (the filters together lost the rows); no rows
    read, no line (the count says 0 of 0)."""
    hints: list[str] = []
    if not rows:
        return hints
    if reason is not None and not any(matches(r, reason=reason) for r in rows):
        counts = Counter(reason_of(r) for r in rows)
        have = ", ".join(f"{name} ({n})" for name, n in sorted(counts.items()))
        hints.append(f"no row has grade reason {reason!r}; reasons here: {have}")
    if group is not None and not any(matches(r, group=group) for r in rows):
        iteration = group.split(":")[0].strip() if ":" in group else None
        pool = [r for r in rows if iteration is None or str(r["iteration"]) == iteration]
        if not pool:
            its = sorted({int(r["iteration"]) for r in rows})
            hints.append(
                f"no row is of iteration {iteration} (--group {group}); rows here are of iterations "
                f"{its[0]}-{its[-1]}"
            )
        else:
            groups = sorted({int(r["group"]) for r in pool})
            listed = ", ".join(map(str, groups[:HINT_MAX_GROUPS]))
            if len(groups) > HINT_MAX_GROUPS:
                listed += f", ... ({len(groups)} groups)"
            where = f"in iteration {iteration}" if iteration is not None else "here"
            hints.append(f"no row is in group {group}; groups recorded {where}: {listed}")
    return hints


def full_text(row: dict[str, Any]) -> str:
    """A row with its whole prompt and completion, for ``--full``."""
    return "\n".join(
        [
            f"{row_label(row)} query {row['query_id']}: {row_outcome(row)}",
            "--- prompt ---",
            row.get("prompt_text") or "",
            "--- completion ---",
            row.get("response_text") or "",
            "",
        ]
    )


def show_samples(run: str | Path, args: argparse.Namespace, out=None) -> int:
    """Print the rows of ``run`` that pass the filters of ``args``; 2 when ``run`` holds no records."""
    out = out or sys.stdout
    if Path(run).is_file() and Path(run).suffix != ".parquet":  # progress.csv, a checkpoint file, ...
        print(
            f"r3 samples: {run} is not a records file ({FILE_PREFIX}*.parquet): name the run's folder",
            file=sys.stderr,
        )
        return 2
    trials = record_files(run)
    if not trials:
        print(f"r3 samples: no sample records under {run} (samples/{FILE_PREFIX}*.parquet)", file=sys.stderr)
        return 2
    for folder, files in trials.items():
        chosen = select_files(files, args.iteration)
        rows, damaged = readable_rows(chosen, COLUMNS)
        for line in damaged:
            print(f"r3 samples: warning: {line}", file=sys.stderr)
        kept = [
            r
            for r in rows
            if matches(
                r,
                min_reward=args.min_reward,
                max_reward=args.max_reward,
                reason=args.reason,
                group=args.group,
            )
        ]
        # -n rows of several prompts (each group's first sample, then its second, ...) unless one group is asked for.
        shown = kept if args.n <= 0 else kept[: args.n] if args.group else preview(kept, args.n)
        span = (
            f"iterations {iteration_of(chosen[0])}-{iteration_of(chosen[-1])}" if chosen else "no iteration"
        )
        print(f"{folder}: {len(kept)} of {len(rows)} rows match ({span}), showing {len(shown)}", file=out)
        for r in shown:
            print(full_text(r) if args.full else "  " + format_row(r), file=out)
        if not kept:
            for hint in missing_filter_hints(rows, reason=args.reason, group=args.group):
                print("  " + hint, file=out)
    return 0


def add_samples_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.add_argument(
        "run", help="experiment folder (runs/<name>), trial folder, samples folder or .parquet file"
    )
    parser.add_argument("--iteration", type=int, default=None, help="only this iteration (-1: the last)")
    parser.add_argument("--min-reward", type=float, default=None, help="only rows with reward >= this")
    parser.add_argument("--max-reward", type=float, default=None, help="only rows with reward <= this")
    parser.add_argument(
        "--reason", default=None, help="only this grade reason (correct / wrong where the env gives none)"
    )
    parser.add_argument("--group", default=None, help="only group G of each iteration, or I:G")
    parser.add_argument("-n", type=int, default=20, help="rows per trial (default 20; 0: all)")
    parser.add_argument("--full", action="store_true", help="whole prompts and completions, not one line")
    return parser


def run_samples(args: argparse.Namespace) -> int:
    try:
        return show_samples(args.run, args)
    except OSError as e:
        print(f"r3 samples: error: {e}", file=sys.stderr)
        return 2
