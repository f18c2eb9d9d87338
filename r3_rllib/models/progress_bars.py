"""transformers' progress bars off around the package's own model loads and saves.

transformers 5 draws a tqdm bar for every ``from_pretrained`` ("Loading weights") and ``save_pretrained`` ("Writing
model shards"), with no argument to turn it off per call. The package loads the policy in every EnvRunner and
learner at each start and writes it at each export: from Ray actors the bars reach the console as two carriage-
return lines per process, prefixed with the actor's name, and say nothing about the run. Only the calls wrapped in
:func:`no_progress_bars` lose them; the switch is restored after (a download's bar elsewhere is untouched).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator


@contextlib.contextmanager
def no_progress_bars() -> Iterator[None]:
    """While inside, transformers (and huggingface_hub) draw no progress bars; restored on exit."""
    from transformers.utils import logging as hf_logging

    was_enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_enabled:
            hf_logging.enable_progress_bar()
