"""The ha: section: modes, lease timings the kubernetes client accepts, identity and replica from the env,
and alertmanager_only refusing direct receivers."""

from __future__ import annotations

import json
import socket
from typing import Any

import pytest

from agent.config import Config, load_config
from agent.errors import ConfigError


def _load(tmp_path: Any, data: dict[str, Any], environ: dict[str, str] | None = None) -> Config:
    path = tmp_path / "agent.yaml"
    path.write_text(json.dumps(data))
    return load_config(path, environ or {})


def _errors(tmp_path: Any, data: dict[str, Any], environ: dict[str, str] | None = None) -> str:
    with pytest.raises(ConfigError) as exc:
        _load(tmp_path, data, environ)
    return str(exc.value)


def test_defaults_are_client_go_timings_and_the_host_name(tmp_path: Any) -> None:
    """Without ha: nothing is coordinated; the lease defaults are client-go's 15 s / 10 s / 2 s."""
    ha = _load(tmp_path, {}).ha
    assert ha.mode == "none" and not ha.enabled
    assert (ha.lease.lease_duration, ha.lease.renew_deadline, ha.lease.retry_period) == (15.0, 10.0, 2.0)
    assert ha.identity == socket.gethostname() and ha.replica == ha.identity
    assert ha.replica_labels() == {}


def test_identity_replica_and_namespace_from_the_environment(tmp_path: Any) -> None:
    """A StatefulSet pod name through the downward API names the replica (read by the config loader)."""
    ha = _load(tmp_path, {"ha": {"mode": "kubernetes", "identity_env": "POD_NAME", "replica_label": "ha_replica",
                                 "lease": {"namespace_env": "POD_NAMESPACE"}}},
               {"POD_NAME": "sre-agent-1", "POD_NAMESPACE": "monitoring"}).ha
    assert ha.identity == "sre-agent-1" and ha.lease.namespace == "monitoring"
    assert ha.replica_labels() == {"ha_replica": "sre-agent-1"}


def test_an_empty_replica_label_writes_identical_series(tmp_path: Any) -> None:
    """``replica_label: ""`` (a pair writing its recording rules back): no label tells the replicas apart,
    so both write the same series; a bad label name is still refused."""
    ha = _load(tmp_path, {"ha": {"mode": "kubernetes", "replica_label": "", "replica": "a"}}).ha
    assert ha.replica_labels() == {}
    assert "invalid label name" in _errors(tmp_path, {"ha": {"mode": "kubernetes", "replica_label": "0x"}})


def test_unset_environment_variable_is_named(tmp_path: Any) -> None:
    """An identity or replica that cannot be resolved stops start-up, naming the variable."""
    msg = _errors(tmp_path, {"ha": {"mode": "kubernetes", "replica_env": "REPLICA"}})
    assert "ha: replica_env: environment variable 'REPLICA' is not set" in msg


@pytest.mark.parametrize(("lease", "wanted"), [
    ({"lease_duration": "10s", "renew_deadline": "10s"}, "lease_duration must be longer than renew_deadline"),
    ({"renew_deadline": "2s", "retry_period": "2s"}, "renew_deadline must be longer than 1.2 x retry_period"),
    ({"retry_period": "500ms"}, "retry_period: whole seconds, at least 1s (got 500ms)"),
    ({"name": "Not_A_Name"}, "is not a Kubernetes object name"),
    ({"kubeconfig": "/nonexistent/kubeconfig"}, "kubeconfig: no such file '/nonexistent/kubeconfig'"),
])
def test_lease_timings_the_client_would_exit_on_are_refused(tmp_path: Any, lease: dict[str, str],
                                                            wanted: str) -> None:
    """The kubernetes client calls sys.exit on these; the config check says why first."""
    assert wanted in _errors(tmp_path, {"ha": {"mode": "kubernetes", "lease": lease}})


def test_alertmanager_only_refuses_direct_receivers_and_says_why(tmp_path: Any) -> None:
    """Slack and webhooks would be sent by both replicas: refused, naming them and the alternatives."""
    msg = _errors(tmp_path, {
        "ha": {"mode": "alertmanager_only"},
        "receivers": [{"name": "am", "alertmanager": {"urls": ["http://127.0.0.1:9093"]}},
                      {"name": "pager", "webhook": {"url": "http://127.0.0.1:9/hook"}}],
        "route": {"receiver": "am"},
    })
    assert "ha.mode alertmanager_only: receiver(s) pager (webhook) are sent by the agent itself" in msg
    assert "through Alertmanager" in msg and "ha.mode kubernetes" in msg


def test_alertmanager_only_allows_alertmanager_console_and_scaling(tmp_path: Any) -> None:
    """Alertmanager de-duplicates, console is the replica's own output, scale keys are deterministic."""
    cfg = _load(tmp_path, {
        "ha": {"mode": "alertmanager_only", "replica": "a"},
        "receivers": [{"name": "am", "alertmanager": {"urls": ["http://127.0.0.1:9093"]}},
                      {"name": "console", "console": {}}],
        "route": {"receiver": "am"},
        "scaling": {"services": [{"name": "vllm", "webhook": {"url": "http://127.0.0.1:9/scale"}}]},
    })
    assert cfg.ha.replica_labels() == {"replica": "a"}


def test_kubernetes_mode_allows_direct_receivers(tmp_path: Any) -> None:
    """With a Lease only the leader sends them; the margin defaults to evaluation + dispatch interval."""
    cfg = _load(tmp_path, {"ha": {"mode": "kubernetes"},
                           "receivers": [{"name": "pager", "webhook": {"url": "http://127.0.0.1:9/hook"}}],
                           "route": {"receiver": "pager"}})
    assert cfg.ha.margin_s(15, 1) == 16.0
