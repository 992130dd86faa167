"""The tailed logs the daemon reads for OOM evidence (``diagnostics.oom.log_files``), with the
start-up lines that explain a later OOM.

Why a class of its own (beside :mod:`agent.app.triggers`, which decides when diagnoses run): a
log is read and matched in a worker thread, so everything a scan touches, the tailer and the
remembered start-up lines of each file, lives here behind one lock, and the event loop only
awaits :meth:`LogWatch.scan`.

A later OOM's advice depends on the engine that printed it: the API server's arguments
(``--gpu-memory-utilization``, ``--max-num-seqs``), the engine's config line (model,
``max_seq_len``, parallelism, quantization) and the memory profile. The last line of each kind
per file is remembered; a kind seen again starts a new run, so the kinds after it (from the
previous run) are dropped. A prompt the request logger echoes never counts as such a line.
"""

from __future__ import annotations

import os
import threading

import structlog

from agent.diagnose.logtail import LogTailer, bounded_lines
from agent.diagnose.oom.evidence import parse_evidence
from agent.diagnose.oom.lines import is_request_log

__all__ = ["LogWatch"]

log = structlog.get_logger(__name__)

#: Start-up lines that describe the engine a later OOM happens in, in the order vLLM prints them.
_CONTEXT_MARKERS: tuple[tuple[str, ...], ...] = (
    ("non-default args:", "args: Namespace("),  # V1 log_non_default_args / V0 api_server
    ("with config:",),  # "Initializing a V1 LLM engine (v0.12.0) with config: model=..., ..."
    ("Memory profiling results:", "the current vLLM instance can use total_gpu_memory"),
)
_CONTEXT_BYTES = tuple(m.encode() for markers in _CONTEXT_MARKERS for m in markers)
#: Of a log that exists at start-up, the tail read for its start-up lines: vLLM's stats line
#: every 10 s is ~2 MB a day, so this reaches back about a month.
_PRIME_BYTES = 64 << 20


class LogWatch:
    """The files matching ``patterns``, followed from their end; their start-up lines remembered
    from what they already hold (an engine started before the agent printed them there)."""

    def __init__(self, patterns: list[str]) -> None:
        self.tailer = LogTailer(patterns)
        self._context: dict[str, dict[int, str]] = {}  # path -> context kind -> last line of that kind
        self._lock = threading.Lock()  # one scan at a time: the tailer and the context are not shared
        for path in self.tailer.followed:
            self._prime(path)

    def scan(self) -> dict[str, list[str]]:
        """Blocking: the new lines of each file that hold OOM evidence, after that file's remembered
        start-up lines."""
        with self._lock:
            new: dict[str, list[str]] = {}
            for path, line in self.tailer.poll():
                new.setdefault(path, []).append(line)
            evidence: dict[str, list[str]] = {}
            for path, lines in new.items():
                context = self._take_context(path, lines)
                if parse_evidence(lines)[0]:
                    evidence[path] = [*context, *lines]
            return evidence

    def close(self) -> None:
        """Blocking: close the files, after a scan in flight (not under it)."""
        with self._lock:
            self.tailer.close()

    def _take_context(self, path: str, lines: list[str]) -> list[str]:
        """The remembered start-up lines of ``path`` that still describe the engine writing
        ``lines`` (those before the first kind ``lines`` prints again); remembers ``lines``' own."""
        mem = self._context.setdefault(path, {})
        kinds = [(k, line) for line in lines if (k := _context_kind(line)) is not None]
        first = kinds[0][0] if kinds else len(_CONTEXT_MARKERS)
        context = [mem[k] for k in sorted(mem) if k < first]
        for k, line in kinds:
            for later in [j for j in mem if j > k]:
                del mem[later]
            mem[k] = line
        return context

    def _prime(self, path: str) -> None:
        """Remember the start-up lines an existing log already holds: the tailer starts at its end."""
        try:
            with open(path, "rb") as fh:
                size = fh.seek(0, os.SEEK_END)
                fh.seek(max(0, size - _PRIME_BYTES))
                raws = bounded_lines(fh)  # cut as the tailer cuts them: a line may be a user's megabytes
                if size > _PRIME_BYTES:
                    next(raws, None)  # the cut first line
                lines = [raw.decode("utf-8", errors="replace").rstrip("\r\n") for raw in raws
                         if any(m in raw for m in _CONTEXT_BYTES)]
        except OSError as exc:
            log.warning("log file unreadable", path=path, error=str(exc))
            return
        self._take_context(path, lines)


def _context_kind(line: str) -> int | None:
    """The index in :data:`_CONTEXT_MARKERS` of a start-up line, None for any other line (and for the
    request logger's: a prompt that quotes start-up lines neither replaces them nor starts a new run)."""
    kind = next((i for i, markers in enumerate(_CONTEXT_MARKERS) if any(m in line for m in markers)), None)
    return None if kind is None or is_request_log(line) else kind
