"""OOM evidence from Kubernetes: ``kubectl get pod -o json`` and ``kubectl describe pod`` output.

A container killed by its memory cgroup shows in Kubernetes as a terminated state with
``reason: OOMKilled`` (or exit code 137, SIGKILL, when the runtime could not tell why),
next to the container's restart count and memory limit. Those are the facts the OOM verdict
needs to size a new limit. This module reads both forms an operator pastes: the pod's JSON
(a Pod or a List of Pods) and the human-readable ``kubectl describe pod``, whose facts for
one container are spread over an indented block and are only complete at its end. It
returns plain ``(line, values)`` facts; :mod:`agent.diagnose.oom.evidence` turns them into
``k8s-oom`` matches among the log lines. :func:`parse_quantity` reads Kubernetes' resource
quantities (``32Gi``, ``512M``); :class:`JsonDocuments` finds the JSON among log lines.
"""

from __future__ import annotations

import json
from typing import Any

from agent.gocompat.regex import compile_go

__all__ = ["DescribeReader", "JsonDocuments", "is_pod", "parse_quantity", "pod_oom_kills"]

_QUANTITY = compile_go(r"^(\d+(?:\.\d+)?)(?:([eE][+-]?\d+)|(Ki|Mi|Gi|Ti|Pi|Ei|m|k|M|G|T|P|E))?$")
# `kubectl describe pod` lines (RE2, anchored at the line's start as re.match would be).
_NAME = compile_go(r"^(Name|Namespace):\s+(\S+)\s*$")
_CONTAINER = compile_go(r"^  ([\w.-]+):\s*$")
_STATE = compile_go(r"^\s+(?:Last )?State:\s+(\w+)")
_REASON = compile_go(r"^\s+Reason:\s+(\S+)")
_EXIT_CODE = compile_go(r"^\s+Exit Code:\s+(\d+)")
_RESTARTS = compile_go(r"^\s+Restart Count:\s+(\d+)")
_LIMITS = compile_go(r"^\s+Limits:\s*$")
_MEMORY = compile_go(r"^\s+memory:\s+(\S+)")
_FIELD = compile_go(r"^\s+[A-Z][\w ]*:")
_QUANTITY_SUFFIX = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60, "m": 1e-3,
                    "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18}


def parse_quantity(text: str) -> int | None:
    """A Kubernetes resource quantity (``32Gi``, ``512M``, ``1e9``, ``134217728``) in bytes."""
    m = _QUANTITY.search(text.strip())
    if m is None:
        return None
    exponent, suffix = m.group(2), m.group(3) or ""
    value = float(m.group(1) or 0) * (10 ** int(exponent[1:]) if exponent else _QUANTITY_SUFFIX.get(suffix, 1))
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
        if m := _NAME.search(line):
            self._pod.setdefault((m.group(1) or "").lower(), m.group(2) or "")
        elif m := _CONTAINER.search(line):
            self._container, self._terminated, self._in_limits = m.group(1) or "", False, False
        elif m := _STATE.search(line):
            self._terminated, self._in_limits = m.group(1) == "Terminated", False
        elif self._terminated and (m := _REASON.search(line)):
            self._record(line, lineno, reason=m.group(1))
        elif self._terminated and (m := _EXIT_CODE.search(line)):
            self._record(line, lineno, exit_code=int(m.group(1) or 0))
        elif m := _RESTARTS.search(line):
            self._k8s.setdefault(self._container, {})["restart_count"] = int(m.group(1) or 0)
        elif _LIMITS.search(line):
            self._in_limits = True
        elif self._in_limits and (m := _MEMORY.search(line)):
            self._k8s.setdefault(self._container, {})["limit_bytes"] = parse_quantity(m.group(1) or "")
        elif _FIELD.search(line):
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


class JsonDocuments:
    """JSON values that start at a line's first column of ``lines``, on one line or on many (``kubectl
    get pod -o json`` is pretty-printed). A multi-line value is decoded from its first line to the end
    of the input, so the text so decoded is bounded in total to a few times the input: a log of lines
    that open a "{" and never close it stays linear. Too deep a value is no value, not an error."""

    def __init__(self, lines: list[str]) -> None:
        self._lines = lines
        self._budget = 4 * sum(len(t) + 1 for t in lines) + (1 << 20)

    def at(self, i: int) -> tuple[Any, int]:
        """The JSON value that starts at ``lines[i]`` (None if none) and how many lines it spans."""
        try:
            return json.loads(self._lines[i]), 1
        except (ValueError, RecursionError):
            pass
        if self._budget <= 0:
            return None, 1
        rest = "\n".join(self._lines[i:])
        self._budget -= len(rest)
        try:
            doc, end = json.JSONDecoder().raw_decode(rest)
        except (ValueError, RecursionError):
            return None, 1
        return doc, rest.count("\n", 0, end) + 1


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
