"""What one sandboxed tool call costs (``run_python``, wall seconds from the call to its result), per isolation.

    python bench/bench_sandbox.py               # 20 calls per path, taking turns after a warm-up round
    python bench/bench_sandbox.py --smoke       # CI: one call per path

Paths: "rlimits" without Landlock (the baseline: the fallback as it was before Landlock confined it), "rlimits" with
Landlock (where the kernel has it: the rules are built in the caller and applied in the program's process before
its execve), and "namespaces" (where this process may create them: root). Each call runs the same small program,
an interpreter start-up and a few lines, which is what a model's tool call mostly is.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import common

PROGRAM = "import math, os\nprint(sum(math.isqrt(i) for i in range(10_000)), len(os.listdir('.')))\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--reps", type=int, default=20, help="calls per path, taking turns; the median is shown"
    )
    parser.add_argument("--smoke", action="store_true", help="one call per path")
    args = parser.parse_args(argv)
    if args.smoke:
        args.reps = 1
    from r3_rllib.tools import sandbox

    common.print_header("run_python: one tool call per isolation", args)
    abi = sandbox.landlock_abi()

    def call(isolation: str, landlock: bool) -> Any:
        def run() -> float:
            saved = sandbox.landlock_abi
            sandbox.landlock_abi = (lambda: abi) if landlock else (lambda: 0)
            try:
                result = sandbox.run_python(PROGRAM, isolation=isolation, timeout_s=30.0)
            finally:
                sandbox.landlock_abi = saved
            if not result.ok:
                raise RuntimeError(f"{isolation} run failed: {result.output}")
            return result.duration_s

        return run

    baseline = "rlimits, no Landlock"
    paths = {baseline: call("rlimits", False)}
    if abi >= 1:
        paths[f"rlimits + Landlock ABI {abi}"] = call("rlimits", True)
    if sandbox.namespaces_available():
        paths["namespaces"] = call("namespaces", False)
    medians = common.alternating_medians(paths, args.reps, warmup=not args.smoke)
    print(f"{common.load_note()}; Landlock ABI {abi or 'none'}")
    rows = [(name, m, m / medians[baseline]) for name, m in medians.items()]
    print(common.markdown_table(["path", "median s per call", "x baseline"], rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
