"""What `R3` itself prints: one progress line per iteration, and none of the start-up notices that do not apply to it.

:class:`R3Console` is a base of `R3` (before RLlib's ``Algorithm``). It

- starts Ray the package's way (:func:`~r3_rllib.ray_session.init_ray`: a private cluster with token
  authentication, the token file readable by its owner only, no dashboard) when an algorithm is set up in a
  process without Ray, as a plain ``config.build_algo()`` is (RLlib's first remote call would start a default
  Ray, with Ray's notice inviting users to switch token authentication off); a Tune trial or a caller's own
  ``ray.init`` has started it already;
- drops two notices Tune's ``Trainable.__init__`` logs while the algorithm is built (:func:`quiet_trainable_start`);
- prints the iteration's progress line after each ``train()`` (``log_result``; :mod:`.progress`).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Mapping
from typing import Any

from r3_rllib.algorithms.r3.progress import format_progress_line
from r3_rllib.ray_session import init_ray

#: (logger, start of the message) of the notices Tune's Trainable.__init__ logs that do not apply to R3. Both come
#: from Ray's own code, run inside RLlib's Algorithm constructor, so they are filtered there and only there:
#: - Tune's system monitor (``log_sys_usage``, on by default) reads CPU and RAM with psutil, and GPU load with
#:   GPUtil, an optional package Ray does not install (unmaintained since 2018). Without it the ``perf/`` metrics
#:   lack GPU load and every algorithm start says so; the runners' and learners' GPUs are not this process's.
#: - "Trainable.setup took N seconds ... consider setting reuse_actors=True": an algorithm whose setup starts
#:   runners and learners always takes that long, and reusing actors needs ``Trainable.reset_config``, which
#:   RLlib's Algorithm does not implement: the advice changes nothing (and a built algorithm is no Tune trial).
TRAINABLE_START_NOTICES: tuple[tuple[str, str], ...] = (
    ("ray.tune.utils.util", "Install gputil for GPU system monitoring."),
    ("ray.tune.trainable.trainable", "Trainable.setup took "),
)


class _DropMessages(logging.Filter):
    """Drops the records whose message starts with one of ``prefixes``."""

    def __init__(self, prefixes: tuple[str, ...]) -> None:
        super().__init__()
        self.prefixes = prefixes

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(self.prefixes)


@contextlib.contextmanager
def quiet_trainable_start() -> Iterator[None]:
    """While inside, the notices of :data:`TRAINABLE_START_NOTICES` are dropped (every other record passes)."""
    added = []
    for name in dict.fromkeys(name for name, _ in TRAINABLE_START_NOTICES):
        prefixes = tuple(text for logger_name, text in TRAINABLE_START_NOTICES if logger_name == name)
        log_filter = _DropMessages(prefixes)
        logging.getLogger(name).addFilter(log_filter)
        added.append((name, log_filter))
    try:
        yield
    finally:
        for name, log_filter in added:
            logging.getLogger(name).removeFilter(log_filter)


def print_progress(algo: Any, result: Mapping[str, Any]) -> None:
    """Print the iteration's progress line when ``config.progress`` is on and ``algo`` is not a Tune trial (the
    driver prints a trial's lines: a trial actor's output does not reach the console)."""
    config = algo.config
    if not getattr(config, "progress", False) or getattr(algo, "_storage", None) is not None:
        return
    print(format_progress_line(result, getattr(config, "progress_total_iterations", None)), flush=True)


class R3Console:
    """`R3`'s console behaviour (see the module docstring); a base class placed before RLlib's ``Algorithm``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        with quiet_trainable_start():
            super().__init__(*args, **kwargs)

    def setup(self, config: Any) -> None:
        # After RLlib validated the config (a bad one is refused before Ray starts). Does nothing when Ray is up in
        # this process already (a Tune trial, the caller's ray.init).
        init_ray()
        super().setup(config)

    def log_result(self, result: dict) -> None:
        super().log_result(result)  # RLlib's on_train_result callbacks first: they may change the result
        print_progress(self, result)
