"""Per-iteration metric groups that report a metric the iteration did not measure as absent, not NaN.

RLlib's MetricsLogger reports a key logged in an earlier iteration and not in this one as NaN (``reduce="mean"``
over no value); TensorBoard, W&B, MLflow and Tune's result dicts then show that NaN as if it had been measured. A
group logged with :func:`log_group` holds the iteration's own values alone: its keys of earlier iterations are
deleted first, so a metric the iteration did not measure is absent from its result, and one it measured reports its
value as before (a measured NaN stays NaN). A group whose values are logged one by one is cleared with
:func:`clear_groups` before the iteration logs them. Ray-free: ``logger`` is anything with MetricsLogger's
``delete(*key, key_error=...)`` and ``log_dict(values, key=..., reduce=..., window=...)``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

#: A group's key: its name, or a tuple of names for a nested group (``("r2po", "A")``).
GroupKey = str | tuple[str, ...]


def clear_groups(logger: Any, *keys: GroupKey) -> None:
    """Delete the groups ``keys`` from ``logger`` with every value logged under them (a group not there is passed
    over): the iteration's result holds only what is logged under them afterwards."""
    for key in keys:
        logger.delete(*((key,) if isinstance(key, str) else key), key_error=False)


def log_group(logger: Any, key: GroupKey, metrics: Mapping[str, Any]) -> None:
    """Log ``metrics`` (numbers, or dicts of them for subgroups) under ``key`` as the iteration's only values of that
    group (:func:`clear_groups` first; each reported as logged, ``reduce="mean"`` over ``window=1``). Empty
    ``metrics``: the group is absent from the iteration's result."""
    clear_groups(logger, key)
    if metrics:
        logger.log_dict(dict(metrics), key=key, reduce="mean", window=1)
