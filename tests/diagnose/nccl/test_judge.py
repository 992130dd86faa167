"""Tests for agent.diagnose.nccl.judge and agent.diagnose.nccl.interconnects: parsing real nccl-tests
outputs, the verdict, the cross-node rule, the JSON document, /metrics samples, runbooks.

Expected numbers were read off the fixture files by hand (the largest row's busbw columns,
the footer), not from the parser.
"""

from __future__ import annotations

import re

import pytest

from agent.diagnose.findings import DEFAULT_RUNBOOK_BASE
from agent.diagnose.nccl.interconnects import INTERCONNECTS, expected_busbw, guess_interconnect, nvlink_busbw
from agent.diagnose.nccl.judge import NcclResult, check, nccl_samples, parse_nccl, to_json
from agent.errors import DiagnosisError
from tests.conftest import FIXTURES, REPO

NCCL = FIXTURES / "nccl"


def _fixture(name: str) -> str:
    return (NCCL / name).read_text(encoding="utf-8")


def _parse(name: str, exit_code: int | None = None) -> NcclResult:
    return parse_nccl(_fixture(name), exit_code=exit_code)


# ---- the real outputs -------------------------------------------------------------------------------------------


def test_a100_nvswitch_run_parses_to_hand_checked_numbers() -> None:
    """8x A100 over NVSwitch: 30 sizes, the 4 GiB row's busbw 232.44 (out-of-place) and the footer 66.2058."""
    r = _parse("a100x8_nvswitch_allreduce.txt")
    assert r.collective == "all_reduce"
    assert (r.ranks, r.nodes, r.gpu_models) == (8, 1, ["NVIDIA A100-SXM4-80GB"])
    assert len(r.rows) == 30  # 8 B .. 4 GiB by factor 2 = 2^3 .. 2^32
    assert r.largest_size == 4294967296
    last = r.rows[-1]
    assert (last.count, last.type, last.redop, last.root) == (1073741824, "float", "sum", -1)
    assert (last.out_of_place.time_us, last.out_of_place.algbw_gbps, last.out_of_place.busbw_gbps) == (
        32336.0, 132.82, 232.44)
    assert last.in_place is not None and last.in_place.busbw_gbps == 231.59
    assert r.peak_busbw_gbps == 232.44
    assert r.avg_busbw_gbps == 66.2058
    assert (r.wrong, r.out_of_bounds, r.failed, r.truncated) == (0, 0, False, False)


def test_a100_run_is_ok_against_the_230_gbps_nvswitch_figure() -> None:
    """The A100 node is guessed as a100-nvswitch (230 GB/s) and passes at 232.44 GB/s."""
    verdict, findings = check(_parse("a100x8_nvswitch_allreduce.txt"))
    assert verdict == "ok"
    assert [f.kind for f in findings] == ["nccl-ok"]
    ok = findings[0]
    assert ok.ok and ok.severity == "info"
    assert ok.details["expected_gbps"] == 230.0 and ok.details["expected_source"] == "a100-nvswitch"
    assert ok.details["fraction_of_expected"] == pytest.approx(232.44 / 230.0)
    assert "101%" in ok.summary and "80%" in ok.summary


def test_rtx2080ti_pcie_run_is_low() -> None:
    """2x RTX 2080 Ti without P2P: 28 sizes, plateau 4.00 GB/s, 40 % of the PCIe Gen3 figure -> low."""
    r = _parse("rtx2080ti_x2_pcie_allreduce.txt")
    assert (r.ranks, r.nodes, len(r.rows), r.largest_size) == (2, 1, 28, 1073741824)
    assert (r.peak_busbw_gbps, r.avg_busbw_gbps, r.wrong) == (4.0, 2.05774, 0)
    verdict, findings = check(r)
    assert verdict == "low"
    low = findings[0]
    assert low.kind == "nccl-bandwidth-low" and low.severity == "warning" and not low.ok
    assert low.details["expected_gbps"] == 10.0 and low.details["expected_source"] == "pcie-gen3"
    assert low.runbook_url == f"{DEFAULT_RUNBOOK_BASE}diagnosis-nccl-bandwidth-low.md"


def test_old_format_allgather_partial_output() -> None:
    """Pre-2.x all_gather: no '#', no redop/root, 'error' column; the footer's 2 out-of-bounds count as wrong."""
    r = _parse("allgather_old_format_partial.txt")
    assert r.collective == "all_gather"
    assert r.ranks == 8  # from the command line's -g 8: the excerpt has no "Using devices"
    assert len(r.rows) == 1
    row = r.rows[0]
    assert (row.size, row.count, row.type, row.redop, row.root) == (4294967296, 134217728, "float", "", None)
    assert (row.out_of_place.busbw_gbps, row.out_of_place.max_error, row.out_of_place.wrong) == (129.05, 1.0, None)
    assert row.in_place is not None and row.in_place.busbw_gbps == 128.84
    assert (r.peak_busbw_gbps, r.avg_busbw_gbps, r.out_of_bounds, r.wrong) == (129.05, 128.942, 2, 2)
    verdict, findings = check(r)
    assert verdict == "wrong-results"
    assert findings[0].kind == "nccl-wrong-results" and findings[0].severity == "critical"


def test_gh200_run_with_wrong_elements() -> None:
    """nccl-tests#369: #wrong 96 + 32 at 1 MiB sums to 128; the run completed but failed its check."""
    r = _parse("gh200x2_2node_wrong_results.txt")
    assert (r.ranks, r.nodes, r.hosts) == (2, 2, ["gpu-1-1", "gpu-1-7"])
    assert (r.wrong, r.out_of_bounds) == (128, 4)
    assert (r.peak_busbw_gbps, r.avg_busbw_gbps) == (22.87, 4.79995)
    assert r.failed and r.failure_lines == [".. gpu-1-1 pid 662195: Test failure common.cu:1189",
                                            ".. gpu-1-7 pid 2448661: Test failure common.cu:1189"]
    verdict, findings = check(r)
    assert verdict == "wrong-results"
    assert [f.kind for f in findings] == ["nccl-wrong-results"]
    assert "size 1048576: #wrong out-of-place 96, in-place 32" in findings[0].evidence
    assert "128 wrong values" in findings[0].summary


def test_gh200_run_failing_before_any_row() -> None:
    """nccl-tests#369: 'Test CUDA failure ... busy or unavailable' on 8 ranks, 2 nodes, no rows -> failed."""
    r = _parse("gh200x8_2node_cuda_busy_failed.txt")
    assert (r.ranks, r.nodes, r.rows, r.peak_busbw_gbps, r.avg_busbw_gbps) == (8, 2, [], None, None)
    assert r.failed and len(r.failure_lines) == 12
    verdict, findings = check(r)
    assert verdict == "failed"
    assert findings[0].kind == "nccl-failed" and findings[0].severity == "critical"
    assert "busy or unavailable" in findings[0].summary


def test_rtx5090_run_with_nccl_warn_and_test_nccl_failure() -> None:
    """nccl-tests#287: the cause is the 'NCCL WARN Cuda failure' line, not the benign 'Could not find a path' WARNs."""
    r = _parse("rtx5090x2_nccl_warn_failed.txt")
    assert r.failed and not r.rows
    assert len(r.failure_lines) == 11  # 5 NCCL WARN, 1 Test NCCL failure, 5 Test failure relays
    verdict, findings = check(r)
    assert verdict == "failed"
    assert "NCCL WARN Cuda failure 1 'invalid argument'" in findings[0].summary


def test_h100_two_node_run_needs_a_network_figure() -> None:
    """2 nodes x 8 H100: peak 472.35 GB/s at 16 GiB; no guess across nodes, ok against 8x 400G NICs."""
    r = _parse("h100x16_2node_allreduce.txt")
    assert (r.ranks, r.nodes, r.largest_size) == (16, 2, 17179869184)
    assert (r.peak_busbw_gbps, r.avg_busbw_gbps) == (472.35, 91.2553)
    verdict, findings = check(r)
    assert verdict == "unknown"
    assert [f.kind for f in findings] == ["nccl-expected-unknown"]
    verdict, findings = check(r, interconnect="ib-400gx8")
    assert verdict == "ok"
    assert findings[0].details["expected_gbps"] == 8 * 48.0
    assert not any(f.kind == "nccl-cross-node-tp" for f in findings)  # 472 GB/s is far above 370 / 10


# ---- synthetic edge cases ---------------------------------------------------------------------------------------

HEADER = ("# nThread 1 nGpus 2 minBytes 1048576 maxBytes 2097152 step: 2(factor) warmup iters: 5 iters: 20 "
          "agg iters: 1 validation: 1 graph: 0\n") + """\
#
# Using devices
#  Rank  0 Group  0 Pid   1000 on      nodea device  0 [0x07] NVIDIA A100-SXM4-80GB
#  Rank  1 Group  0 Pid   1000 on      nodea device  1 [0x0a] NVIDIA A100-SXM4-80GB
#
#                                                              out-of-place                       in-place
#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong
#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)
"""
ROWS = """\
     1048576        262144     float     sum      -1    100.0    1.00    1.00    N/A    100.0    3.00    3.00    N/A
     2097152        524288     float     sum      -1    100.0    5.00    5.00    N/A    100.0    7.00    7.00    N/A
"""


def test_na_wrong_is_unknown_and_mean_replaces_a_missing_footer() -> None:
    """#wrong N/A (validation off) gives wrong=None; without the footer avg is the mean of every busbw (16/4)."""
    r = parse_nccl(HEADER + ROWS)
    assert r.wrong is None
    assert r.avg_busbw_gbps == 4.0  # (1 + 3 + 5 + 7) / 4
    assert r.peak_busbw_gbps == 7.0
    assert r.truncated  # no footer
    assert check(r)[0] != "wrong-results"


def test_partial_last_line_marks_truncated_and_is_dropped() -> None:
    """A row cut mid-line is not a row: peak comes from the last complete one and truncated is set."""
    text = _fixture("a100x8_nvswitch_allreduce.txt")
    cut = text[: text.index("  4294967296") + 60]  # inside the 4 GiB row
    r = parse_nccl(cut)
    assert r.truncated
    assert len(r.rows) == 29
    assert r.peak_busbw_gbps == 230.13  # the 2 GiB row: max(230.13, 229.87)
    assert r.avg_busbw_gbps is not None and r.avg_busbw_gbps != 66.2058


def test_non_zero_exit_fails_a_complete_output() -> None:
    """An exit status the caller saw overrides a clean-looking output."""
    r = _parse("a100x8_nvswitch_allreduce.txt", exit_code=137)
    assert r.failed
    verdict, findings = check(r)
    assert verdict == "failed"
    assert "exit status 137" in findings[0].summary


def test_nccl_warn_fails_only_an_unfinished_run() -> None:
    """A WARN in a run that reached its footer is evidence, not failure; without the footer it is."""
    warn = "host:1:2 [0] graph/search.cc:1135 NCCL WARN Could not find a path for pattern 4, falling back\n"
    finished = parse_nccl(HEADER + warn + ROWS + "# Out of bounds values : 0 OK\n# Avg bus bandwidth    : 4 \n")
    assert not finished.failed and finished.failure_lines == [warn.strip()]
    unfinished = parse_nccl(HEADER + warn + ROWS)
    assert unfinished.failed


def test_timeout_marker_is_a_failure_line() -> None:
    """The runner's '[sre-agent] timed out' line fails the run and is named as its cause."""
    r = parse_nccl(HEADER + ROWS + "[sre-agent] timed out after 900 s; killed the process group\n", exit_code=124)
    verdict, findings = check(r)
    assert verdict == "failed"
    assert "timed out after 900 s" in findings[0].summary


def test_mpirun_tagged_lines_and_per_iteration_columns() -> None:
    """'[1,0]<stdout>:' prefixes are stripped; per-iteration columns (i_min ...) do not shift busbw."""
    half = "     time   algbw   busbw  #wrong    i_min    i_max    i_p99    i_cv%"
    tag = "[1,0]<stdout>:"
    text = "\n".join([
        f"{tag}# Collective test starting: reduce_scatter_perf",
        f"{tag}#       size         count      type   redop    root{half}{half}",
        f"{tag}     8388608       2097152     float     sum      -1"
        "    90.00   93.21   81.56       0    88.00    95.00    94.00     1.20"
        "    91.00   92.18   80.66       0    87.00    96.00    95.00     1.30",
        f"{tag}# Avg bus bandwidth    : 81.11",
    ]) + "\n"
    r = parse_nccl(text)
    assert r.collective == "reduce_scatter"
    assert len(r.rows) == 1
    row = r.rows[0]
    assert row.in_place is not None
    assert (row.out_of_place.busbw_gbps, row.in_place.busbw_gbps) == (81.56, 80.66)
    assert r.avg_busbw_gbps == 81.11


def test_collective_comes_from_the_command_when_the_text_has_none() -> None:
    """A caller's command names the collective of an output that never prints the binary."""
    r = parse_nccl(HEADER + ROWS, command=["mpirun", "-np", "2", "/opt/nccl-tests/build/all_gather_perf", "-b", "8"])
    assert r.collective == "all_gather"
    assert parse_nccl(HEADER + ROWS).collective == "unknown"


def _two_nodes(busbw: float) -> str:
    ranks = "".join(f"#  Rank {i:2d} Group  0 Pid   {100 + i} on {'nodea' if i < 8 else 'nodeb':>10} device {i % 8:2d} "
                    f"[0x{i:02x}] NVIDIA A100-SXM4-80GB\n" for i in range(16))
    row = (f"  8589934592    2147483648     float     sum      -1   100000  {busbw:6.2f}  {busbw:6.2f}      0   100000"
           f"  {busbw:6.2f}  {busbw:6.2f}      0\n")
    head = HEADER.split("# Using devices\n")[1].split("#\n", 1)[1]
    return ("# Using devices\n" + ranks + "#\n" + head + row + "# Out of bounds values : 0 OK\n"
            f"# Avg bus bandwidth    : {busbw}\n")


def test_cross_node_run_under_a_tenth_of_nvlink_recommends_tp_within_a_node() -> None:
    """16 A100 ranks on 2 nodes at 5 GB/s (< 230 / 10 = 23): TP within a node (8), PP across nodes (2)."""
    r = parse_nccl(_two_nodes(5.0))
    assert (r.ranks, r.nodes) == (16, 2)
    verdict, findings = check(r)
    assert verdict == "unknown"  # no network figure given
    tp = [f for f in findings if f.kind == "nccl-cross-node-tp"]
    assert len(tp) == 1
    assert tp[0].severity == "warning"
    assert tp[0].suggested_value == "8 / 2"
    assert "tensor parallelism within a node" in tp[0].summary and "pipeline parallelism" in tp[0].summary
    assert tp[0].runbook_url.endswith("/diagnosis-nccl-cross-node-tp.md")


def test_cross_node_rule_needs_both_nodes_and_a_low_figure() -> None:
    """25 GB/s across nodes (>= 23) or a single-node low run raises no cross-node finding."""
    _, fast = check(parse_nccl(_two_nodes(25.0)))
    assert not any(f.kind == "nccl-cross-node-tp" for f in fast)
    _, single = check(_parse("rtx2080ti_x2_pcie_allreduce.txt"))
    assert not any(f.kind == "nccl-cross-node-tp" for f in single)


def test_configured_expectation_beats_the_guess() -> None:
    """expected_gbps overrides the table: the A100 run is low against 300 GB/s (77 %)."""
    verdict, findings = check(_parse("a100x8_nvswitch_allreduce.txt"), expected_gbps=300.0)
    assert verdict == "low"
    assert findings[0].details["expected_source"] == "configured"


def test_unknown_interconnect_is_a_diagnosis_error() -> None:
    """A key outside the table names the known keys."""
    with pytest.raises(DiagnosisError, match="a100-nvswitch"):
        check(_parse("a100x8_nvswitch_allreduce.txt"), interconnect="nvlink9000")


def test_no_rows_and_no_failure_is_failed_with_a_reason() -> None:
    """Text with no nccl-tests rows at all gives verdict failed, 'no result rows'."""
    verdict, findings = check(parse_nccl("hello\n"))
    assert verdict == "failed"
    assert "no result rows" in findings[0].summary


# ---- the table ---------------------------------------------------------------------------------------------------


def test_expected_busbw_scales_network_keys_by_nic_count() -> None:
    """ib-200gx4 = 4 x 24 GB/s; node keys take no count."""
    assert expected_busbw("ib-200gx4") == 96.0
    assert expected_busbw("ib-400g") == 48.0
    assert expected_busbw("h100-nvls") == 480.0
    with pytest.raises(KeyError):
        expected_busbw("a100-nvswitchx2")


def test_every_table_entry_cites_a_source() -> None:
    """Each interconnect figure names the public page it comes from."""
    for entry in INTERCONNECTS.values():
        assert entry.source.startswith("https://github.com/NVIDIA/"), entry.key


@pytest.mark.parametrize(("models", "ranks", "nodes", "key"), [
    (["NVIDIA A100-SXM4-80GB"], 8, 1, "a100-nvswitch"),
    (["NVIDIA H100 80GB HBM3"], 8, 1, "h100-nvswitch"),
    (["NVIDIA H200"], 8, 1, "h200-nvswitch"),
    (["NVIDIA A100 80GB PCIe"], 8, 1, "pcie-gen4"),
    (["NVIDIA GeForce RTX 4090"], 8, 1, "pcie-gen4"),
    (["NVIDIA GeForce RTX 2080 Ti"], 2, 1, "pcie-gen3"),
    (["NVIDIA H100 80GB HBM3"], 16, 2, None),
    (["NVIDIA GH200 120GB"], 4, 1, None),
    (["NVIDIA A100-SXM4-80GB"], 1, 1, None),
])
def test_guess_interconnect(models: list[str], ranks: int, nodes: int, key: str | None) -> None:
    """Single-node runs map GPU models to a table key; multi-node and unknown models give None."""
    assert guess_interconnect(models, ranks, nodes) == key


def test_nvlink_figure_per_model() -> None:
    """A100 SXM 230, H100 370; PCIe cards and unknown models have none."""
    assert nvlink_busbw(["NVIDIA A100-SXM4-80GB"]) == 230.0
    assert nvlink_busbw(["NVIDIA H100 80GB HBM3"]) == 370.0
    assert nvlink_busbw(["NVIDIA A100 80GB PCIe"]) is None
    assert nvlink_busbw(["NVIDIA GH200 120GB"]) is None


# ---- outputs ----------------------------------------------------------------------------------------------------


def test_to_json_carries_the_agreed_keys() -> None:
    """The JSON document has the numbers, the expectation, the verdict, runbook, findings and rows."""
    r = _parse("rtx2080ti_x2_pcie_allreduce.txt")
    verdict, findings = check(r)
    doc = to_json(r, verdict, findings)
    for key in ("collective", "ranks", "peak_busbw_gbps", "avg_busbw_gbps", "wrong", "failed", "expected_gbps",
                "verdict", "runbook_url", "findings", "rows"):
        assert key in doc
    assert (doc["verdict"], doc["expected_gbps"], doc["peak_busbw_gbps"]) == ("low", 10.0, 4.0)
    assert doc["runbook_url"].endswith("diagnosis-nccl-bandwidth-low.md")
    assert doc["rows"][-1]["in_place"]["busbw_gbps"] == 4.0
    assert len(doc["rows"]) == 28


def test_samples_for_metrics() -> None:
    """peak/avg busbw, wrong, last-run time (seconds) and ok, each with the collective label."""
    r = _parse("a100x8_nvswitch_allreduce.txt")
    samples = nccl_samples(r, "ok", 1_700_000_000_500, {"instance": "node1"})
    got = {(name, tuple(sorted(labels.items()))): value for name, labels, value in samples}
    base = (("collective", "all_reduce"), ("instance", "node1"))
    assert got == {
        ("sre_agent_nccl_busbw_gbps", (*base, ("stat", "peak"))): 232.44,
        ("sre_agent_nccl_busbw_gbps", (*base, ("stat", "avg"))): 66.2058,
        ("sre_agent_nccl_wrong_total", base): 0.0,
        ("sre_agent_nccl_last_run_timestamp_seconds", base): 1_700_000_000.5,
        ("sre_agent_nccl_ok", base): 1.0,
    }
    failed = nccl_samples(_parse("gh200x8_2node_cuda_busy_failed.txt"), "failed", 0, {})
    assert [name for name, _, _ in failed] == ["sre_agent_nccl_last_run_timestamp_seconds", "sre_agent_nccl_ok"]
    assert failed[-1][2] == 0.0


# ---- fixtures and runbooks --------------------------------------------------------------------------------------


def test_every_fixture_names_its_source() -> None:
    """Each copied output starts with a '# source:' line."""
    files = sorted(NCCL.glob("*.txt"))
    assert len(files) >= 7
    for path in files:
        assert path.read_text(encoding="utf-8").startswith("# source: "), path.name


RUNBOOKS = ["diagnosis-nccl-bandwidth-low", "diagnosis-nccl-wrong-results", "diagnosis-nccl-failed",
            "diagnosis-nccl-cross-node-tp"]


@pytest.mark.parametrize("name", RUNBOOKS)
def test_runbook_format(name: str) -> None:
    """H1 is the file name, the four sections follow in order, the diagnosis commands are there, no TODO."""
    text = (REPO / "runbooks" / f"{name}.md").read_text(encoding="utf-8")
    assert text.splitlines()[0] == f"# {name}"
    assert re.findall(r"^## (.+)$", text, flags=re.M) == ["Meaning", "Impact", "Diagnosis", "Mitigation"]
    for needle in ("sre-agent nccl --parse out.txt", "nvidia-smi topo -m", "nvidia-smi nvlink --status",
                   "NCCL_DEBUG=INFO", "ibstat", "sre_agent_nccl_busbw_gbps", "NCCL_IB_HCA"):
        assert needle in text, needle
    assert "TODO" not in text


def test_every_finding_kind_has_its_runbook() -> None:
    """The runbook URL of each non-ok finding kind points at a file that exists."""
    kinds = {"nccl-bandwidth-low", "nccl-wrong-results", "nccl-failed", "nccl-cross-node-tp"}
    assert {f"diagnosis-{k}" for k in kinds} == set(RUNBOOKS)
    for name in RUNBOOKS:
        assert (REPO / "runbooks" / f"{name}.md").is_file()


def test_rows_that_were_no_measurement_are_named_in_the_evidence() -> None:
    """A run whose largest row printed busbw inf is judged on the rows that are measurements, and every
    finding's evidence says which line was ignored and why."""
    lines = _fixture("a100x8_nvswitch_allreduce.txt").splitlines()
    tokens = lines[46].split()  # line 47, the 4 GiB row
    tokens[7] = tokens[11] = "inf"
    lines[46] = "  ".join(tokens)
    result = parse_nccl("\n".join(lines) + "\n")
    verdict, findings = check(result, expected_gbps=230.0)
    assert result.largest_size == 2147483648 and result.peak_busbw_gbps == 230.13  # the 2 GiB row, by hand
    assert verdict == "ok"
    assert "ignored line 47: busbw is 'inf', not a measurement (a finite number ≥ 0)" in findings[0].evidence
