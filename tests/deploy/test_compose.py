"""deploy/compose: the laptop stack, checked by the tools that will read it. Debian's
``docker-compose config`` validates and resolves compose.yaml (no daemon needed); the configs
it mounts load in their programs: the agent's in ``load_config`` and its route tree, Prometheus'
in ``promtool check config`` (with the bundled rules, as the container sees them), Alertmanager's
in ``amtool check-config``; and the wiring between them agrees (ports, service names, mounts).
Upstream images cannot be pulled in CI (Docker Hub is not reachable), so nothing is started."""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from agent.act.routing import Router
from agent.cli import _parser as cli_parser
from agent.config import load_config

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "deploy" / "compose"
SERVICES = {"simulator", "agent", "prometheus", "alertmanager", "grafana"}
DASHBOARD_UIDS = ("vllm-fleet", "vllm-replica", "lmdeploy", "gpu", "sre-agent")


def _raw() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((COMPOSE / "compose.yaml").read_text())
    return data


def _volumes(service: str) -> dict[str, str]:
    """Container path -> host path (resolved against compose.yaml's folder) or volume name."""
    out: dict[str, str] = {}
    for spec in _raw()["services"][service].get("volumes", []):
        src, dst = spec.split(":")[:2]
        out[dst] = str((COMPOSE / src).resolve()) if src.startswith(".") else src
    return out


def _simulator_args() -> argparse.Namespace:
    """The simulator service's command, parsed by the real ``sre-agent`` parser."""
    return cli_parser().parse_args(_raw()["services"]["simulator"]["command"])


def test_docker_compose_config_accepts_it() -> None:
    """docker-compose config validates the file, and it resolves to the five services: upstream
    images pinned to a version, the agent and simulator built from the repo's Dockerfile."""
    if shutil.which("docker-compose") is None:
        pytest.skip("docker-compose is not installed (Debian: apt-get install docker-compose)")
    res = subprocess.run(["docker-compose", "-f", str(COMPOSE / "compose.yaml"), "config"], capture_output=True,
                         text=True, timeout=60, check=False, cwd=ROOT)
    assert res.returncode == 0, res.stderr
    resolved = yaml.safe_load(res.stdout)
    services = resolved["services"]
    assert set(services) == SERVICES
    for name in ("agent", "simulator"):
        assert services[name]["build"] == {"context": str(ROOT), "dockerfile": "deploy/docker/Dockerfile"}
        assert services[name]["image"] == "sre-agent:local"
    for name in ("prometheus", "alertmanager", "grafana"):
        image, _, tag = services[name]["image"].partition(":")
        assert image.split("/")[0] in {"prom", "grafana"} and tag and tag != "latest", services[name]["image"]
    for name, svc in services.items():  # a laptop stack is not exposed beyond the laptop
        for port in svc.get("ports", []):
            assert str(port).startswith("127.0.0.1:"), (name, port)
    assert set(resolved["volumes"]) == {"agent-state", "prometheus-data", "grafana-data"}


def test_bind_mounts_exist_in_the_repo() -> None:
    """Every file or folder compose.yaml mounts from the repository is there (dashboards/ aside:
    the next test checks it)."""
    for service in SERVICES:
        for dst, src in _volumes(service).items():
            if src.startswith("/") and "/dashboards" not in src:
                assert Path(src).exists(), f"{service}: {src} (mounted at {dst}) does not exist"


def test_simulator_listens_on_every_interface_on_the_ports_the_others_use() -> None:
    """The simulator binds 0.0.0.0 (other containers reach it) with the replicas and control port
    that the agent's targets and scale webhook, Prometheus' http_sd and the published port name."""
    args = _simulator_args()
    assert args.command == "simulate" and args.host == "0.0.0.0"
    control = args.port - 1  # FleetConfig: control port = first replica port - 1
    ports = list(range(args.port, args.port + args.replicas + args.lmdeploy))
    config = load_config(COMPOSE / "agent.yaml")
    assert [(t.url, t.job) for t in config.targets] == (
        [(f"http://simulator:{p}/metrics", "vllm") for p in ports[:args.replicas]]
        + [(f"http://simulator:{p}/metrics", "lmdeploy") for p in ports[args.replicas:]])
    [svc] = config.scaling.services
    assert svc.webhook is not None and svc.webhook.url == f"http://simulator:{control}/scale"
    assert svc.initial_replicas == svc.min_replicas == args.replicas
    assert _raw()["services"]["simulator"]["ports"] == [f"127.0.0.1:{control}:{control}"]
    prom = yaml.safe_load((COMPOSE / "prometheus.yml").read_text())
    sd_urls = {sd["url"] for job in prom["scrape_configs"] for sd in job.get("http_sd_configs", [])}
    assert sd_urls == {f"http://simulator:{control}/targets"}


def test_agent_config_loads_and_routes_to_alertmanager() -> None:
    """The agent's compose config loads, its route tree is valid, every alert goes to the
    alertmanager service, and it listens where the HEALTHCHECK and Prometheus look."""
    config = load_config(COMPOSE / "agent.yaml")
    Router(config)  # the checks `sre-agent check` runs on the route tree
    assert config.route.receiver == "alertmanager"
    [receiver] = config.receivers
    assert receiver.alertmanager is not None and receiver.alertmanager.urls == ["http://alertmanager:9093"]
    assert "9093" in str(_raw()["services"]["alertmanager"]["ports"])
    assert config.server.listen == "0.0.0.0:9400"  # the image's HEALTHCHECK default asks 127.0.0.1:9400
    assert config.rules.files == ["/etc/sre-agent/rules/*.rules.yaml"]  # what the image copies
    assert config.state.path.startswith("/var/lib/sre-agent/")
    assert _volumes("agent") == {"/etc/sre-agent/agent.yaml": str(COMPOSE / "agent.yaml"),
                                 "/var/lib/sre-agent": "agent-state"}
    prom = yaml.safe_load((COMPOSE / "prometheus.yml").read_text())
    static = {job["job_name"]: job["static_configs"][0]["targets"] for job in prom["scrape_configs"]
              if "static_configs" in job}
    assert static["sre-agent"] == [f"agent:{config.server.port}"]


def test_prometheus_config_passes_promtool_with_the_rules(tmp_path: Path) -> None:
    """promtool check config accepts prometheus.yml and the bundled rules it loads, laid out as
    compose mounts them (the config at /etc/prometheus/prometheus.yml, rules/ beside it)."""
    if shutil.which("promtool") is None:
        pytest.skip("promtool is not installed (Debian: apt-get install prometheus)")
    mounts = _volumes("prometheus")
    assert mounts["/etc/prometheus/prometheus.yml"] == str(COMPOSE / "prometheus.yml")
    assert mounts["/etc/prometheus/rules"] == str(ROOT / "rules")
    shutil.copy(COMPOSE / "prometheus.yml", tmp_path / "prometheus.yml")
    (tmp_path / "rules").symlink_to(ROOT / "rules")
    res = subprocess.run(["promtool", "check", "config", "prometheus.yml"], capture_output=True, text=True,
                         timeout=60, check=False, cwd=tmp_path)
    out = res.stdout + res.stderr
    assert res.returncode == 0, out
    rule_files = sorted((ROOT / "rules").glob("*.rules.yaml"))
    assert rule_files
    for path in rule_files:  # promtool checked each one, so the glob reaches them
        assert f"rules/{path.name}" in out, out
    assert f"SUCCESS: {len(rule_files)} rule files found" in out, out
    assert "FAILED" not in out, out


def test_alertmanager_config_passes_amtool() -> None:
    """amtool check-config accepts alertmanager.yml, mounted where the command line reads it."""
    if shutil.which("amtool") is None:
        pytest.skip("amtool is not installed (Debian: apt-get install prometheus-alertmanager)")
    am = _raw()["services"]["alertmanager"]
    assert "--config.file=/etc/alertmanager/alertmanager.yml" in am["command"]
    assert _volumes("alertmanager")["/etc/alertmanager/alertmanager.yml"] == str(COMPOSE / "alertmanager.yml")
    res = subprocess.run(["amtool", "check-config", str(COMPOSE / "alertmanager.yml")], capture_output=True,
                         text=True, timeout=60, check=False)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "SUCCESS" in res.stdout


def test_prometheus_mounts_match_its_command_line() -> None:
    """Prometheus reads the mounted config and keeps its TSDB in the named volume."""
    prom = _raw()["services"]["prometheus"]
    assert "--config.file=/etc/prometheus/prometheus.yml" in prom["command"]
    assert "--storage.tsdb.path=/prometheus" in prom["command"]
    assert _volumes("prometheus")["/prometheus"] == "prometheus-data"


def test_grafana_provisioning_matches_the_mounts() -> None:
    """Grafana's provisioning (from dashboards/) names the prometheus service as its datasource and
    reads the dashboards from where compose mounts them; every dashboard and the home one exist."""
    dashboards = ROOT / "dashboards"
    if not (dashboards / "provisioning").is_dir():
        pytest.skip("dashboards/provisioning is not in this checkout (issue 11's dashboards part)")
    mounts = _volumes("grafana")
    assert mounts["/etc/grafana/provisioning"] == str(dashboards / "provisioning")
    assert mounts["/var/lib/grafana/dashboards"] == str(dashboards)
    datasources = [ds for f in sorted((dashboards / "provisioning" / "datasources").glob("*.y*ml"))
                   for ds in yaml.safe_load(f.read_text()).get("datasources", [])]
    prom = [ds for ds in datasources if ds.get("type") == "prometheus"]
    assert prom and prom[0]["uid"] == "prometheus", datasources
    url = urlsplit(prom[0]["url"])
    assert (url.hostname, url.port) == ("prometheus", 9090)
    assert "9090" in str(_raw()["services"]["prometheus"]["ports"])
    providers = [p for f in sorted((dashboards / "provisioning" / "dashboards").glob("*.y*ml"))
                 for p in yaml.safe_load(f.read_text()).get("providers", [])]
    assert any(p.get("type", "file") == "file" and p["options"]["path"] == "/var/lib/grafana/dashboards"
               for p in providers), providers
    for uid in DASHBOARD_UIDS:
        assert json.loads((dashboards / f"{uid}.json").read_text())["uid"] == uid
    home = _raw()["services"]["grafana"]["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert (dashboards / Path(home).relative_to("/var/lib/grafana/dashboards")).is_file()
