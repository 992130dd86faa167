"""Tests for agent.act.routing: the route tree by hand and against amtool, grouping, silences and actions."""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from agent.act.routing import Route, Router, build_route_tree, group_for, match_actions, match_routes, silenced_by
from agent.config import ActionConfig, Config, RouteConfig
from agent.errors import ConfigError
from tests.test_matchers import amtool_routes, needs_amtool, receivers_of, write_am_config


def tree(spec: dict[str, Any]) -> Route:
    """A route tree from the same dict shape a YAML config has."""
    return build_route_tree(RouteConfig.model_validate(spec))


def receivers(root: Route, labels: dict[str, str]) -> list[str]:
    return [r.receiver for r in match_routes(root, labels)]


# -- inheritance -----------------------------------------------------------------------------------


def test_children_inherit_what_they_do_not_set() -> None:
    """receiver, group_by, timers and send_resolved flow down until a route overrides them."""
    root = tree({
        "receiver": "r0", "group_by": ["alertname"], "group_wait": "10s", "group_interval": "1m",
        "repeat_interval": "2h", "send_resolved": False,
        "routes": [{
            "receiver": "r1", "group_wait": "5s", "match": {"team": "a"},
            "routes": [
                {"group_by": ["..."], "match": {"svc": "x"}},
                {"group_by": [], "send_resolved": True, "match": {"svc": "y"}},
                {"group_by": ["cluster", "alertname"], "repeat_interval": "30m", "receiver": "r2"},
            ],
        }],
    })
    child = root.routes[0]
    assert (child.receiver, child.group_by, child.group_wait_s, child.group_interval_s, child.repeat_interval_s,
            child.send_resolved) == ("r1", ("alertname",), 5.0, 60.0, 7200.0, False)
    all_labels, empty, own = child.routes
    assert (all_labels.receiver, all_labels.group_by, all_labels.group_wait_s) == ("r1", None, 5.0)
    assert (empty.group_by, empty.send_resolved) == (("alertname",), True)  # group_by: [] inherits, as in AM
    assert (own.receiver, own.group_by, own.repeat_interval_s, own.group_interval_s) == (
        "r2", ("cluster", "alertname"), 1800.0, 60.0)
    assert [r.path for r in root.walk()] == ["root", "root.0", "root.0.0", "root.0.1", "root.0.2"]


def test_root_defaults_are_alertmanagers() -> None:
    """A root that sets only its receiver gets 30s / 5m / 4h, no grouping labels, send_resolved."""
    root = tree({"receiver": "r0", "routes": [{"group_by": ["..."], "routes": [{"match": {"a": "b"}}]}]})
    assert (root.group_by, root.group_wait_s, root.group_interval_s, root.repeat_interval_s, root.send_resolved) == (
        (), 30.0, 300.0, 14400.0, True)
    assert root.routes[0].routes[0].group_by is None  # "..." is inherited too


@pytest.mark.parametrize(("spec", "message"), [
    ({"receiver": "r0", "group_by": ["...", "alertname"]}, "route.group_by: cannot have '...'"),
    ({"receiver": "r0", "routes": [{"group_by": ["a", "b", "a"]}]}, "route.routes[0].group_by: duplicated label"),
    ({"receiver": "r0", "routes": [{"group_by": ["a-b"]}]}, "route.routes[0].group_by: invalid label name"),
    ({"receiver": "r0", "match": {"a": "b"}}, "root route must not have matchers"),
    ({"receiver": "r0", "continue": True}, "root route cannot have continue"),
    ({"group_by": ["a"]}, "root route needs a receiver"),
    ({"receiver": "r0", "routes": [{"group_interval": "0s"}]}, "route.routes[0].group_interval: must be greater"),
])
def test_trees_alertmanager_refuses(spec: dict[str, Any], message: str) -> None:
    """A tree Alertmanager's config loader rejects is a ConfigError naming the key path."""
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
        tree(spec)


# -- matching --------------------------------------------------------------------------------------

CONTINUE_TREE = {
    "receiver": "default",
    "routes": [
        {"receiver": "pager", "matchers": ['severity="critical"'], "continue": True},
        {"receiver": "team-a", "match": {"team": "a"},
         "routes": [{"receiver": "team-a-db", "match_re": {"svc": "db|cache"}}]},
        {"receiver": "catch-all", "matchers": ['team=~".+"']},
        {"receiver": "never", "matchers": ['team=~".+"']},
    ],
}


@pytest.mark.parametrize(("labels", "expected"), [
    ({"severity": "critical", "team": "a"}, ["pager", "team-a"]),  # continue lets the next sibling match
    ({"severity": "critical"}, ["pager"]),  # the parent is the result only when no child matched at all
    ({"team": "a", "svc": "db"}, ["team-a-db"]),  # the deepest match, not its parent
    ({"team": "a", "svc": "dbx"}, ["team-a"]),  # regex anchored: no child matches, the node itself
    ({"team": "b"}, ["catch-all"]),  # a match without continue stops later siblings
    ({}, ["default"]),  # nothing matches: the root
])
def test_match_routes(labels: dict[str, str], expected: list[str]) -> None:
    """Depth first, continue, stop at the first non-continue match, fall back to the parent."""
    assert receivers(tree(CONTINUE_TREE), labels) == expected


def test_not_equal_and_empty_match_missing_labels() -> None:
    """!= and ="" match an alert that lacks the label; =~".+" does not."""
    root = tree({"receiver": "d", "routes": [
        {"receiver": "not-prod", "matchers": ['env!="prod"'], "continue": True},
        {"receiver": "no-env", "matchers": ['env=""'], "continue": True},
        {"receiver": "has-env", "matchers": ['env=~".+"']},
    ]})
    assert receivers(root, {}) == ["not-prod", "no-env"]
    assert receivers(root, {"env": "prod"}) == ["has-env"]
    assert receivers(root, {"env": "dev"}) == ["not-prod", "has-env"]


def test_match_forms_combine() -> None:
    """match, match_re and matchers on one route must all hold."""
    root = tree({"receiver": "d", "routes": [
        {"receiver": "x", "match": {"a": "1"}, "match_re": {"b": "2|3"}, "matchers": ['c!~"4.*"']}]})
    assert receivers(root, {"a": "1", "b": "3", "c": "5"}) == ["x"]
    assert receivers(root, {"a": "1", "b": "3", "c": "45"}) == ["d"]
    assert receivers(root, {"a": "1", "b": "23"}) == ["d"]


# -- grouping --------------------------------------------------------------------------------------


def test_group_for_by_labels() -> None:
    """Group labels are the alert's values of group_by, sorted; missing and empty ones are left out."""
    root = tree({"receiver": "d", "routes": [{"match": {"team": "a"}, "group_by": ["cluster", "alertname"]}]})
    route = root.routes[0]
    labels = {"alertname": "KVFull", "cluster": "c1", "pod": "p-1", "team": "a"}
    assert group_for(route, labels) == ('root.0:{alertname="KVFull", cluster="c1"}',
                                        {"alertname": "KVFull", "cluster": "c1"})
    assert group_for(route, {"alertname": "KVFull", "team": "a"}) == ('root.0:{alertname="KVFull"}',
                                                                      {"alertname": "KVFull"})
    assert group_for(route, {"alertname": "KVFull", "cluster": ""}) == ('root.0:{alertname="KVFull"}',
                                                                        {"alertname": "KVFull"})
    assert group_for(route, {"team": "a"}) == ("root.0:{}", {})


def test_group_for_all_labels_and_none() -> None:
    """'...' groups by every label; a root without group_by puts every alert in one group."""
    root = tree({"receiver": "d", "routes": [{"match": {"x": "1"}, "group_by": ["..."]}]})
    assert group_for(root.routes[0], {"x": "1", "b": 'say "hi"\n'}) == (
        'root.0:{b="say \\"hi\\"\\n", x="1"}', {"b": 'say "hi"\n', "x": "1"})
    assert group_for(root, {"x": "2", "b": "3"}) == ("root:{}", {})


def test_group_key_differs_per_route() -> None:
    """The same labels on two routes make two groups."""
    root = tree({"receiver": "d", "group_by": ["alertname"],
                 "routes": [{"receiver": "a", "continue": True}, {"receiver": "b"}]})
    keys = [group_for(r, {"alertname": "X"})[0] for r in match_routes(root, {"alertname": "X"})]
    assert keys == ['root.0:{alertname="X"}', 'root.1:{alertname="X"}']


# -- silences --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class FakeSilence:
    """Alertmanager's silence window: active from starts_ms (inclusive) to ends_ms (exclusive)."""

    id: str
    matchers: list[str]
    starts_ms: int
    ends_ms: int

    def active(self, now_ms: int) -> bool:
        return self.starts_ms <= now_ms < self.ends_ms


def test_silences_active_expired_pending() -> None:
    """Only a silence whose window holds now mutes; one starting later or already ended does not."""
    labels = {"alertname": "KVFull", "instance": "a:8000"}
    silences = [
        FakeSilence("active", ['alertname="KVFull"'], 1000, 2000),
        FakeSilence("pending", ['alertname="KVFull"'], 1600, 3000),
        FakeSilence("expired", ['alertname="KVFull"'], 0, 1500),
    ]
    assert silenced_by(labels, silences, 1500) == ["active"]
    assert silenced_by(labels, silences, 1000) == ["active", "expired"]
    assert silenced_by(labels, silences, 2000) == ["pending"]


def test_silence_matchers_all_must_hold() -> None:
    """Every matcher of a silence must match, regexes anchored; a silence without matchers mutes nothing."""
    labels = {"alertname": "KVFull", "instance": "a:8000", "severity": "warning"}
    silences = [
        FakeSilence("both", ['alertname="KVFull"', 'instance=~"a:.*"'], 0, 10),
        FakeSilence("one-fails", ['alertname="KVFull"', 'severity="critical"'], 0, 10),
        FakeSilence("unanchored", ['instance=~"a"'], 0, 10),
        FakeSilence("negated", ['severity!~"crit.*"'], 0, 10),
        FakeSilence("empty", [], 0, 10),
        FakeSilence("broken", ['instance=~"("'], 0, 10),
    ]
    assert silenced_by(labels, silences, 5) == ["both", "negated"]


def test_real_state_silence_fits() -> None:
    """agent.act.state.Silence works with silenced_by as it is."""
    state = pytest.importorskip("agent.act.state")
    s = state.Silence(id="s1", matchers=['alertname="X"'], starts_ms=0, ends_ms=10, created_by="t", comment="c")
    assert silenced_by({"alertname": "X"}, [s], 5) == ["s1"]
    assert silenced_by({"alertname": "X"}, [s], 10) == []


# -- actions and Router ----------------------------------------------------------------------------


def test_default_actions() -> None:
    """The default config scales out `action="scale_out"` alerts and diagnoses GPUMemoryNearFull, OOM-looking
    names (as other rule sets behind an Alertmanager call them), VLLMGenerationThroughputLow and the KV-capacity
    alerts, anchored."""
    actions = Config().actions
    scale = {"alertname": "VLLMRequestsQueueing", "action": "scale_out"}
    assert [a.type for a in match_actions(actions, scale)] == ["scale_out"]
    assert [a.type for a in match_actions(actions, {"alertname": "GPUMemoryNearFull"})] == ["diagnose"]
    for name in ("DCGMFramebufferNearFull", "GpuMemoryHigh", "CUDAOutOfMemory", "KubeContainerOOMKilled",
                 "VLLMGenerationThroughputLow", "VLLMKVCacheSaturated", "VLLMQueueingWithKVCacheHeadroom",
                 "VLLMPreemptionsSustained"):
        assert [a.type for a in match_actions(actions, {"alertname": name})] == ["diagnose"], name
    for name in ("VLLMGenerationThroughputLowish", "VLLMKVCacheSaturatedX", "Zoom", "GPUThermalThrottling"):
        assert [a.type for a in match_actions(actions, {"alertname": name})] == [], name
    assert [a.type for a in match_actions(actions, {"alertname": "GPUMemoryNearFull", "action": "scale_out"})] == [
        "scale_out", "diagnose"]
    router = Router(Config())
    assert router.actions_for(scale) == match_actions(actions, scale)
    assert [r.receiver for r in router.routes_for(scale)] == ["console"]


def test_action_match_forms() -> None:
    """An action needs all of its matchers, match and match_re; one with none runs for every alert."""
    actions = [
        ActionConfig(type="diagnose", match={"alertname": "A"}, match_re={"gpu": "[0-3]"}, matchers=['job!="x"']),
        ActionConfig(type="scale_in"),
    ]
    assert [a.type for a in match_actions(actions, {"alertname": "A", "gpu": "2"})] == ["diagnose", "scale_in"]
    assert [a.type for a in match_actions(actions, {"alertname": "A", "gpu": "12"})] == ["scale_in"]
    assert [a.type for a in match_actions(actions, {"alertname": "A", "gpu": "2", "job": "x"})] == ["scale_in"]


def test_router_uses_the_config_tree() -> None:
    """Router routes with the tree of the config it was given."""
    cfg = Config.model_validate({
        "receivers": [{"name": "console", "console": {}}, {"name": "hook", "webhook": {"url": "http://127.0.0.1:9/"}}],
        "route": {"receiver": "console", "routes": [{"receiver": "hook", "matchers": ['severity="critical"']}]},
    })
    router = Router(cfg)
    assert [r.path for r in router.routes_for({"severity": "critical"})] == ["root.0"]
    assert router.routes_for({}) == [router.root]


# -- differential: amtool --------------------------------------------------------------------------

RECEIVERS = ["r0", "r1", "r2", "r3", "r4"]
VALUES = {
    "alertname": ["VLLMKVCacheFull", "VLLMQueueGrowing", "GPUMemoryNearFull"],
    "severity": ["critical", "warning", "info"],
    "team": ["a", "b"],
    "env": ["prod", "dev"],
}


def _regex(rng: random.Random, name: str) -> str:
    values = VALUES[name]
    return rng.choice([
        "|".join(rng.sample(values, rng.randint(1, len(values)))),
        rng.choice(values)[:3] + ".*",
        rng.choice(values)[1:],  # unanchored this would match; anchored it must not
        ".*", ".+", "", "(?i)" + rng.choice(values).upper(),
    ])


def _random_conditions(rng: random.Random) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for _ in range(rng.choice([0, 1, 1, 2])):
        name = rng.choice(list(VALUES))
        op = rng.choice(["=", "=", "!=", "=~", "=~", "!~"])
        value = _regex(rng, name) if "~" in op else rng.choice([*VALUES[name], ""])
        form = rng.random()
        if op == "=" and form < 0.4:
            out.setdefault("match", {})[name] = value
        elif op == "=~" and form < 0.4:
            out.setdefault("match_re", {})[name] = value
        else:
            quoted = form < 0.7 or not value.isalnum()
            out.setdefault("matchers", []).append(f'{name}{op}"{value}"' if quoted else f"{name}{op}{value}")
    return out


def _random_route(rng: random.Random, depth: int) -> dict[str, Any]:
    route: dict[str, Any] = _random_conditions(rng)
    if rng.random() < 0.6:
        route["receiver"] = rng.choice(RECEIVERS)
    if rng.random() < 0.35:
        route["continue"] = True
    if depth < 3 and rng.random() < 0.5:
        route["routes"] = [_random_route(rng, depth + 1) for _ in range(rng.randint(1, 3))]
    return route


def _random_labels(rng: random.Random) -> dict[str, str]:
    labels = {}
    for name, values in VALUES.items():
        if rng.random() < 0.7:
            labels[name] = rng.choice([*values, *values, rng.choice(values) + "x", rng.choice(values).upper()])
    return labels


# Hand-picked: continue chains, nested fall-back, anchoring, != on missing labels, list-form matchers.
EDGE_TREE: dict[str, Any] = {
    "receiver": "r0",
    "routes": [
        {"receiver": "r1", "matchers": ['severity="critical"'], "continue": True,
         "routes": [{"receiver": "r2", "matchers": ['team="a"'], "continue": True},
                    {"receiver": "r3", "matchers": ['env!="prod"']}]},
        {"matchers": ['team=~"a|b"'], "routes": [{"receiver": "r4", "match_re": {"env": "pro"}}]},
        {"receiver": "r2", "matchers": ["alertname=~VLLM.*,severity!="]},  # two matchers, as Alertmanager reads it
        {"receiver": "r3", "matchers": ['env=""'], "continue": True},
        {"receiver": "r4", "matchers": ['alertname!~".+"']},
    ],
}
EDGE_LABELS: list[dict[str, str]] = [
    {}, {"severity": "critical"}, {"severity": "critical", "env": "prod"},
    {"severity": "critical", "team": "a", "env": "prod"}, {"severity": "critical", "team": "a"},
    {"team": "a", "env": "pro"}, {"team": "a", "env": "prod"}, {"team": "ab"},
    {"alertname": "VLLMQueueGrowing", "severity": "info"}, {"alertname": "VLLMQueueGrowing"},
    {"alertname": "vllmQueue", "severity": "info", "env": "dev"}, {"env": "dev", "alertname": "X"},
    {"severity": "", "env": ""},
]


@needs_amtool
def test_differential_against_amtool(tmp_path: Path) -> None:
    """Seeded random trees and hand-picked edge cases route to the same receivers, in order, as Alertmanager."""
    rng = random.Random(20240611)
    cases: list[tuple[dict[str, Any], dict[str, str]]] = [(EDGE_TREE, labels) for labels in EDGE_LABELS]
    for _ in range(14):
        spec = {"receiver": "r0", "routes": [_random_route(rng, 1) for _ in range(rng.randint(1, 4))]}
        cases += [(spec, _random_labels(rng)) for _ in range(10)]
    files: dict[int, Path] = {}
    for spec, _ in cases:
        if id(spec) not in files:
            files[id(spec)] = write_am_config(tmp_path / f"t{len(files)}.yml", spec, RECEIVERS)
    procs = amtool_routes([(files[id(spec)], labels) for spec, labels in cases])
    trees = {id(spec): tree(spec) for spec, _ in cases}
    mismatches = [(spec, labels, theirs, ours)
                  for (spec, labels), proc in zip(cases, procs, strict=True)
                  if (theirs := receivers_of(proc)) != (ours := receivers(trees[id(spec)], labels))]
    assert not mismatches
    assert len(cases) >= 150
    assert any(len(receivers_of(p)) > 1 for p in procs)  # continue fan-out was exercised
