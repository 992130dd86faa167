"""LogTailer on real temporary files: new lines only, rotation, truncation, missing files, globs,
partial lines, the per-poll byte bound and the line-length bound."""

from __future__ import annotations

import os
from collections.abc import Iterator, MutableMapping
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from agent.diagnose.logtail import LogTailer, bounded_lines


@pytest.fixture(autouse=True)
def logs() -> Iterator[list[MutableMapping[str, Any]]]:
    """The tailer's log events, captured (whatever another test left structlog pointing at)."""
    with capture_logs() as events:
        yield events


def _append(path: Path, text: str) -> None:
    with path.open("a", encoding="utf-8") as fh:
        fh.write(text)


def test_starts_at_the_end_of_existing_files(tmp_path: Path) -> None:
    """Lines already in a file at start are skipped; lines appended later come back in order."""
    log = tmp_path / "vllm.log"
    log.write_text("old OOM line\n")
    with LogTailer([str(log)]) as tail:
        assert tail.poll() == []
        _append(log, "first\nsecond\n")
        assert tail.poll() == [(str(log), "first"), (str(log), "second")]
        assert tail.poll() == []


def test_from_start_reads_existing_lines(tmp_path: Path) -> None:
    """from_start=True returns what the file already holds."""
    log = tmp_path / "vllm.log"
    log.write_text("a\nb\n")
    with LogTailer([str(log)], from_start=True) as tail:
        assert [line for _, line in tail.poll()] == ["a", "b"]


def test_partial_line_is_held_until_its_newline(tmp_path: Path) -> None:
    """A line written in two pieces is returned once, whole; CRLF endings lose the CR."""
    log = tmp_path / "vllm.log"
    log.write_text("")
    with LogTailer([str(log)]) as tail:
        _append(log, "torch.OutOfMemoryError: CUDA out")
        assert tail.poll() == []
        _append(log, " of memory.\r\nnext")
        assert tail.poll() == [(str(log), "torch.OutOfMemoryError: CUDA out of memory.")]


def test_rotation_reads_the_old_file_to_its_end_then_the_new_one(tmp_path: Path) -> None:
    """logrotate's rename-and-create: the rest of the old file, then the new file from its start."""
    log = tmp_path / "vllm.log"
    log.write_text("")
    with LogTailer([str(log)]) as tail:
        _append(log, "before\n")
        assert [line for _, line in tail.poll()] == ["before"]
        _append(log, "last words\nunterminated")
        os.rename(log, tmp_path / "vllm.log.1")
        log.write_text("fresh\n")
        assert [line for _, line in tail.poll()] == ["last words", "unterminated", "fresh"]
        _append(log, "more\n")
        assert [line for _, line in tail.poll()] == ["more"]


def test_rotated_away_and_recreated_later(tmp_path: Path) -> None:
    """A file renamed away is finished; when the path reappears it is read from its start."""
    log = tmp_path / "vllm.log"
    log.write_text("")
    with LogTailer([str(log)]) as tail:
        _append(log, "tail of old\n")
        os.rename(log, tmp_path / "old.log")
        assert [line for _, line in tail.poll()] == ["tail of old"]
        assert tail.poll() == []
        log.write_text("new file\n")
        assert [line for _, line in tail.poll()] == ["new file"]


def test_truncation_restarts_at_the_beginning(tmp_path: Path) -> None:
    """copytruncate: the file shrinks below the offset; reading starts over at 0."""
    log = tmp_path / "vllm.log"
    log.write_text("")
    with LogTailer([str(log)]) as tail:
        _append(log, "a long line before truncation\n")
        tail.poll()
        log.write_text("short\n")  # truncates, same inode
        assert [line for _, line in tail.poll()] == ["short"]


def test_missing_file_is_logged_once_and_picked_up(tmp_path: Path, logs: list[MutableMapping[str, Any]]) -> None:
    """A path that does not exist yet: one warning, then its lines once it appears (from its start)."""
    log = tmp_path / "later.log"
    with LogTailer([str(log)]) as tail:
        assert tail.poll() == [] and tail.poll() == []
        log.write_text("appeared\n")
        assert [line for _, line in tail.poll()] == ["appeared"]
    missing = [e for e in logs if e["event"].startswith("log file missing")]
    assert [(e["log_level"], e["path"]) for e in missing] == [("warning", str(log))]


def test_globs_pick_up_new_files(tmp_path: Path) -> None:
    """A glob follows the files it matches at each poll, new ones from their start."""
    (tmp_path / "a.log").write_text("old a\n")
    with LogTailer([str(tmp_path / "*.log")]) as tail:
        assert tail.followed == [str(tmp_path / "a.log")]
        (tmp_path / "b.log").write_text("b1\n")
        _append(tmp_path / "a.log", "a1\n")
        (tmp_path / "c.txt").write_text("not matched\n")
        assert sorted(tail.poll()) == [(str(tmp_path / "a.log"), "a1"), (str(tmp_path / "b.log"), "b1")]


def test_max_bytes_per_poll_bounds_each_read(tmp_path: Path) -> None:
    """At most max_bytes_per_poll bytes per file per poll; the rest comes on the next polls, lines whole."""
    log = tmp_path / "vllm.log"
    log.write_text("")
    with LogTailer([str(log)], max_bytes_per_poll=8) as tail:
        _append(log, "abc\ndefgh\nij\n")  # 13 bytes
        assert [line for _, line in tail.poll()] == ["abc"]  # read "abc\ndefg"; "defg" held
        assert [line for _, line in tail.poll()] == ["defgh", "ij"]


@pytest.mark.parametrize(("per_poll", "writes"), [
    (4, ["x" * 30 + "\nnext\n"]),  # one write, read 4 bytes a poll
    (1 << 20, ["x" * 30 + "\nnext\n"]),  # one write, read at once
    (1 << 20, ["x" * 10, "x" * 10, "x" * 10 + "\n", "next\n"]),  # the long line arrives over several polls
    (7, ["y" * 5 + "x" * 25 + "\nnext\n"]),  # the cut falls inside a read
    (1 << 20, ["a" + "\u00e9" * 15 + "\nnext\n"]),  # two-byte characters: the cut splits one
])
def test_overlong_line_is_cut_and_its_rest_skipped(tmp_path: Path, per_poll: int, writes: list[str]) -> None:
    """A line longer than max_line_bytes comes back once, cut to that many bytes; the rest of it, up to
    its newline, is skipped (never returned as lines of their own) and counted; the next line is whole."""
    log = tmp_path / "vllm.log"
    log.write_text("")
    got: list[str] = []
    with LogTailer([str(log)], max_bytes_per_poll=per_poll, max_line_bytes=8) as tail:
        for text in writes:
            _append(log, text)
            for _ in range(40):  # enough polls to read what was written, per_poll bytes at a time
                got.extend(line for _, line in tail.poll())
        assert len(got) == 2 and got[1] == "next"
        assert len(got[0].encode()) <= 8 + 2 and got[0].rstrip("\ufffd") == writes[0][: len(got[0].rstrip("\ufffd"))]
        assert tail.lines_cut == 1


def test_line_at_the_bound_is_whole(tmp_path: Path) -> None:
    """A line of exactly max_line_bytes is returned whole and not counted as cut."""
    log = tmp_path / "vllm.log"
    log.write_text("")
    with LogTailer([str(log)], max_line_bytes=8) as tail:
        _append(log, "12345678\n123456789\n")
        assert [line for _, line in tail.poll()] == ["12345678", "12345678"]
        assert tail.lines_cut == 1


@pytest.mark.parametrize(("per_poll", "per_line"), [(0, 8), (8, 0), (-1, 8), (8, -1)])
def test_bad_bound_is_rejected(per_poll: int, per_line: int) -> None:
    """max_bytes_per_poll and max_line_bytes must be positive."""
    with pytest.raises(ValueError, match="positive"):
        LogTailer([], max_bytes_per_poll=per_poll, max_line_bytes=per_line)


@pytest.mark.parametrize(("data", "expected"), [
    (b"a\nbb\n", [b"a\n", b"bb\n"]),
    (b"12345678\nx\n", [b"12345678", b"x\n"]),  # the newline is the ninth byte: cut off
    (b"1234567\nx\n", [b"1234567\n", b"x\n"]),
    (b"x" * 30 + b"\nnext\n", [b"x" * 8, b"next\n"]),  # the rest of the long line is read past
    (b"first\n" + b"y" * 30, [b"first\n", b"y" * 8]),  # a long last line without a newline
    (b"last", [b"last"]),
    (b"", []),
])
def test_bounded_lines(tmp_path: Path, data: bytes, expected: list[bytes]) -> None:
    """bounded_lines gives each line cut to the bound, reading past (not returning) the rest of a long one."""
    path = tmp_path / "log"
    path.write_bytes(data)
    with path.open("rb") as fh:
        assert list(bounded_lines(fh, 8)) == expected
