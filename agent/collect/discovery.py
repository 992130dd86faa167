"""Which targets to scrape: static targets from the config plus Prometheus ``file_sd`` files.

A ``file_sd`` file is the format Prometheus reads (JSON, or YAML by extension)::

    [{"targets": ["10.0.0.5:8000", "10.0.0.6:8000"], "labels": {"model": "llama-3-8b"}}]

with the special labels ``__scheme__`` (default ``http``) and ``__metrics_path__``
(default ``/metrics``). Files are re-read when their modification time changes or
``refresh_interval`` has passed. A file that fails to parse keeps the targets it gave
last time (Prometheus does the same), and the error is reported, so a half-written
file never empties the fleet.
"""

from __future__ import annotations

import glob
import hashlib
import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import structlog
import yaml
from pydantic import SecretStr

from agent.config import BasicAuthConfig, Config, FileSDConfig, TargetConfig
from agent.errors import ConfigError
from agent.gocompat import yamlv3
from agent.series import labels_get

__all__ = ["FileSD", "TargetSpec", "all_targets", "expand_globs", "hashmod", "instance_of", "parse_file_sd",
           "static_targets"]

log = structlog.get_logger(__name__)


@dataclass(frozen=True, slots=True)
class TargetSpec:
    """What to scrape and the labels every scraped series gets."""

    url: str
    labels: tuple[tuple[str, str], ...]  # sorted, includes job and instance
    bearer_token: SecretStr | None = field(default=None, compare=False)
    basic_auth: BasicAuthConfig | None = field(default=None, compare=False)
    source: str = "static"

    @property
    def job(self) -> str:
        return labels_get(self.labels, "job")

    @property
    def instance(self) -> str:
        return labels_get(self.labels, "instance")


def expand_globs(patterns: Iterable[str]) -> list[str]:
    """Each pattern's matches, sorted; a pattern without glob characters that matches
    nothing is kept as it is, so whoever opens it reports the missing file by name."""
    out: list[str] = []
    for pattern in patterns:
        out.extend(sorted(glob.glob(pattern)) or ([] if glob.has_magic(pattern) else [pattern]))
    return out


def instance_of(url: str) -> str:
    """``host:port`` of a URL, adding the scheme's default port like Prometheus 2.x."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if ":" in host:  # IPv6
        host = f"[{host}]"
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return f"{host}:{port}"


def _spec(url: str, job: str, extra: dict[str, str], auth: TargetConfig | FileSDConfig | None,
          source: str) -> TargetSpec:
    labels = {"job": job, "instance": instance_of(url), **extra}
    return TargetSpec(url=url, labels=tuple(sorted(labels.items())), source=source,
                      bearer_token=auth.bearer_token if auth else None, basic_auth=auth.basic_auth if auth else None)


def static_targets(targets: list[TargetConfig]) -> list[TargetSpec]:
    return [_spec(t.url, t.job, dict(t.labels), t, "static") for t in targets]


@dataclass
class _FileState:
    mtime: float = -1.0
    specs: list[TargetSpec] = field(default_factory=list)
    error: str = ""


class FileSD:
    """Targets from ``file_sd`` files; call :meth:`refresh` each scrape cycle (cheap)."""

    def __init__(self, configs: list[FileSDConfig], clock: Callable[[], float]) -> None:
        self._configs = configs
        self._clock = clock
        self._files: dict[tuple[int, str], _FileState] = {}
        self._last_full: list[float] = [float("-inf")] * len(configs)

    def refresh(self) -> list[TargetSpec]:
        now = self._clock()
        seen: set[tuple[int, str]] = set()
        for i, cfg in enumerate(self._configs):
            force = now - self._last_full[i] >= cfg.refresh_interval
            if force:
                self._last_full[i] = now
            for path in expand_globs(cfg.files):
                key = (i, path)
                seen.add(key)
                self._load(key, cfg, Path(path), force)
        for key in set(self._files) - seen:  # a file that was deleted takes its targets with it
            log.info("file_sd file gone; dropping its targets", path=key[1])
            del self._files[key]
        return [s for st in self._files.values() for s in st.specs]

    def errors(self) -> dict[str, str]:
        # refresh() runs on a worker thread (the daemon keeps file reads and YAML parsing off its event
        # loop); list() copies the items in one step, so a refresh that adds or drops a file meanwhile
        # cannot break this iteration.
        return {path: st.error for (_, path), st in list(self._files.items()) if st.error}

    def _load(self, key: tuple[int, str], cfg: FileSDConfig, path: Path, force: bool) -> None:
        st = self._files.setdefault(key, _FileState())
        try:
            mtime = path.stat().st_mtime
        except OSError as exc:
            self._fail(st, path, f"cannot stat: {exc.strerror}")
            return
        if mtime == st.mtime and not force:
            return
        try:
            st.specs = parse_file_sd(path, cfg.job, cfg)
        except ConfigError as exc:
            self._fail(st, path, str(exc))
            return
        st.mtime, st.error = mtime, ""
        log.info("file_sd loaded", path=str(path), targets=len(st.specs))

    @staticmethod
    def _fail(st: _FileState, path: Path, error: str) -> None:
        if error != st.error:
            log.error("file_sd file unusable; keeping its previous targets", path=str(path), error=error,
                      kept=len(st.specs))
        st.error = error


def parse_file_sd(path: Path, job: str, auth: FileSDConfig | None = None) -> list[TargetSpec]:
    """Parse one ``file_sd`` file; raises :class:`ConfigError` naming the entry. ``auth``: the
    ``file_sd`` entry whose ``bearer_token``/``basic_auth`` its targets use."""
    try:
        raw = yamlv3.read_capped(path)  # a file_sd file gets the same size cap, JSON or YAML
        data: Any = json.loads(raw) if path.suffix == ".json" else yamlv3.load(raw)
    except (OSError, ValueError, RecursionError, yaml.YAMLError) as exc:  # RecursionError: deep JSON
        raise ConfigError(f"{path}: cannot parse: {exc}") from exc
    if data is None:
        return []
    if not isinstance(data, list):
        raise ConfigError(f"{path}: expected a list of target groups")
    specs = []
    for i, group in enumerate(data):
        if not isinstance(group, dict) or not isinstance(group.get("targets", []), list):
            raise ConfigError(f"{path}: [{i}]: expected {{targets: [...], labels: {{...}}}}")
        labels = group.get("labels") or {}
        if not isinstance(labels, dict) or not all(isinstance(v, str) for v in labels.values()):
            raise ConfigError(f"{path}: [{i}].labels: expected a mapping of strings")
        scheme = labels.pop("__scheme__", "http")
        mpath = labels.pop("__metrics_path__", "/metrics")
        group_job = labels.pop("job", job)
        public = {k: v for k, v in labels.items() if not k.startswith("__")}
        for j, addr in enumerate(group["targets"]):
            if isinstance(addr, str) and "@" in addr:  # checked first: the messages below quote the address
                raise ConfigError(f"{path}: [{i}].targets[{j}]: credentials in a target address are refused; "
                                  "remove them and give the file_sd entry basic_auth: {username: ..., "
                                  "password_file: ...} (or password_env)")
            if not isinstance(addr, str) or not addr or "/" in addr:
                raise ConfigError(f"{path}: [{i}].targets[{j}]: expected host:port, got {yamlv3.brief(addr)}")
            url = f"{scheme}://{addr}{mpath}"
            try:
                TargetConfig(url=url, labels=public)
            except ValueError as exc:
                raise ConfigError(f"{path}: [{i}].targets[{j}]: {exc}") from exc
            specs.append(_spec(url, group_job, public, auth, f"file_sd:{path}"))
    return specs


def hashmod(value: str, modulus: int) -> int:
    """Prometheus' ``hashmod`` relabel action: the md5 of ``value``, its last 8 bytes as a big-endian
    integer, modulo ``modulus``, so the agent's shards and a Prometheus' split a fleet identically."""
    digest = hashlib.md5(value.encode(), usedforsecurity=False).digest()
    return int.from_bytes(digest[8:], "big") % modulus


def all_targets(
    config: Config, file_sd: FileSD | None, *, static: list[TargetSpec] | None = None
) -> list[TargetSpec]:
    """Static targets then discovered ones; the first spec for a URL wins.

    ``static``: ``static_targets(config.targets)`` built already; the config is frozen, so a
    caller that runs every scrape cycle builds it once and passes it here.
    """
    out: dict[str, TargetSpec] = {}
    if static is None:
        static = static_targets(config.targets)
    for spec in static + (file_sd.refresh() if file_sd else []):
        out.setdefault(spec.url, spec)
    shards = config.scrape.shards
    if shards is None:
        return list(out.values())
    # Prometheus hashes __address__ as discovered, before it adds a default port: the URL's host[:port]
    return [spec for url, spec in out.items() if hashmod(urlsplit(url).netloc, shards.total) == shards.index]
