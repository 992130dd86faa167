"""Write every dashboard's JSON: ``python -m dashboards.generate [--out DIR] [--check]``.

Each dashboard goes to ``<DIR>/<uid>.json`` (DIR defaults to this package's folder, where the
committed JSON lives and Grafana's provisioning loads it from). ``--check`` writes nothing and
exits 1, naming the files, when the committed JSON differs from what the code builds.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from dashboards import agent, gpu, lmdeploy, vllm
from dashboards.kit import Board

__all__ = ["BOARDS", "HERE", "main", "render"]

HERE = Path(__file__).resolve().parent
#: Every dashboard, in the order the links drop-down lists them (Grafana sorts by title).
BOARDS: tuple[Callable[[], Board], ...] = (vllm.fleet, vllm.replica, lmdeploy.board, gpu.board, agent.board)


def render() -> dict[str, str]:
    """``<uid>.json`` -> its JSON text, for every dashboard."""
    out: dict[str, str] = {}
    for build in BOARDS:
        board = build()
        if f"{board.uid}.json" in out:
            raise ValueError(f"two dashboards with uid {board.uid!r}")
        out[f"{board.uid}.json"] = board.to_json()
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dashboards.generate", description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=HERE, help="folder to write <uid>.json into (default: %(default)s)")
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if a file would change")
    args = parser.parse_args(argv)
    stale = []
    for name, text in render().items():
        path = args.out / name
        current = path.read_text(encoding="utf-8") if path.is_file() else None
        if current == text:
            continue
        stale.append(name)
        if not args.check:
            path.write_text(text, encoding="utf-8")
    if args.check and stale:
        print(f"stale: {', '.join(stale)}; run: python -m dashboards.generate", file=sys.stderr)
        return 1
    for name in stale:
        print(f"wrote {args.out / name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
