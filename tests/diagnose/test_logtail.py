"""LogTailer on real temporary files: new lines only, rotation, truncation, missing files, globs,
partial lines and the per-poll byte bound."""

from __future__ import annotations

import os
from collections.abc import Iterator, MutableMapping
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from agent.diagnose.logtail import LogTailer


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


def test_overlong_line_is_returned_in_pieces(tmp_path: Path) -> None:
    """A line with no newline longer than the bound is not buffered without limit."""
    log = tmp_path / "vllm.log"
    log.write_text("")
    with LogTailer([str(log)], max_bytes_per_poll=4) as tail:
        _append(log, "xxxxxxxx")
        assert [line for _, line in tail.poll()] == ["xxxx"]
        assert [line for _, line in tail.poll()] == ["xxxx"]


def test_bad_bound_is_rejected() -> None:
    """max_bytes_per_poll must be positive."""
    with pytest.raises(ValueError, match="positive"):
        LogTailer([], max_bytes_per_poll=0)
