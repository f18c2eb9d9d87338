"""MKL's strict conditional numerical reproducibility (CNR) in this process.

``cpu_threads='auto'`` moves a learner's torch threads while it updates (core/threads.py), so a seeded run repeats
only if every product gives the same bits at every thread count. MKL without strict CNR rounds some small shapes
differently at 1 and 2 threads (BENCHMARKS.md section 40). Importing ``r3_rllib`` sets ``MKL_CBWR=AUTO,STRICT``, but
MKL reads it once, at its first call: a torch product run before the import leaves this process in MKL's default
mode. :func:`mkl_strict` reads the mode MKL runs in, through the MKL service functions that torch's CPU library
exports; builds without MKL (ARM, or torch built without it) have none, and the answer is ``None``.
"""

from __future__ import annotations

import ctypes
import functools
import logging
from pathlib import Path

logger = logging.getLogger(__name__)

#: mkl_service.h: MKL_CBWR_ALL (the whole mode word) and the MKL_CBWR_STRICT flag in it.
_CBWR_ALL = ~0
_CBWR_STRICT = 0x10000


@functools.cache
def _cbwr_get():
    """MKL's ``mkl_serv_cbwr_get`` from torch's CPU library, or None where torch has no MKL."""
    import torch

    for name in ("libtorch_cpu.so", "libtorch_cpu.dylib"):
        path = Path(torch.__file__).parent / "lib" / name
        if path.exists():
            try:
                get = ctypes.CDLL(str(path)).mkl_serv_cbwr_get
            except (OSError, AttributeError):
                return None
            get.argtypes, get.restype = [ctypes.c_int], ctypes.c_int
            return get
    return None


def mkl_strict() -> bool | None:
    """Whether MKL runs with strict CNR in this process; None where torch has no MKL. The first reading starts
    MKL's mode from ``MKL_CBWR`` if no MKL call has yet."""
    get = _cbwr_get()
    if get is None:
        return None
    return bool(get(_CBWR_ALL) & _CBWR_STRICT)


@functools.cache
def warn_if_mkl_not_strict(who: str) -> bool:
    """Warn (once per ``who``) when MKL runs without strict CNR; True if it warned."""
    if mkl_strict() is not False:
        return False
    logger.warning(
        "%s changes its torch threads while it runs (cpu_threads), but MKL in this process runs without strict "
        "numerical reproducibility: a torch product ran before r3_rllib was imported (MKL reads MKL_CBWR at its "
        "first call), or MKL_CBWR was set without STRICT. Seeded runs can then differ in their last bits with the "
        "thread count. Import r3_rllib first, or set MKL_CBWR=AUTO,STRICT in the environment.",
        who,
    )
    return True
