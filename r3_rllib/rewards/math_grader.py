"""Rule-based grading of math answers: the last ``\\boxed{...}`` of a response against gold answer(s).

Pipeline for one response:

1. Reasoning is ignored: when the response contains ``</think>``, only the text after the last ``</think>`` is
   graded. A ``<think>`` that is never closed (or, with ``think_in_prompt=True``, a response with no ``</think>``
   at all, because the prompt already opened the think block) is wrong with reason ``"unclosed_think"``.
2. The answer is the content of the LAST ``\\boxed{...}`` / ``\\fbox{...}`` (balanced braces, escaped ``\\{``
   ``\\}`` allowed) or ``\\boxed 5``. None: ``"no_boxed"``; an unbalanced or empty box: ``"unparsable"``.
3. Fast path (no sympy): equal after a meaning-preserving normalisation (spaces, ``\\left``/``\\right``,
   ``\\dfrac``/``\\tfrac``, thin spaces, a trailing period) is correct; two different integer literals are wrong.
4. Otherwise math-verify decides equivalence (``\\frac{1}{2}`` = ``0.5`` = ``1/2``, ``x=3`` = ``3``, sets,
   intervals, ...). Gold and answer are both bare expressions, so both are wrapped in ``$...$`` before
   ``math_verify.parse`` (measured on the 11k shared MATH/AIME/DeepScaleR golds: every non-empty gold parses and
   verifies against itself; bare strings without the wrapper fail on ~9 %).

math-verify's own timeouts use ``signal.alarm``, which only works in the main thread of a process, and sympy can
run for minutes (``9^{9^{9^{9}}}``) or crash on deep nesting. So step 4 runs in one persistent worker subprocess
per :class:`MathGrader` with math-verify's timeouts switched off and a hard per-item timeout enforced here: on
timeout the worker is killed (and a fresh one started in the background), the item gets ``"timeout"``, and the
rest of the batch continues. Grading never raises and never hangs; it works from any thread, inside Ray actors
and inside daemonic processes.

The worker is a plain ``python <this file>`` subprocess talking pickled messages over two pipes, rather than a
``multiprocessing`` spawn/forkserver child: those re-import the parent's ``__main__`` module in the child (which
re-runs unguarded user scripts) and cannot be started from daemonic processes. This file therefore imports only
the standard library at module level, and the worker imports nothing from the package.

Reasons: ``correct``, ``wrong``, ``no_boxed``, ``unclosed_think``, ``unparsable`` (no usable answer in the box),
``too_long`` (boxed answer longer than ``max_answer_chars``), ``gold_unparsable`` (math-verify could not read the
gold and the strings differ), ``timeout``, ``error`` (math-verify raised, the worker crashed or could not start).
"""

from __future__ import annotations

import atexit
import logging
import math
import numbers
import os
import re
import subprocess
import sys
import threading
import time
import weakref
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection

logger = logging.getLogger(__name__)

REASONS = (
    "correct",
    "wrong",
    "no_boxed",
    "unclosed_think",
    "unparsable",
    "too_long",
    "gold_unparsable",
    "timeout",
    "error",
)

Gold = str | Sequence[str]


@dataclass(frozen=True)
class GradeResult:
    correct: bool
    reason: str


#: The longest timeout a grader takes, in seconds (a day). Past ~2.1e6 s the waits on the worker's pipe overflow
#: (``Connection.poll`` raises OverflowError), and no math answer needs more than a day.
MAX_TIMEOUT_S = 86_400


def check_timeout(name: str, value: object) -> float:
    """``value`` as a float when it is a finite number of seconds > 0 and <= :data:`MAX_TIMEOUT_S`; else a
    ValueError naming ``name``. Checked when a grader or env is built: NaN passes ``<= 0`` and then fails inside
    ``selectors`` at the first grade, and a string fails with a bare TypeError."""
    if (
        isinstance(value, bool)
        or not isinstance(value, numbers.Real)
        or not (math.isfinite(value) and 0 < value <= MAX_TIMEOUT_S)
    ):
        raise ValueError(
            f"{name} must be a finite number > 0 and <= {MAX_TIMEOUT_S} (seconds), got {value!r}"
        )
    return float(value)


# --------------------------------------------------------------------------------------------------------------
# Answer extraction (pure, linear time: responses can be 10^6 characters)
# --------------------------------------------------------------------------------------------------------------
_BOX_COMMANDS = ("\\boxed", "\\fbox")


def strip_reasoning(response: str, *, think_in_prompt: bool = False) -> str | None:
    """The part of ``response`` after the last ``</think>``; ``None`` when a think block is left open."""
    end = response.rfind("</think>")
    if end >= 0:
        return response[end + len("</think>") :]
    if think_in_prompt or "<think>" in response:
        return None
    return response


def _box_argument(text: str, start: int) -> str | None:
    """Argument of a box command whose name ends at ``start``; ``None`` if unbalanced."""
    n = len(text)
    i = start
    while i < n and text[i] in " \t\r\n":
        i += 1
    if i < n and text[i] == "{":
        depth = 0
        j = i
        while j < n:
            ch = text[j]
            if ch == "\\":
                j += 2  # an escaped character (``\{``, ``\}``, ``\\``) never changes the depth
                continue
            if ch == "{":
                depth += 1
            elif ch == "}":
                depth -= 1
                if depth == 0:
                    return text[i + 1 : j]
            j += 1
        return None
    # ``\boxed 5`` / ``\boxed5``: one space-delimited token; ``$`` ends inline math, a trailing period ends the
    # sentence.
    j = i
    while j < n and text[j] not in " \t\r\n$":
        j += 1
    return text[i:j].rstrip(".,;")


def extract_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed``/``\\fbox`` in ``text``.

    Returns ``None`` when there is no box command, ``""`` when the last one is unbalanced or empty.
    """
    best = -1
    name_len = 0
    for cmd in _BOX_COMMANDS:
        pos = text.rfind(cmd)
        while pos >= 0:
            after = pos + len(cmd)
            # ``\boxedfoo`` would be another command; only a non-letter may follow the name.
            if after >= len(text) or not text[after].isalpha():
                break
            pos = text.rfind(cmd, 0, pos)
        if pos > best:
            best, name_len = pos, len(cmd)
    if best < 0:
        return None
    content = _box_argument(text, best + name_len)
    return (content or "").strip()


# --------------------------------------------------------------------------------------------------------------
# Fast path normalisation (only transformations that cannot change the mathematical meaning)
# --------------------------------------------------------------------------------------------------------------
_SPACING = re.compile(r"\\[,;:! ]|\\q?quad|~")
_INT = re.compile(r"[+-]?\d+")


def normalize_answer(answer: str) -> str:
    s = answer.strip()
    if len(s) >= 2 and s[0] == "$" and s[-1] == "$":
        s = s.strip("$")
    s = s.replace("\\left", "").replace("\\right", "")
    s = s.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    s = _SPACING.sub("", s)
    s = "".join(s.split())
    return s.rstrip(".")


def _gold_forms(gold: Gold) -> tuple[str, ...]:
    forms = (gold,) if isinstance(gold, str) else tuple(gold)
    out = []
    for g in forms:
        if not isinstance(g, str):
            raise TypeError(f"gold answers must be strings, got {type(g).__name__}")
        g = g.strip()
        # Accept golds stored as a full solution or a boxed answer.
        boxed = extract_boxed(g) if ("\\boxed" in g or "\\fbox" in g) else None
        out.append(boxed if boxed else g)
    return tuple(out)


def _fast_verdict(answer: str, golds: tuple[str, ...]) -> bool | None:
    """True/False when decidable without sympy, else None."""
    norm = normalize_answer(answer)
    norm_golds = [normalize_answer(g) for g in golds]
    if norm in norm_golds:
        return True
    # Integer literals compare exactly; cap the length (int() refuses > 4300 digits, and such answers are junk).
    if (
        len(norm) <= 1000
        and _INT.fullmatch(norm)
        and all(len(g) <= 1000 and _INT.fullmatch(g) for g in norm_golds)
    ):
        return int(norm) in {int(g) for g in norm_golds}
    return None


# --------------------------------------------------------------------------------------------------------------
# The math-verify worker (runs as ``python math_grader.py --worker RFD WFD``)
# --------------------------------------------------------------------------------------------------------------
_UNESCAPED_DOLLAR = re.compile(r"(?<!\\)\$")


def _as_math(s: str) -> str:
    return "$" + _UNESCAPED_DOLLAR.sub("", s) + "$"


def _worker_main(read_fd: int, write_fd: int) -> None:
    from functools import lru_cache

    # The worker runs math-verify without its signal-based timeouts (the parent enforces a hard one), so its
    # "timeout is disabled" warnings are expected noise.
    logging.getLogger("math_verify").setLevel(logging.CRITICAL)
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

    config = [LatexExtractionConfig(), ExprExtractionConfig()]
    conn_in = Connection(read_fd, writable=False)
    conn_out = Connection(write_fd, readable=False)

    @lru_cache(maxsize=8192)  # a GRPO group shares one gold and often repeats answers
    def parsed(s: str):
        return parse(_as_math(s), extraction_config=config, parsing_timeout=None)

    def grade(answer: str, golds: tuple[str, ...]) -> str:
        pred = parsed(answer)
        if not pred:
            return "unparsable"
        gold_parsed = [p for g in golds for p in [parsed(g)] if p]
        if not gold_parsed:
            return "gold_unparsable"
        # raise_on_error=False: a comparison sympy cannot carry out (a matrix against a set, ...) is a mismatch.
        ok = any(verify(g, pred, timeout_seconds=None, raise_on_error=False) for g in gold_parsed)
        return "correct" if ok else "wrong"

    # Warm up before reporting ready: sympy imports parts lazily on first use, which must not eat into the first
    # item's timeout.
    grade("x=\\frac{1}{2}", ("0.5",))
    conn_out.send("ready")
    while True:
        try:
            batch = conn_in.recv()
        except (EOFError, OSError):
            return  # the parent closed the pipe or died
        for answer, golds in batch:
            try:
                reason = grade(answer, golds)
            except Exception:  # any math-verify/sympy failure (RecursionError included) grades as an error
                reason = "error"
            conn_out.send(reason)


class _Worker:
    """One worker subprocess and its pipes."""

    def __init__(self) -> None:
        req_r, req_w = os.pipe()
        res_r, res_w = os.pipe()
        env = dict(os.environ)
        env.setdefault("OMP_NUM_THREADS", "1")
        # -P (3.11+): do not put this file's folder first on sys.path, where a sibling module could shadow stdlib.
        flags = ["-P"] if sys.version_info >= (3, 11) else []
        try:
            self.proc = subprocess.Popen(
                [sys.executable, *flags, os.path.abspath(__file__), "--worker", str(req_r), str(res_w)],
                pass_fds=(req_r, res_w),
                stdin=subprocess.DEVNULL,
                env=env,
                close_fds=True,
            )
        finally:
            os.close(req_r)
            os.close(res_w)
        self.send_conn = Connection(req_w, readable=False)
        self.recv_conn = Connection(res_r, writable=False)
        self.ready = False
        self.started = time.monotonic()

    def wait_ready(self, timeout_s: float) -> bool:
        if self.ready:
            return True
        remaining = timeout_s - (time.monotonic() - self.started)
        try:
            if self.recv_conn.poll(max(remaining, 0.0)) and self.recv_conn.recv() == "ready":
                self.ready = True
        except (EOFError, OSError):
            pass
        return self.ready

    def kill(self) -> None:
        for conn in (self.send_conn, self.recv_conn):
            try:
                conn.close()
            except OSError:
                pass
        if self.proc.poll() is None:
            self.proc.kill()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:  # pragma: no cover - kill -9 does not fail
            pass


_LIVE_GRADERS: weakref.WeakSet[MathGrader] = weakref.WeakSet()


class MathGrader:
    """Grades (response, gold) pairs; math-verify runs in a persistent worker with a hard per-item timeout.

    Thread-safe: one lock serialises access to the worker. ``timeout_s`` bounds each item's math-verify time;
    ``startup_timeout_s`` bounds the worker start (imports sympy: ~2.5 s on a loaded 2-core machine).
    ``max_answer_chars`` rejects longer boxed answers without parsing them (``"too_long"``); ``fast_path=False``
    sends every extracted answer to math-verify (to measure math-verify alone).
    """

    def __init__(
        self,
        timeout_s: float = 5.0,
        *,
        startup_timeout_s: float = 120.0,
        max_answer_chars: int = 1000,
        fast_path: bool = True,
    ) -> None:
        self.timeout_s = check_timeout("timeout_s", timeout_s)
        self.startup_timeout_s = check_timeout("startup_timeout_s", startup_timeout_s)
        self.max_answer_chars = int(max_answer_chars)
        self.fast_path = bool(fast_path)
        self._lock = threading.Lock()
        self._worker: _Worker | None = None
        self._stats: Counter[str] = Counter()
        _LIVE_GRADERS.add(self)

    # -- public API ------------------------------------------------------------------------------------------
    def grade(self, response: str, gold: Gold, *, think_in_prompt: bool = False) -> GradeResult:
        return self.grade_many([(response, gold)], think_in_prompt=think_in_prompt)[0]

    def grade_many(
        self, pairs: Sequence[tuple[str, Gold]], *, think_in_prompt: bool = False
    ) -> list[GradeResult]:
        """Grade every pair; one round trip to the worker for all pairs the fast path cannot decide."""
        reasons: list[str | None] = [None] * len(pairs)
        pending: list[tuple[int, str, tuple[str, ...]]] = []
        for i, (response, gold) in enumerate(pairs):
            golds = _gold_forms(gold)
            reason, answer = self._pre_grade(response, golds, think_in_prompt)
            if reason is not None:
                reasons[i] = reason
            else:
                pending.append((i, answer, golds))
        with self._lock:
            self._stats["fast_path"] += len(pairs) - len(pending)
            if pending:
                for (i, _, _), reason in zip(
                    pending, self._run_worker([(a, g) for _, a, g in pending]), strict=True
                ):
                    reasons[i] = reason
            results = [GradeResult(r == "correct", r) for r in reasons]  # type: ignore[arg-type]
            self._stats.update(r.reason for r in results)
        return results

    def stats(self) -> dict[str, int]:
        """Counts of each reason plus ``fast_path`` (decided without math-verify), ``worker_items``,
        ``worker_starts``."""
        with self._lock:
            return dict(self._stats)

    def close(self) -> None:
        with self._lock:
            if self._worker is not None:
                self._worker.kill()
                self._worker = None

    def __del__(self) -> None:  # best effort; close() is the clean way
        worker = getattr(self, "_worker", None)
        if worker is not None:
            try:
                worker.kill()
            except Exception:  # interpreter shutdown: modules may already be gone
                pass

    # -- internals -------------------------------------------------------------------------------------------
    def _pre_grade(
        self, response: str, golds: tuple[str, ...], think_in_prompt: bool
    ) -> tuple[str | None, str]:
        if not isinstance(response, str):
            return "error", ""
        final = strip_reasoning(response, think_in_prompt=think_in_prompt)
        if final is None:
            return "unclosed_think", ""
        answer = extract_boxed(final)
        if answer is None:
            return "no_boxed", ""
        if not answer:
            return "unparsable", ""
        if len(answer) > self.max_answer_chars:
            return "too_long", ""
        if not golds or not any(golds):
            return "gold_unparsable", ""
        verdict = _fast_verdict(answer, golds) if self.fast_path else None
        if verdict is not None:
            return ("correct" if verdict else "wrong"), ""
        return None, answer

    def _start(self) -> None:
        try:
            self._worker = _Worker()
            self._stats["worker_starts"] += 1
        except OSError as exc:  # no executable, no fds left, ...: grade as errors rather than raise
            logger.error("cannot start the math grader worker: %s", exc)
            self._worker = None

    def _ensure_worker(self) -> _Worker | None:
        if self._worker is None:
            self._start()
            if self._worker is None:
                return None
        if not self._worker.wait_ready(self.startup_timeout_s):
            logger.error(
                "math grader worker did not start within %.0f s; grading as error", self.startup_timeout_s
            )
            self._restart(start_new=False)
            return None
        return self._worker

    def _restart(self, *, start_new: bool = True) -> None:
        if self._worker is not None:
            self._worker.kill()
            self._worker = None
        if start_new:
            # Start the replacement now: it imports sympy while the caller carries on.
            self._start()

    def _run_worker(self, items: list[tuple[str, tuple[str, ...]]]) -> list[str]:
        out: list[str] = []
        while len(out) < len(items):
            worker = self._ensure_worker()
            if worker is None:
                out.extend("error" for _ in range(len(items) - len(out)))
                break
            todo = items[len(out) :]
            try:
                worker.send_conn.send(todo)
            except (OSError, ValueError):  # broken pipe: the worker died between calls
                self._restart(start_new=False)
                worker = self._ensure_worker()
                if worker is None:
                    continue
                try:
                    worker.send_conn.send(todo)
                except (OSError, ValueError):
                    out.append("error")
                    self._restart()
                    continue
            self._stats["worker_items"] += len(todo)
            for _ in todo:
                try:
                    if not worker.recv_conn.poll(self.timeout_s):
                        out.append("timeout")
                        self._restart()
                        break
                    out.append(worker.recv_conn.recv())
                except (EOFError, OSError):  # the worker crashed on this item (e.g. a C-level stack overflow)
                    out.append("error")
                    self._restart()
                    break
        return out


@atexit.register
def _close_all() -> None:
    for grader in list(_LIVE_GRADERS):
        grader.close()


def _after_fork_in_child() -> None:
    # A forked child shares the parent's pipes to the parent's worker and may inherit a lock held by another
    # thread: forget both (the worker still belongs to the parent) and start fresh on the next call.
    global _SHARED_LOCK
    _SHARED_LOCK = threading.Lock()
    for grader in list(_LIVE_GRADERS):
        grader._lock = threading.Lock()
        grader._worker = None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


# --------------------------------------------------------------------------------------------------------------
# Module-level convenience
# --------------------------------------------------------------------------------------------------------------
_SHARED: dict[float, MathGrader] = {}
_SHARED_LOCK = threading.Lock()

DEFAULT_TIMEOUT_S = 5.0


def shared_grader(timeout_s: float = DEFAULT_TIMEOUT_S) -> MathGrader:
    """The process-wide grader for ``timeout_s`` (one worker subprocess per distinct timeout)."""
    # checked, not float(): float("5") would pass, and a NaN key never matches (a new worker per call)
    key = check_timeout("timeout_s", timeout_s)
    with _SHARED_LOCK:
        if key not in _SHARED:
            _SHARED[key] = MathGrader(timeout_s=key)
        return _SHARED[key]


def grade_math_detailed(response: str, gold: Gold, *, think_in_prompt: bool = False) -> GradeResult:
    """Grade one response with the shared default grader (see the module docstring for the rules)."""
    return shared_grader().grade(response, gold, think_in_prompt=think_in_prompt)


def grade_math(response: str, gold: Gold, *, think_in_prompt: bool = False) -> bool:
    """True when the last boxed answer of ``response`` is equivalent to ``gold`` (or one of several golds)."""
    return grade_math_detailed(response, gold, think_in_prompt=think_in_prompt).correct


if __name__ == "__main__" and len(sys.argv) == 4 and sys.argv[1] == "--worker":
    _worker_main(int(sys.argv[2]), int(sys.argv[3]))
