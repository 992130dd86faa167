"""Regex cost: RE2 (what the agent runs) against Python's backtracking ``re`` (what it ran before).

Run from the repository root:  python bench/regex.py  [--timeout 10]

Part 1, hostile input: each nested-quantifier pattern, anchored as Prometheus anchors it, is
matched against a 10,000-character value that almost matches. RE2 runs here; Python's ``re``
runs in a child process killed after ``--timeout`` seconds (it would otherwise never finish).
Part 2, the hot path: a ``SeriesMatcher`` ``=~`` over 100,000 distinct label values (every value
seen once, so the matcher's memo does not help), then 4,000 distinct values seen 25 times each (the
steady state of rule evaluation, where label values repeat), beside the bare ``re`` pattern the old matcher
compiled (a lower bound of its cost: the old ``SeriesMatcher.matches`` added its own call).
Not a test: numbers depend on the machine; the ratios are what to compare.
"""

from __future__ import annotations

import argparse
import random
import re
import string
import subprocess
import sys
import time
import timeit

from agent.gocompat.regex import compile_anchored
from agent.store import SeriesMatcher

HOSTILE = {"(a+)+$": "a" * 10_000 + "!", "(a|a)*b": "a" * 10_000, "(.*a){20}": "a" * 10_000 + "\n",
           "(x+x+)+y": "x" * 10_000}


def hostile(timeout: float) -> None:
    print(f"{'pattern':14} {'RE2':>10} {'Python re':>16}")
    for pattern, value in HOSTILE.items():
        rx = compile_anchored(pattern)
        t0 = time.perf_counter()
        rx.search(value)
        ours = time.perf_counter() - t0
        child = f"import re; re.compile({'(?:' + pattern + ')'!r}).fullmatch({value!r})"
        t0 = time.perf_counter()
        try:
            subprocess.run([sys.executable, "-c", child], timeout=timeout, check=True)
            theirs = f"{time.perf_counter() - t0:.3f} s"
        except subprocess.TimeoutExpired:
            theirs = f"> {timeout:g} s (killed)"
        print(f"{pattern:14} {ours * 1000:8.2f} ms {theirs:>16}")


def hot_path() -> None:
    rng = random.Random(1)
    values = ["".join(rng.choices(string.ascii_lowercase + "-0123456789", k=rng.randint(5, 30)))
              for _ in range(100_000)]
    print(f"\n{'pattern':16} {'re (before)':>12} {'RE2 cold':>10} {'RE2 warm':>10}   per 100k values")
    for pattern in ["vllm-.*", "vllm-abc", "a|b|vllm-x", ".*gpu.*", "[a-z]+-[0-9]+", ".*"]:
        old = re.compile(f"(?:(?-s:{pattern}))\\Z", re.DOTALL).match
        before = min(timeit.repeat(lambda old=old: sum(old(v) is not None for v in values), number=1, repeat=3))
        cold = []
        for _ in range(3):
            m = SeriesMatcher("job", "=~", pattern)
            t0 = time.perf_counter()
            sum(map(m.matches, values))
            cold.append(time.perf_counter() - t0)
        warm_values = values[:4000] * 25  # 4,000 distinct values, as a fleet's series repeat every evaluation
        warm = min(timeit.repeat(lambda m=m, vs=warm_values: sum(map(m.matches, vs)), number=1, repeat=3))
        print(f"{pattern!r:16} {before * 1000:9.1f} ms {min(cold) * 1000:7.1f} ms {warm * 1000:7.1f} ms")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--timeout", type=float, default=10.0, help="seconds to give Python's re per pattern")
    args = ap.parse_args()
    hostile(args.timeout)
    hot_path()


if __name__ == "__main__":
    main()
