"""YAML documents that cost far more to use than to read, shared by the tests of every reader
of YAML files (config, rule files, file_sd), so each proves it refuses the same bombs."""

from __future__ import annotations

from pathlib import Path

from agent.gocompat import yamlv3

__all__ = ["BILLION_LAUGHS", "DEEP_BLOCK", "DEEP_FLOW", "MERGE_BOMB", "SELF_ALIAS", "write_huge"]

#: The classic: ten levels of ten aliases, 10**10 "lol" strings once expanded, 31 nodes written.
BILLION_LAUGHS = 'lol0: &lol0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]\n' + "".join(
    f"lol{i}: &lol{i} [{', '.join([f'*lol{i - 1}'] * 10)}]\n" for i in range(1, 10)
)
#: The same growth through merge keys, which PyYAML flattens by copying key/value pairs.
MERGE_BOMB = "m0: &m0 {a: 1, b: 2}\n" + "".join(
    f"m{i}: &m{i} {{<<: [{', '.join([f'*m{i - 1}'] * 10)}]}}\n" for i in range(1, 9)
)
#: A cycle PyYAML would build as a self-containing list.
SELF_ALIAS = "a: &a [1, *a]\n"
#: Nested far past any real file, in flow and in block style.
DEEP_FLOW = "[" * 100_000 + "]" * 100_000
DEEP_BLOCK = "".join("  " * i + "k:\n" for i in range(yamlv3.MAX_DEPTH + 50)) + "  " * (yamlv3.MAX_DEPTH + 50) + "v\n"


def write_huge(path: Path) -> Path:
    """A file one byte over the size cap, valid YAML all along (one long comment line)."""
    path.write_bytes(b"#" * (yamlv3.MAX_BYTES + 1))
    return path
