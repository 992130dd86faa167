"""Read a pasted vLLM or LMDeploy serving command line into memory-planner inputs.

Operators already have the command that starts their server; ``sre-agent plan -- vllm
serve ...`` plans exactly that. Recognised forms::

    vllm serve MODEL [flags]
    python -m vllm.entrypoints.openai.api_server --model MODEL [flags]
    lmdeploy serve api_server MODEL [flags]

given as separate arguments or as one quoted string (split with :func:`shlex.split`).
``--flag=value`` and ``--flag value`` both work, as do vLLM's ``--flag_name`` spellings
and human-readable lengths (``32k`` = 32,000, ``32K`` = 32,768, as vLLM reads them).
Leading ``VAR=value`` environment assignments are skipped, except
``VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE=1``, which lets Llama 4's chunked layers keep
only their chunk (``hybrid_chunked_attention``). Flags that do not change the
memory plan (``--port``, ``--trust-remote-code``, …) are ignored, each with a note, so a
real command line can be pasted unchanged.

LMDeploy's flags map onto the planner's fields: ``--tp`` → tensor parallel size,
``--session-len`` → max model length, ``--max-batch-size`` → max sequences,
``--cache-max-entry-count`` (a fraction of the memory *free after the weights*),
``--quant-policy 8``/``4`` → int8/int4 KV cache, ``--model-format awq``/``gptq`` → 4-bit weights,
``--cache-block-seq-len`` → block size (default 64).
"""

from __future__ import annotations

import math
import re
import shlex
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import PurePath
from typing import Any

from agent.diagnose.plan.fields import MAX_VALUE
from agent.diagnose.plan.quant import METHODS, normalize_method
from agent.errors import DiagnosisError

__all__ = ["ServeCommand", "parse_count", "parse_fraction", "parse_human_int", "parse_serve_command"]

_ENV_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
_HUMAN_INT = re.compile(r"^(\d+(?:\.\d+)?)([kKmMgG]?)$")
_UNITS = {"": 1, "k": 10**3, "K": 2**10, "m": 10**6, "M": 2**20, "g": 10**9, "G": 2**30}
_SHORT = {"-tp": "tensor-parallel-size", "-pp": "pipeline-parallel-size", "-q": "quantization"}
_QUANT_ALIASES = {"hf": "none", "llama": "none"}  # LMDeploy's --model-format names for 16-bit weights


def parse_human_int(text: str) -> int:
    """``8192``, ``32k`` (32,000) or ``32K`` (32,768): vLLM's reading of lengths. A length is at
    least 1 and at most :data:`~agent.diagnose.plan.fields.MAX_VALUE`."""
    m = _HUMAN_INT.match(text.strip())
    if m is None:
        raise ValueError(f"must be a positive whole number, got {text!r:.60} (use e.g. 8192, 32k or 32K)")
    value = float(m.group(1)) * _UNITS[m.group(2)]
    if not value.is_integer():  # also inf, from a number too long for a float
        raise ValueError(f"must be a positive whole number, got {text!r:.60}")
    return _in_range(int(value), text)


def parse_count(text: str) -> int:
    """A parallel size, sequence count or block size: a whole number ≥ 1 (``0``, ``-4``, ``2.5``,
    ``nan`` and ``inf`` are refused with the value in the message)."""
    try:
        value = int(text.strip())
    except ValueError as exc:
        raise ValueError(f"must be a positive integer, got {text!r:.60}") from exc
    return _in_range(value, text)


def parse_fraction(text: str) -> float:
    """A share of memory (``--gpu-memory-utilization``, ``--cache-max-entry-count``): a finite
    number in (0, 1]. ``nan`` would compare false with every bound and slip through a range check."""
    try:
        value = float(text.strip())
    except ValueError as exc:
        raise ValueError(f"must be a number in (0, 1], got {text!r:.60}") from exc
    if not (math.isfinite(value) and 0 < value <= 1):
        raise ValueError(f"must be a number in (0, 1], got {text!r:.60}")
    return value


def _in_range(value: int, text: str) -> int:
    if value < 1:
        raise ValueError(f"must be a positive integer, got {text!r:.60}")
    if value > MAX_VALUE:
        raise ValueError(f"must be at most {MAX_VALUE:,}, got {text!r:.60}")
    return value


def _quant(text: str) -> str:
    key = _QUANT_ALIASES.get(text.strip().lower()) or normalize_method(text)
    if key not in METHODS:
        raise ValueError(f"quantization {text!r} is not modelled ({', '.join(METHODS[1:])})")
    return key


def _quant_policy(text: str) -> str:
    policies = {"0": "auto", "4": "int4", "8": "int8"}
    if text.strip() not in policies:
        raise ValueError(f"--quant-policy must be 0, 4 or 8, not {text!r}")
    return policies[text.strip()]


def _dtype(text: str) -> str:
    value = text.strip().lower()
    return "float16" if value == "half" else value


# flag (without dashes, '_' read as '-') -> (PlanInput field, converter)
_Converter = Callable[[str], Any]
_VLLM_FLAGS: dict[str, tuple[str, _Converter]] = {
    "model": ("model", str),
    "tensor-parallel-size": ("tensor_parallel_size", parse_count),
    "pipeline-parallel-size": ("pipeline_parallel_size", parse_count),
    "max-model-len": ("max_model_len", parse_human_int),
    "max-num-seqs": ("max_num_seqs", parse_count),
    "gpu-memory-utilization": ("gpu_memory_utilization", parse_fraction),
    "quantization": ("quantization", _quant),
    "dtype": ("dtype", _dtype),
    "kv-cache-dtype": ("kv_cache_dtype", str.lower),
    "block-size": ("block_size", parse_count),
    "max-num-batched-tokens": ("max_num_batched_tokens", parse_human_int),
}
_LMDEPLOY_FLAGS: dict[str, tuple[str, _Converter]] = {
    "tp": ("tensor_parallel_size", parse_count),
    "session-len": ("max_model_len", parse_human_int),
    "max-batch-size": ("max_num_seqs", parse_count),
    "cache-max-entry-count": ("cache_max_entry_count", parse_fraction),
    "quant-policy": ("kv_cache_dtype", _quant_policy),
    "model-format": ("quantization", _quant),
    "dtype": ("dtype", _dtype),
    "cache-block-seq-len": ("block_size", parse_count),
    "max-prefill-token-num": ("max_num_batched_tokens", parse_count),
}
# Switches that change the plan: flag -> PlanInput field set to True.
_VLLM_SWITCHES = {"disable-hybrid-kv-cache-manager": "disable_hybrid_kv_cache_manager"}
# Environment variables before the command that change the plan: variable (set to 1) -> PlanInput field.
_VLLM_ENV_SWITCHES = {"VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE": "hybrid_chunked_attention"}
# Flags known to take no value (the rest of --enable-*/--disable-*/--no-* are treated alike).
_BOOLEAN_FLAGS = frozenset({"trust-remote-code", "enforce-eager", "disable-log-requests", "disable-log-stats",
                            "enable-prefix-caching", "enable-chunked-prefill", "enable-auto-tool-choice",
                            "disable-custom-all-reduce", "skip-tokenizer-init", "enable-lora", "log-stats"})


@dataclass(frozen=True)
class ServeCommand:
    """A parsed serving command: ``options`` holds only the planner fields the command set."""

    engine: str  # "vllm" or "lmdeploy"
    model: str
    options: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def parse_serve_command(argv: Sequence[str]) -> ServeCommand:
    """Parse a serving command. Raises :class:`DiagnosisError` for an unrecognised program,
    a missing model, an unbalanced quote in a one-string command, or a flag value that is not
    a usable number where one is needed (naming the flag)."""
    tokens = list(argv)
    if len(tokens) == 1 and any(c.isspace() for c in tokens[0]):
        try:
            tokens = shlex.split(tokens[0])
        except ValueError as exc:  # "No closing quotation", "No escaped character"
            raise DiagnosisError(f"cannot split the serving command as a shell would: {exc}") from exc
    environment: dict[str, str] = {}
    while tokens and _ENV_ASSIGNMENT.match(tokens[0]):
        key, _, value = tokens.pop(0).partition("=")
        environment[key] = value
    if not tokens:
        raise DiagnosisError("no serving command after '--' (e.g. -- vllm serve MODEL --tensor-parallel-size 4)")
    program = PurePath(tokens[0]).name
    if program == "vllm" and tokens[1:2] == ["serve"]:
        engine, rest = "vllm", tokens[2:]
    elif program.startswith("python") and tokens[1:3] == ["-m", "vllm.entrypoints.openai.api_server"]:
        engine, rest = "vllm", tokens[3:]
    elif program == "lmdeploy" and tokens[1:3] == ["serve", "api_server"]:
        engine, rest = "lmdeploy", tokens[3:]
    else:
        raise DiagnosisError(f"not a vLLM or LMDeploy serving command: {shlex.join(tokens[:3])!r}; expected "
                             "'vllm serve MODEL ...', 'python -m vllm.entrypoints.openai.api_server --model M ...' "
                             "or 'lmdeploy serve api_server MODEL ...'")
    known = _VLLM_FLAGS if engine == "vllm" else _LMDEPLOY_FLAGS
    options: dict[str, Any] = {field: True for var, field in _VLLM_ENV_SWITCHES.items()
                               if engine == "vllm" and environment.get(var) == "1"}
    notes: list[str] = []
    positional: list[str] = []
    i = 0
    while i < len(rest):
        arg = rest[i]
        i += 1
        if not arg.startswith("-") or arg == "-":
            positional.append(arg)
            continue
        name, eq, value = arg.partition("=")
        name = _SHORT[name] if engine == "vllm" and name in _SHORT else name.lstrip("-").replace("_", "-")
        takes_value = name in known or not (name in _BOOLEAN_FLAGS or name.startswith(("enable-", "disable-", "no-")))
        if not eq and takes_value and i < len(rest) and not rest[i].startswith("--"):
            value = rest[i]
            i += 1
        if engine == "vllm" and name in _VLLM_SWITCHES:
            options[_VLLM_SWITCHES[name]] = True
            continue
        if name not in known:
            notes.append(f"ignored --{name}" + (f" {value}" if value else "") + " (does not change the memory plan)")
            continue
        target, convert = known[name]
        try:
            options[target] = convert(value)
        except ValueError as exc:
            raise DiagnosisError(f"--{name}: {exc}") from exc
    model = str(options.pop("model", ""))
    if not model and positional:
        model = positional.pop(0)
    notes.extend(f"ignored argument {extra!r}" for extra in positional)
    if not model:
        raise DiagnosisError(f"the {engine} command names no model")
    return ServeCommand(engine=engine, model=model, options=options, notes=notes)
