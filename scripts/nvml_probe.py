"""Print what the agent's NVML poller sees on this machine, for a maintainer on a real GPU box.

Starts an :class:`agent.collect.nvml.NvmlSource` with the real ``pynvml``, polls twice (the second
poll shows rates such as NVLink bandwidth, which DCGM reports as 0 on the first reading),
and prints every sample in Prometheus text format, then the GPU list. Readings the GPU does
not support are absent from the output; ``sre_agent_nvml_errors_total`` lists failures.
Exit status is 0 even when NVML is unavailable: the reason is printed instead.

    python scripts/nvml_probe.py [--interval 1.0] [--proc-root /proc] [--debug]
"""

from __future__ import annotations

import argparse
import logging
import math
import socket
import sys
import time
from pathlib import Path

import structlog

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout, uninstalled

from agent.collect.nvml import NvmlSource
from agent.series import Observation


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _number(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return str(int(value)) if value.is_integer() else repr(value)


def exposition(sample: Observation) -> str:
    """One sample as a line of the Prometheus text format, with its timestamp."""
    labels = ",".join(f'{k}="{_escape(v)}"' for k, v in sample.labels if k != "__name__")
    body = f"{sample.name}{{{labels}}}" if labels else sample.name
    return f"{body} {_number(sample.value)} {sample.timestamp_ms}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between the two polls")
    parser.add_argument("--proc-root", type=Path, default=Path("/proc"), help="procfs for process names")
    parser.add_argument("--debug", action="store_true", help="show debug logs (unsupported readings)")
    args = parser.parse_args(argv)
    level = logging.DEBUG if args.debug else logging.INFO
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(level))

    source = NvmlSource(hostname=socket.gethostname(), proc_root=args.proc_root)
    try:
        if not source.start():
            print(f"# NVML unavailable: {source.reason}")
            return 0
        for round_ in (1, 2):
            if round_ == 2:
                time.sleep(args.interval)
            started = time.perf_counter()
            samples = source.poll(int(time.time() * 1000))
            print(f"# poll {round_}: {len(samples)} samples in {time.perf_counter() - started:.3f}s")
            for sample in samples:
                print(exposition(sample))
        print("# gpus()")
        for gpu in source.gpus():
            print("#  " + " ".join(f"{k}={v}" for k, v in gpu.items()))
        return 0
    finally:
        source.shutdown()


if __name__ == "__main__":
    sys.exit(main())
