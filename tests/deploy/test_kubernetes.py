"""deploy/kubernetes: the Kustomize base and overlays build, and what they ship is valid.

Needs ``kubectl`` (``kubectl kustomize``) and, for one check, ``promtool``; each test skips
with the reason when its tool is absent.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from agent.cli import main
from agent.config import load_config

ROOT = Path(__file__).resolve().parents[2]
KUSTOMIZE = ROOT / "deploy" / "kubernetes"
PROMETHEUSRULE = KUSTOMIZE / "monitoring" / "prometheusrule.yaml"

BASE_KINDS = {"ServiceAccount", "ConfigMap", "Secret", "Deployment", "Service", "PodDisruptionBudget"}
EXPECTED_KINDS = {
    "base": BASE_KINDS,
    "node-agent": BASE_KINDS | {"DaemonSet"},
    "monitoring": BASE_KINDS | {"ServiceMonitor", "PrometheusRule"},
}

needs_kubectl = pytest.mark.skipif(shutil.which("kubectl") is None,
                                   reason="kubectl not installed: cannot run `kubectl kustomize`")


def _build(overlay: str) -> list[dict[str, Any]]:
    kubectl = shutil.which("kubectl")
    assert kubectl is not None
    proc = subprocess.run([kubectl, "kustomize", str(KUSTOMIZE / overlay)],
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    return [d for d in yaml.safe_load_all(proc.stdout) if d is not None]


def _one(docs: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    found = [d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]


@needs_kubectl
@pytest.mark.parametrize("overlay", sorted(EXPECTED_KINDS))
def test_kustomize_builds_with_expected_kinds(overlay: str) -> None:
    docs = _build(overlay)
    assert {d["kind"] for d in docs} == EXPECTED_KINDS[overlay]
    for d in docs:
        assert d["metadata"]["name"]


@needs_kubectl
def test_no_rbac_and_no_api_token() -> None:
    docs = _build("node-agent")
    assert not [d for d in docs if d["kind"] in {"Role", "ClusterRole", "RoleBinding", "ClusterRoleBinding"}]
    assert _one(docs, "ServiceAccount")["automountServiceAccountToken"] is False
    for kind in ("Deployment", "DaemonSet"):
        assert _one(docs, kind)["spec"]["template"]["spec"]["automountServiceAccountToken"] is False


def test_prometheusrule_is_fresh(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["rules", "export", "--format", "prometheusrule"]) == 0
    fresh = capsys.readouterr().out
    committed = "".join(line for line in PROMETHEUSRULE.read_text().splitlines(keepends=True)
                        if not line.startswith("#"))
    assert committed == fresh, ("deploy/kubernetes/monitoring/prometheusrule.yaml is stale: regenerate it with "
                                "`sre-agent rules export --format prometheusrule` (see its header)")


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed")
def test_prometheusrule_passes_promtool(tmp_path: Path) -> None:
    obj = yaml.safe_load(PROMETHEUSRULE.read_text())
    assert obj["apiVersion"] == "monitoring.coreos.com/v1" and obj["kind"] == "PrometheusRule"
    rule_file = tmp_path / "rules.yaml"
    rule_file.write_text(yaml.safe_dump({"groups": obj["spec"]["groups"]}, sort_keys=False))
    promtool = shutil.which("promtool")
    assert promtool is not None
    proc = subprocess.run([promtool, "check", "rules", str(rule_file)],
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def _config_with_token(docs: list[dict[str, Any]], configmap: str, tmp_path: Path) -> Any:
    """The ConfigMap's agent.yaml through the agent's own validation, the token file faked in tmp
    with the Secret's (placeholder) value."""
    data = yaml.safe_load(_one(docs, "ConfigMap", configmap)["data"]["agent.yaml"])
    secret = _one(docs, "Secret", "sre-agent-token")
    token_path = data["server"]["auth"]["bearer_token_file"]
    assert token_path.startswith("/etc/sre-agent/token/")
    token = tmp_path / "token"
    token.write_text(secret["stringData"][Path(token_path).name] + "\n")
    data["server"]["auth"]["bearer_token_file"] = str(token)
    path = tmp_path / "agent.yaml"
    path.write_text(yaml.safe_dump(data))
    return load_config(path, environ={})


@needs_kubectl
@pytest.mark.parametrize(("overlay", "configmap"), [("base", "sre-agent-config"),
                                                    ("node-agent", "sre-agent-node-config")])
def test_configmap_is_a_valid_agent_config(overlay: str, configmap: str, tmp_path: Path) -> None:
    docs = _build(overlay)
    cfg = _config_with_token(docs, configmap, tmp_path)
    assert cfg.server.listen == "0.0.0.0:9400"
    assert cfg.server.auth.bearer_token is not None
    assert cfg.state.path.startswith("/var/lib/sre-agent/")
    kind = "Deployment" if overlay == "base" else "DaemonSet"
    container = _one(docs, kind)["spec"]["template"]["spec"]["containers"][0]
    mounts = {m["mountPath"] for m in container["volumeMounts"]}
    assert "/var/lib/sre-agent" in mounts and "/etc/sre-agent/token" in mounts
    assert container["args"] == ["run", "--config", "/etc/sre-agent/agent.yaml"]


@needs_kubectl
@pytest.mark.parametrize(("overlay", "kind"), [("base", "Deployment"), ("node-agent", "DaemonSet")])
def test_security_context(overlay: str, kind: str) -> None:
    spec = _one(_build(overlay), kind)["spec"]["template"]["spec"]
    for c in spec["containers"]:
        sc = {**spec.get("securityContext", {}), **c["securityContext"]}
        assert sc["runAsNonRoot"] is True
        assert sc["runAsUser"] == 10001
        assert c["securityContext"]["readOnlyRootFilesystem"] is True
        assert c["securityContext"]["allowPrivilegeEscalation"] is False
        assert c["securityContext"]["capabilities"]["drop"] == ["ALL"]
        assert sc["seccompProfile"]["type"] == "RuntimeDefault"
        assert "privileged" not in c["securityContext"]
        assert {p["name"]: p["containerPort"] for p in c["ports"]} == {"http": 9400}


@needs_kubectl
def test_node_agent_scheduling_and_mounts() -> None:
    spec = _one(_build("node-agent"), "DaemonSet")["spec"]["template"]["spec"]
    assert spec["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in spec["tolerations"]
    c = spec["containers"][0]
    assert {e["name"]: e["value"] for e in c["env"]} == {"NVIDIA_VISIBLE_DEVICES": "all",
                                                        "NVIDIA_DRIVER_CAPABILITIES": "utility"}
    logs = next(m for m in c["volumeMounts"] if m["mountPath"] == "/var/log/pods")
    assert logs["readOnly"] is True
    vol = next(v for v in spec["volumes"] if v["name"] == logs["name"])
    assert vol["hostPath"]["path"] == "/var/log/pods"
    assert "resources" in c and "nvidia.com/gpu" not in c["resources"].get("limits", {})
