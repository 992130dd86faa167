"""Which targets to scrape: static targets from the config plus Prometheus ``file_sd`` files.

A ``file_sd`` file is the format Prometheus reads (JSON, or YAML by extension)::

    [{"targets": ["10.0.0.5:8000", "10.0.0.6:8000"], "labels": {"model": "llama-3-8b"}}]

with the special labels ``__scheme__`` (default ``http``) and ``__metrics_path__``
(default ``/metrics``). Files are re-read when their modification time changes or
``refresh_interval`` has passed. A file that fails to parse keeps the targets it gave
last time (Prometheus does the same), and the error is reported, so a half-written
file never empties the fleet.

A file is written by another program (a deploy script, a sidecar) and re-read inside the
running daemon, so whatever it holds is *that file's* refusal, never an exception out of
:meth:`FileSD.refresh`: the scrape cycle goes on with the other files and this file's last
good targets, the refusal is logged, counted (:attr:`FileSD.read_errors`, exported as
``sre_agent_file_sd_read_errors_total``) and shown on ``/api/v1/status``. Refused as
Prometheus' ``targetgroup.Group`` refuses them: a top level that is not a list, a group
that is not ``{targets, labels}``, a label name that is not a string or not a valid
Prometheus label name, a label value or target that is not a string. Also refused: text
that is not UTF-8 (a JSON ``"\\ud800"``), a target with blanks or control characters, a
file that is not a regular file (a FIFO would block the reading thread for good), and a
file that expands, through YAML aliases, to more than :data:`MAX_TARGETS` targets or
:data:`MAX_TARGET_LABELS` target labels (the YAML reader's own budgets bound what is
composed; these bound what is built from it, a second a file at worst).

Label values that are YAML numbers (``gpu: 0``) are refused, like JSON numbers: Prometheus'
YAML reader would turn them into text, but a value that is a number here is more often a
mistake than a label, and quoting it costs two characters.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import re
import stat
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import structlog
import yaml
from pydantic import SecretStr

from agent.config import BasicAuthConfig, Config, FileSDConfig, TargetConfig, check_target_url
from agent.errors import ConfigError
from agent.gocompat import yamlv3
from agent.series import labels_get

__all__ = ["MAX_TARGETS", "MAX_TARGET_LABELS", "FileSD", "TargetSpec", "all_targets", "expand_globs", "hashmod",
           "instance_of", "parse_file_sd", "static_targets"]

log = structlog.get_logger(__name__)

#: Most targets one file may give. A real file_sd file lists up to some thousands; YAML aliases can make
#: a 4 MiB file list a million, which would take a minute and gigabytes to build.
MAX_TARGETS = 50_000
#: Most labels (``job`` and ``instance`` included) over all the targets of one file: 10,000 targets
#: with 100 labels each.
MAX_TARGET_LABELS = 1_000_000
#: A Prometheus label name (``model.LabelName.IsValid``); matched whole (``fullmatch``: ``$`` alone would
#: let a trailing newline through). Internal syntax, so Python's ``re``.
_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
#: What a target address may not contain: blanks, control characters, and "/" (a path is ``__metrics_path__``).
_BAD_ADDRESS = re.compile(r"[\x00-\x20\x7f/]")


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
    """Targets from ``file_sd`` files; call :meth:`refresh` each scrape cycle (cheap), off the event loop.

    ``read_errors`` counts the reads that were refused (a file refused at each re-read counts each time);
    ``failing_files`` is how many files are refused now."""

    def __init__(self, configs: list[FileSDConfig], clock: Callable[[], float]) -> None:
        self._configs = configs
        self._clock = clock
        self._files: dict[tuple[int, str], _FileState] = {}
        self._last_full: list[float] = [float("-inf")] * len(configs)
        self.read_errors = 0

    @property
    def failing_files(self) -> int:
        return sum(1 for st in list(self._files.values()) if st.error)

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
            specs = parse_file_sd(path, cfg.job, cfg)
        except ConfigError as exc:
            self._fail(st, path, str(exc))
            return
        except Exception as exc:  # one file's surprise must not stop every scrape cycle
            log.exception("file_sd file refused by an unexpected error", path=str(path))
            self._fail(st, path, f"{path}: cannot use: {type(exc).__name__}: {yamlv3.brief(str(exc))}")
            return
        st.specs, st.mtime, st.error = specs, mtime, ""
        log.info("file_sd loaded", path=str(path), targets=len(st.specs))

    def _fail(self, st: _FileState, path: Path, error: str) -> None:
        self.read_errors += 1
        if error != st.error:
            log.error("file_sd file unusable; keeping its previous targets", path=str(path), error=error,
                      kept=len(st.specs))
        st.error = error


def _read_regular(path: Path) -> bytes:
    """The file's bytes, at most :data:`yamlv3.MAX_BYTES`; a FIFO, device or directory is refused without
    blocking (opened non-blocking, checked with ``fstat`` on the open file, so a swap in between is caught)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ConfigError(f"{path}: not a regular file")
        data = f.read(yamlv3.MAX_BYTES + 1)
    if len(data) > yamlv3.MAX_BYTES:
        raise yaml.YAMLError(f"file is over the {yamlv3.MAX_BYTES:,}-byte limit")
    return data


def _utf8(text: str) -> bool:
    """Whether ``text`` is valid UTF-8 text (JSON's ``\\ud800`` escapes give lone surrogates, which are not)."""
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


def _group_labels(where: str, labels: object) -> dict[str, str]:
    """A group's ``labels``, checked as Prometheus' ``model.LabelSet`` checks them."""
    if labels is None:
        return {}
    if not isinstance(labels, dict):
        raise ConfigError(f"{where}: expected a mapping of label names to values, got {yamlv3.brief(labels)}")
    out: dict[str, str] = {}
    for name, value in labels.items():
        if not isinstance(name, str):
            raise ConfigError(f"{where}: label names must be strings, got {yamlv3.brief(name)}")
        if not _LABEL_NAME.fullmatch(name):
            raise ConfigError(f"{where}: {yamlv3.brief(name)} is not a valid label name")
        if not isinstance(value, str):
            raise ConfigError(f"{where}.{name}: label values must be strings, got {yamlv3.brief(value)}")
        if not _utf8(value):
            raise ConfigError(f"{where}.{name}: label value is not valid UTF-8")
        out[name] = value
    return out


def parse_file_sd(path: Path, job: str, auth: FileSDConfig | None = None) -> list[TargetSpec]:
    """Parse one ``file_sd`` file; raises :class:`ConfigError` naming the entry. ``auth``: the
    ``file_sd`` entry whose ``bearer_token``/``basic_auth`` its targets use."""
    try:
        raw = _read_regular(path)  # a file_sd file gets the same size cap, JSON or YAML
        data: Any = json.loads(raw) if path.suffix == ".json" else yamlv3.load(raw)
    except (OSError, ValueError, RecursionError, yaml.YAMLError) as exc:  # RecursionError: deep JSON
        raise ConfigError(f"{path}: cannot parse: {exc}") from exc
    if data is None:
        return []
    if not isinstance(data, list):
        raise ConfigError(f"{path}: expected a list of target groups, got {yamlv3.brief(data)}")
    groups: list[tuple[list[Any], dict[str, str]]] = []
    targets = target_labels = 0
    for i, group in enumerate(data):
        addrs = group.get("targets", []) if isinstance(group, dict) else None
        if not isinstance(group, dict) or not isinstance(addrs, list | None):
            raise ConfigError(f"{path}: [{i}]: expected {{targets: [...], labels: {{...}}}}")
        labels = _group_labels(f"{path}: [{i}].labels", group.get("labels"))
        addrs = addrs or []
        # counted before anything is built: aliases can make a small file list a million targets
        targets += len(addrs)
        target_labels += len(addrs) * (len(labels) + 2)
        if targets > MAX_TARGETS:
            raise ConfigError(f"{path}: more than {MAX_TARGETS:,} targets in one file")
        if target_labels > MAX_TARGET_LABELS:
            raise ConfigError(f"{path}: more than {MAX_TARGET_LABELS:,} target labels in one file "
                              "(targets x labels)")
        groups.append((addrs, labels))
    specs = []
    for i, (addrs, labels) in enumerate(groups):
        # an empty label is an unset one (Prometheus drops them); a path gets its leading "/" as Go's url.URL does
        scheme = labels.pop("__scheme__", "") or "http"
        mpath = labels.pop("__metrics_path__", "") or "/metrics"
        mpath = mpath if mpath.startswith("/") else f"/{mpath}"
        group_job = labels.pop("job", "") or job
        public = {k: v for k, v in labels.items() if v and not k.startswith("__")}
        checked: str | None = None  # the group's labels are validated with its first target
        for j, addr in enumerate(addrs):
            if isinstance(addr, str) and "@" in addr:  # checked first: the messages below quote the address
                raise ConfigError(f"{path}: [{i}].targets[{j}]: credentials in a target address are refused; "
                                  "remove them and give the file_sd entry basic_auth: {username: ..., "
                                  "password_file: ...} (or password_env)")
            if not isinstance(addr, str) or not addr or _BAD_ADDRESS.search(addr):
                raise ConfigError(f"{path}: [{i}].targets[{j}]: expected host:port, got {yamlv3.brief(addr)}")
            if not _utf8(addr):
                raise ConfigError(f"{path}: [{i}].targets[{j}]: target is not valid UTF-8")
            url = f"{scheme}://{addr}{mpath}"
            try:
                if checked is None:
                    TargetConfig(url=url, labels=public)
                    checked = url
                else:
                    check_target_url(url)
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
