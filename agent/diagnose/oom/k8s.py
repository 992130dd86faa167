"""OOM evidence from Kubernetes: ``kubectl get pod -o json`` and ``kubectl describe pod`` output.

A container killed by its memory cgroup shows in Kubernetes as a terminated state with
``reason: OOMKilled`` (or exit code 137, SIGKILL, when the runtime could not tell why),
next to the container's restart count and memory limit. Those are the facts the OOM verdict
needs to size a new limit. This module reads both forms an operator pastes: the pod's JSON
(a Pod or a List of Pods) and the human-readable ``kubectl describe pod``, whose facts for
one container are spread over an indented block and are only complete at its end. It
returns plain ``(line, values)`` facts; :mod:`agent.diagnose.oom.evidence` turns them into
``k8s-oom`` matches among the log lines. :func:`parse_quantity` reads Kubernetes' resource
quantities (``32Gi``, ``512M``).
"""

from __future__ import annotations

import re
from typing import Any

__all__ = ["DescribeReader", "is_pod", "parse_quantity", "pod_oom_kills"]

_QUANTITY = re.compile(r"^(\d+(?:\.\d+)?)(?:([eE][+-]?\d+)|(Ki|Mi|Gi|Ti|Pi|Ei|m|k|M|G|T|P|E))?$")
_QUANTITY_SUFFIX = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60, "m": 1e-3,
                    "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18}


def parse_quantity(text: str) -> int | None:
    """A Kubernetes resource quantity (``32Gi``, ``512M``, ``1e9``, ``134217728``) in bytes."""
    m = _QUANTITY.match(text.strip())
    if m is None:
        return None
    value = float(m[1]) * (10 ** int(m[2][1:]) if m[2] else _QUANTITY_SUFFIX.get(m[3] or "", 1))
    return round(value)


class DescribeReader:
    """``kubectl describe pod`` read line by line (:meth:`feed`): container blocks with State/Last
    State, Restart Count, Limits. :meth:`oom_kills` gives each OOM termination with the facts of
    its container as they stand at the end of the input."""

    def __init__(self) -> None:
        self._pod: dict[str, str] = {}
        self._container = ""
        self._terminated = False
        self._in_limits = False
        self._k8s: dict[str, dict[str, Any]] = {}  # container -> facts from `kubectl describe`
        self._k8s_lines: list[tuple[str, str, int]] = []

    def feed(self, line: str, lineno: int) -> None:
        """One line (without its newline); ``lineno`` is where it is in the input."""
        if m := re.match(r"(Name|Namespace):\s+(\S+)\s*$", line):
            self._pod.setdefault(m[1].lower(), m[2])
        elif m := re.match(r"  ([\w.-]+):\s*$", line):
            self._container, self._terminated, self._in_limits = m[1], False, False
        elif m := re.match(r"\s+(?:Last )?State:\s+(\w+)", line):
            self._terminated, self._in_limits = m[1] == "Terminated", False
        elif self._terminated and (m := re.match(r"\s+Reason:\s+(\S+)", line)):
            self._record(line, lineno, reason=m[1])
        elif self._terminated and (m := re.match(r"\s+Exit Code:\s+(\d+)", line)):
            self._record(line, lineno, exit_code=int(m[1]))
        elif m := re.match(r"\s+Restart Count:\s+(\d+)", line):
            self._k8s.setdefault(self._container, {})["restart_count"] = int(m[1])
        elif re.match(r"\s+Limits:\s*$", line):
            self._in_limits = True
        elif self._in_limits and (m := re.match(r"\s+memory:\s+(\S+)", line)):
            self._k8s.setdefault(self._container, {})["limit_bytes"] = parse_quantity(m[1])
        elif re.match(r"\s+[A-Z][\w ]*:", line):
            self._in_limits = False

    def _record(self, line: str, lineno: int, **facts: Any) -> None:
        rec = self._k8s.setdefault(self._container, {})
        if facts.get("reason") == "OOMKilled" or facts.get("exit_code") == 137:
            self._k8s_lines.append((self._container, line, lineno))
        rec.update(facts)

    def oom_kills(self) -> list[tuple[str, int, dict[str, Any]]]:
        """``(line, lineno, values)`` of every OOMKilled / exit-137 line, in input order."""
        out = []
        for container, line, lineno in self._k8s_lines:
            rec = self._k8s.get(container, {})
            out.append((line, lineno, {
                "pod": self._pod.get("name", ""), "namespace": self._pod.get("namespace", ""),
                "container": container, "reason": rec.get("reason", ""), "exit_code": rec.get("exit_code"),
                "restart_count": rec.get("restart_count"), "limit_bytes": rec.get("limit_bytes")}))
        return out


def pod_oom_kills(doc: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """``(line, values)`` of each OOM termination in a ``kubectl get pod -o json`` Pod or List of
    Pods; ``line`` is a one-line summary, as a log line would be."""
    pods = doc.get("items", []) if doc.get("kind") == "List" or "items" in doc else [doc]
    out: list[tuple[str, dict[str, Any]]] = []
    for pod in pods:
        meta, spec, status = pod.get("metadata", {}), pod.get("spec", {}), pod.get("status", {})
        limits = {c.get("name", ""): ((c.get("resources") or {}).get("limits") or {}).get("memory")
                  for c in spec.get("containers", []) + spec.get("initContainers", [])}
        for cs in status.get("containerStatuses", []) + status.get("initContainerStatuses", []):
            for where in ("state", "lastState"):
                term = (cs.get(where) or {}).get("terminated") or {}
                if term.get("reason") != "OOMKilled" and term.get("exitCode") != 137:
                    continue
                name = cs.get("name", "")
                line = (f"pod {meta.get('namespace', '')}/{meta.get('name', '')} container {name}: {where}.terminated "
                        f"reason={term.get('reason', '')} exitCode={term.get('exitCode')} "
                        f"restartCount={cs.get('restartCount', 0)}")
                limit = limits.get(name)
                out.append((line, {
                    "pod": meta.get("name", ""), "namespace": meta.get("namespace", ""), "container": name,
                    "reason": term.get("reason", ""), "exit_code": term.get("exitCode"),
                    "restart_count": cs.get("restartCount"), "limit_bytes": parse_quantity(limit) if limit else None,
                    "finished_at": term.get("finishedAt", "")}))
    return out


def is_pod(doc: object) -> bool:
    """Whether a decoded JSON document is a Pod (or a List of them) worth reading."""
    return isinstance(doc, dict) and (doc.get("kind") in ("Pod", "List")
                                      or "containerStatuses" in doc.get("status", {}))
