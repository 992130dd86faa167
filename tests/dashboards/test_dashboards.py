"""Tests for dashboards/: the committed JSON is the generator's output, every query parses and names
only real metrics, every vLLM query returns data on both metric generations, and the conventions hold."""

from __future__ import annotations

import asyncio
import difflib
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import promql_parser
import pytest
import yaml
from prometheus_client.exposition import generate_latest

from agent.collect import catalog
from agent.diagnose.nccl import judge, parse
from agent.promql import metric_names
from agent.promql import parse as engine_parse
from dashboards import generate
from dashboards.kit import ALL, RUNBOOK_BASE, TAG
from tests.dashboards.fleetdata import Fleet
from tests.dashboards.queries import ALL_VALUES, dashboards, panel_queries, panels, substitute

ROOT = Path(__file__).resolve().parents[2]
BOARDS = dashboards()
UIDS = ("vllm-fleet", "vllm-replica", "lmdeploy", "gpu", "sre-agent")
#: Filters each dashboard must offer, in chain order.
CHAINS = {"vllm-fleet": ["job", "model_name", "instance"], "vllm-replica": ["job", "model_name", "instance"],
          "lmdeploy": ["job", "model_name", "instance"], "gpu": ["job", "instance", "gpu"],
          "sre-agent": ["job", "instance"]}  # fmt: skip
#: Panels that may be empty on a generation, and why.
EMPTY_ON = {("v0", "Prefix-cache hit rate"): "the V0 simulator runs without prefix caching (gauge -1)"}
PROMETHEUS_SERIES = {"up", "scrape_duration_seconds", "scrape_samples_scraped"}


def all_queries() -> Iterator[tuple[str, str, str]]:
    for uid, board in BOARDS.items():
        for title, expr in panel_queries(board):
            yield uid, title, expr


QUERIES = list(all_queries())


def test_the_five_dashboards_are_committed() -> None:
    """dashboards/ holds exactly the five dashboards, each in <uid>.json."""
    assert sorted(BOARDS) == sorted(UIDS)
    for uid in UIDS:
        assert (ROOT / "dashboards" / f"{uid}.json").is_file()


def test_committed_json_is_what_the_generator_builds(tmp_path: Path) -> None:
    """Regenerating into a temp dir gives the committed files byte for byte (else: diff + command)."""
    assert generate.main(["--out", str(tmp_path)]) == 0
    problems = []
    for built in sorted(tmp_path.glob("*.json")):
        committed = ROOT / "dashboards" / built.name
        old = committed.read_text(encoding="utf-8").splitlines(keepends=True) if committed.is_file() else []
        new = built.read_text(encoding="utf-8").splitlines(keepends=True)
        if old != new:
            problems.append("".join(difflib.unified_diff(old, new, f"committed/{built.name}", f"generated/{built.name}",
                                                         n=2)))  # fmt: skip
    assert not problems, "dashboards/*.json are stale; run: python -m dashboards.generate\n" + "\n".join(problems)
    assert generate.main(["--check"]) == 0


@pytest.mark.parametrize(("uid", "title", "expr"), QUERIES, ids=[f"{u}/{t}" for u, t, _ in QUERIES])
def test_every_query_parses_and_the_engine_accepts_it(uid: str, title: str, expr: str) -> None:
    """Each panel query, variables filled as All or as one value, parses with promql-parser and the agent's engine."""
    for values in (ALL_VALUES, {**ALL_VALUES, "job": "vllm", "model_name": "m", "instance": "h:8000", "gpu": "0"}):
        text = substitute(expr, values)
        promql_parser.parse(text)
        engine_parse(text)


def _agent_metric_names() -> set[str]:
    """Every family the agent's /metrics serves (an agent built with the bundled rules), plus the
    NVML poller's and the nccl-tests check's, which appear only after a poll or a run."""
    from agent.app.daemon import Agent
    from agent.config import Config
    from tests.fake_pynvml import FakeNvml

    config = Config.model_validate({"targets": [], "state": {"path": ":memory:"},
                                    "server": {"listen": "127.0.0.1:0"},
                                    "rules": {"files": [str(ROOT / "rules" / "*.rules.yaml")]}})  # fmt: skip
    agent = Agent(config, nvml_module=FakeNvml().module, hostname="n")
    try:
        text = generate_latest(agent.registry).decode()
    finally:
        asyncio.run(agent.stop())
    names = {line.split(" ")[2] for line in text.splitlines() if line.startswith("# TYPE ")}
    result = parse.parse_nccl((ROOT / "tests/fixtures/nccl/a100x8_nvswitch_allreduce.txt").read_text())
    names |= {name for name, _, _ in judge.nccl_samples(result, "ok", 0, {})}
    return names | set(catalog.SRE_AGENT_GPU_FAMILIES)


def _exposed() -> set[str]:
    """Names something really exposes: vLLM (both generations) and LMDeploy per the catalog and the
    captures, dcgm-exporter, the agent, Prometheus' own scrape series, and our recording rules."""
    names = set(PROMETHEUS_SERIES) | _agent_metric_names()
    names |= {"DCGM_FI_DEV_" + f for f in catalog.DCGM_FIELDS}
    for path in (ROOT / "tests/fixtures/vllm").glob("*_metrics.txt"):
        names |= {m.group(1) for m in re.finditer(r"^([a-zA-Z_:][\w:]*)[{ ]", path.read_text(), re.MULTILINE)}
    for path in (ROOT / "rules").glob("*.rules.yaml"):
        for group in yaml.safe_load(path.read_text())["groups"]:
            names |= {r["record"] for r in group["rules"] if "record" in r}
    return names


def test_every_metric_name_is_one_something_exposes() -> None:
    """No query names a metric that vLLM, LMDeploy, dcgm-exporter, the agent or our rules do not expose."""
    exposed = _exposed()
    strays: dict[str, set[str]] = {}
    for uid, title, expr in QUERIES:
        names, unnamed = metric_names(engine_parse(substitute(expr)))
        assert not unnamed, f"{uid}/{title}: a selector without a metric name"
        for name in names:
            if name not in exposed and catalog.family(name) is None:
                strays.setdefault(name, set()).add(f"{uid}/{title}")
    assert not strays, "strays: " + "; ".join(f"{n} ({', '.join(sorted(w))})" for n, w in sorted(strays.items()))


@pytest.fixture(scope="module")
def fleets() -> dict[str, Fleet]:
    """Offline stores of simulated V0, V1 and LMDeploy servers, with the recording rules evaluated."""
    return {f: Fleet(f) for f in ("v0", "v1", "lmdeploy")}


def test_every_vllm_and_lmdeploy_query_returns_data_on_each_generation(fleets: dict[str, Fleet]) -> None:
    """Each query of the vLLM dashboards returns series on a V0-only and on a V1-only fleet (LMDeploy's on LMDeploy)."""
    empty = []
    for uid, title, expr in QUERIES:
        flavors = {"vllm-fleet": ("v0", "v1"), "vllm-replica": ("v0", "v1"), "lmdeploy": ("lmdeploy",)}.get(uid, ())
        for flavor in flavors:
            if (flavor, title) not in EMPTY_ON and not fleets[flavor].query(substitute(expr)):
                empty.append(f"{uid}/{title} on {flavor}: {expr}")
    assert not empty, "\n".join(empty)


def test_a_chosen_model_filters_the_queries(fleets: dict[str, Fleet]) -> None:
    """With model_name set to a model that does not exist, every vLLM query but the per-server one
    (cache_config_info: no model_name label) returns nothing: the filter reaches every selector (up
    through the vLLM series of its target)."""
    values = {**ALL_VALUES, "model_name": "no-such-model"}
    unfiltered = [f"{uid}/{title}" for uid, title, expr in QUERIES if uid.startswith("vllm")
                  and fleets["v1"].query(substitute(expr, values))]  # fmt: skip
    assert unfiltered == ["vllm-replica/Cache configuration"]


def _vars(board: dict[str, Any]) -> list[dict[str, Any]]:
    return list(board["templating"]["list"])


@pytest.mark.parametrize("uid", UIDS)
def test_conventions(uid: str) -> None:
    """uid, shared tag, dashboard links, ${datasource} everywhere, units, runbook-linked descriptions,
    and $__rate_interval in every rate/increase."""
    board = BOARDS[uid]
    assert board["uid"] == uid and TAG in board["tags"]
    assert any(link["type"] == "dashboards" and TAG in link["tags"] for link in board["links"])
    ds = _vars(board)[0]
    assert (ds["name"], ds["type"], ds["query"]) == ("datasource", "datasource", "prometheus")
    assert [a["datasource"]["uid"] for a in board["annotations"]["list"]] == ["-- Grafana --"]
    seen_ids = set()
    for p in panels(board):
        where = f"{uid}/{p['title']}"
        assert p["id"] not in seen_ids, f"{where}: duplicate panel id"
        seen_ids.add(p["id"])
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, where
        assert p["targets"] and all(t["datasource"]["uid"] == "${datasource}" for t in p["targets"]), where
        assert len({t["refId"] for t in p["targets"]}) == len(p["targets"]), f"{where}: refIds repeat"
        assert p["fieldConfig"]["defaults"].get("unit"), f"{where}: no unit"
        desc = p.get("description", "")
        assert "**Bad:**" in desc, f"{where}: the description does not say what a bad value means"
        links = re.findall(r"\]\((\S+?)\)", desc)
        assert links and all(u.startswith(RUNBOOK_BASE) for u in links), f"{where}: no runbook link"
        for url in links:
            assert (ROOT / "runbooks" / url.removeprefix(RUNBOOK_BASE)).is_file(), f"{where}: {url}"
        for t in p["targets"]:
            for m in re.finditer(r"\b(rate|increase|irate|delta|deriv)\((.*?)\[([^\]]+)\]", t["expr"]):
                assert m.group(3) == "$__rate_interval", f"{where}: {m.group(0)} must use $__rate_interval"


@pytest.mark.parametrize("uid", UIDS)
def test_variables_are_chained_multi_select_with_all(uid: str) -> None:
    """job -> model_name -> instance (or job -> instance -> gpu): each label_values() filtered by those before it."""
    qvars = [v for v in _vars(BOARDS[uid]) if v["type"] == "query"]
    assert [v["name"] for v in qvars] == CHAINS[uid]
    for i, v in enumerate(qvars):
        assert v["multi"] and v["includeAll"] and v["allValue"] == ALL, v["name"]
        assert v["datasource"]["uid"] == "${datasource}"
        m = re.fullmatch(r"label_values\((.+), (\w+)\)", v["query"])
        assert m and m.group(2) == v["name"]
        for before in qvars[:i]:
            assert f'=~"${before["name"]}"' in m.group(1), f"{v['name']} is not filtered by {before['name']}"
        for after in qvars[i:]:
            assert f"${after['name']}" not in m.group(1)


def _rule_thresholds() -> dict[str, set[float]]:
    """Alert -> every number its expression compares with (read here independently of dashboards.rules)."""
    out: dict[str, set[float]] = {}
    for path in (ROOT / "rules").glob("*.rules.yaml"):
        for group in yaml.safe_load(path.read_text())["groups"]:
            for r in group["rules"]:
                if "alert" in r:
                    out[r["alert"]] = {float(x) for x in re.findall(r"(?:[<>]=?|\bon \([^)]*\))\s*(\d+(?:\.\d+)?)",
                                                                    r["expr"])}  # fmt: skip
    return out


#: Panels whose lines must be exactly these alerts' numbers.
EXPECTED_LINES = {
    ("vllm-fleet", "KV-cache usage"): {0.8, 0.95}, ("vllm-replica", "KV-cache usage"): {0.8, 0.95},
    ("vllm-fleet", "Time to first token"): {2.0}, ("vllm-fleet", "Inter-token latency"): {0.2},
    ("vllm-fleet", "End-to-end request latency"): {60.0}, ("lmdeploy", "Prefix-cache miss ratio"): {0.15},
    ("lmdeploy", "Time to first token"): {2.0}, ("lmdeploy", "End-to-end request latency"): {60.0},
    ("gpu", "Framebuffer used / usable"): {0.95}, ("sre-agent", "Failed scrapes"): {0.1},
    ("sre-agent", "Scrape duration"): {8.0},
}  # fmt: skip


def test_thresholds_equal_the_rules() -> None:
    """Every threshold line is a number the linked alert compares with, and the key panels draw the guide's lines."""
    rules = _rule_thresholds()
    for (uid, title), expected in EXPECTED_LINES.items():
        [p] = [p for p in panels(BOARDS[uid]) if p["title"] == title]
        steps = {s["value"] for s in p["fieldConfig"]["defaults"]["thresholds"]["steps"] if s["value"] is not None}
        assert steps == expected, (uid, title)
    for uid, board in BOARDS.items():
        for p in panels(board):
            if p["type"] != "timeseries" or "thresholds" not in p["fieldConfig"]["defaults"]:
                continue
            alerts = re.findall(r"runbooks/(\w+)\.md", p["description"])
            numbers = set().union(*(rules.get(a, set()) for a in alerts))
            steps = {s["value"] for s in p["fieldConfig"]["defaults"]["thresholds"]["steps"] if s["value"] is not None}
            assert steps <= numbers, f"{uid}/{p['title']}: {steps - numbers} is no threshold of {alerts}"


def test_scale_out_panels_use_the_rules_factor() -> None:
    """The scale-out panels compare waiting with the rule's factor times running."""
    for uid in ("vllm-fleet", "lmdeploy"):
        [p] = [p for p in panels(BOARDS[uid]) if p["title"].startswith("Scale-out rule")]
        assert p["targets"][1]["expr"].startswith("2 * job_model:")


def test_substitute_fills_every_form_and_refuses_unknown_variables() -> None:
    """$x, ${x}, ${x:regex} and [[x]] are replaced; an unknown variable raises."""
    values = {"job": "a|b", "__rate_interval": "1m"}
    assert substitute('rate(x{job=~"$job"}[$__rate_interval])', values) == 'rate(x{job=~"a|b"}[1m])'
    assert substitute('x{job=~"${job}", j=~"${job:regex}", k="[[job]]"}', values) == 'x{job=~"a|b", j=~"a|b", k="a|b"}'
    with pytest.raises(KeyError, match="nope"):
        substitute("x{a=~\"$nope\"}", values)


def test_panel_queries_lists_titles_and_expressions() -> None:
    """panel_queries gives (title, expr) for every target, rows skipped, collapsed rows' panels included."""
    board = {"panels": [{"type": "row", "panels": [{"title": "in", "targets": [{"expr": "b"}]}]},
                        {"title": "t", "type": "timeseries", "targets": [{"expr": "a"}, {"expr": "c"}]}]}
    assert panel_queries(board) == [("in", "b"), ("t", "a"), ("t", "c")]


def test_provisioning_files() -> None:
    """The datasource is Prometheus uid "prometheus" at http://prometheus:9090; dashboards load from
    /var/lib/grafana/dashboards into the folder sre-agent."""
    prov = ROOT / "dashboards" / "provisioning"
    [ds] = yaml.safe_load((prov / "datasources" / "prometheus.yaml").read_text())["datasources"]
    assert (ds["type"], ds["uid"], ds["url"]) == ("prometheus", "prometheus", "http://prometheus:9090")
    [provider] = yaml.safe_load((prov / "dashboards" / "sre-agent.yaml").read_text())["providers"]
    assert (provider["type"], provider["folder"], provider["options"]["path"]) == (
        "file", "sre-agent", "/var/lib/grafana/dashboards")
