"""The agent's own HTTP endpoint: where it listens, its resource limits, authentication and TLS.

Apart from :mod:`agent.config` because these are the settings that decide whether the API can be
exposed beyond loopback, and :meth:`ServerConfig.warnings` says so when it should not be.
"""

from __future__ import annotations

import ipaddress
import re
import ssl

from pydantic import Field, SecretStr, field_validator, model_validator

from agent.config.types import ByteSize, ConfigModel, Duration

__all__ = ["ServerAuthConfig", "ServerConfig", "ServerTLSConfig"]

#: An ``allowed_hosts`` entry: ``*``, a DNS name (``.`` first: the domain and its subdomains), an IPv4
#: address or a bracketed IPv6 one, each with an optional ``:port``.
_HOST_ENTRY = re.compile(r"\*|(?:\.?[a-z0-9_](?:[a-z0-9_.-]*[a-z0-9_])?|\[[0-9a-f:.]+\])(?::[0-9]{1,5})?")


class ServerAuthConfig(ConfigModel):
    """An optional bearer token for the HTTP API (``bearer_token_file`` or ``bearer_token_env``).

    With a token, mutating requests (POST, PUT, PATCH, DELETE: silences, and any intake endpoint)
    need ``Authorization: Bearer <token>``; ``protect_reads`` extends that to every read except
    ``/healthz`` and ``/readyz``, which stay open for probes.
    """

    bearer_token: SecretStr | None = None
    protect_reads: bool = False

    SECRETS = ("bearer_token",)

    @field_validator("bearer_token")
    @classmethod
    def _not_empty(cls, v: SecretStr | None) -> SecretStr | None:
        if v is not None and not v.get_secret_value():
            raise ValueError("the bearer token is empty")
        if v is not None and any(c.isspace() or not c.isprintable() for c in v.get_secret_value()):
            raise ValueError("the bearer token must be one line of printable characters without spaces")
        return v


class ServerTLSConfig(ConfigModel):
    """Serve HTTPS from a PEM certificate (chain) and its private key; checked when the config loads."""

    cert_file: str
    key_file: str

    @model_validator(mode="after")
    def _loadable(self) -> ServerTLSConfig:
        try:
            ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(self.cert_file, self.key_file)
        except OSError as exc:  # ssl.SSLError is an OSError too
            raise ValueError(f"cannot load the certificate and key ({self.cert_file}, {self.key_file}): "
                             f"{exc.strerror or exc}") from exc
        return self


class ServerConfig(ConfigModel):
    """The HTTP endpoint and its resource limits.

    The limits protect the process, not just the endpoint: every connection holds a file
    descriptor, and the scraper needs up to 2 x ``scrape.concurrency`` of them from the same budget
    (``ulimit -n``, often 1024). A request head must arrive within ``header_timeout`` and a body
    within ``body_timeout``; at ``max_connections`` the oldest connection that is idle or still
    sending its head is closed to make room.
    """

    listen: str = "127.0.0.1:9400"
    max_connections: int = Field(default=256, ge=8, le=100_000)
    header_timeout: Duration = 10.0
    body_timeout: Duration = 30.0
    keepalive_timeout: Duration = 60.0
    body_limit: ByteSize = 2**20
    auth: ServerAuthConfig = ServerAuthConfig()
    tls: ServerTLSConfig | None = None
    #: Where people reach this agent (behind a proxy or an ingress: that URL), for links to its pages
    #: from elsewhere: the Slack message of an alert links ``<external_url>/incidents/<id>``. Empty: no links.
    external_url: str = ""
    #: Host names (``name`` or ``name:port``; ``.example.org`` for the domain and its subdomains; ``*`` for
    #: any) that requests may name in their ``Host`` header besides the listen address, ``localhost`` and
    #: ``external_url``'s host: the names people and tools reach this agent by (agent.app.hosts says why).
    allowed_hosts: list[str] = Field(default_factory=list)
    #: Accept mutating requests (silences, intake posts) from other machines without ``server.auth``, as
    #: Prometheus' ``--web.enable-admin-api`` opts in: only behind something else that authenticates.
    allow_unauthenticated_writes: bool = False

    @field_validator("allowed_hosts")
    @classmethod
    def _allowed_hosts(cls, v: list[str]) -> list[str]:
        out = []
        for i, entry in enumerate(v):
            host = entry.strip().lower()
            port = host.rpartition("]")[2].partition(":")[2] if host.startswith("[") else host.partition(":")[2]
            if not _HOST_ENTRY.fullmatch(host) or len(host) > 300 or (port and int(port) > 65535):
                raise ValueError(f"[{i}]: not a host name, name:port, .domain or '*': {entry[:60]!r}")
            out.append(host)
        return out

    @field_validator("external_url")
    @classmethod
    def _external_url(cls, v: str) -> str:
        v = v.strip()
        bad = any(c.isspace() or c in '<>|"' for c in v)  # they would break a Slack link (<url|text>)
        if v and (not v.startswith(("http://", "https://")) or len(v) > 1000 or bad):
            raise ValueError(f"must be an http:// or https:// URL without spaces, <, >, | or \", not {v[:60]!r}")
        return v.rstrip("/")

    @field_validator("listen")
    @classmethod
    def _listen(cls, v: str) -> str:
        _, sep, port = v.rpartition(":")
        if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
            raise ValueError(f"not host:port: {v!r}")
        return v

    @field_validator("header_timeout", "body_timeout", "keepalive_timeout")
    @classmethod
    def _positive(cls, v: float) -> float:
        if not 0 < v <= 3600:
            raise ValueError("must be positive and at most 1h")
        return v

    @field_validator("body_limit")
    @classmethod
    def _body_limit(cls, v: int) -> int:
        if not 1024 <= v <= 64 * 2**20:
            raise ValueError("must be between 1KiB and 64MiB")
        return v

    @property
    def host(self) -> str:
        return self.listen.rpartition(":")[0].strip("[]") or "0.0.0.0"

    @property
    def port(self) -> int:
        return int(self.listen.rpartition(":")[2])

    @property
    def loopback_only(self) -> bool:
        """True when only this machine can connect (127.0.0.0/8, ::1, ``localhost``)."""
        if self.host == "localhost":
            return True
        try:
            return ipaddress.ip_address(self.host).is_loopback
        except ValueError:  # a host name: it may resolve to anything
            return False

    def warnings(self) -> list[str]:
        """What an operator should hear about this endpoint's exposure (logged at start, in /api/v1/status)."""
        out = []
        if not self.loopback_only and self.auth.bearer_token is None and self.allow_unauthenticated_writes:
            out.append(f"listening on {self.listen} beyond loopback without authentication and with "
                       "server.allow_unauthenticated_writes: anyone who can reach it can add and expire silences "
                       "and post alerts and findings (set server.auth.bearer_token_file)")
        elif not self.loopback_only and self.auth.bearer_token is None:
            out.append(f"listening on {self.listen} beyond loopback without authentication: anyone who can "
                       "reach it can read it, and writes from other machines (silences, alerts, findings) are "
                       "refused (set server.auth.bearer_token_file)")
        if not self.loopback_only and self.auth.bearer_token is not None and self.tls is None:
            out.append(f"listening on {self.listen} beyond loopback without TLS: the bearer token travels "
                       "in clear text (set server.tls)")
        return out
