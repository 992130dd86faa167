"""deploy/systemd: the unit passes ``systemd-analyze verify`` (no unknown keys, no bad values), the
sysusers.d snippet parses, and the example config loads with its state under StateDirectory."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from agent.config import load_config

DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "systemd"
UNIT = DEPLOY / "sre-agent.service"
SYSUSERS = DEPLOY / "sre-agent.sysusers.conf"
CONFIG = DEPLOY / "agent.yaml"
TRUE = shutil.which("true") or "/bin/true"


def _directives(text: str) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line[0] in "#;[":
            continue
        key, _, value = line.partition("=")
        out.setdefault(key.strip(), []).append(value.strip())
    return out


def _verify(tmp_path: Path, text: str) -> tuple[int, list[str]]:
    """Run ``systemd-analyze verify`` on ``text`` with ExecStart pointed at an existing binary
    (the venv is not installed here); return its status and the lines that name the unit file."""
    if shutil.which("systemd-analyze") is None:
        pytest.skip("systemd-analyze is not installed")
    unit = tmp_path / "sre-agent.service"
    unit.write_text(re.sub(r"(?m)^ExecStart=\S+", f"ExecStart={TRUE}", text))
    try:
        proc = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True,
                              timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        pytest.skip(f"systemd-analyze cannot run here: {exc}")
    output = proc.stdout + proc.stderr
    if "Failed to initialize manager" in output or "Failed to create manager" in output:
        pytest.skip(f"systemd-analyze verify cannot run in this environment: {output.strip()[:300]}")
    return proc.returncode, [line for line in output.splitlines() if line.strip()]


def test_unit_verifies_clean(tmp_path):
    rc, lines = _verify(tmp_path, UNIT.read_text())
    assert rc == 0, lines
    assert lines == [], "systemd-analyze verify complained:\n" + "\n".join(lines)


@pytest.mark.parametrize("change", [
    ("Restart=on-failure", "Restart=sometimes"),             # a bad value
    ("NoNewPrivileges=yes", "NoNewPrivileges=yes\nProtectEverything=yes"),  # an unknown key
    ("LimitNOFILE=4096", "LimitNOFILE=lots"),
])
def test_verify_catches_mistakes(tmp_path, change):
    """The check above means something: systemd-analyze reports bad values and unknown keys
    (with status 0 in systemd 252, "ignoring"), and those lines fail it."""
    old, new = change
    text = UNIT.read_text()
    assert old in text
    _, lines = _verify(tmp_path, text.replace(old, new))
    assert any("sre-agent.service:" in line for line in lines), lines


def test_unit_settings():
    d = _directives(UNIT.read_text())
    exec_start = d["ExecStart"][0].split()
    assert exec_start[0] == "/opt/sre-agent/bin/sre-agent"
    assert exec_start[1:] == ["run", "--config", "/etc/sre-agent/agent.yaml"]
    assert d["User"] == ["sre-agent"]
    assert d["StateDirectory"] == ["sre-agent"]
    for key, value in {"ProtectSystem": "strict", "ProtectHome": "yes", "PrivateTmp": "yes",
                       "NoNewPrivileges": "yes", "Restart": "on-failure", "KillSignal": "SIGTERM",
                       "LimitNOFILE": "4096", "PrivateDevices": "no", "DevicePolicy": "closed"}.items():
        assert d.get(key) == [value], key
    assert "TimeoutStopSec" in d
    assert "char-nvidia-frontend rw" in d["DeviceAllow"]  # NVML: /dev/nvidiactl, /dev/nvidia0..N
    assert "/etc/sre-agent" in d["ReadOnlyPaths"][0].split()


def test_sysusers_snippet(tmp_path):
    if shutil.which("systemd-sysusers") is None:
        pytest.skip("systemd-sysusers is not installed")
    (tmp_path / "etc").mkdir()
    try:
        proc = subprocess.run(["systemd-sysusers", f"--root={tmp_path}", "--dry-run", str(SYSUSERS)],
                              capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        pytest.skip(f"systemd-sysusers cannot run here: {exc}")
    assert proc.returncode == 0, proc.stderr
    assert "Creating user 'sre-agent'" in proc.stdout + proc.stderr


def test_example_config_loads():
    config = load_config(CONFIG)
    assert Path(config.state.path).parent == Path("/var/lib/sre-agent")  # StateDirectory=sre-agent
    assert config.server.listen == "127.0.0.1:9400"
    assert config.rules.files == ["/etc/sre-agent/rules/*.rules.yaml"]  # ReadOnlyPaths=/etc/sre-agent
