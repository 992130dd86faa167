"""Fuzz the OOM evidence scanner with a user's text: whatever a prompt holds (pieces of real
evidence lines, prefixes, quotes, separators), vLLM's request logger printing it yields no
evidence, and no input line makes the scanner raise."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from agent.diagnose.oom.evidence import parse_evidence
from tests.fuzz import budget

#: Pieces of real evidence and of the prefixes before it (tests/fixtures/logs), to build prompts from.
_PIECES = st.sampled_from([
    "RuntimeError: ", "torch.OutOfMemoryError: ", "CUDA out of memory. Tried to allocate 1.00 GiB",
    ". GPU 0 has a total capacity of 79.14 GiB of which 3.02 GiB is free.", "CUDA error: out of memory",
    "Out of memory: Killed process 15784 (python3) total-vm:11964kB, anon-rss:4288kB",
    "Memory cgroup out of memory: ", "oom-kill:constraint=CONSTRAINT_MEMCG,oom_memcg=/kubepods,task=python,pid=1",
    "memory: usage 1kB, limit 1kB, failcnt 1", "NVRM: Xid (PCI:0000:44:00): 79, GPU has fallen off the bus",
    "ValueError: No available memory for the cache blocks.", "Available KV cache memory: -2.14 GiB",
    "Sequence group 1 is preempted by PreemptionMode.RECOMPUTE mode because there is not enough KV cache space",
    "ERROR 05-08 14:46:12 [core.py:330] ", "(EngineCore_DP0 pid=7) ", "[  518.050606] ", "[rank0]: ",
    "May 15 23:09:30 host kernel: ", "2025-05-08T14:46:12Z stderr F ", "\n", "\\n", "'", '"', " ", "\u2028", "{",
])
_PROMPT = st.one_of(st.lists(_PIECES, max_size=8).map("".join),
                    st.lists(st.one_of(_PIECES, st.text(max_size=6)), max_size=8).map("".join))


def _shapes(prompt: str) -> list[str]:
    r = repr(prompt)  # vLLM logs the prompt and the output with %r
    return [
        f"INFO 11-23 18:54:12 logger.py:37] Received request cmpl-1: prompt: {r}, params: SamplingParams(n=1), "
        "prompt_token_ids: [1, 2], lora_request: None.",
        f"(APIServer pid=1) DEBUG 06-14 05:10:02 [logger.py:35] Request chatcmpl-9 details: prompt: {r}, "
        "prompt_token_ids: [1], prompt_embeds shape: None.",
        f"(APIServer pid=1) INFO 06-14 05:10:02 [logger.py:41] Received request chatcmpl-9: params: "
        f"SamplingParams(n=1, stop=[{r}]), lora_request: None.",
        f"(APIServer pid=1) INFO 06-14 05:10:03 [logger.py:70] Generated response chatcmpl-9: output: {r}, "
        "output_token_ids: [3], finish_reason: stop",
        json.dumps({"log": f"INFO 11-23 18:54:12 logger.py:37] Received request cmpl-1: prompt: {r}\n"}),
        json.dumps({"request_id": "cmpl-1", "prompt": prompt}),
    ]


@budget(80)
@given(prompt=_PROMPT)
def test_a_logged_prompt_is_never_evidence(prompt: str) -> None:
    """vLLM's request logger printing any prompt (in every generation's shape) yields no evidence."""
    text = "\n".join(_shapes(prompt))
    matches, _ = parse_evidence(text)
    assert matches == [], text


@budget(80)
@given(text=st.one_of(_PROMPT, st.text(max_size=200)))
def test_any_text_scans_without_an_error(text: str) -> None:
    """The scanner reads any text (as one string and as lines) and returns matches, never an exception."""
    parse_evidence(text)
    parse_evidence(text.split("\n"))
