"""The building blocks every config section uses: durations, sizes, secrets, URLs.

Durations are written the Prometheus way (``15s``, ``5m``, ``1h30m``, ``100ms``); sizes as
``16MiB``, ``512KiB``, ``1GB`` or plain bytes. Secrets are never written inline: a secret
field is given as ``<name>_file`` or ``<name>_env`` and resolved here, from the environment
the caller passes in (``load_config``'s ``environ``), into a :class:`pydantic.SecretStr`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, ClassVar
from urllib.parse import urlsplit

from pydantic import BaseModel, BeforeValidator, ConfigDict, PlainSerializer, SecretStr, ValidationInfo, model_validator

from agent.gocompat.yamlv3 import brief

__all__ = [
    "ByteSize",
    "ConfigModel",
    "Duration",
    "check_url",
    "format_duration",
    "from_env",
    "parse_duration",
    "parse_size",
    "resolve_secret",
]

_DURATION_RE = re.compile(r"^(?:(\d+)y)?(?:(\d+)w)?(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?(?:(\d+)ms)?$")
_DURATION_UNITS = (365 * 86400, 7 * 86400, 86400, 3600, 60, 1, 0.001)
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]i?B|B)?\s*$", re.IGNORECASE)
_SIZE_UNITS = {
    "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
    "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40,
}


def parse_duration(text: object) -> float:
    """Prometheus duration string -> seconds. ``0`` alone is accepted."""
    if isinstance(text, bool) or not isinstance(text, str):
        raise ValueError(f"a duration needs a unit, like '15s' or '5m' (got {brief(text)})")
    if text == "0":
        return 0.0
    m = _DURATION_RE.match(text.strip())
    if not text.strip() or m is None or not any(m.groups()):
        raise ValueError(f"not a duration: {brief(text)} (use Prometheus units: 100ms, 15s, 5m, 1h, 1d)")
    return float(sum(int(g) * u for g, u in zip(m.groups(), _DURATION_UNITS, strict=True) if g))


def format_duration(seconds: float) -> str:
    """Seconds -> the shortest Prometheus duration string (``90`` -> ``1m30s``)."""
    ms = round(seconds * 1000)
    if ms == 0:
        return "0s"
    out = []
    for unit, size in (("d", 86_400_000), ("h", 3_600_000), ("m", 60_000), ("s", 1000), ("ms", 1)):
        n, ms = divmod(ms, size)
        if n:
            out.append(f"{n}{unit}")
    return "".join(out)


def parse_size(value: object) -> int:
    """``16MiB`` / ``1GB`` / ``1048576`` -> bytes."""
    if isinstance(value, bool):
        raise ValueError(f"not a size: {brief(value)}")
    if isinstance(value, int):
        return value
    m = _SIZE_RE.match(str(value))
    if m is None:
        raise ValueError(f"not a size: {brief(value)} (use e.g. 16MiB, 512KiB, 1GB or bytes)")
    return int(float(m.group(1)) * _SIZE_UNITS[(m.group(2) or "B").upper()])


Duration = Annotated[
    float, BeforeValidator(parse_duration), PlainSerializer(format_duration, when_used="json")
]
ByteSize = Annotated[int, BeforeValidator(parse_size)]


class ConfigModel(BaseModel):
    """A config section: unknown keys refused, frozen once validated.

    ``SECRETS`` names the section's secret fields: each is given as ``<name>_file`` or
    ``<name>_env`` and never inline (:func:`resolve_secret`), resolved here for every section.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)
    SECRETS: ClassVar[tuple[str, ...]] = ()

    @model_validator(mode="before")
    @classmethod
    def _resolve_secrets(cls, data: Any, info: ValidationInfo) -> Any:
        if not cls.SECRETS or not isinstance(data, dict):
            return data
        data = dict(data)
        for name in cls.SECRETS:
            data = resolve_secret(data, name, info)
        return data


def resolve_secret(values: dict[str, Any], field: str, info: ValidationInfo) -> dict[str, Any]:
    """Turn ``<field>_file`` / ``<field>_env`` into ``<field>`` (a SecretStr)."""
    if field in values and values[field] is not None and not isinstance(values[field], SecretStr):
        raise ValueError(
            f"{field}: secrets are not accepted inline; use {field}_file (a file path) or {field}_env "
            "(an environment variable name)"
        )
    path, env_name = values.pop(f"{field}_file", None), values.pop(f"{field}_env", None)
    if path is not None and env_name is not None:
        raise ValueError(f"{field}: give {field}_file or {field}_env, not both")
    for key, given in ((f"{field}_file", path), (f"{field}_env", env_name)):
        if given is not None and not isinstance(given, str):
            raise ValueError(f"{key}: expected a string, got {brief(given)}")
    if path is not None:
        try:
            values[field] = SecretStr(Path(path).read_text(encoding="utf-8").strip())
        except OSError as exc:
            raise ValueError(f"{field}_file: cannot read {path!r}: {exc.strerror}") from exc
    elif env_name is not None:
        environ: Mapping[str, str] = (info.context or {}).get("environ", {})
        if env_name not in environ:
            raise ValueError(f"{field}_env: environment variable {env_name!r} is not set")
        values[field] = SecretStr(environ[env_name])
    return values


def check_url(v: str) -> str:
    """An http(s) URL with a host and a valid port, else ValueError saying why."""
    parts = urlsplit(v)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"not a URL: {v!r} (expected http(s)://host[:port]/path)")
    try:
        parts.port  # noqa: B018 - raises ValueError on a bad port
    except ValueError as exc:
        raise ValueError(f"not a URL: {v!r} (bad port)") from exc
    return v


def from_env(data: Any, info: ValidationInfo, field: str) -> Any:
    """``<field>_env: NAME`` -> ``<field>: $NAME``, from the environment the loader passes in
    ``info.context`` (the one place settings read it)."""
    if not isinstance(data, dict) or data.get(f"{field}_env") is None:
        return data
    if data.get(field) is not None:
        raise ValueError(f"give {field} or {field}_env, not both")
    name = data[f"{field}_env"]
    environ: Mapping[str, str] = (info.context or {}).get("environ", {})
    if not isinstance(name, str) or not environ.get(name):
        raise ValueError(f"{field}_env: environment variable {name!r} is not set")
    return {**data, field: environ[name]}
