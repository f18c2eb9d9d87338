"""Loading math problems (problem text + accepted answers) from local files or the Hugging Face hub.

``source`` is a local ``.json`` (a list of rows, or ``{"data": [...]}``), ``.jsonl`` or ``.parquet`` file, or a hub
dataset name such as ``agentica-org/DeepScaleR-Preview-Dataset`` (read with ``datasets.load_dataset(name,
split=split)``). A string is a local path when it exists, ends like a data file (``.json``, ``.csv``, ``.gz``, ...)
or starts with ``/``, ``.`` or ``~``; anything else is a hub name. Files are UTF-8; a byte-order mark at the start
(Windows editors, spreadsheet exports) is dropped.

Answer normalisation (the ``answer`` column and the optional ``answers`` column, whose forms are all accepted):

- ``str``: stripped; empty is a bad row. The string ``"142.0"`` stays ``"142.0"`` (the grader handles it).
- ``int``: ``str(value)`` (an integer of more than Python's 4,300 digits is read from JSON as its digit string;
  one handed over as an int, from parquet or a list of rows, is a bad row); ``float``: ``"142"`` when integral (AMC answers are stored as ``142.0``), else
  ``repr(value)``; NaN/inf are bad rows.
- ``list``/``tuple`` of the above: several accepted forms (duplicates dropped, order kept).
- ``None``, ``bool``, ``dict`` and anything else: a bad row.

A bad row (missing or empty problem or answer, wrong types, duplicate id, text that is not valid Unicode (a lone
surrogate), a key written twice in one JSON object at any depth (the field named by its path: ``prompt[0].role``), a
JSON line that does not parse or is nested too deeply) raises :class:`DataError` naming the file, the 0-based row
(and the line for JSONL) and the field. With ``on_bad_row="skip"`` it is skipped instead, counted, and logged once
per load (``logging.warning`` with the count and the first reasons); :func:`load_math_problems_with_report` also
returns a :class:`LoadReport` with the counts. Missing or unreadable files, unknown extensions and a ``.json`` file
naming a top-level key twice (``{"data": [...], "data": [...]}``) always raise :class:`DataError` naming the path.

Row ids: the ``id`` column when present (str or int), else ``f"{stem}:{row}"`` with the file stem (or the dataset
name) and the 0-based row.

Also here, shared by the finite-pool environments: :class:`QueryOrder` (epoch-wise shuffled iteration with a
checkpointable cursor, optionally one EnvRunner's :class:`Shard` of a global order per epoch) and
:func:`parse_reset_options` (validation of ``reset(options=...)``).
"""

from __future__ import annotations

import json
import logging
import math
import numbers
import os
import random
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

logger = logging.getLogger(__name__)

LOCAL_SUFFIXES = (".json", ".jsonl", ".parquet")
# Names ending like a data file are local paths (a clear "not found"/"unknown extension" beats a hub lookup).
_FILE_LIKE_SUFFIXES = LOCAL_SUFFIXES + (
    ".csv",
    ".tsv",
    ".txt",
    ".gz",
    ".zip",
    ".xz",
    ".arrow",
    ".yaml",
    ".yml",
)
# How many skip reasons a LoadReport keeps and the warning shows.
MAX_REASONS = 20
_LOGGED_REASONS = 5
# How many of a row's columns a "missing column" message lists.
MAX_LISTED_COLUMNS = 12


class DataError(ValueError):
    """A data source or one of its rows cannot be used; the message names the file, row and field."""


@dataclass(frozen=True)
class MathProblem:
    id: str
    problem: str
    answers: tuple[str, ...]  # accepted forms of the gold answer, at least one

    @property
    def answer(self) -> str:
        return self.answers[0]


@dataclass(frozen=True)
class LoadReport:
    source: str
    rows_read: int
    loaded: int
    skipped: int
    skip_reasons: tuple[str, ...]  # the first MAX_REASONS reasons


class _BadRow(Exception):
    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


def _json_int(digits: str) -> int | str:
    """A JSON integer literal as an int, or as its digit string when Python refuses to convert that many digits
    (``sys.get_int_max_str_digits()``, 4300 by default). Such a number can only be an answer (an id or problem of
    that size is junk), and answers are strings for the grader: ``"1234...9"`` grades as the int would."""
    try:
        return int(digits)
    except ValueError:
        return digits


class _JsonObject(dict):
    """A JSON object whose text names a key twice, here or in an object nested in it: ``json`` keeps the last
    value silently (``{"answer": "1", "answer": "2"}`` grades against "2"; ``{"prompt": [{"role": "user", "role":
    "system", ...}]}`` sends a system turn), so the object remembers the path to the first such key and the row is
    refused. ``duplicate_path`` is ``("answer",)`` for a key of the object itself, ``("prompt", 0, "role")`` for
    one nested in it."""

    duplicate_path: tuple[str | int, ...] = ()


def _nested_duplicate(pairs: list[tuple[str, Any]]) -> tuple[str | int, ...]:
    """The path to the first key written twice in an object nested in ``pairs`` (objects are built inner first,
    so a nested one is already marked: only lists are walked, each element once, with a stack not recursion)."""
    stack: list[tuple[tuple[str | int, ...], Any]] = [((key,), value) for key, value in reversed(pairs)]
    while stack:
        path, value = stack.pop()
        if isinstance(value, _JsonObject):
            return path + value.duplicate_path
        if isinstance(value, list):
            nested = [(i, item) for i, item in enumerate(value) if isinstance(item, list | _JsonObject)]
            stack.extend((path + (i,), item) for i, item in reversed(nested))
    return ()


def _json_object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """``object_pairs_hook``: a plain dict, or a :class:`_JsonObject` naming the first key written twice in it or
    in an object nested in it (its own keys first)."""
    out: dict[str, Any] = dict(pairs)
    path: tuple[str | int, ...] = ()
    if len(out) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                path = (key,)
                break
            seen.add(key)
    else:
        path = _nested_duplicate(pairs)
    if not path:
        return out
    marked = _JsonObject(out)
    marked.duplicate_path = path
    return marked


def key_path(path: tuple[str | int, ...]) -> str:
    """``("prompt", 0, "role")`` as ``prompt[0].role``: the column as it is, a nested key that is not a plain name
    as ``["a key"]``."""
    text = ""
    for part in path:
        if isinstance(part, int):
            text += f"[{part}]"
        elif not text:
            text = part
        elif part.isidentifier():
            text += f".{part}"
        else:
            text += f"[{json.dumps(part, ensure_ascii=False)}]"
    return text


def duplicate_key(row: Any) -> str | None:
    """The path (:func:`key_path`) to the first key a JSON row's text names twice, at any depth (read by this
    module's readers), else None."""
    return key_path(row.duplicate_path) if isinstance(row, _JsonObject) else None


def _loads(text: str) -> Any:
    """``json.loads`` reading over-long integers as strings (:func:`_json_int`) instead of raising a ValueError
    that names neither file nor row, and marking objects with a duplicate key (:func:`_json_object`)."""
    return json.loads(text, parse_int=_json_int, object_pairs_hook=_json_object)


def invalid_text(value: str) -> str | None:
    """Why ``value`` is not valid Unicode text, or None. A lone surrogate (the JSON escape ``"\\ud800"``, found
    in scraped data) loads as a str but fails later, in the tokenizer or the sample log, naming no row."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        return f"not valid Unicode text ({exc.reason} at character {exc.start})"
    return None


def _check_text(value: str, field: str) -> str:
    """``value``, or a bad row naming ``field`` when it is not valid Unicode text."""
    reason = invalid_text(value)
    if reason is not None:
        raise _BadRow(field, reason)
    return value


def _integer_text(item: numbers.Integral, field: str) -> str:
    """``str(item)``, or a bad row when the int has more digits than Python converts to a string."""
    try:
        return str(int(item))
    except ValueError:
        raise _BadRow(
            field, "an integer with more digits than Python converts to text: store the answer as a string"
        ) from None


def normalize_answer_value(value: Any, field: str = "answer") -> tuple[str, ...]:
    """Accepted answer strings for one ``answer``/``answers`` cell (rules in the module docstring)."""
    items = list(value) if isinstance(value, list | tuple) else [value]
    if not items:
        raise _BadRow(field, "empty list")
    out: list[str] = []
    for item in items:
        if isinstance(item, str):
            text = _check_text(item, field).strip()
            if not text:
                raise _BadRow(field, "empty string")
        elif isinstance(item, bool) or item is None:
            raise _BadRow(field, f"{item!r} is not an answer")
        elif isinstance(item, numbers.Integral):
            text = _integer_text(item, field)
        elif isinstance(item, numbers.Real):
            x = float(item)
            if not math.isfinite(x):
                raise _BadRow(field, f"{x!r} is not a finite number")
            text = str(int(x)) if x.is_integer() else repr(x)
        else:
            raise _BadRow(field, f"expected a string, number or list of them, got {type(item).__name__}")
        if text not in out:
            out.append(text)
    return tuple(out)


def _missing_column(row: Mapping[str, Any], option: str) -> str:
    """ "missing" with the columns the row has: a file whose columns are named otherwise (``question``/``solution``)
    is told which option picks them, not only that ``problem`` is absent from every row."""
    columns = ", ".join(repr(str(c)) for c in list(row)[:MAX_LISTED_COLUMNS])
    more = f", ... ({len(row)} in all)" if len(row) > MAX_LISTED_COLUMNS else ""
    return f"missing; the row's columns are {columns or 'none'}{more} (set {option} to read another column)"


def _parse_row(
    row: Any, *, problem_key: str, answer_key: str, answers_key: str, id_key: str, default_id: str
) -> MathProblem:
    if not isinstance(row, Mapping):
        raise _BadRow("<row>", f"expected an object, got {type(row).__name__}")
    twice = duplicate_key(row)
    if twice is not None:
        raise _BadRow(twice, "the key appears twice in the row (JSON would keep the last silently)")
    problem = row.get(problem_key)
    if problem is None:
        raise _BadRow(
            problem_key, "missing (null)" if problem_key in row else _missing_column(row, "problem_key")
        )
    if not isinstance(problem, str):
        raise _BadRow(problem_key, f"expected a string, got {type(problem).__name__}")
    if not _check_text(problem, problem_key).strip():
        raise _BadRow(problem_key, "empty string")

    answer_value, answers_value = row.get(answer_key), row.get(answers_key)
    if answer_value is None and answers_value is None:
        raise _BadRow(
            answer_key, "missing (null)" if answer_key in row else _missing_column(row, "answer_key")
        )
    answers = normalize_answer_value(answer_value, answer_key) if answer_value is not None else ()
    if answers_value is not None:
        extra = normalize_answer_value(answers_value, answers_key)
        answers += tuple(a for a in extra if a not in answers)

    raw_id = row.get(id_key)
    if raw_id is None:
        qid = default_id
    elif isinstance(raw_id, bool) or not isinstance(raw_id, str | numbers.Integral):
        raise _BadRow(id_key, f"expected a string or integer, got {type(raw_id).__name__}")
    else:
        qid = (
            _check_text(raw_id, id_key) if isinstance(raw_id, str) else _integer_text(raw_id, id_key)
        ).strip()
        if not qid:
            raise _BadRow(id_key, "empty string")
    return MathProblem(id=qid, problem=problem, answers=answers)


# --------------------------------------------------------------------------------------------------------------
# Readers: each yields (row_index, location, row) where location names the line for JSONL; a JSON line that does
# not parse is yielded as a _BadRow so the caller's skip policy applies to it.
# --------------------------------------------------------------------------------------------------------------
def _is_local(source: str | os.PathLike) -> bool:
    if isinstance(source, os.PathLike):
        return True
    s = str(source)
    return os.path.exists(s) or s.lower().endswith(_FILE_LIKE_SUFFIXES) or s.startswith(("/", ".", "~"))


def _read_jsonl(path: Path) -> Iterator[tuple[int, str, Any]]:
    try:
        # utf-8-sig: a byte-order mark (Windows editors, Excel's export) is dropped, not parsed as row 0's JSON.
        handle = path.open(encoding="utf-8-sig")
    except OSError as exc:
        raise DataError(f"{path}: cannot read: {exc}") from exc
    with handle:
        row = 0
        try:
            for lineno, line in enumerate(handle, start=1):
                if not line.strip():
                    continue
                where = f"row {row} (line {lineno})"
                try:
                    value = _loads(line)
                except json.JSONDecodeError as exc:
                    value = _BadRow("<json>", f"invalid JSON: {exc}")
                except RecursionError:  # `[[[[...` thousands deep: a bad row like any other, not a crash
                    value = _BadRow("<json>", "invalid JSON: nested too deeply to parse")
                yield row, where, value
                row += 1
        except UnicodeDecodeError as exc:
            raise DataError(f"{path}: not UTF-8 text: {exc}") from exc


def _read_json(path: Path) -> Iterator[tuple[int, str, Any]]:
    try:
        data = _loads(path.read_text(encoding="utf-8-sig"))  # a byte-order mark is not JSON: dropped
    except (OSError, UnicodeDecodeError) as exc:
        raise DataError(f"{path}: cannot read: {exc}") from exc
    except json.JSONDecodeError as exc:
        raise DataError(f"{path}: invalid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}") from exc
    except RecursionError:  # one document: there is no row to skip, but the file is named
        raise DataError(f"{path}: invalid JSON: nested too deeply to parse") from None
    if isinstance(data, _JsonObject) and len(data.duplicate_path) == 1:  # {"data": [...], "data": [...]}
        raise DataError(
            f"{path}: the top-level key {data.duplicate_path[0]!r} appears twice (JSON would keep the last silently)"
        )
    if isinstance(data, dict) and isinstance(data.get("data"), list):
        data = data["data"]
    if not isinstance(data, list):
        raise DataError(f"{path}: expected a JSON list of rows or an object with a 'data' list")
    for row, value in enumerate(data):
        yield row, f"row {row}", value


def _read_parquet(path: Path) -> Iterator[tuple[int, str, Any]]:
    try:
        import pyarrow.parquet as pq

        rows = pq.read_table(path).to_pylist()
    except (OSError, ValueError) as exc:  # pyarrow raises ArrowInvalid (a ValueError) on corrupt files
        raise DataError(f"{path}: cannot read parquet: {exc}") from exc
    for row, value in enumerate(rows):
        yield row, f"row {row}", value


def _read_hub(name: str, split: str, config: str | None = None) -> Iterator[tuple[int, str, Any]]:
    import datasets

    try:
        if config is None:
            dataset = datasets.load_dataset(name, split=split)
        else:  # the dataset's configuration (subset), e.g. "main" of openai/gsm8k
            dataset = datasets.load_dataset(name, config, split=split)
    except Exception as exc:  # network, auth, unknown name, unknown split: all surface as one clear error
        raise DataError(f"hub dataset {name!r} (split {split!r}): cannot load: {exc}") from exc
    for row, value in enumerate(dataset):
        yield row, f"row {row}", value


def _open_source(
    source: str | os.PathLike, split: str, hub_config: str | None = None
) -> tuple[str, str, Iterator[tuple[int, str, Any]]]:
    """(display name, id stem, row iterator)."""
    # Anything else would become a hub name ('None', '5') and cost the hub client's retries before failing.
    if not isinstance(source, str | os.PathLike):
        raise TypeError(
            f"a data source is a file path or a hub dataset name, got {type(source).__name__} {source!r}"
        )
    if not str(source).strip():
        raise DataError("a data source is a file path or a hub dataset name, got an empty string")
    if not _is_local(source):
        name = str(source)
        return f"{name}[{split}]", name.rsplit("/", 1)[-1], _read_hub(name, split, hub_config)
    path = Path(os.path.expanduser(str(source)))
    if not path.exists():
        raise DataError(f"{path}: file not found")
    if not path.is_file():
        raise DataError(f"{path}: not a file")
    suffix = path.suffix.lower()
    readers = {".jsonl": _read_jsonl, ".json": _read_json, ".parquet": _read_parquet}
    if suffix not in readers:
        raise DataError(f"{path}: unknown extension {suffix!r}; expected one of {', '.join(LOCAL_SUFFIXES)}")
    return str(path), path.stem, readers[suffix](path)


def load_math_problems_with_report(
    source: str | os.PathLike,
    *,
    split: str = "train",
    problem_key: str = "problem",
    answer_key: str = "answer",
    answers_key: str = "answers",
    id_key: str = "id",
    on_bad_row: Literal["error", "skip"] = "error",
    max_rows: int | None = None,
) -> tuple[list[MathProblem], LoadReport]:
    """Like :func:`load_math_problems`, plus a :class:`LoadReport` with the row counts and skip reasons."""
    if on_bad_row not in ("error", "skip"):
        raise ValueError(f"on_bad_row must be 'error' or 'skip', got {on_bad_row!r}")
    if max_rows is not None and (isinstance(max_rows, bool) or not isinstance(max_rows, numbers.Integral)):
        raise TypeError(f"max_rows must be an int >= 0 or None, got {type(max_rows).__name__} {max_rows!r}")
    if max_rows is not None and max_rows < 0:
        raise ValueError(f"max_rows must be >= 0 or None, got {max_rows}")
    display, stem, rows = _open_source(source, split)
    problems: list[MathProblem] = []
    seen: dict[str, int] = {}
    reasons: list[str] = []
    skipped = 0
    rows_read = 0
    for row, where, value in rows:
        if max_rows is not None and len(problems) >= max_rows:
            break
        rows_read += 1
        try:
            if isinstance(value, _BadRow):
                raise value
            problem = _parse_row(
                value,
                problem_key=problem_key,
                answer_key=answer_key,
                answers_key=answers_key,
                id_key=id_key,
                default_id=f"{stem}:{row}",
            )
            if problem.id in seen:
                raise _BadRow(id_key, f"duplicate id {problem.id!r} (first seen in row {seen[problem.id]})")
        except _BadRow as bad:
            message = f"{display}: {where}: field {bad.field!r}: {bad}"
            if on_bad_row == "error":
                raise DataError(message) from None
            skipped += 1
            if len(reasons) < MAX_REASONS:
                reasons.append(message)
            continue
        seen[problem.id] = row
        problems.append(problem)
    if skipped:
        logger.warning(
            "%s: skipped %d bad row(s) of %d; first: %s",
            display,
            skipped,
            rows_read,
            "; ".join(reasons[:_LOGGED_REASONS]),
        )
    report = LoadReport(display, rows_read, len(problems), skipped, tuple(reasons))
    return problems, report


def load_math_problems(
    source: str | os.PathLike,
    *,
    split: str = "train",
    problem_key: str = "problem",
    answer_key: str = "answer",
    answers_key: str = "answers",
    id_key: str = "id",
    on_bad_row: Literal["error", "skip"] = "error",
    max_rows: int | None = None,
) -> list[MathProblem]:
    """Load problems from a local file or hub dataset (see the module docstring for formats and rules).

    ``max_rows`` stops reading once that many problems are loaded. ``split`` only applies to hub datasets.
    """
    problems, _ = load_math_problems_with_report(
        source,
        split=split,
        problem_key=problem_key,
        answer_key=answer_key,
        answers_key=answers_key,
        id_key=id_key,
        on_bad_row=on_bad_row,
        max_rows=max_rows,
    )
    return problems


def read_rows(
    source: str | os.PathLike, *, split: str = "train", hub_config: str | None = None
) -> tuple[str, str, list[tuple[str, Any]]]:
    """The rows of a local ``.json``/``.jsonl``/``.parquet`` file or a hub dataset (``datasets.load_dataset(source,
    hub_config, split=split)``), read as for math problems but kept as they are, for an env with rows of its own
    (``reward_fn``): ``(display name, id stem, [(where, row)])``, ``where`` naming the row (and line) for messages.
    A JSON line that does not parse raises :class:`DataError` naming it."""
    display, stem, rows = _open_source(source, split, hub_config)
    out: list[tuple[str, Any]] = []
    for _, where, value in rows:
        if isinstance(value, _BadRow):
            raise DataError(f"{display}: {where}: {value}")
        out.append((where, value))
    return display, stem, out


# --------------------------------------------------------------------------------------------------------------
# Iterating a finite pool of queries, epoch by epoch (shared by the finite-pool environments)
# --------------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Shard:
    """Which queries of each epoch's global order one EnvRunner serves.

    The global order of an epoch is cut into *steps* of ``batch_size`` queries (one training iteration's queries
    over all runners); this shard takes the ``count`` positions ``start .. start + count - 1`` of every step. The
    runners' ``(start, count)`` tile ``0 .. batch_size - 1``, so one step's queries over all runners are one
    contiguous slice of the permutation: distinct within the step, each query at most once per epoch.

    Drop-last: an epoch has ``size // batch_size`` steps; the last ``size % batch_size`` positions of each epoch's
    permutation are served by nobody that epoch. The permutation changes every epoch, so the skipped queries are
    different ones each time (a query is skipped in a given epoch with probability ``(size % batch_size) / size``).
    No step spans two epochs, so no query is served twice in one iteration.

    ``Shard()`` (one step = one query) is the unsharded order: every query once per epoch, nothing dropped.
    """

    batch_size: int = 1
    start: int = 0
    count: int = 1

    def __post_init__(self) -> None:
        for name in ("batch_size", "start", "count"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"shard {name} must be an int, got {type(value).__name__}")
        if (
            self.batch_size < 1
            or self.count < 1
            or self.start < 0
            or self.start + self.count > self.batch_size
        ):
            raise ValueError(
                f"a shard takes positions start..start+count-1 of each step of batch_size queries with "
                f"0 <= start, 1 <= count and start + count <= batch_size; got batch_size={self.batch_size}, "
                f"start={self.start}, count={self.count}"
            )

    @classmethod
    def of(cls, value: Shard | Mapping[str, Any] | None) -> Shard:
        """A ``Shard`` from itself, a mapping with its fields (env configs are plain dicts), or None."""
        if value is None:
            return cls()
        if isinstance(value, Shard):
            return value
        if not isinstance(value, Mapping):
            raise TypeError(
                f"shard must be a mapping with batch_size, start, count; got {type(value).__name__}"
            )
        unknown = sorted(set(value) - {"batch_size", "start", "count"})
        if unknown:
            raise ValueError(f"unknown shard key(s) {unknown}; expected batch_size, start, count")
        return cls(**dict(value))

    def as_dict(self) -> dict[str, int]:
        return {"batch_size": self.batch_size, "start": self.start, "count": self.count}


def runner_shards(batch_size: int, num_runners: int) -> list[Shard]:
    """The shards of ``num_runners`` EnvRunners sharing steps of ``batch_size`` queries, in worker order.

    Runner ``i`` (0-based) serves ``batch_size // num_runners`` queries per step, plus one for the first
    ``batch_size % num_runners`` runners: the same split the algorithm asks its runners for
    (``RolloutCoordinator.query_shares`` with every runner healthy), so a step is exactly one iteration's batch.
    """
    if num_runners < 1 or batch_size < num_runners:
        raise ValueError(
            f"{num_runners} runner(s) cannot share steps of {batch_size} queries (need 1 <= runners <= batch_size)"
        )
    shards, start = [], 0
    for i in range(num_runners):
        count = batch_size // num_runners + (i < batch_size % num_runners)
        shards.append(Shard(batch_size, start, count))
        start += count
    return shards


def check_count(name: str, value: Any, *, minimum: int, optional: bool = True) -> None:
    """Refuse a count (of tokens, say) that is not an integer >= ``minimum`` (or None when ``optional``) with a
    ValueError naming it: a string fails with a bare ``'<=' not supported`` TypeError, and NaN, a float or a bool
    pass ``<= 0`` and go wrong later, silently."""
    if value is None and optional:
        return
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        wanted = f"an integer >= {minimum}" + (" or None" if optional else "")
        raise ValueError(f"{name} must be {wanted}, got {type(value).__name__} {value!r}")


def _int_seed(seed: Any) -> int:
    """``int(seed)``, or an error naming ``seed`` (``int("abc")``'s own message names no key)."""
    try:
        return int(seed)
    except (TypeError, ValueError) as exc:
        raise type(exc)(f"seed must be an integer, got {type(seed).__name__} {seed!r}") from None


def resharded_cursor(cursor: int, saved: Shard, shard: Shard) -> int:
    """The cursor in ``shard`` at the start of the step where ``cursor`` of ``saved`` stands: both shards cut each
    epoch's order into the same steps (one iteration's queries over all runners), so a run resumed on another number
    of EnvRunners serves, from that step on, exactly the queries it would have served on the old number. A
    ValueError when the steps differ (another ``queries_per_iteration``) or ``cursor`` is inside a step (a runner
    stopped mid-step: no shipped loop saves one so)."""
    if saved.batch_size != shard.batch_size:
        raise ValueError(
            f"state is for shard {saved.as_dict()}, this environment serves shard {shard.as_dict()}: steps of "
            f"{saved.batch_size} and {shard.batch_size} queries (a checkpoint resumes with the same "
            f"queries_per_iteration; another number of EnvRunners is fine)"
        )
    step, offset = divmod(cursor, saved.count)
    if offset:
        raise ValueError(
            f"state cursor={cursor} of shard {saved.as_dict()} stands inside a step: it cannot move to shard "
            f"{shard.as_dict()} (resume with the number of EnvRunners it was saved with)"
        )
    return step * shard.count


class QueryOrder:
    """Epoch-wise order over ``size`` queries, optionally one shard of a global order (see :class:`Shard`).

    Every epoch's global order is a permutation seeded with ``seed * 100_003 + epoch`` (identity when not
    shuffling): the same on every runner that has the same ``seed``, so runners that take disjoint shards of it
    together serve each query at most once per epoch. (The multiplier keeps orders with seeds a small offset apart
    from replaying each other a few epochs later, as plain ``seed + epoch`` would.)

    ``epoch`` counts completed passes over this shard's part of the global order (it becomes 1 as soon as the last
    query of the first pass is served); ``cursor`` is how many queries this shard has served in the current epoch.
    Both are the checkpointed state, with ``seed``, ``size`` and the shard.
    """

    def __init__(
        self,
        size: int,
        *,
        seed: int = 0,
        shuffle: bool = True,
        shard: Shard | Mapping[str, Any] | None = None,
    ) -> None:
        if size < 1:
            raise ValueError(f"a query pool needs at least one query, got {size}")
        self.size = size
        self.seed = _int_seed(seed)
        # bool("false") is True: a string (an env_config written by hand) must not turn shuffling on silently.
        if not isinstance(shuffle, bool | np.bool_):
            raise TypeError(f"shuffle must be true or false, got {type(shuffle).__name__} {shuffle!r}")
        self.shuffle = bool(shuffle)
        self.shard = Shard.of(shard)
        self.steps_per_epoch = size // self.shard.batch_size
        if self.steps_per_epoch < 1:
            raise ValueError(
                f"a pool of {size} queries is smaller than one step of {self.shard.batch_size} queries "
                f"(the queries of one iteration over all EnvRunners): use more data or fewer queries per iteration"
            )
        self.per_epoch = self.steps_per_epoch * self.shard.count  # queries this shard serves per epoch
        self.cursor = 0
        self.epoch = 0
        self._order: list[int] | None = None
        self._order_epoch = -1

    def global_order(self, epoch: int) -> list[int]:
        """The permutation of epoch ``epoch`` shared by all shards (its last ``size % batch_size`` are skipped)."""
        order = list(range(self.size))
        if self.shuffle:
            random.Random(self.seed * 100_003 + epoch).shuffle(order)
        return order

    def _permutation(self) -> list[int]:
        if self._order is None or self._order_epoch != self.epoch:
            self._order, self._order_epoch = self.global_order(self.epoch), self.epoch
        return self._order

    def position(self, cursor: int) -> int:
        """Position in the epoch's global order of this shard's ``cursor``-th query."""
        step, offset = divmod(cursor, self.shard.count)
        return step * self.shard.batch_size + self.shard.start + offset

    def next(self) -> int:
        """Index of the next query; advances the cursor (and the epoch after the last query of a pass)."""
        index = self._permutation()[self.position(self.cursor)]
        self.cursor += 1
        if self.cursor == self.per_epoch:
            self.cursor = 0
            self.epoch += 1
        return index

    def restart(self, seed: int) -> None:
        self.seed, self.cursor, self.epoch = _int_seed(seed), 0, 0
        self._order = None

    def state(self) -> dict[str, Any]:
        return {
            "cursor": self.cursor,
            "epoch": self.epoch,
            "seed": self.seed,
            "size": self.size,
            "shard": self.shard.as_dict(),
        }

    def set_state(self, state: Mapping[str, Any]) -> None:
        """Resume the order a :meth:`state` describes; a ValueError naming what does not fit (another pool or
        position, a step of another size, or a damaged state: not a mapping, a count that is not a whole number).

        A state of another shard of the same steps (a run resumed on another number of EnvRunners) resumes at the
        step it stands at, at the start of this shard's part of it (:func:`resharded_cursor`)."""
        if not isinstance(state, Mapping):
            raise ValueError(f"a data order state must be a mapping, got {type(state).__name__}")
        for key in ("size", "cursor", "epoch", "seed"):
            value = state.get(key, 0)
            if isinstance(value, bool) or not isinstance(value, numbers.Integral):
                raise ValueError(f"data order state {key!r} must be a whole number, got {value!r}")
        if "cursor" not in state or "epoch" not in state:
            raise ValueError(f"data order state lacks 'cursor' or 'epoch': {sorted(state)}")
        size = int(state.get("size", self.size))
        if size != self.size:
            raise ValueError(f"state is for a pool of {size} queries, this environment has {self.size}")
        # States written before sharding existed have no shard: they are unsharded orders.
        shard = Shard.of(state.get("shard"))
        cursor, epoch = int(state["cursor"]), int(state["epoch"])
        if shard != self.shard:
            cursor = resharded_cursor(cursor, shard, self.shard)
        if not 0 <= cursor < self.per_epoch or epoch < 0:
            raise ValueError(
                f"invalid state cursor={cursor} epoch={epoch} for a shard serving {self.per_epoch} queries per epoch"
            )
        self.seed = int(state.get("seed", self.seed))
        self.cursor, self.epoch = cursor, epoch
        self._order = None


RESET_OPTIONS = ("query_id", "user_content")


def parse_reset_options(options: Mapping[str, Any] | None) -> tuple[str | None, str | None]:
    """``(query_id, user_content)`` from ``reset(options=...)``; rejects unknown keys and ``user_content``
    without ``query_id``."""
    if not options:
        return None, None
    unknown = sorted(set(options) - set(RESET_OPTIONS))
    if unknown:
        raise ValueError(f"unknown reset option(s) {unknown}; supported: {list(RESET_OPTIONS)}")
    query_id, user_content = options.get("query_id"), options.get("user_content")
    if user_content is not None and query_id is None:
        raise ValueError(
            "reset option 'user_content' needs 'query_id' (the query whose gold answer grades it)"
        )
    if query_id is not None and not isinstance(query_id, str):
        raise TypeError(f"query_id must be a string, got {type(query_id).__name__}")
    if user_content is not None and not isinstance(user_content, str):
        raise TypeError(f"user_content must be a string, got {type(user_content).__name__}")
    return query_id, user_content
