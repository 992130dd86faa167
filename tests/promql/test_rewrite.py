"""agent.promql.rewrite: PromQL printed back from promql-parser's tree, unchanged in meaning (checked
through the parser's own printer on every bundled rule and every conformance expression), and the
mixin parameters: a selector on every series selector, labels on every aggregation and on(...)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import promql_parser as pp
import pytest
import yaml

from agent.cli import main
from agent.config import bundled_rules_dir
from agent.errors import PromQLError
from agent.promql.rewrite import parse_selector, print_expr, rewrite
from tests import promqltest
from tests.conftest import SHARED

CONFORMANCE = SHARED / "conformance" / "promql"
BUNDLED = [(r.get("alert") or r.get("record"), r["expr"]) for f in sorted(bundled_rules_dir().glob("*.rules.yaml"))
           for g in yaml.safe_load(f.read_text())["groups"] for r in g["rules"]]


def _same_tree(a: str, b: str) -> bool:
    return str(pp.parse(a)) == str(pp.parse(b))


@pytest.mark.parametrize(("name", "expr"), BUNDLED, ids=[n for n, _ in BUNDLED])
def test_every_bundled_rule_prints_back_to_the_same_tree(name: str, expr: str) -> None:
    assert _same_tree(print_expr(expr), expr)


@pytest.mark.skipif(not CONFORMANCE.is_dir(), reason=f"{CONFORMANCE} not present (CI has it)")
def test_every_conformance_expression_prints_back_to_the_same_tree() -> None:
    exprs = []
    for case in promqltest.collect(CONFORMANCE):
        try:
            pp.parse(case.expr)
        except ValueError:
            continue  # the cases that test parse errors
        exprs.append(case.expr)
    assert len(exprs) > 500
    wrong = [e for e in exprs if not _same_tree(print_expr(e), e)]
    assert wrong == []


@pytest.mark.parametrize(("expr", "want"), [
    ('sum by (job) (rate(x_total{a="b"}[5m]))', 'sum by (job, cluster) (rate(x_total{a="b", cluster="a"}[5m]))'),
    ("sum(x)", 'sum by (cluster) (x{cluster="a"})'),
    ("max without (gpu) (x)", 'max without (gpu) (x{cluster="a"})'),
    ("a / on (job) group_left (model) b", 'a{cluster="a"} / on (job, cluster) group_left (model) b{cluster="a"}'),
    ("a / ignoring (le) b", 'a{cluster="a"} / ignoring (le) b{cluster="a"}'),
    ('x{cluster="b"}', 'x{cluster="b"}'),  # a selector that names the label keeps its own
    ("max_over_time(x[10m:1m] offset 5m)", 'max_over_time(x{cluster="a"}[10m:1m] offset 5m)'),
    ("topk by (job) (3, x)", 'topk by (job, cluster) (3, x{cluster="a"})'),
    ("vector(1)", "vector(1)"),
    ("1 - x > bool 0.5", '1 - x{cluster="a"} > bool 0.5'),
])
def test_the_mixin_parameters(expr: str, want: str) -> None:
    got = rewrite(expr, selector=parse_selector('cluster="a"'), by=["cluster"])
    assert got == want
    assert _same_tree(got, want)


def test_selectors_parse_with_or_without_braces_and_errors_say_why() -> None:
    assert parse_selector('cluster="a", env=~"prod|dev"') == [("cluster", "=", "a"), ("env", "=~", "prod|dev")]
    assert parse_selector('{cluster!="b"}') == [("cluster", "!=", "b")]
    with pytest.raises(PromQLError, match="not a label selector"):
        parse_selector("up")
    with pytest.raises(PromQLError, match="not a label selector"):
        parse_selector("cluster")


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed (apt-get install prometheus)")
def test_exported_rules_keep_clusters_apart_in_prometheus(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The exported vLLM rules with --by cluster, run by promtool: the same job and model in two
    clusters give two job_model series instead of one sum; with --selector only cluster a's."""
    for args, name, expected in (
        (["--by", "cluster"], "by", [("a", 30), ("b", 5)]),
        (["--by", "cluster", "--selector", 'cluster="a"'], "selector", [("a", 30)]),
    ):
        assert main(["rules", "export", "--format", "rules", *args, str(bundled_rules_dir() / "vllm.rules.yaml")]) == 0
        (tmp_path / f"{name}.rules.yaml").write_text(capsys.readouterr().out)
        series = [("a", "gpu-1:8000", 10), ("a", "gpu-2:8000", 20), ("b", "gpu-1:8000", 5)]
        test = {"rule_files": [f"{name}.rules.yaml"], "evaluation_interval": "15s", "tests": [{
            "interval": "15s",
            "input_series": [{"series": f'vllm:num_requests_waiting{{job="vllm",model_name="m",cluster="{c}",'
                                        f'instance="{i}"}}', "values": f"{v}x10"} for c, i, v in series],
            "promql_expr_test": [{"expr": "job_model:vllm_num_requests_waiting:sum", "eval_time": "1m",
                                  "exp_samples": [{"labels": f'job_model:vllm_num_requests_waiting:sum{{cluster="{c}",'
                                                             f'job="vllm",model_name="m"}}', "value": v}
                                                  for c, v in expected]}],
        }]}
        (tmp_path / f"{name}.test.yaml").write_text(yaml.safe_dump(test))
        proc = subprocess.run(["promtool", "test", "rules", str(tmp_path / f"{name}.test.yaml")],
                              capture_output=True, text=True, timeout=60, check=False)
        assert proc.returncode == 0, proc.stdout + proc.stderr
