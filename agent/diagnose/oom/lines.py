"""The shape of a log line: where its message starts, and whether a user's text wrote it.

Why a module of its own: OOM evidence is only evidence where PyTorch, vLLM, the kernel or the
NVIDIA driver print it, and every one of them prints its message at a known place, after a
known prefix (a timestamp, a container runtime's stream tag, vLLM's ``(EngineCore_DP0 pid=7)``
process tag and ``ERROR 05-08 14:46:12 [core.py:330]`` level/logger prefix, the kernel's
``[  518.050606]`` or journald's ``May 15 23:09:30 host kernel:``). A prompt echoed by vLLM's
request logger (``Received request ...: prompt: 'CUDA out of memory. Tried to allocate ...'``)
holds the same words in the middle of a line. :func:`message` strips the known prefixes, so
:mod:`agent.diagnose.oom.evidence` can anchor every pattern to the start of what is left, and
:func:`is_request_log` names the request logger's own lines (the prompt, its token ids, the
sampling parameters with their stop strings, the generated text), which are never evidence.

:data:`MAX_LINE_CHARS` bounds what is matched per line: a real evidence line is a few KiB;
a longer "line" is a user's prompt or binary junk, and matching it in full would let one
request stall the scan. All patterns are RE2 (:mod:`agent.gocompat.regex`): linear time.
"""

from __future__ import annotations

from agent.gocompat.regex import compile_go

__all__ = ["MAX_LINE_CHARS", "is_request_log", "message", "record_texts"]

#: The longest line matched for evidence (characters); the rest of a longer line is not read.
#: vLLM's longest own lines (the engine config, a non-default args dict) are under 8 KiB.
MAX_LINE_CHARS = 64 * 1024

#: One prefix a program or a log shipper puts before a message, anchored at the start. They
#: stack ("May 15 23:09:30 host kernel: [  518.05] ...", "vllm-1  | (EngineCore pid=7) ERROR ..."),
#: so :func:`message` strips them one at a time.
_PREFIX = compile_go(
    r"^(?:"
    r"[\w.-]+ +\| "  # docker compose: "vllm-1  | "
    r"|\[pod/[^\]\s]+\] "  # kubectl logs --prefix: "[pod/vllm-0/vllm] "
    r"|\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)?"  # RFC 3339 / ISO time, then one of:
    r"(?: (?:stdout|stderr) [FP] "  # CRI (/var/log/containers): "<time> stderr F "
    r"| [^\s:\[]+ [\w./-]+(?:\[\d+\])?: "  # journalctl -o short-iso: "<time> host kernel: "
    r"| - [\w.]+ - [A-Z]+ - "  # Python logging's "<time> - lmdeploy - ERROR - "
    r"| )"  # kubectl logs --timestamps: "<time> "
    r"|\[\d{4}-\d\d-\d\d[T ][^\]]{0,40}\] "  # "[2026-02-24T20:21:58Z] "
    r"|[A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d(?:\.\d+)? [^\s:\[]+ [\w./-]+(?:\[\d+\])?: "  # syslog, journalctl's
    # short and short-precise: "May 15 23:09:30[.123456] host kernel: "
    r"|\[[A-Z][a-z]{2} [A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d \d{4}\] "  # dmesg -T: "[Thu May  9 14:52:38 2024] "
    r"|\[ *\d+\.\d+\](?: [^\s:\[]+ [\w./-]+(?:\[\d+\])?:)? "  # dmesg: "[  518.050606] ", journalctl -o
    # short-monotonic: "[  518.050606] host kernel: "
    r"|\[rank\d+\]: "  # torch.distributed: "[rank0]: "
    r"|\([A-Za-z_][\w-]*(?: [A-Z]+\d+)*(?:,? \w+=[\w.:/-]*)+\) "  # "(EngineCore_DP0 pid=7130) ",
    # "(VllmWorker rank=1 pid=9) ", "(VllmWorker TP0 pid=1430) ", "(Worker_PP1 TP0 pid=7) "
    r"|(?:DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL) \d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)? \[?[\w.-]+:\d+\] "  # vLLM
    r"|(?:DEBUG|INFO|WARNING|ERROR|CRITICAL): +"  # uvicorn: "INFO:     "
    r")", what="log line prefix")
#: The message field of a JSON log record (Docker's json-file "log", structured loggers' "message"/"msg").
_RECORD_MESSAGE = ("log", "message", "msg")
#: Where Python's JSON loggers (python-json-logger, structlog's JSON renderer) put the traceback: the
#: exception line that is the evidence ("torch.OutOfMemoryError: CUDA out of memory ...") is there.
_RECORD_TRACEBACK = ("exc_info", "exception", "stack_info", "stack_trace", "traceback")
#: The traceback lines of one record that are read: the exception line is the last of a traceback,
#: so the tail is kept.
_MAX_TRACEBACK_LINES = 200
#: No line stacks more prefixes than this; a line made of prefixes stops being stripped here.
_MAX_PREFIXES = 8

#: vLLM's request logger (``vllm.entrypoints.logger``, ``.../serve/utils/request_logger.py``):
#: "Received request <id>: prompt: '...', params: ..., prompt_token_ids: [...]" (to 0.10), then
#: "Request <id> details: prompt: '...'" (DEBUG) with "Received request <id>: params: ..." (INFO);
#: "Generated response <id>[ (streaming ...)]: output: '...'" with --enable-log-outputs.
_REQUEST_LOG = compile_go(r"^(?:Received request |Generated response |Request \S+ details: )",
                          what="request log line")
#: Fields only the request logger prints: a line holding one quotes a user's text.
_REQUEST_FIELDS = ("prompt: ", "prompt_token_ids: ", "output: '", 'output: "', "output_token_ids: ")
#: Substrings every request logger line holds: most lines have none and skip the regexes.
_REQUEST_HINTS = ("Received request ", "Generated response ", " details: ", *_REQUEST_FIELDS)


def message(line: str) -> str:
    """``line`` without the prefixes its writers and shippers put before the message and without
    terminal colour codes (at most :data:`MAX_LINE_CHARS` of it). vLLM colours its process prefix
    ("\\x1b[1;36m(EngineCore_DP0 pid=7)\\x1b[0;0m", and newer releases its level too), and the codes
    land in files written through a TTY."""
    text = _plain(line[:MAX_LINE_CHARS])
    for _ in range(_MAX_PREFIXES):
        m = _PREFIX.search(text)
        if m is None or m.end() == 0:
            break
        text = text[m.end():]
    return text


def record_texts(record: dict[str, object]) -> list[str]:
    """What a JSON log record says, line by line: its message, then the lines of its traceback
    (the last :data:`_MAX_TRACEBACK_LINES`). Its other fields (a ``prompt``, request parameters) are
    data, never read as log text; an empty list for a record with neither."""
    said = next((v for k in _RECORD_MESSAGE if isinstance(v := record.get(k), str)), None)
    out = [said] if said is not None else []
    for key in _RECORD_TRACEBACK:
        if isinstance(trace := record.get(key), str):
            out.extend(trace[-MAX_LINE_CHARS:].split("\n")[-_MAX_TRACEBACK_LINES:])
    return out


def _plain(text: str) -> str:
    """``text`` without terminal colour and style codes (``ESC [ digits/; letter``), in one pass."""
    if "\x1b[" not in text:
        return text
    out, pos = [], 0
    while (i := text.find("\x1b[", pos)) >= 0:
        j = i + 2
        while j < len(text) and text[j] in "0123456789;":
            j += 1
        if j < len(text) and ("a" <= text[j] <= "z" or "A" <= text[j] <= "Z"):
            out.append(text[pos:i])  # a code: dropped
            pos = j + 1
        else:
            out.append(text[pos:j])  # not a code: kept as text
            pos = j
    out.append(text[pos:])
    return "".join(out)


def is_request_log(line: str) -> bool:
    """Whether ``line`` is the request logger's: it quotes a user's prompt, stop strings or the
    generated text, so nothing in it is evidence."""
    if not any(hint in line for hint in _REQUEST_HINTS):
        return False
    msg = message(line)
    return _REQUEST_LOG.search(msg) is not None or any(field in msg for field in _REQUEST_FIELDS)
