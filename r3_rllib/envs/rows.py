"""The rows of a dataset for a task of one's own (the ``reward_fn`` env): read from a file, a hub dataset, a
``datasets.Dataset`` or a list of dicts; given stable ids; split into train and held-out rows; turned into prompts.

- **Sources**: a local ``.json``/``.jsonl``/``.parquet`` path or a hub dataset name (read as
  :func:`~r3_rllib.envs.data.read_rows` reads them; ``hub_config`` is the dataset's configuration, e.g. ``"main"``
  of ``openai/gsm8k``), a list of dicts, a ``datasets.Dataset`` or a pandas ``DataFrame``. Every row must be a
  mapping of columns.
- **Ids**: the ``id_key`` column (a string or an integer) when the row has it, else ``"<name>:<row>"`` with the
  file stem (the hub name's last part; ``row`` for rows given in memory, ``heldout`` for held-out ones) and the
  0-based row of the source: stable across processes and runs, and across the split (a carved held-out row keeps
  its id). A duplicate id is a :class:`~r3_rllib.envs.data.DataError` naming both rows.
- **Split** (:func:`split_rows`): the held-out rows are ``heldout`` when given, else ``data["test"]`` when ``data``
  is a ``{"train": ..., "test": ...}`` mapping (a ``datasets.DatasetDict`` is one), else ``test_size`` rows carved
  from the data: an int is a number of rows, a float in (0, 1) a fraction (rounded up, as
  ``datasets.Dataset.train_test_split`` does), 0 none; default 0.1. The carved rows are a fixed draw
  (``split_seed``, an integer), so every EnvRunner and the held-out env carve the same split, whatever the run's
  seed.
- **Prompts** (:func:`format_prompt`): ``prompt`` is a column name (a string column, or a list of chat messages
  ``[{"role": ..., "content": ...}]`` as TRL's conversational datasets hold), a template over the row's columns
  (``"Q: {question}\\nA:"``, Python's ``str.format``: write a literal brace twice, ``{{}}``), or a callable
  ``prompt(row) -> str | messages``.
"""

from __future__ import annotations

import math
import numbers
import os
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from r3_rllib.envs.data import DataError, duplicate_key, invalid_text, read_rows

#: The held-out share carved from the data when neither ``heldout`` nor a ``test`` split is given.
DEFAULT_TEST_SIZE = 0.1
Messages = list[dict[str, str]]
PromptSpec = str | Callable[[Mapping[str, Any]], Any]


@dataclass(frozen=True)
class Row:
    """One row: its id, its columns, and where it came from (for messages)."""

    id: str
    values: dict[str, Any]
    where: str


def _is_source(data: Any) -> bool:
    return isinstance(data, str | os.PathLike)


def _in_memory_rows(data: Any) -> list[Any] | None:
    """The rows of a list of dicts, a ``datasets.Dataset`` or a pandas ``DataFrame``; None for anything else."""
    if hasattr(data, "to_dict") and hasattr(data, "columns") and not isinstance(data, Mapping):  # a DataFrame
        return list(data.to_dict("records"))
    if hasattr(data, "column_names") and hasattr(data, "__iter__"):  # a datasets.Dataset
        return list(data)
    if isinstance(data, Sequence) and not isinstance(data, str | bytes):
        return list(data)
    return None


def load_rows(
    data: Any,
    *,
    name: str = "row",
    hub_split: str = "train",
    hub_config: str | None = None,
    id_key: str = "id",
) -> list[Row]:
    """The rows of one source (see the module), with their ids; ``name`` stems the ids of rows given in memory."""
    if _is_source(data):
        display, stem, located = read_rows(data, split=hub_split, hub_config=hub_config)
    else:
        values = _in_memory_rows(data)
        if values is None:
            raise TypeError(
                "data must be a .json/.jsonl/.parquet path, a hub dataset name, a list of dicts, a datasets.Dataset, "
                f"or a {{'train': ..., 'test': ...}} mapping of them; got {type(data).__name__}"
            )
        display, stem, located = f"{name}s", name, [(f"row {i}", v) for i, v in enumerate(values)]
    rows: list[Row] = []
    first_seen: dict[str, str] = {}
    for index, (where, value) in enumerate(located):
        place = f"{display}: {where}"
        if not isinstance(value, Mapping):
            raise DataError(f"{place}: expected a mapping of columns, got {type(value).__name__}")
        twice = duplicate_key(value)
        if twice is not None:
            raise DataError(f"{place}: field {twice!r}: the key appears twice in the row")
        _check_row_text(value, place)
        qid = _row_id(value, id_key, f"{stem}:{index}", place)
        if qid in first_seen:
            raise DataError(f"{place}: duplicate id {qid!r} (first in {first_seen[qid]})")
        first_seen[qid] = place
        rows.append(Row(qid, dict(value), place))
    if not rows:
        raise DataError(f"{display}: no rows")
    return rows


def _bad_text(value: Any) -> str | None:
    """Why a string in ``value`` (a cell: a string, or lists and mappings of them) is not valid Unicode text.
    Walked with a stack, not recursion: a cell nested thousands deep must not raise a RecursionError."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            reason = invalid_text(item)
            if reason is not None:
                return reason
        elif isinstance(item, Mapping):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list | tuple):
            stack.extend(item)
    return None


def _check_row_text(row: Mapping[str, Any], place: str) -> None:
    """Refuse a row with a lone surrogate in any column now, naming it, rather than in the tokenizer later."""
    for column, cell in row.items():
        reason = _bad_text(column) or _bad_text(cell)
        if reason is not None:
            raise DataError(f"{place}: field {column!r}: {reason}")


def _row_id(row: Mapping[str, Any], id_key: str, default: str, place: str) -> str:
    raw = row.get(id_key)
    if raw is None:
        return default
    if isinstance(raw, bool) or not isinstance(raw, str | numbers.Integral):
        raise DataError(
            f"{place}: field {id_key!r}: expected a string or integer id, got {type(raw).__name__}"
        )
    qid = str(raw).strip()
    if not qid:
        raise DataError(f"{place}: field {id_key!r}: empty id")
    return qid


def held_out_count(test_size: int | float, n: int) -> int:
    """Rows carved out of ``n`` for ``test_size`` (rows, or a fraction rounded up); a ValueError names a value
    that is not a count or a fraction, or that leaves no training row."""
    if isinstance(test_size, bool) or not isinstance(test_size, numbers.Real):
        raise ValueError(f"test_size must be a number of rows or a fraction in [0, 1), got {test_size!r}")
    if isinstance(test_size, numbers.Integral):
        k = int(test_size)
    elif 0.0 <= float(test_size) < 1.0:
        k = math.ceil(float(test_size) * n)
    else:
        raise ValueError(f"test_size as a fraction must be in [0, 1), got {test_size!r}")
    if k < 0 or k >= n:
        raise ValueError(
            f"test_size={test_size!r} holds out {k} of {n} rows: at least one must stay for training"
        )
    return k


def carve(n: int, test_size: int | float, split_seed: int) -> tuple[list[int], list[int]]:
    """``(train, held-out)`` row indices, each in row order: a fixed draw of ``held_out_count`` rows."""
    k = held_out_count(test_size, n)
    drawn = set(random.Random(split_seed).sample(range(n), k))
    return [i for i in range(n) if i not in drawn], sorted(drawn)


def split_rows(
    data: Any,
    *,
    split: str,
    test_size: int | float | None = None,
    heldout: Any = None,
    split_seed: int = 0,
    hub_config: str | None = None,
    id_key: str = "id",
) -> list[Row]:
    """The rows of ``split`` (``"train"`` or ``"test"``, the held-out rows): see the module for where each comes
    from. Asking for ``"test"`` when nothing is held out is a DataError saying how to hold rows out."""
    if split not in ("train", "test"):
        raise ValueError(f"split must be 'train' or 'test' (the held-out rows), got {split!r}")
    split_seed = _checked_split_seed(split_seed)
    if isinstance(data, Mapping):
        unknown = sorted(set(data) - {"train", "test"})
        if unknown or "train" not in data:
            raise ValueError(
                f"data as a mapping holds splits 'train' and optionally 'test', got {sorted(data)}; give another "
                "held-out split as heldout=..."
            )
        if "test" in data:
            heldout = _only_one_heldout(heldout, test_size, data["test"], "data['test']")
        data = data["train"]
    elif heldout is not None:
        _only_one_heldout(None, test_size, heldout, "heldout")
    if heldout is not None:
        source, name, hub_split = (data, "row", "train") if split == "train" else (heldout, "heldout", "test")
        return load_rows(source, name=name, hub_split=hub_split, hub_config=hub_config, id_key=id_key)
    rows = load_rows(data, hub_config=hub_config, id_key=id_key)
    train, test = carve(len(rows), DEFAULT_TEST_SIZE if test_size is None else test_size, split_seed)
    if split == "test" and not test:
        raise DataError(
            f"split 'test' (the held-out rows) asked, but test_size={test_size!r} holds none out of {len(rows)} "
            "rows: set test_size > 0 or give heldout=..., or turn held-out evaluation off (eval_interval=0)"
        )
    return [rows[i] for i in (train if split == "train" else test)]


def _checked_split_seed(split_seed: Any) -> int:
    """``split_seed`` as an int (a numpy integer too, which ``random.Random`` refuses), or a ValueError naming it:
    ``random.Random([1])`` raises a TypeError naming no option, and a string or float seed would draw a split of
    its own silently."""
    if isinstance(split_seed, bool) or not isinstance(split_seed, numbers.Integral):
        raise ValueError(
            f"split_seed (the draw of the held-out rows) must be an integer, got {type(split_seed).__name__} "
            f"{split_seed!r}"
        )
    return int(split_seed)


def _only_one_heldout(heldout: Any, test_size: Any, given: Any, where: str) -> Any:
    if heldout is not None or test_size is not None:
        other = "heldout" if heldout is not None else "test_size"
        raise ValueError(f"held-out rows come from {where}; {other} must not be given as well")
    return given


def format_prompt(spec: PromptSpec, row: Row) -> str | Messages:
    """The prompt of ``row`` under ``spec`` (a column, a template or a callable; see the module): a string, or a
    list of chat messages. A missing column or a value of the wrong type is a DataError naming the row."""
    values = row.values
    if callable(spec):
        value = _call_prompt(spec, row)
    elif not isinstance(spec, str) or not spec:
        raise TypeError(f"prompt must be a column name, a template or a callable, got {spec!r}")
    elif "{" in spec:
        value = _fill_template(spec, row)
    elif spec not in values:
        raise DataError(
            f"{row.where}: prompt {spec!r} is neither a column of the row (columns: {sorted(values)}) nor a "
            "template (a template names columns in braces: '{question}')"
        )
    else:
        value = values[spec]
    return _checked_prompt(value, row)


def _call_prompt(spec: Callable[[Mapping[str, Any]], Any], row: Row) -> Any:
    """``spec(row)``; an error of the user's callable is a DataError naming the row (chained, so its traceback
    stays), not a bare ``KeyError: 'missing'`` from somewhere in the data."""
    try:
        return spec(row.values)
    except Exception as e:
        name = getattr(spec, "__qualname__", None) or type(spec).__name__
        raise DataError(f"{row.where}: prompt callable {name} raised {type(e).__name__}: {e}") from e


def _fill_template(spec: str, row: Row) -> str:
    """``spec.format_map(row)``, every way it can fail being a DataError naming the row and the template."""
    values = row.values
    try:
        return spec.format_map(values)
    except KeyError as e:
        raise DataError(
            f"{row.where}: prompt template {spec!r} names column {e.args[0]!r}, which the row lacks; "
            f"columns: {sorted(values)}"
        ) from None
    except (ValueError, IndexError, AttributeError, TypeError) as e:
        # TypeError: "{q[x]}" indexes a string column with a str; the others: a stray brace, a bad field spec.
        hint = " (write a literal brace as '{{')" if isinstance(e, ValueError) else ""
        raise DataError(f"{row.where}: prompt template {spec!r}: {type(e).__name__}: {e}{hint}") from None


def _checked_prompt(value: Any, row: Row) -> str | Messages:
    if isinstance(value, str):
        if not value.strip():
            raise DataError(f"{row.where}: the prompt is empty")
        reason = invalid_text(value)  # a callable's output is not checked at load time
        if reason is not None:
            raise DataError(f"{row.where}: the prompt is {reason}")
        return value
    if isinstance(value, Sequence) and value and all(_is_message(m) for m in value):
        reason = _bad_text([m["content"] for m in value])
        if reason is not None:
            raise DataError(f"{row.where}: a prompt message is {reason}")
        return [{"role": m["role"], "content": m["content"]} for m in value]
    raise DataError(
        f"{row.where}: a prompt is a string or a list of {{'role', 'content'}} messages, got {type(value).__name__}"
    )


def _is_message(m: Any) -> bool:
    return isinstance(m, Mapping) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)


def user_text(prompt: str | Messages) -> str:
    """The user turn of a prompt: the string itself, or the last user message's content."""
    if isinstance(prompt, str):
        return prompt
    if not prompt:
        raise ValueError("a prompt is a string or a non-empty list of messages, got an empty list")
    users = [m["content"] for m in prompt if m["role"] == "user"]
    return users[-1] if users else prompt[-1]["content"]
