"""Which ``Host`` names the agent answers to: its defence against DNS rebinding.

A web page the operator visits can point its own name at 127.0.0.1 (or at the agent's address
on the operator's network) once it has loaded. The browser then treats the agent as part of
the attacker's origin: the page reads ``/api/v1/status`` and posts the UI's forms with the
Origin check passing, since Origin and Host both name the attacker. What such a request cannot
hide is that name in ``Host``, and refusing unknown names is the defence Django's
``ALLOWED_HOSTS``, Jupyter's ``local_hostnames`` and dev servers' ``allowedHosts`` use.

A request may name (compared as host names, case-insensitively, a trailing dot ignored):

* any **IP address** (``127.0.0.1:9400``, ``[::1]``, a pod's address): a browser sends an
  address only for a URL written with that address, and nobody can re-point an address
  (Vite and webpack-dev-server allow them for the same reason); probes and Prometheus reach
  pods this way;
* ``localhost`` when listening on loopback or on every address; the listen host when it is a name;
* the host of ``server.external_url`` (where a proxy or an ingress publishes the agent);
* an entry of ``server.allowed_hosts``: ``name`` (any port), ``name:port``, ``.example.org`` (the
  domain and its subdomains) or ``*`` (anything);
* listening on every address (``0.0.0.0``, ``::``): the machine's own name (``gethostname``);
* beyond loopback with ``server.auth`` and no ``allowed_hosts``: **any name**. There the token
  guards every write, and the UI's session cookie belongs to the name the operator logged in
  at, so a rebound page holds neither; what it can read is what the agent shows anyone who
  reaches its port (``protect_reads`` closes that). An agent reached by many names (a Service,
  an Ingress, node names) keeps working without a list; giving one makes the check strict.
  Without auth the names above are all there is: such an agent answers reads to anyone, and a
  rebound page would carry them to a site on the Internet.

A request without ``Host`` (an HTTP/1.0 client, never a browser) passes, and so do the probes
(``/healthz``, ``/readyz``): kubelet may name the pod any way, and their answers say nothing.
A refused request is a ``400`` naming the host and the setting, as Django answers.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Awaitable, Callable, Collection
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import structlog
from aiohttp import web

from agent.config import ServerConfig

__all__ = ["HostPolicy", "host_middleware", "split_host"]

log = structlog.get_logger(__name__)

_Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyz0123456789-._")
_MAX_LOGGED = 32  # distinct refused names logged per process; a flood of made-up names logs no more


def split_host(value: str) -> tuple[str, str] | None:
    """``Host`` (or an ``allowed_hosts`` entry) as (host, port), lower case, brackets and a final dot
    removed; ``port`` is ``""`` when absent. None when it is not a host name, an IP address or ``[IPv6]``."""
    value = value.strip().lower()
    if value.startswith("["):
        host, bracket, rest = value[1:].partition("]")
        if not bracket or not _is_ip(host) or ":" not in host:
            return None
        port = rest[1:] if rest.startswith(":") else None if rest else ""
    else:
        host, colon, port_text = value.partition(":")
        port = port_text if colon else ""
        if not host or not set(host) <= _NAME_CHARS or len(host) > 254:
            return None
    if port is None or (port and not (port.isascii() and port.isdigit() and len(port) <= 5)):
        return None
    host = host[:-1] if host.endswith(".") and len(host) > 1 else host
    return host, port


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


@dataclass(frozen=True)
class HostPolicy:
    """The names a request's ``Host`` may give: (host, port) pairs (port ``""``: any), domain
    suffixes (``.example.org``), or everything (``any_host``)."""

    names: frozenset[tuple[str, str]]
    suffixes: tuple[tuple[str, str], ...] = ()
    any_host: bool = False

    @classmethod
    def from_config(cls, config: ServerConfig, machine_name: str = "") -> HostPolicy:
        """The policy the module docstring describes; ``machine_name`` is ``socket.gethostname()``."""
        listen = config.host.lower()
        wildcard = _is_ip(listen) and ipaddress.ip_address(listen).is_unspecified
        names: set[tuple[str, str]] = set()
        suffixes: list[tuple[str, str]] = []
        if config.loopback_only or wildcard:
            names.add(("localhost", ""))
        if not _is_ip(listen):
            names.add((listen, ""))
        if wildcard and machine_name:
            for name in {machine_name, machine_name.partition(".")[0]}:
                if (parsed := split_host(name)) is not None:
                    names.add((parsed[0], ""))
        external = urlsplit(config.external_url).hostname if config.external_url else None
        if external:
            names.add((external.rstrip("."), ""))
        any_host = (not config.loopback_only and config.auth.bearer_token is not None
                    and not config.allowed_hosts)
        for entry in config.allowed_hosts:
            if entry == "*":
                any_host = True
                continue
            parsed = split_host(entry.removeprefix("."))
            if parsed is None:  # the config validated the entry's shape; this is a bracket without an IP
                continue
            if entry.startswith("."):
                suffixes.append(parsed)
            else:
                names.add(parsed)
        return cls(frozenset(names), tuple(suffixes), any_host)

    def allows(self, header: str | None) -> bool:
        """Whether a request whose ``Host`` header is ``header`` (None: absent) may be answered."""
        if header is None or self.any_host:
            return True
        parsed = split_host(header)
        if parsed is None:
            return False
        host, port = parsed
        if _is_ip(host):
            return True
        if (host, "") in self.names or (host, port) in self.names:
            return True
        return any((host == s or host.endswith("." + s)) and p in ("", port) for s, p in self.suffixes)

    def shown(self) -> list[str]:
        """The allowed names for a message and ``/api/v1/status`` (``*`` when any)."""
        if self.any_host:
            return ["*"]
        out = sorted(f"{h}:{p}" if p else h for h, p in self.names)
        return ["<any IP address>", *out, *sorted(f".{h}:{p}" if p else f".{h}" for h, p in self.suffixes)]


def host_middleware(policy: HostPolicy, open_paths: Collection[str]) -> Any:
    """An aiohttp middleware refusing requests whose ``Host`` the policy does not allow (400)."""
    logged: set[str] = set()

    @web.middleware
    async def check_host(request: web.Request, handler: _Handler) -> web.StreamResponse:
        host = request.headers.get("Host")
        if request.path in open_paths or policy.allows(host):
            return await handler(request)
        shown = (host or "")[:100]
        if len(logged) < _MAX_LOGGED and shown not in logged:
            logged.add(shown)
            log.warning("refused a request naming a host this agent does not answer to (DNS rebinding?)",
                        host=shown, path=request.path[:200], remote=request.remote)
        message = (f"Host {shown!r} is not a name this agent answers to; if people or tools reach it by that "
                   "name, add it to server.allowed_hosts")
        return web.json_response({"status": "error", "errorType": "bad_host", "error": message}, status=400)

    return check_host
