"""The ``sre-agent plan`` command: the GPU memory planner on the command line.

Flags mirror vLLM's (``--tensor-parallel-size``/``-tp``, ``--max-model-len``, …) so a
plan reads like the server's own command line, or the command line itself can be pasted
after ``--`` (``sre-agent plan --gpu H100 -- vllm serve MODEL -tp 4``). Flags given to
``plan`` override the pasted command's. Exit status: 0 when ``max_num_seqs`` full-length
sequences fit, 1 when they (or the weights) do not, 2 on bad input (unknown model or GPU,
bad numbers, a command line that is not vLLM's or LMDeploy's).

``--from-target URL`` (repeatable) and ``--from-fleet CONFIG`` ask running vLLM replicas
instead: :mod:`agent.cli.plan_live` scrapes each once and prints its real KV capacity and
the change that removes its preemptions or queueing.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from agent.cli.argtypes import checked, duration
from agent.cli.exitcodes import EXIT_BAD_INPUT, EXIT_OK, EXIT_PROBLEM
from agent.cli.plan_live import DEFAULT_TIMEOUT_S, run_live
from agent.config import parse_size
from agent.diagnose.plan.memory import MXFP4_BACKENDS
from agent.diagnose.plan.models import (
    PRESETS,
    ModelSpec,
    find_model,
    gpu_memory_bytes,
    load_model_config,
    quantization_from_name,
)
from agent.diagnose.plan.overhead import SAMPLERS, accounting_for_version, default_max_num_seqs
from agent.diagnose.plan.planner import KV_CACHE_DTYPES, LMDEPLOY_SCALE_BYTES, QUANTIZATIONS, GiB, Plan, PlanInput, plan
from agent.diagnose.plan.servecmd import parse_count, parse_fraction, parse_human_int, parse_serve_command
from agent.errors import DiagnosisError

__all__ = ["add_parser", "build_input", "render_table", "run"]

_DESCRIPTION = """\
Will this model fit on these GPUs, and how many full-length sequences does the KV cache hold?

  sre-agent plan --model meta-llama/Meta-Llama-3-70B-Instruct --gpu A100-80GB -tp 4 --max-model-len 8192
  sre-agent plan --gpu H100 -- vllm serve Qwen/Qwen2-7B-Instruct --max-num-seqs 128
  sre-agent plan --gpu A100-80GB -- lmdeploy serve api_server internlm/internlm2-chat-20b --tp 2 --quant-policy 8
  sre-agent plan --from-target http://gpu-node-1:8000/metrics --from-target gpu-node-2:8000
  sre-agent plan --from-fleet agent.yaml --max-model-len 8192

Presets: {presets}. Any other model: --model-config path/to/config.json.
Exit status: 0 fits, 1 does not fit, 2 bad input. With --from-target/--from-fleet: 0 every
replica serves its load, 1 one needs a change, 2 a target did not answer.
"""


def add_parser(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "plan", help="GPU memory plan: do the weights and max_num_seqs full-length sequences fit?",
        description=_DESCRIPTION.format(presets=", ".join(PRESETS)),
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", "-m", help="preset name or Hugging Face id (case-insensitive)")
    p.add_argument("--model-config", type=Path, help="a Hugging Face config.json to read the shape from")
    p.add_argument("--quantization", "-q", choices=QUANTIZATIONS, help="weight quantization (default: none, or "
                                                                       "what the checkpoint's config/name says)")
    p.add_argument("--dtype", choices=["auto", "float16", "bfloat16"])
    p.add_argument("--kv-cache-dtype", choices=[k for k in KV_CACHE_DTYPES if k != "int4"])
    count, length = checked(parse_count), checked(parse_human_int)
    p.add_argument("--tensor-parallel-size", "-tp", type=count)
    p.add_argument("--pipeline-parallel-size", "-pp", type=count)
    p.add_argument("--max-model-len", type=length, help="default: the model's maximum")
    p.add_argument("--max-num-seqs", type=count, help="default: vLLM V1's, 1024 on ≥70 GiB GPUs (not A100), else 256")
    p.add_argument("--gpu-memory-utilization", type=checked(parse_fraction), help="default 0.9 (vLLM's)")
    p.add_argument("--max-num-batched-tokens", type=length,
                   help="sizes the activation estimate (default: vLLM V1's, 2048 or 8192 on ≥70 GiB GPUs)")
    p.add_argument("--vllm-version", help="the vLLM version whose memory accounting to model (e.g. 0.11.0; "
                                          "default: V1 as in 0.8-0.20; 0.21+ also reserves CUDA graphs)")
    p.add_argument("--sampler", choices=SAMPLERS, help="native (default) or flashinfer: what vLLM logs as "
                                                       "'Using FlashInfer for top-p & top-k sampling'")
    p.add_argument("--mxfp4-backend", choices=MXFP4_BACKENDS,
                   help="the MoE kernels that load mxfp4 experts (gpt-oss), which pad them differently: auto "
                        "(default: marlin on A100/L40S/RTX, flashinfer on B200, triton on H100/H200), or what "
                        "vLLM logs ('Using Marlin backend', 'leveraging the Marlin kernel')")
    gpu = p.add_mutually_exclusive_group()
    gpu.add_argument("--gpu", help="A100-40GB, A100-80GB, H100, H200, L40S or RTX-4090")
    gpu.add_argument("--gpu-memory", help="memory of one GPU as CUDA reports it (vLLM's 'total_gpu_memory' or "
                     "'Free memory on device (…/TOTAL GiB)'; nvidia-smi shows 0.3-0.85 GiB more), e.g. 79.18GiB")
    live = p.add_argument_group("capacity advice from live vLLM replicas (instead of a model and GPU)")
    live.add_argument("--from-target", action="append", metavar="URL",
                      help="a vLLM /metrics URL (or host:port) to scrape once; repeat for several replicas")
    live.add_argument("--from-fleet", type=Path, metavar="CONFIG",
                      help="scrape every target of this agent config file")
    live.add_argument("--timeout", type=duration, metavar="DURATION",
                      help="the most one target's reply may take, connect to last byte (default: the config's "
                           f"scrape.timeout, else {DEFAULT_TIMEOUT_S:g}s); e.g. 5s, 1m")
    p.add_argument("--json", action="store_true", help="print the plan as JSON")
    p.add_argument("serve", nargs="*", metavar="-- COMMAND",
                   help="a vllm serve / python -m vllm.entrypoints.openai.api_server / lmdeploy serve api_server "
                        "command line (separate words or one quoted string)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.from_target or args.from_fleet is not None:
        return run_live(args)
    try:
        inp, notes = build_input(args)
        result = plan(inp)
    except DiagnosisError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    result.notes[:0] = notes
    if args.json:
        print(json.dumps(result.to_json(), indent=2))
    else:
        print(render_table(result))
    return EXIT_OK if result.fits else EXIT_PROBLEM


def _model(name: str, config: Path | None) -> ModelSpec:
    if config is not None:
        return load_model_config(config, name=name)
    local = Path(name) / "config.json"
    if name and local.is_file():  # a served local checkpoint directory
        return load_model_config(local, name=name)
    if not name:
        raise DiagnosisError(f"give --model (a preset: {', '.join(PRESETS)}), --model-config PATH, or a serving "
                             "command after --")
    return find_model(name)


def build_input(args: argparse.Namespace) -> tuple[PlanInput, list[str]]:
    """The planner input from ``plan``'s flags and the optional pasted command line."""
    notes: list[str] = []
    options: dict[str, Any] = {}
    engine, name = "vllm", args.model or ""
    if args.serve:
        cmd = parse_serve_command(args.serve)
        engine, options, notes = cmd.engine, dict(cmd.options), list(cmd.notes)
        name = args.model or cmd.model
    model = _model(name, args.model_config)
    flags = {"quantization": args.quantization, "dtype": args.dtype, "kv_cache_dtype": args.kv_cache_dtype,
             "tensor_parallel_size": args.tensor_parallel_size, "pipeline_parallel_size": args.pipeline_parallel_size,
             "max_model_len": args.max_model_len, "max_num_seqs": args.max_num_seqs,
             "gpu_memory_utilization": args.gpu_memory_utilization,
             "max_num_batched_tokens": args.max_num_batched_tokens}
    options.update({k: v for k, v in flags.items() if v is not None})
    if "quantization" not in options:
        guess = model.quant_method or quantization_from_name(name)
        if guess in QUANTIZATIONS:
            options["quantization"] = guess
            source = "config" if model.quant_method else "name"
            notes.append(f"quantization {guess} taken from the checkpoint's {source}")
    if args.gpu:
        gpu_name, total = args.gpu, gpu_memory_bytes(args.gpu)
    elif args.gpu_memory:
        try:
            gpu_name, total = f"{args.gpu_memory} GPU", parse_size(args.gpu_memory)
        except (ValueError, OverflowError) as exc:  # OverflowError: digits past a float's range
            raise DiagnosisError(f"--gpu-memory: {exc}") from exc
        if total <= 0:
            raise DiagnosisError(f"--gpu-memory: must be more than 0 bytes, got {args.gpu_memory!r}")
    else:
        raise DiagnosisError("give --gpu (A100-40GB, A100-80GB, H100, H200, L40S, RTX-4090) or --gpu-memory SIZE")
    if engine == "lmdeploy":
        options.setdefault("block_size", 64)  # LMDeploy's --cache-block-seq-len default
    else:
        accounting = accounting_for_version(args.vllm_version)
        options["vllm_accounting"] = accounting
        options.setdefault("max_num_seqs", default_max_num_seqs(total, gpu_name, accounting))
        if args.sampler:
            options["sampler"] = args.sampler
        if args.mxfp4_backend:
            options["mxfp4_backend"] = args.mxfp4_backend
    inp = PlanInput(model=model, gpu_memory_bytes=total, engine=engine, gpu=gpu_name)
    try:
        return replace(inp, **options), notes
    except TypeError as exc:  # an option the planner does not know: a programming error, not user input
        raise DiagnosisError(str(exc)) from exc


def render_table(p: Plan) -> str:
    """The plan as aligned text: inputs, the arithmetic, the verdict and what to change."""
    inp, m = p.input, p.input.model
    world = inp.tensor_parallel_size * inp.pipeline_parallel_size
    kv_bytes = {"auto": 4 if inp.dtype == "float32" else 2, "int4": 0.5}.get(inp.kv_cache_dtype, 1)
    per_head = f"{m.head_dim} head_dim × {kv_bytes:g} B"
    if inp.engine == "lmdeploy" and inp.kv_cache_dtype in ("int8", "int4"):
        per_head = f"({per_head} + {LMDEPLOY_SCALE_BYTES} B scale and zero point)"
    ratio = p.kv_bytes_per_token_guide / p.kv_bytes_per_token if p.kv_bytes_per_token else 0.0
    if inp.engine == "lmdeploy":
        knobs = (f"session_len={inp.effective_max_model_len:,}  max_batch_size={inp.max_num_seqs}  "
                 f"cache_max_entry_count={inp.cache_max_entry_count:.2f}")
    else:
        knobs = (f"max_model_len={inp.effective_max_model_len:,}  max_num_seqs={inp.max_num_seqs}  "
                 f"gpu_memory_utilization={inp.gpu_memory_utilization:.2f}")
    kv_formula = (f"{m.num_layers} layers × ({m.kv_lora_rank} kv_lora_rank + {m.qk_rope_head_dim} qk_rope_head_dim) "
                  f"× {kv_bytes:g} B (MLA latent, not split by TP)" if m.is_mla and inp.engine == "vllm" else
                  f"2 × {m.num_layers} layers × {m.num_key_value_heads} KV heads × {per_head}")
    why = ("MLA stores one compressed latent per token and layer instead of K and V per head" if m.is_mla else
           f"it counts {m.num_attention_heads} query heads where {m.num_key_value_heads} KV heads are stored "
           "(grouped-query attention)" if m.is_gqa else "the same: this model has one KV head per query head")
    rows = [
        ("inputs", f"TP={inp.tensor_parallel_size} PP={inp.pipeline_parallel_size}  {knobs}  "
                   f"quantization={inp.quantization}  kv_cache_dtype={inp.kv_cache_dtype}"),
        ("weights", f"{p.weights_bytes_per_gpu / GiB:.2f} GiB per GPU ({m.num_params / 1e9:.2f} B params / "
                    f"{world} GPU{'s' if world > 1 else ''}; an approximation)"),
        ("KV per token", f"{p.kv_bytes_per_token:,} B = {kv_formula}; {p.kv_bytes_per_token_per_gpu:,} B per GPU"),
        ("guide formula", f"{p.kv_bytes_per_token_guide:,} B = 2 × {m.num_layers} layers × {m.hidden_size} hidden × "
                          f"{kv_bytes:g} B: {ratio:.1f}× ours, {why}"),
        ("overhead", f"{p.overhead_bytes / GiB:.2f} GiB per GPU (CUDA context, framework"
                     f"{'' if inp.engine == 'lmdeploy' else ', activation peak estimate'})"),
        ("KV available", f"{p.kv_bytes_available / GiB:.2f} GiB per GPU = {p.max_tokens_in_cache:,} tokens"),
        ("max sequences", f"{p.max_concurrent_seqs} concurrent sequences of {inp.effective_max_model_len:,} tokens "
                          f"(the guide formula would say {p.max_concurrent_seqs_guide})"),
        ("fits", ("yes" if p.fits else "no") + f": {inp.max_num_seqs} requested"
         + ("" if p.weights_fit else "; the weights alone do not fit")),
    ]
    gpu = inp.gpu or "GPU"
    lines = [f"Memory plan: {m.name} on {world} × {gpu} ({inp.gpu_memory_bytes / GiB:.2f} GiB each), "
             f"{'LMDeploy' if inp.engine == 'lmdeploy' else 'vLLM'}"]
    lines += [f"  {label:<14} {text}" for label, text in rows]
    changes = [f for f in p.recommendations if f.setting]
    if changes:
        lines.append("Recommendations (setting → value: why)")
        lines += [f"  {f.setting} {f.suggested_value}: {f.summary}" for f in changes]
    for f in p.recommendations:
        if not f.setting:
            lines.append(("OK: " if f.ok else "Problem: ") + f.summary)
    if p.recommendations:
        lines.append(f"Runbook: {p.recommendations[0].runbook_url}")
    lines += [f"Note: {n}" for n in p.notes]
    return "\n".join(lines)
