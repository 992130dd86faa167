"""A local stand-in for the Kubernetes API server's Lease endpoints, served by aiohttp on 127.0.0.1.

There is no cluster here; what the HA tests need from one is what the kubernetes client's
``LeaseLock`` uses, answered the way the API server does (coordination.k8s.io/v1):

* ``GET    /apis/coordination.k8s.io/v1/namespaces/{ns}/leases/{name}``: the Lease, or a 404
  ``Status`` (the elector creates the lease only on a clean 404);
* ``POST   /apis/coordination.k8s.io/v1/namespaces/{ns}/leases``: 201, or 409 ``AlreadyExists``;
* ``PUT    /apis/coordination.k8s.io/v1/namespaces/{ns}/leases/{name}``: optimistic concurrency on
  ``metadata.resourceVersion``: a stale one is 409 ``Conflict`` (two replicas taking an expired
  lease at once: one wins), a missing one 422 ``Invalid``, a match stores the body and bumps the
  version;
* ``Authorization: Bearer <token>`` is required (401 otherwise), as with a service-account token.

:meth:`FakeKube.kubeconfig` writes a kubeconfig file pointing at it (what ``ha.lease.kubeconfig``
takes). :meth:`FakeKube.outage` makes every request answer 503 until :meth:`FakeKube.recover`,
for a leader that cannot renew. Every write is recorded (:attr:`FakeKube.writes`) so a test sees
who held the lease when, and with which annotations.
"""

from __future__ import annotations

import copy
import json
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web

__all__ = ["FakeKube", "LeaseWrite", "running_fake_kube"]

_BASE = "/apis/coordination.k8s.io/v1/namespaces/{ns}/leases"


@dataclass
class LeaseWrite:
    """One accepted create or replace: when, by what verb, the holder and the annotations written."""

    at: float
    verb: str
    holder: str | None
    annotations: dict[str, str]
    resource_version: str


@dataclass
class FakeKube:
    token: str = "fake-service-account-token"
    port: int = 0
    leases: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    writes: list[LeaseWrite] = field(default_factory=list)
    conflicts: int = 0
    refused: int = 0  # requests answered 503 during an outage
    down: bool = False
    _version: int = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def kubeconfig(self, path: Path) -> Path:
        """A kubeconfig file for this server and token (JSON is YAML)."""
        path.write_text(json.dumps({
            "apiVersion": "v1", "kind": "Config", "current-context": "fake",
            "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
            "users": [{"name": "agent", "user": {"token": self.token}}],
            "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "agent"}}],
        }))
        return path

    def outage(self) -> None:
        self.down = True

    def recover(self) -> None:
        self.down = False

    def holder(self, name: str = "sre-agent", namespace: str = "default") -> str | None:
        lease = self.leases.get((namespace, name))
        return None if lease is None else lease.get("spec", {}).get("holderIdentity")

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._gate])
        base = _BASE.format(ns="{ns}")
        app.router.add_get(base + "/{name}", self._get)
        app.router.add_post(base, self._create)
        app.router.add_put(base + "/{name}", self._replace)
        return app

    @web.middleware
    async def _gate(self, request: web.Request, handler: Any) -> web.StreamResponse:
        if self.down:
            self.refused += 1
            return _status(503, "ServiceUnavailable", "the fake API server is in an outage")
        if request.headers.get("Authorization") != f"Bearer {self.token}":
            return _status(401, "Unauthorized", "Unauthorized")
        response: web.StreamResponse = await handler(request)
        return response

    async def _get(self, request: web.Request) -> web.Response:
        ns, name = request.match_info["ns"], request.match_info["name"]
        lease = self.leases.get((ns, name))
        if lease is None:
            return _status(404, "NotFound", f'leases.coordination.k8s.io "{name}" not found')
        return web.json_response(lease)

    async def _create(self, request: web.Request) -> web.Response:
        ns = request.match_info["ns"]
        body = await request.json()
        name = (body.get("metadata") or {}).get("name")
        if not name:
            return _status(422, "Invalid", "metadata.name: Required value")
        if (ns, name) in self.leases:
            self.conflicts += 1
            return _status(409, "AlreadyExists", f'leases.coordination.k8s.io "{name}" already exists')
        return web.json_response(self._store(ns, name, body, verb="create"), status=201)

    async def _replace(self, request: web.Request) -> web.Response:
        ns, name = request.match_info["ns"], request.match_info["name"]
        body = await request.json()
        current = self.leases.get((ns, name))
        if current is None:
            return _status(404, "NotFound", f'leases.coordination.k8s.io "{name}" not found')
        sent = (body.get("metadata") or {}).get("resourceVersion")
        if not sent:  # the Lease strategy allows no unconditional update (the API server's store.go)
            return _status(422, "Invalid", f'Lease.coordination.k8s.io "{name}" is invalid: metadata.resourceVersion: '
                                           "Invalid value: 0x0: must be specified for an update")
        if sent != current["metadata"]["resourceVersion"]:
            self.conflicts += 1
            return _status(409, "Conflict", f'Operation cannot be fulfilled on leases.coordination.k8s.io "{name}": '
                                            "the object has been modified; please apply your changes to the latest "
                                            "version and try again")
        return web.json_response(self._store(ns, name, body, verb="replace", uid=current["metadata"]["uid"]))

    def _store(self, ns: str, name: str, body: dict[str, Any], *, verb: str, uid: str | None = None) -> dict[str, Any]:
        self._version += 1
        lease = copy.deepcopy(body)
        meta = lease.setdefault("metadata", {})
        meta.update(name=name, namespace=ns, resourceVersion=str(self._version),
                    uid=uid or f"00000000-0000-0000-0000-{self._version:012d}")
        meta.setdefault("creationTimestamp", time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
        lease.update(apiVersion="coordination.k8s.io/v1", kind="Lease")
        self.leases[(ns, name)] = lease
        self.writes.append(LeaseWrite(time.time(), verb, (lease.get("spec") or {}).get("holderIdentity"),
                                      dict(meta.get("annotations") or {}), str(self._version)))
        return lease


def _status(code: int, reason: str, message: str) -> web.Response:
    """A ``metav1.Status`` body, as the API server answers errors."""
    return web.json_response({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                              "message": message, "reason": reason, "code": code}, status=code)


@asynccontextmanager
async def running_fake_kube() -> AsyncIterator[FakeKube]:
    """Serve a :class:`FakeKube` on a free loopback port for the duration of the block."""
    fake = FakeKube()
    runner = web.AppRunner(fake.app())
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    fake.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield fake
    finally:
        await runner.cleanup()
