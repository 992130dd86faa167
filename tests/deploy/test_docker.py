"""deploy/docker: a static check of the Dockerfile (no image is built): non-root USER, HEALTHCHECK
on /healthz without curl, ENTRYPOINT/CMD, the copied config loads, and .dockerignore keeps the
virtual environment and .git out of the build context."""

from __future__ import annotations

import fnmatch
import json
from pathlib import Path

from agent.config import load_config

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "deploy" / "docker" / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"


def parse(text: str) -> list[tuple[str, str]]:
    """Instructions as (NAME, arguments): comments dropped, backslash continuations joined."""
    out: list[tuple[str, str]] = []
    buf = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not buf and (not line or line.startswith("#")):
            continue
        if buf and line.startswith("#"):
            continue
        if line.endswith("\\"):
            buf += line[:-1] + " "
            continue
        buf += line
        name, _, args = buf.strip().partition(" ")
        out.append((name.upper(), args.strip()))
        buf = ""
    assert not buf, f"unterminated continuation: {buf!r}"
    return out


INSTRUCTIONS = parse(DOCKERFILE.read_text())


def _all(name: str) -> list[str]:
    return [args for n, args in INSTRUCTIONS if n == name]


def _last(name: str) -> str:
    found = _all(name)
    assert found, f"no {name} instruction"
    return found[-1]


def _ignore_patterns() -> list[str]:
    return [line.strip() for line in DOCKERIGNORE.read_text().splitlines()
            if line.strip() and not line.startswith("#")]


def _ignored(path: str) -> bool:
    return any(fnmatch.fnmatch(path, p) or fnmatch.fnmatch(path, p.removeprefix("**/"))
               or path.startswith(p.rstrip("/") + "/") for p in _ignore_patterns())


def test_pip_build_arguments_stay_out_of_the_image():
    """PIP_INDEX_URL and PIP_EXTRA_CA are build arguments (no default, so unset unless given), used
    by the pip step only: no ENV names them and the temporary CA bundle is removed in that step."""
    args = _all("ARG")
    assert "PIP_INDEX_URL" in args and "PIP_EXTRA_CA" in args
    assert not any("PIP_" in e for e in " ".join(_all("ENV")).split())
    [pip] = [a for a in _all("RUN") if "pip install" in a]
    assert "PIP_EXTRA_CA" in pip and "export PIP_CERT=/tmp/pip-ca.pem" in pip
    assert pip.rstrip().endswith("rm -rf /src /tmp/pip-ca.pem")


def test_base_is_an_argument():
    assert INSTRUCTIONS[0] == ("ARG", "BASE=debian:bookworm-slim")
    assert _all("FROM") == ["${BASE}"]
    assert any("python3-venv" in args and "apt-get install" in args for args in _all("RUN"))
    assert any("python3 -m venv /opt/sre-agent" in args and "pip install" in args for args in _all("RUN"))


def test_runs_as_non_root():
    user = _last("USER").split(":")[0]
    assert user not in {"root", "0"}
    assert user == "10001"
    assert any("--uid 10001" in args for args in _all("RUN"))
    # USER comes after every RUN: nothing in the image runs as root at run time.
    names = [n for n, _ in INSTRUCTIONS]
    assert names.index("USER") > max(i for i, n in enumerate(names) if n == "RUN")


def test_healthcheck_uses_python_on_healthz():
    check = _last("HEALTHCHECK")
    assert "CMD" in check
    cmd = json.loads(check.split("CMD", 1)[1])
    assert cmd[0].endswith("/python")
    # the URL is an ENV default (9400, what EXPOSE and the default config use), overridable with -e
    assert "os.environ['SRE_AGENT_HEALTHCHECK_URL']" in cmd[-1]
    env = " ".join(_all("ENV")).split()
    assert "SRE_AGENT_HEALTHCHECK_URL=http://127.0.0.1:9400/healthz" in env
    assert "curl" not in check and "wget" not in check  # neither is in the slim image


def test_entrypoint_cmd_expose_env():
    assert json.loads(_last("ENTRYPOINT")) == ["/opt/sre-agent/bin/sre-agent"]
    assert json.loads(_last("CMD")) == ["run", "--config", "/etc/sre-agent/agent.yaml"]
    assert _all("EXPOSE") == ["9400"]
    env = " ".join(_all("ENV")).split()
    assert "NVIDIA_VISIBLE_DEVICES=all" in env
    assert "NVIDIA_DRIVER_CAPABILITIES=utility" in env


def _copies() -> dict[str, list[str]]:
    """Destination -> sources for every COPY."""
    out: dict[str, list[str]] = {}
    for args in _all("COPY"):
        parts = [p for p in args.split() if not p.startswith("--")]
        out[parts[-1]] = parts[:-1]
    return out


def test_copied_sources_exist_and_are_in_the_context():
    for sources in _copies().values():
        for src in sources:
            assert (ROOT / src).exists(), src
            assert not _ignored(src), f"{src} is copied but .dockerignore excludes it"


def test_default_config_loads():
    [src] = _copies()["/etc/sre-agent/agent.yaml"]
    config = load_config(ROOT / src)
    assert config.server.listen == "0.0.0.0:9400"  # reachable through -p 9400:9400
    assert config.server.port == 9400  # what HEALTHCHECK and EXPOSE use
    assert Path(config.state.path).parent == Path("/var/lib/sre-agent")  # the VOLUME
    assert "/var/lib/sre-agent" in _last("VOLUME")
    # the rules the config names are the ones the image copies
    assert _copies()["/etc/sre-agent/rules"] == ["rules"]
    assert config.rules.files == ["/etc/sre-agent/rules/*.rules.yaml"]
    assert list((ROOT / "rules").glob("*.rules.yaml"))


def test_dockerignore_excludes_local_state():
    patterns = _ignore_patterns()
    assert ".venv" in patterns
    assert ".git" in patterns
    for path in (".venv", ".git", "agent/__pycache__", "agent/x.pyc", "sre-agent.db", "x/sre-agent.db",
                 ".pytest_cache", "tests"):
        assert _ignored(path), path
