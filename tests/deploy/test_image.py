"""deploy/docker: the image built and run for real, as CI does it (issue 11).

One test does it all, so pytest-xdist gives it to one worker and nothing else here touches
Docker: reach a Docker daemon (or, as root, start ``dockerd --iptables=false --bridge=none``
on a private socket); make the base ``debian:bookworm-slim`` with debootstrap from the mirror
apt already uses and ``docker import`` it, unless the daemon has it (no registry but PyPI and
Debian's is reachable in CI); build the image with ``--network host`` so pip reaches PyPI; run
it with ``--network host`` against ``sre-agent simulate`` on 127.0.0.1; check the endpoints, the
user, the scrape, NVML's clean absence, the HEALTHCHECK and a clean stop; remove the container.
The timings and the image size are printed (``-n 0 -s``) and kept in ``image-report.json`` in
the test's tmp dir. Without docker, a daemon or debootstrap it skips and says which is missing,
with dockerd's own error when it cannot start.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.receivers import free_port

ROOT = Path(__file__).resolve().parents[2]
BASE = "debian:bookworm-slim"  # the Dockerfile's ARG BASE default
SUITE = "bookworm"
IMAGE = "sre-agent:image-test"  # kept between runs: the next build reuses its layers
UID = 10001  # the Dockerfile's USER
DEADLINE_S = 90.0  # for the running container to pass each check
_PEM = re.compile(r"-----BEGIN CERTIFICATE-----.+?-----END CERTIFICATE-----", re.S)


# -- pure helpers (tested below without Docker) ------------------------------------------------
def debian_mirror(sources: Iterable[tuple[str, str]], suite: str = SUITE) -> str | None:
    """The first apt source serving ``suite`` with ``main``, from (file name, text) pairs in
    one-line (``.list``) or deb822 (``.sources``) format: the mirror this machine already uses."""
    for name, text in sources:
        if name.endswith(".sources"):
            for stanza in re.split(r"\n\s*\n", text):
                fields: dict[str, str] = {}
                for line in stanza.splitlines():
                    key, sep, value = line.partition(":")
                    if sep and not line.startswith((" ", "\t", "#")):
                        fields[key.strip().lower()] = value.strip()
                if ("deb" in fields.get("types", "").split() and suite in fields.get("suites", "").split()
                        and "main" in fields.get("components", "").split() and fields.get("uris")):
                    return fields["uris"].split()[0]
        else:
            for line in text.splitlines():
                words = re.sub(r"\[[^]]*\]", " ", line.split("#", 1)[0]).split()
                if len(words) >= 4 and words[0] == "deb" and words[2] == suite and "main" in words[3:]:
                    return words[1]
    return None


def extra_ca_pem(bundles: Iterable[str], reference: str) -> str:
    """PEM certificates in ``bundles`` (what this machine trusts) that ``reference`` (pip's own
    bundle, what pip in the image trusts) lacks: a TLS-inspecting proxy's CA, say. Empty if none."""
    known = set(_PEM.findall(reference))
    out: list[str] = []
    for text in bundles:
        out.extend(c for c in _PEM.findall(text) if c not in known and c not in out)
    return "\n".join(out)


def test_debian_mirror_reads_both_source_formats() -> None:
    """The mirror is the first deb source of the suite with main, in .list and deb822 .sources."""
    deb822 = ("Types: deb\n# a comment\nURIs: http://cloud.example/apt\nSuites: cloud-sdk-bookworm\n"
              "Components: main\n\n"
              "Types: deb deb-src\nURIs: http://mirror.example/debian\nSuites: bookworm bookworm-updates\n"
              "Components: main contrib\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n")
    assert debian_mirror([("debian.sources", deb822)]) == "http://mirror.example/debian"
    one_line = ("# deb http://old.example/debian bookworm main\ndeb-src http://src.example/debian bookworm main\n"
                "deb [arch=amd64 signed-by=/k.gpg] http://one.example/debian bookworm main non-free\n")
    assert debian_mirror([("sources.list", one_line)]) == "http://one.example/debian"
    assert debian_mirror([("sources.list", "deb http://x.example/debian bullseye main\n")]) is None
    assert debian_mirror([("a.list", ""), ("b.sources", deb822)]) == "http://mirror.example/debian"


def test_extra_ca_pem_is_what_pip_lacks() -> None:
    """Only the certificates pip's bundle does not have are passed into the build, each once."""
    a, b, c = (f"-----BEGIN CERTIFICATE-----\n{x}\n-----END CERTIFICATE-----" for x in "ABC")
    assert extra_ca_pem([f"{a}\n{b}\n", f"{c}\n{b}"], reference=a) == f"{b}\n{c}"
    assert extra_ca_pem([a], reference=f"# Mozilla\n{a}\n") == ""


# -- Docker plumbing ---------------------------------------------------------------------------
class Docker:
    """The docker CLI with the environment that reaches the daemon."""

    def __init__(self, env: dict[str, str]) -> None:
        self.env = env

    def __call__(self, *args: str, timeout: float = 120, check: bool = True,
                 stdin: Any = None) -> subprocess.CompletedProcess[str]:
        res = subprocess.run(["docker", *args], env=self.env, capture_output=True, text=True, timeout=timeout,
                             check=False, stdin=stdin)
        if check and res.returncode != 0:
            pytest.fail(f"docker {' '.join(args[:3])} ... exited {res.returncode}:\n{_tail(res.stdout + res.stderr)}")
        return res

    def reachable(self) -> str:
        """'' if the daemon answers, else why not."""
        try:
            res = self("info", "--format", "{{.ServerVersion}}", timeout=20, check=False)
        except subprocess.TimeoutExpired:
            return "docker info timed out"
        return "" if res.returncode == 0 else (res.stderr.strip() or res.stdout.strip())


def _tail(text: str, lines: int = 25) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


@contextlib.contextmanager
def docker_daemon() -> Iterator[Docker]:
    """A Docker reaching a daemon: the one configured (DOCKER_HOST or the default socket), else,
    as root, a dockerd of our own on a private socket and data root, stopped afterwards."""
    if shutil.which("docker") is None:
        pytest.skip("docker is not installed (Debian: apt-get install docker.io)")
    docker = Docker(dict(os.environ))
    why = docker.reachable()
    if not why:
        yield docker
        return
    if shutil.which("dockerd") is None or os.geteuid() != 0:
        pytest.skip(f"no Docker daemon ({why}), and dockerd cannot be started here "
                    f"({'dockerd is not installed' if shutil.which('dockerd') is None else 'not root'})")
    tmp = Path(tempfile.mkdtemp(prefix="sre-dockerd-"))  # short: a unix socket path has 108 bytes
    sock, log_path = tmp / "docker.sock", tmp / "dockerd.log"
    with log_path.open("wb") as log_file:
        proc = subprocess.Popen(
            ["dockerd", "--iptables=false", "--bridge=none", f"--host=unix://{sock}", f"--data-root={tmp / 'root'}",
             f"--exec-root={tmp / 'exec'}", f"--pidfile={tmp / 'dockerd.pid'}"],
            stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True)
    docker = Docker({**os.environ, "DOCKER_HOST": f"unix://{sock}"})
    try:
        deadline = time.monotonic() + 60
        while why := docker.reachable():
            if proc.poll() is not None or time.monotonic() > deadline:
                state = f"exited {proc.returncode}" if proc.poll() is not None else "no answer in 60 s"
                pytest.skip(f"dockerd cannot start ({state}): {_tail(log_path.read_text(errors='replace'), 8)}")
            time.sleep(0.5)
        yield docker
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
        _unmount_under(tmp)  # dockerd leaves exec/netns/default mounted, and overlays if killed
        shutil.rmtree(tmp, ignore_errors=True)


def _unmount_under(folder: Path) -> None:
    """Lazily unmount everything mounted under ``folder``, deepest first."""
    prefix = f"{folder}/"
    points = [line.split()[1] for line in Path("/proc/self/mounts").read_text().splitlines()]
    for point in sorted((p for p in points if p.startswith(prefix)), key=len, reverse=True):
        subprocess.run(["umount", "--lazy", point], capture_output=True, timeout=30, check=False)


def ensure_base(docker: Docker, work: Path) -> float | None:
    """Make ``debian:bookworm-slim`` with debootstrap unless the daemon has it; seconds taken, or
    None when it was there already."""
    if docker("image", "inspect", BASE, check=False).returncode == 0:
        return None
    if shutil.which("debootstrap") is None or os.geteuid() != 0:
        pytest.skip(f"{BASE} is not in the daemon and debootstrap cannot make it "
                    f"({'not installed (apt-get install debootstrap)' if os.geteuid() == 0 else 'not root'})")
    apt = Path("/etc/apt")
    files = [apt / "sources.list", *sorted((apt / "sources.list.d").glob("*"))]
    mirror = debian_mirror((p.name, p.read_text(errors="replace")) for p in files if p.is_file())
    if mirror is None:
        pytest.skip(f"no Debian mirror serving {SUITE} main in /etc/apt/sources.list*: nothing to debootstrap from")
    t0 = time.monotonic()
    rootfs = work / "rootfs"
    res = subprocess.run(["debootstrap", "--variant=minbase", SUITE, str(rootfs), mirror],
                         capture_output=True, text=True, timeout=600, check=False)
    assert res.returncode == 0, f"debootstrap from {mirror} failed:\n{_tail(res.stdout + res.stderr)}"
    # what the Dockerfile's apt-get update fetches again, and the downloaded packages: ~80 MB
    for junk in ("var/cache/apt/archives", "var/lib/apt/lists"):
        for p in (rootfs / junk).glob("*"):
            if p.is_file():
                p.unlink()
    tar = subprocess.Popen(["tar", "-C", str(rootfs), "--numeric-owner", "-c", "."], stdout=subprocess.PIPE)
    docker("import", "--change", 'CMD ["bash"]', "-", BASE, stdin=tar.stdout, timeout=300)
    assert tar.wait(timeout=60) == 0
    shutil.rmtree(rootfs, ignore_errors=True)
    return time.monotonic() - t0


def pip_build_args() -> list[str]:
    """Build arguments pip in the image needs to reach the index this machine's pip reaches: a
    PyPI mirror named by PIP_INDEX_URL, and the CAs this machine trusts that pip's bundle lacks."""
    out: list[str] = []
    index = os.environ.get("PIP_INDEX_URL", "")
    if index.startswith(("http://", "https://")):  # a file:// index is not in the build
        out += ["--build-arg", f"PIP_INDEX_URL={index}"]
    try:
        from pip._vendor import certifi  # pip's bundle: what pip in the image trusts
    except ImportError:
        return out
    paths = {os.environ.get("PIP_CERT", ""), os.environ.get("SSL_CERT_FILE", ""),
             ssl.get_default_verify_paths().cafile or ""}
    bundles = [Path(p).read_text(errors="replace") for p in sorted(paths) if p and Path(p).is_file()]
    extra = extra_ca_pem(bundles, Path(certifi.where()).read_text())
    if extra:
        out += ["--build-arg", f"PIP_EXTRA_CA={extra}"]
    return out


@contextlib.contextmanager
def simulator() -> Iterator[list[str]]:
    """``sre-agent simulate`` on free 127.0.0.1 ports (2 vLLM, 1 LMDeploy); yields the /metrics URLs."""
    proc = subprocess.Popen([sys.executable, "-m", "agent", "simulate", "--port", "0", "--replicas", "2",
                             "--lmdeploy", "1", "--log-level", "warning"], stdout=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        assert proc.stdout is not None
        yield [proc.stdout.readline().strip() for _ in range(3)]
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=20)


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(errors="replace")
    except OSError as exc:
        return 0, str(exc)


def wait_for(what: str, probe: Callable[[], Any], logs: Callable[[], str], timeout: float = DEADLINE_S) -> Any:
    """``probe()`` until it returns something truthy, or fail naming ``what`` with the container's log."""
    deadline = time.monotonic() + timeout
    while True:
        got = probe()
        if got:
            return got
        if time.monotonic() > deadline:
            pytest.fail(f"{what}: not within {timeout:.0f} s (last: {got!r})\ncontainer log:\n{_tail(logs())}")
        time.sleep(0.5)


# -- the test ----------------------------------------------------------------------------------
def test_image_builds_runs_non_root_and_scrapes_the_simulator(tmp_path: Path) -> None:
    """The image builds from the repo's Dockerfile, and a container of it on the host network
    answers /healthz and /readyz, runs as uid 10001, scrapes every simulated replica, says NVML
    is unavailable without crashing, turns healthy by its own HEALTHCHECK and stops cleanly."""
    report: dict[str, Any] = {}
    with docker_daemon() as docker:
        base_s = ensure_base(docker, tmp_path)
        report["base_debootstrap_import_s"] = None if base_s is None else round(base_s, 1)

        t0 = time.monotonic()
        docker("build", "--network", "host", "-f", "deploy/docker/Dockerfile", "-t", IMAGE, *pip_build_args(),
               str(ROOT), timeout=900)
        report["build_s"] = round(time.monotonic() - t0, 1)
        size = int(docker("image", "inspect", "--format", "{{.Size}}", IMAGE).stdout)
        report["image_bytes"], report["image_mb"] = size, round(size / 1e6, 1)

        t0 = time.monotonic()
        with simulator() as urls:
            assert all(u.startswith("http://127.0.0.1:") for u in urls), urls
            port = free_port()
            config = tmp_path / "agent.yaml"
            config.write_text(json.dumps({
                "targets": [{"url": urls[0], "job": "vllm"}, {"url": urls[1], "job": "vllm"},
                            {"url": urls[2], "job": "lmdeploy"}],
                "scrape": {"interval": "1s", "timeout": "1s"},
                "nvml": {"enabled": "auto"},
                "server": {"listen": f"127.0.0.1:{port}"},
                "rules": {"files": ["/etc/sre-agent/rules/*.rules.yaml"], "evaluation_interval": "1s"},
                "state": {"path": "/var/lib/sre-agent/sre-agent.db"},
                "log": {"format": "json", "level": "info"},
            }))
            config.chmod(0o644)  # read by uid 10001 through the bind mount
            name = f"sre-agent-image-test-{os.getpid()}"
            base = f"http://127.0.0.1:{port}"
            docker("run", "-d", "--name", name, "--network", "host",
                   "-e", f"SRE_AGENT_HEALTHCHECK_URL={base}/healthz",  # the image's HEALTHCHECK, on this port
                   "--health-interval", "2s", "--health-start-period", "5s",  # the image's 30 s, shortened
                   "-v", f"{config}:/etc/sre-agent/agent.yaml:ro", IMAGE)
            try:
                def logs() -> str:
                    res = docker("logs", name, check=False)
                    return res.stdout + res.stderr

                def inspect() -> dict[str, Any]:
                    found: list[dict[str, Any]] = json.loads(docker("inspect", name).stdout)
                    return found[0]

                wait_for("/healthz answers 200", lambda: _get(f"{base}/healthz")[0] == 200, logs)
                wait_for("/readyz answers 200", lambda: _get(f"{base}/readyz")[0] == 200, logs)

                uid = docker("exec", name, "cat", "/proc/1/status").stdout
                assert re.search(rf"^Uid:\s+{UID}\s+{UID}\s+{UID}\s+{UID}$", uid, re.M), uid  # the agent, PID 1
                assert inspect()["Config"]["User"] == f"{UID}:{UID}"

                def targets_up() -> bool:
                    code, body = _get(f"{base}/api/v1/targets")
                    targets = json.loads(body)["data"]["targets"] if code == 200 else []
                    return len(targets) == 3 and all(t["health"] == "up" for t in targets)

                wait_for("all 3 simulated replicas scraped (/api/v1/targets health up)", targets_up, logs)
                metrics = _get(f"{base}/metrics")[1]
                up_line = r'^sre_agent_target_up\{(?=[^}]*instance="127\.0\.0\.1:\d+")[^}]*job="(\w+)"[^}]*\} 1\.0$'
                up = re.findall(up_line, metrics, re.M)
                assert sorted(up) == ["lmdeploy", "vllm", "vllm"], metrics[:2000]

                def nvml_reported() -> dict[str, Any] | None:
                    code, body = _get(f"{base}/api/v1/status")
                    nvml: dict[str, Any] = json.loads(body)["data"]["nvml"] if code == 200 else {}
                    return nvml if nvml.get("reason") not in (None, "", "not started") else None

                nvml = wait_for("NVML's state in /api/v1/status", nvml_reported, logs)
                assert nvml["enabled"] is True and nvml["available"] is False, nvml
                assert re.search(r"^sre_agent_nvml_up 0\.0$", _get(f"{base}/metrics")[1], re.M)
                text = logs()
                assert '"nvml_unavailable"' in text, _tail(text)
                assert "Traceback" not in text, _tail(text, 60)
                report["nvml_reason"] = nvml["reason"]

                wait_for("HEALTHCHECK reports healthy", lambda: inspect()["State"]["Health"]["Status"] == "healthy",
                         logs)
                state = inspect()["State"]
                assert state["Running"] and inspect()["RestartCount"] == 0, state

                docker("stop", "--time", "20", name, timeout=60)  # SIGTERM (STOPSIGNAL)
                state = inspect()["State"]
                assert state["ExitCode"] == 0, f"{state}\n{_tail(logs())}"
            finally:
                docker("rm", "--force", "--volumes", name, check=False)
        report["run_and_checks_s"] = round(time.monotonic() - t0, 1)

    (tmp_path / "image-report.json").write_text(json.dumps(report, indent=2))
    print(f"\nimage test: {json.dumps(report)}")
