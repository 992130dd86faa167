"""Builds deploy/kubernetes overlays with ``kubectl kustomize`` for the deploy tests.

One build per overlay per test session (``kubectl kustomize`` takes a few hundred milliseconds);
every caller gets its own copy of the objects, so a test may break one on purpose.
"""

from __future__ import annotations

import copy
import functools
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
KUSTOMIZE = ROOT / "deploy" / "kubernetes"

# Every kustomization under deploy/kubernetes, by its path there.
OVERLAYS = ("base", "node-agent", "monitoring", "vllm", "autoscaling/hpa", "autoscaling/keda", "shards")

needs_kubectl = pytest.mark.skipif(shutil.which("kubectl") is None,
                                   reason="kubectl not installed: cannot run `kubectl kustomize`")

Doc = dict[str, Any]


@functools.cache
def _kustomize(directory: Path) -> str:
    kubectl = shutil.which("kubectl")
    assert kubectl is not None
    proc = subprocess.run([kubectl, "kustomize", str(directory)],
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def build_dir(directory: Path) -> list[Doc]:
    """The objects ``kubectl kustomize DIRECTORY`` prints."""
    docs = [d for d in yaml.safe_load_all(_kustomize(directory.resolve())) if d is not None]
    return copy.deepcopy(docs)


def build(overlay: str) -> list[Doc]:
    """The objects of ``deploy/kubernetes/OVERLAY``."""
    return build_dir(KUSTOMIZE / overlay)


def build_with_patch(overlay: str, patch: Path, tmp_path: Path) -> list[Doc]:
    """``overlay`` with one more patch file, as a user enabling an optional patch would build it
    (kustomize loads patch files only from inside the kustomization's own directory)."""
    (tmp_path / patch.name).write_text(patch.read_text())
    base = os.path.relpath(KUSTOMIZE / overlay, tmp_path)
    (tmp_path / "kustomization.yaml").write_text(yaml.safe_dump(
        {"resources": [base], "patches": [{"path": patch.name}]}))
    return build_dir(tmp_path)


def one(docs: list[Doc], kind: str, name: str | None = None) -> Doc:
    """The single object of ``kind`` (and ``name``) in ``docs``."""
    found = [d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]
