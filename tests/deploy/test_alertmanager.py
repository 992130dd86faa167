"""deploy/alertmanager: the example Alertmanager config that sends alerts to the agent's intake passes
``amtool check-config`` and points at the endpoint the agent serves, with its bearer token and resolves."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any, cast

import pytest
import yaml

from agent.app.server import build_app

CONFIG = Path(__file__).resolve().parents[2] / "deploy" / "alertmanager" / "alertmanager.yml"


@pytest.mark.skipif(shutil.which("amtool") is None,
                    reason="amtool not installed (apt-get install prometheus-alertmanager)")
def test_example_passes_amtool() -> None:
    """``amtool check-config`` accepts the example (Alertmanager 0.25's own config loader)."""
    amtool = shutil.which("amtool")
    assert amtool is not None
    done = subprocess.run([amtool, "check-config", str(CONFIG)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


def test_example_points_at_the_intake_with_the_token_and_resolves() -> None:
    """The sre-agent receiver posts to a path the agent serves, sends resolved alerts and a bearer token file."""
    data = yaml.safe_load(CONFIG.read_text())
    [receiver] = [r for r in data["receivers"] if r["name"] == "sre-agent"]
    [hook] = receiver["webhook_configs"]
    path = "/" + hook["url"].split("/", 3)[3]
    app = build_app(cast(Any, None))  # the handlers are not called: only the routing table is read
    assert ("POST", path) in {(r.method, r.resource.canonical) for r in app.router.routes() if r.resource}
    assert hook["send_resolved"] is True
    assert hook["http_config"]["authorization"]["type"] == "Bearer"
    assert hook["http_config"]["authorization"]["credentials_file"]
