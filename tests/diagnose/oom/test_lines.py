"""Log line shapes: the prefixes stripped before a message, and the request logger's lines named.
Expected messages are the text after the prefix, read off each line by hand."""

from __future__ import annotations

import time

import pytest

from agent.diagnose.oom.lines import MAX_LINE_CHARS, is_request_log, message

MSG = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 270.00 MiB."


@pytest.mark.parametrize("prefix", [
    "",
    "ERROR 05-08 14:46:12 [multiproc_executor.py:435] ",  # vLLM, newer logger prefix
    "ERROR 11-23 18:54:13 engine.py:135] ",  # vLLM, older
    "(VllmWorker rank=1 pid=194255) ERROR 05-08 14:46:12 [multiproc_executor.py:435] ",
    "(EngineCore_DP0 pid=6940) ",
    "(RayWorkerWrapper pid=5543, ip=10.0.0.2) ERROR 05-08 14:46:12 [worker_base.py:620] ",
    "vllm-1  | ERROR 11-18 18:07:28 engine.py:366] ",  # docker compose
    "[2026-02-24T20:21:58Z] (EngineCore_DP0 pid=6940) ",
    "2025-05-08T14:46:12.123456789Z stderr F ",  # CRI, /var/log/containers
    "2025-05-08T14:46:12.123456789Z ",  # kubectl logs --timestamps
    "[pod/vllm-0/vllm] ",  # kubectl logs --prefix
    "[rank0]: ",  # torch.distributed
    "2025-05-08 14:46:12,123 - lmdeploy - ERROR - ",  # Python logging
    "\x1b[1;36m(VllmWorker rank=1 pid=194255)\x1b[0;0m ERROR 05-08 14:46:12 [multiproc_executor.py:435] ",  # coloured
    "\x1b[1;36m(EngineCore_DP0 pid=7)\x1b[0;0m \x1b[0;31mERROR\x1b[0m 05-08 14:46:12 [core.py:330] ",
])
def test_known_prefixes_are_stripped(prefix: str) -> None:
    """Each writer's and shipper's prefix, alone or stacked, comes off; the message is left as printed."""
    assert message(prefix + MSG) == MSG


@pytest.mark.parametrize(("line", "expected"), [
    ("May 15 23:09:30 ubuntu-s-1vcpu-2gb-ams3-01 kernel: [  518.050606] Out of memory: Killed process 15784",
     "Out of memory: Killed process 15784"),
    ("2024-05-15T23:09:30+0000 gpu-node-1 kernel: NVRM: Xid (PCI:0000:44:00): 79, GPU has fallen off the bus",
     "NVRM: Xid (PCI:0000:44:00): 79, GPU has fallen off the bus"),
    ("[Thu May  9 14:52:38 2024] memory: usage 67579904kB, limit 67579904kB, failcnt 67391",
     "memory: usage 67579904kB, limit 67579904kB, failcnt 67391"),
    ("[ 179.437933] NVRM: Xid (PCI:0000:01:00): 32, Channel ID 00000005",
     "NVRM: Xid (PCI:0000:01:00): 32, Channel ID 00000005"),
    ("INFO:     ::1:36840 - \"POST /v1/completions HTTP/1.1\" 500",
     "::1:36840 - \"POST /v1/completions HTTP/1.1\" 500"),
])
def test_kernel_and_server_prefixes(line: str, expected: str) -> None:
    """Journald (short and ISO), dmesg (-T and seconds) and uvicorn prefixes come off."""
    assert message(line) == expected


@pytest.mark.parametrize("line", [
    "RuntimeError: CUDA out of memory",  # an exception name is part of the message
    "Out of memory: Killed process 1 (x)",  # two words and a colon: not a journald host and ident
    "    raise ValueError(\"No available memory for the cache blocks. \"",  # a traceback's source line
    "Memory cgroup out of memory: Killed process 1 (x)",
])
def test_messages_are_left_alone(line: str) -> None:
    """Text that only looks like a prefix (an exception name, indentation) stays in the message."""
    assert message(line) == line


def test_message_is_bounded() -> None:
    """A line longer than MAX_LINE_CHARS is read only to it."""
    assert len(message("x" * (MAX_LINE_CHARS * 4))) == MAX_LINE_CHARS


@pytest.mark.parametrize("msg", [
    "Received request cmpl-8287d124-0: prompt: 'hello', params: SamplingParams(n=1), prompt_token_ids: [1, 2]",
    "Received request chatcmpl-1: params: SamplingParams(n=1, stop=['x']), lora_request: None.",
    "Request chatcmpl-1 details: prompt: 'hello', prompt_token_ids: [1], prompt_embeds shape: None.",
    "Generated response chatcmpl-1: output: 'hi', output_token_ids: [2], finish_reason: stop",
    "Generated response chatcmpl-1 (streaming complete): output: 'hi', output_token_ids: None, finish_reason: stop",
    "something else: prompt: 'a user text'",
])
def test_request_logger_lines_are_named(msg: str) -> None:
    """vLLM's request logger, in every generation's wording (and any line with its prompt field), is named."""
    assert is_request_log(msg)


@pytest.mark.parametrize("msg", [
    "Added request cmpl-8287d124d13540a4b5f901437edcdf77-0.",
    "Avg prompt throughput: 0.0 tokens/s, Avg generation throughput: 14.3 tokens/s",
    MSG,
])
def test_engine_lines_are_not_request_lines(msg: str) -> None:
    """The engine's own lines (including those that mention prompts in its statistics) are not the request logger's."""
    assert not is_request_log(msg)


@pytest.mark.parametrize(("text", "expected"), [
    ("\x1b[1;36m(EngineCore_DP0 pid=7)\x1b[0;0m " + MSG, MSG),
    ("\x1b[2K\x1b[32mINFO\x1b[0m 05-08 14:46:12 [core.py:1] " + MSG, MSG),  # erase-line, a coloured level
    ("\x1b[ not a code " + MSG, "\x1b[ not a code " + MSG),  # an ESC [ without a final letter stays text
    ("\x1b[1;3 " + MSG, "\x1b[1;3 " + MSG),
])
def test_terminal_codes_are_removed(text: str, expected: str) -> None:
    """vLLM's colour codes (through a TTY) go; an ESC [ that is not a complete code stays."""
    assert message(text) == expected


def test_many_terminal_codes_are_removed_in_linear_time() -> None:
    """A line made of 64 KiB of colour codes is plain text after one pass (no search per code from the start)."""
    t0 = time.perf_counter()
    assert message("\x1b[0m" * (MAX_LINE_CHARS // 4) + MSG) == ""
    assert time.perf_counter() - t0 < 1.0
