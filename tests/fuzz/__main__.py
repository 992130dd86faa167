"""``python -m tests.fuzz --minutes 10``: fuzz the agent's input boundaries for a while.

Runs ``pytest tests/fuzz`` with ``HYPOTHESIS_PROFILE=long`` (random seeds, 50x the CI
examples) round after round until the time is up, and stops at the first failing round
(its output shows the failing input and a ``@reproduce_failure`` line to replay it).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    """Run fuzz rounds until ``--minutes`` have passed; the exit status of the last round."""
    parser = argparse.ArgumentParser(prog="python -m tests.fuzz", description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=10.0, help="how long to keep fuzzing (default 10)")
    parser.add_argument("-k", default="", help="only the fuzz tests matching this pytest -k expression")
    args = parser.parse_args(argv)
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "HYPOTHESIS_PROFILE": "long", "PYTHONPATH": str(root)}
    cmd = [sys.executable, "-m", "pytest", "-n", "0", "-p", "no:cacheprovider", "-q", str(root / "tests" / "fuzz")]
    if args.k:
        cmd += ["-k", args.k]
    deadline = time.monotonic() + args.minutes * 60
    rounds = 0
    while True:
        rounds += 1
        rc = subprocess.call(cmd, cwd=root, env=env)
        if rc != 0 or time.monotonic() >= deadline:
            print(f"tests.fuzz: {rounds} round(s), last exit status {rc}", file=sys.stderr)
            return rc


if __name__ == "__main__":
    sys.exit(main())
