"""The memory planner against real vLLM start-up figures (tests/fixtures/planner/calibration/).

Each case is a captured excerpt with its source, the model's config and the serving flags. The
issue's targets: KV memory within max(10 %, 1.5 GiB) and KV token capacity within 10 %; weights
within 5 % and KV bytes per token within 10 % say which part is off. Cases the planner cannot
meet yet are ``xfail(strict=False)`` with the reason from the index, so they turn into XPASS
(not failures) as the planner learns MoE, MLA, sliding windows and the newer quantizations.
``python -m tests.diagnose.plan.calibration`` prints the whole table.
"""

from __future__ import annotations

import json
import re

import pytest

from agent.diagnose.oom.evidence import parse_evidence
from agent.diagnose.plan.memory import GiB
from tests.diagnose.plan.calibration import (
    HEADER_KEYS,
    INDEX,
    PLANNER_FIXTURES,
    Case,
    compare,
    load_cases,
    parse_startup_log,
    predict,
    status,
    summary_table,
    table,
)

CASES = load_cases()


def _param(case: Case) -> object:
    marks = [pytest.mark.xfail(strict=False, reason=case.xfail)] if case.xfail else []
    return pytest.param(case, id=case.id, marks=marks)


def test_index_and_files_agree() -> None:
    """Every case names existing files, every excerpt in the folder is a case, ids are unique."""
    folder = PLANNER_FIXTURES / "calibration"
    used = {c.log for c in CASES} | {c.config for c in CASES if c.config}
    assert all((PLANNER_FIXTURES / p).is_file() for p in used)
    on_disk = {f"calibration/{p.name}" for p in folder.iterdir() if p.suffix in (".txt", ".json")} - {
        "calibration/index.json"}
    assert on_disk <= used
    assert len({c.id for c in CASES}) == len(CASES)
    assert json.loads(INDEX.read_text(encoding="utf-8"))["cases"]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_excerpt_names_its_source(case: Case) -> None:
    """Each excerpt opens with a source line naming a GitHub issue, pull request or file at a commit."""
    first = (PLANNER_FIXTURES / case.log).read_text(encoding="utf-8").splitlines()[0]
    source = r"# source: https://github\.com/[\w.-]+/[\w.-]+/((issues|pull)/\d+|blob/[0-9a-f]{40}/)"
    assert re.match(source, first), first
    if case.log.startswith("calibration/"):
        assert {"source", "vllm", "gpu", "model", "flags"} <= set(case.figures().header) <= set(HEADER_KEYS)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_parser_reads_the_logged_figures(case: Case) -> None:
    """parse_startup_log reads from the excerpt exactly the figures the index lists (for a quoted
    table of figures, each listed figure appears in it as written)."""
    if case.kind == "table":
        text = (PLANNER_FIXTURES / case.log).read_text(encoding="utf-8")
        assert all((f"{value:,}" if isinstance(value, int) else f"{value:.2f}") in text
                   for value in case.logged.values()), case.logged
        return
    assert case.figures().logged() == dict(case.logged)


def test_parser_reads_negative_kv_and_many_workers() -> None:
    """A negative V0/V1 KV figure is read with its sign; with several workers the smallest KV wins."""
    figures = parse_startup_log([
        "INFO [worker.py:267] model weights take 5.20GiB; non_torch_memory takes 0.03GiB; PyTorch activation "
        "peak memory takes 1.42GiB; the rest of the memory reserved for KV Cache is -1.05GiB.",
        "(VllmWorker rank=1) INFO [gpu_worker.py:233] Available KV cache memory: 12.13 GiB",
        "(VllmWorker rank=3) INFO [gpu_worker.py:233] Available KV cache memory: 11.33 GiB",
        "INFO [kv_cache_utils.py:716] GPU KV cache size: 807,792 tokens",
    ])
    assert (figures.weights_gib, figures.kv_gib, figures.kv_tokens) == (5.20, -1.05, 807_792)
    assert (figures.non_torch_gib, figures.activation_gib) == (0.03, 1.42)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_agrees_with_the_oom_evidence_parser(case: Case) -> None:
    """Where agent.diagnose.oom.evidence reads the same lines (weights, total memory, a non-negative
    KV figure on one worker), both parsers agree."""
    text = (PLANNER_FIXTURES / case.log).read_text(encoding="utf-8")
    _, engine = parse_evidence(text)
    figures = case.figures()
    if engine.weights_bytes is not None and figures.weights_gib is not None:
        # V0 logs the weights twice ("Loading model weights took 5.2032 GB", "model weights take 5.20GiB"):
        # the evidence parser keeps the last, this one the first and finer.
        assert engine.weights_bytes == pytest.approx(figures.weights_gib * GiB, rel=0.01)
    if engine.total_gpu_memory_bytes is not None and figures.total_gpu_gib is not None:
        assert engine.total_gpu_memory_bytes == pytest.approx(figures.total_gpu_gib * GiB, rel=1e-6)
    kv_lines = [ln for ln in text.splitlines() if "KV cache memory:" in ln or "KV Cache is" in ln]
    if engine.kv_cache_bytes is not None and len(kv_lines) == 1 and figures.kv_gib is not None and figures.kv_gib > 0:
        assert engine.kv_cache_bytes == pytest.approx(figures.kv_gib * GiB, rel=1e-6)


RUNNABLE = [c for c in CASES if not c.skip]


@pytest.mark.parametrize("case", [_param(c) for c in RUNNABLE])
def test_planner_meets_the_targets(case: Case) -> None:
    """The planner's weights, KV memory, KV tokens and KV bytes per token are within tolerance of vLLM's."""
    pred = predict(case)
    assert not pred.error, pred.error
    checks = compare(case, pred)
    assert checks, "a case must have at least one figure to compare"
    failed = [f"{c.name}: logged {c.logged:,.2f}, predicted {c.predicted}" for c in checks if not c.ok]
    assert not failed, "; ".join(failed)


def test_table_has_a_row_per_case(capsys: pytest.CaptureFixture[str]) -> None:
    """The calibration table names every case; it is printed (pytest -s shows it)."""
    text = table(CASES)
    with capsys.disabled():
        print("\n" + text)
    assert all(c.id in text for c in CASES)
    assert text.splitlines()[0].split()[:3] == ["case", "GPU", "flags"]


def test_summary_table_has_one_row_per_case_with_its_status() -> None:
    """The summary (what ``python -m tests.diagnose.plan.calibration`` prints) has a row per case; a case
    with an xfail reason reads xfail or XPASS, a skipped one skip, and no case reads FAIL."""
    lines = summary_table(CASES).splitlines()
    assert lines[0].split()[:4] == ["case", "model", "GPU", "flags"] and len(lines) == len(CASES) + 2
    for case, line in zip(CASES, lines[2:], strict=True):
        assert line.startswith(case.id + " ")
        word = line.split()[-1]
        assert word == status(case, [] if case.skip else compare(case, predict(case)))
        assert word in (("xfail", "XPASS") if case.xfail else ("skip",) if case.skip else ("pass",))


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_sampler_flag_follows_the_excerpt(case: Case) -> None:
    """``"sampler": "flashinfer"`` exactly where the excerpt logs vLLM choosing FlashInfer's sampler."""
    text = (PLANNER_FIXTURES / case.log).read_text(encoding="utf-8")
    assert (case.flags.get("sampler") == "flashinfer") == ("Using FlashInfer for top-p & top-k sampling" in text)
