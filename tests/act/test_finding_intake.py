"""Tests for agent.act.finding_intake: the forwarded-finding format read strictly, and which alert it joins."""

from __future__ import annotations

from typing import Any

import pytest

from agent.act.finding_intake import identity, match, parse_forwarded
from agent.act.notification import AlertSnapshot, Notification
from agent.act.queues import forward_queue
from agent.act.sinks.forward import forward_payload
from agent.diagnose.findings import Finding

FINDING = Finding(kind="gpu-oom-runtime", summary="CUDA OOM on GPU 3.", severity="critical",
                  evidence=["torch.OutOfMemoryError: CUDA out of memory."], setting="--gpu-memory-utilization",
                  suggested_value="0.85", details={"gpu_memory_used_bytes": 80 << 30}, runbook_url="https://x/r.md",
                  labels={"log_file": "/var/log/pods/a/b/0.log"})


def _body(**changes: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"version": "1", "key": "finding:forward:abc:1", "labels": {"node": "gpu-node-7"},
                            "finding": FINDING.to_json()}
    body.update(changes)
    return body


def _alert(name: str, starts: int = 1000, status: str = "firing", **labels: str) -> AlertSnapshot:
    return AlertSnapshot(labels={"alertname": name, "severity": "warning", **labels}, annotations={},
                         status=status, starts_at_ms=starts)  # type: ignore[arg-type]


def test_what_the_forward_sink_sends_is_read_back_unchanged() -> None:
    """The node agent's payload (forward_payload) parses to the same finding, key, labels and alert labels."""
    alert = _alert("GPUMemoryNearFull", Hostname="gpu-node-7", gpu="3")
    n = Notification(key="finding:forward:abc:17", receiver=forward_queue(), kind="finding", created_ms=17,
                     alerts=(alert,), finding=FINDING.to_json())
    f = parse_forwarded(forward_payload(n, {"node": "gpu-node-7"}))
    assert (f.key, f.finding, f.labels) == ("finding:forward:abc:17", FINDING, {"node": "gpu-node-7"})
    assert f.alertname == "GPUMemoryNearFull" and f.alert_labels["gpu"] == "3"


@pytest.mark.parametrize(("change", "message"), [
    ({"version": "2"}, "version: expected '1'"),
    ({"key": ""}, "key: 1 to 256 printable"),
    ({"key": "a b"}, "key: 1 to 256 printable"),
    ({"extra": 1}, "unknown key 'extra'"),
    ({"labels": {"no-dash": "x"}}, "labels: 'no-dash' is not a label name"),
    ({"labels": {"node": 7}}, "labels.node: must be a string"),
    ({"finding": {**FINDING.to_json(), "severity": "page"}}, "finding.severity: one of critical"),
    ({"finding": {**FINDING.to_json(), "kind": "Has Space"}}, "finding.kind: expected a name"),
    ({"finding": {**FINDING.to_json(), "summary": "  "}}, "finding.summary: empty"),
    ({"finding": {**FINDING.to_json(), "evidence": ["ok", 3]}}, "finding.evidence[1]: must be a string"),
    ({"finding": {**FINDING.to_json(), "ok": "yes"}}, "finding.ok: must be a boolean"),
    ({"finding": {**FINDING.to_json(), "score": 1}}, "finding: unknown key 'score'"),
    ({"finding": {"summary": "no kind"}}, "finding.kind: missing"),
    ({"finding": []}, "finding: must be an object, not an array"),
    ({"alert": {"labels": {"alertname": "X"}, "startsAt": "yesterday"}}, "alert.startsAt: must be a number"),
    ({"alert": {"labels": {}, "fingerprint": "x"}}, "alert: unknown key 'fingerprint'"),
])
def test_a_malformed_body_is_refused_naming_the_path(change: dict[str, Any], message: str) -> None:
    """Each problem is a ValueError naming where it is (the HTTP layer's 400)."""
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        parse_forwarded(_body(**change))


def test_missing_finding_is_refused() -> None:
    """A body without a finding says so."""
    body = _body()
    del body["finding"]
    with pytest.raises(ValueError, match="finding: missing"):
        parse_forwarded(body)


def test_the_node_spellings_are_one_identity() -> None:
    """node, Hostname and hostname all name the node; other labels are not identity."""
    assert identity({"Hostname": "n1", "gpu": "0", "job": "dcgm"}) == {"node": "n1", "gpu": "0"}
    assert identity({"node": "n1"}) == identity({"hostname": "n1"})


def test_a_finding_joins_the_firing_alert_of_its_node() -> None:
    """The node agent's node label matches the central alert's Hostname; a resolved one or another node does not."""
    f = parse_forwarded(_body())
    ours = _alert("GPUMemoryNearFull", Hostname="gpu-node-7", gpu="3")
    other = _alert("GPUMemoryNearFull", Hostname="gpu-node-8", gpu="3")
    ended = _alert("GPUTempHigh", starts=5000, status="resolved", Hostname="gpu-node-7")
    assert match(f, [other, ended, ours]) is ours
    assert match(f, [other, ended]) is None


def test_a_disagreeing_identity_label_rules_an_alert_out() -> None:
    """Sharing the node is not enough when the GPU differs."""
    f = parse_forwarded(_body(alert={"labels": {"alertname": "GPUMemoryNearFull", "gpu": "3"}}))
    assert match(f, [_alert("GPUMemoryNearFull", Hostname="gpu-node-7", gpu="2")]) is None


def test_the_alertname_when_given_must_agree() -> None:
    """A finding raised for the node's GPUMemoryNearFull does not join a KV-cache alert on the same node."""
    f = parse_forwarded(_body(alert={"labels": {"alertname": "GPUMemoryNearFull"}}))
    kv = _alert("VLLMKVCacheSaturated", node="gpu-node-7")
    mem = _alert("GPUMemoryNearFull", node="gpu-node-7")
    assert match(f, [kv]) is None and match(f, [kv, mem]) is mem


def test_most_shared_identity_then_latest_wins() -> None:
    """Of several matches, the one agreeing on more identity labels; at a tie, the latest to fire."""
    f = parse_forwarded(_body(finding={**FINDING.to_json(), "labels": {"gpu": "3"}}))
    node_only = _alert("NodeDown", starts=9000, node="gpu-node-7")
    node_gpu = _alert("GPUMemoryNearFull", starts=1000, Hostname="gpu-node-7", gpu="3")
    assert match(f, [node_only, node_gpu]) is node_gpu
    later = _alert("GPUTempHigh", starts=2000, Hostname="gpu-node-7", gpu="3")
    assert match(f, [node_only, node_gpu, later]) is later


def test_no_shared_identity_is_no_match() -> None:
    """An alert with none of the finding's identity labels is not its alert (no join on alertname alone)."""
    f = parse_forwarded(_body(alert={"labels": {"alertname": "X"}}))
    assert match(f, [_alert("X", instance="10.0.0.1:8000")]) is None


def _nested(depth: int, leaf: Any = 1) -> Any:
    value = leaf
    for _ in range(depth):
        value = {"a": value} if _ % 2 else [value]
    return value


@pytest.mark.parametrize("depth", [20, 100, 500, 900])
def test_deeply_nested_details_are_refused_naming_the_field(depth: int) -> None:
    """``details`` nested past the limit is a ValueError naming ``finding.details`` (the HTTP layer's 400),
    never a RecursionError further on (a 500 the node agent would retry until it gives up)."""
    with pytest.raises(ValueError, match=r"finding\.details: nested"):
        parse_forwarded(_body(finding={**FINDING.to_json(), "details": {"x": _nested(depth)}}))


def test_details_with_too_many_values_are_refused() -> None:
    """A flat but huge ``details`` is refused by its number of values, naming the field."""
    with pytest.raises(ValueError, match=r"finding\.details: .* values"):
        parse_forwarded(_body(finding={**FINDING.to_json(), "details": {"x": list(range(20_000))}}))


def test_nested_details_within_the_limit_are_kept() -> None:
    """A few levels of structure (what diagnoses write) are taken as they are."""
    details = {"gpus": [{"index": 0, "used": [1, 2, {"x": None}]}]}
    assert parse_forwarded(_body(finding={**FINDING.to_json(), "details": details})).finding.details == details


@pytest.mark.parametrize("starts", [-1, 2**63, 2**64 + 5, 10**30, 253_402_300_800_000])
def test_an_alert_start_outside_the_representable_range_is_refused(starts: int) -> None:
    """``alert.startsAt`` (Unix ms) past what the agent can store and format, or negative, is refused."""
    with pytest.raises(ValueError, match=r"alert\.startsAt"):
        parse_forwarded(_body(alert={"labels": {"alertname": "X"}, "startsAt": starts}))


@pytest.mark.parametrize("change", [{"labels": {"node": "a\ud800"}}, {"key": "k", "finding": {**FINDING.to_json(),
                                    "summary": "x\udfff"}},
                                    {"finding": {**FINDING.to_json(), "details": {"k\ud800": 1}}},
                                    {"finding": {**FINDING.to_json(), "evidence": ["\udc00"]}}])
def test_a_lone_surrogate_anywhere_is_refused(change: dict[str, Any]) -> None:
    """A string JSON can carry but UTF-8 cannot (a lone surrogate), in any field or key, is a ValueError."""
    with pytest.raises(ValueError, match="lone surrogate"):
        parse_forwarded(_body(**change))
