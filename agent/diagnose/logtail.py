"""Follow log files like ``tail -F`` so the daemon sees OOM evidence as it is written.

The daemon calls :meth:`LogTailer.poll` from its scheduler and feeds the new lines to the OOM
diagnosis. Polling (rather than inotify) works the same on every filesystem, including the
network and overlay filesystems that container logs live on, and needs no thread.

What a tailer has to survive, and how:

* **start**: files that exist when the tailer is made are read from their end (old OOMs
  were diagnosed when they happened), unless ``from_start``; files that appear later are
  new and read from their start.
* **rotation** (logrotate's default ``create``: the file is renamed and a new one made):
  the path's inode changes; the rest of the old file is read through the still-open handle,
  then the new file from its start.
* **truncation** (logrotate's ``copytruncate``, or ``> file``): the size drops below the
  offset; reading restarts at 0.
* **missing files**: logged once, picked up when they appear. **Globs** (``/var/log/vllm/*.log``)
  are expanded at every poll.
* **partial last lines** are held until their newline arrives, so a line is never split.

``max_bytes_per_poll`` bounds the bytes read from each file per poll (a multi-GiB backlog
does not stall a poll; the rest comes on later polls). ``max_line_bytes`` bounds a line: a
longer one (a user's prompt echoed by the request logger, binary junk) is returned once, cut
to that many bytes, and the rest of it up to its newline is skipped and counted in
:attr:`LogTailer.lines_cut`. Returning the rest in pieces would make its middle look like
lines of their own, each starting wherever the cut fell, with text a user chose.

:meth:`LogTailer.poll` reads files: blocking work, so the daemon calls it in a worker thread.
"""

from __future__ import annotations

import glob
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import BinaryIO

import structlog

__all__ = ["MAX_LINE_BYTES", "LogTailer", "bounded_lines"]

log = structlog.get_logger(__name__)

#: The default line bound: vLLM's, PyTorch's and the kernel's own lines are a few KiB at most.
MAX_LINE_BYTES = 64 * 1024


def bounded_lines(fh: BinaryIO, limit: int = MAX_LINE_BYTES) -> Iterator[bytes]:
    """The lines of ``fh`` from where it stands, with their newline, each cut to ``limit`` bytes: the
    rest of a longer line is read past, never held (what the tailer returns, for a file read whole)."""
    while line := fh.readline(limit + 1):
        chunk = line
        while chunk and not chunk.endswith(b"\n"):  # a cut line: skip to its newline
            chunk = fh.readline(limit + 1)
        yield line[:limit]


@dataclass
class _Followed:
    handle: BinaryIO
    ident: tuple[int, int]  # (st_dev, st_ino) of the file the handle has open
    offset: int
    partial: bytes = b""
    skipping: bool = False  # inside the rest of a cut line: drop bytes up to its newline


class LogTailer:
    """Tails ``paths`` (files or glob patterns). Call :meth:`close` (or use ``with``) when done."""

    def __init__(self, paths: list[str], *, from_start: bool = False, max_bytes_per_poll: int = 1 << 20,
                 max_line_bytes: int = MAX_LINE_BYTES) -> None:
        if max_bytes_per_poll < 1:
            raise ValueError("max_bytes_per_poll must be positive")
        if max_line_bytes < 1:
            raise ValueError("max_line_bytes must be positive")
        self._patterns = list(paths)
        self._max = max_bytes_per_poll
        self._max_line = max_line_bytes
        self.lines_cut = 0  # lines longer than max_line_bytes, returned cut
        self._files: dict[str, _Followed] = {}
        self._missing_logged: set[str] = set()
        for path in self._expand():
            self._open(path, at_end=not from_start)

    def __enter__(self) -> LogTailer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        for f in self._files.values():
            f.handle.close()
        self._files.clear()

    @property
    def followed(self) -> list[str]:
        """The paths currently open, sorted."""
        return sorted(self._files)

    # -- polling -------------------------------------------------------------------------------
    def poll(self) -> list[tuple[str, str]]:
        """New complete lines since the last poll, as ``(path, line)`` without the newline,
        in file order per path."""
        out: list[tuple[str, str]] = []
        present = set(self._expand())
        for path in sorted(present | set(self._files)):
            try:
                st = os.stat(path)
            except FileNotFoundError:
                self._gone(path, out)
                continue
            except OSError as exc:
                log.warning("log file unreadable", path=path, error=str(exc))
                continue
            self._missing_logged.discard(path)
            f = self._files.get(path)
            if f is not None and f.ident != (st.st_dev, st.st_ino):
                log.info("log file rotated", path=path)
                self._drain(path, f, out, final=True)
                f = None
            if f is None:
                f = self._open(path, at_end=False)
                if f is None:
                    continue
            elif st.st_size < f.offset:
                log.info("log file truncated", path=path, size=st.st_size, offset=f.offset)
                f.handle.seek(0)
                f.offset, f.partial, f.skipping = 0, b"", False
            self._drain(path, f, out, final=False)
        for pattern in self._patterns:
            if pattern not in present and not glob.has_magic(pattern) and pattern not in self._missing_logged:
                self._missing_logged.add(pattern)
                log.warning("log file missing; will pick it up when it appears", path=pattern)
        return out

    # -- internals -----------------------------------------------------------------------------
    def _expand(self) -> list[str]:
        paths: list[str] = []
        for pattern in self._patterns:
            if glob.has_magic(pattern):
                paths.extend(p for p in sorted(glob.glob(pattern)) if os.path.isfile(p))
            elif os.path.isfile(pattern):
                paths.append(pattern)
        return list(dict.fromkeys(paths))

    def _open(self, path: str, *, at_end: bool) -> _Followed | None:
        try:
            handle = open(path, "rb")  # noqa: SIM115 - held open across polls to survive rotation
        except OSError as exc:
            log.warning("log file unreadable", path=path, error=str(exc))
            return None
        st = os.fstat(handle.fileno())
        offset = handle.seek(0, os.SEEK_END) if at_end else 0
        f = self._files[path] = _Followed(handle, (st.st_dev, st.st_ino), offset)
        log.debug("following log file", path=path, offset=offset)
        return f

    def _gone(self, path: str, out: list[tuple[str, str]]) -> None:
        f = self._files.get(path)
        if f is not None:  # renamed away and not yet recreated: finish what was written
            self._drain(path, f, out, final=True)
        if path not in self._missing_logged:
            self._missing_logged.add(path)
            log.warning("log file missing; will pick it up when it appears", path=path)

    def _drain(self, path: str, f: _Followed, out: list[tuple[str, str]], *, final: bool) -> None:
        data = f.handle.read(self._max)
        f.offset += len(data)
        pieces = data.split(b"\n")
        rest = pieces.pop()  # after the last newline: the start of a line still being written
        lines: list[bytes] = []
        for piece in pieces:
            if f.skipping:  # the newline that ends a cut line
                f.skipping = False
                continue
            lines.append(f.partial + piece)
            f.partial = b""
        if not f.skipping:
            f.partial += rest
        if len(f.partial) > self._max_line or (final and f.partial):
            lines.append(f.partial)
            f.partial, f.skipping = b"", len(f.partial) > self._max_line and not final
        for ln in lines:
            if len(ln) > self._max_line:
                self.lines_cut += 1
                log.debug("log line cut", path=path, max_line_bytes=self._max_line)
            out.append((path, ln[: self._max_line].rstrip(b"\r").decode("utf-8", errors="replace")))
        if final:
            f.handle.close()
            del self._files[path]
