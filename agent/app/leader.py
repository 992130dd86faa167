"""Leader election on a Kubernetes Lease for an HA pair (``ha.mode: kubernetes``, docs/ha.md).

The kubernetes client's ``kubernetes.leaderelection`` (``LeaderElection`` over a ``LeaseLock``)
does the election: client-go's algorithm, a follower takes the lease once it has seen the same
record for ``lease_duration``, the leader renews every ``retry_period`` and gives up after
``renew_deadline`` without a successful renew. It is thread-based and blocks (``time.sleep``,
synchronous HTTP), so it runs in a daemon thread of its own and reports to the event loop only
through :class:`~agent.act.leadership.Leadership`, whose state is behind a lock and whose leader
flag expires by itself ``renew_deadline`` after the last successful renew.

Two things are added to the client's lock here (:class:`_WatermarkLeaseLock`): the leader writes
how far its delivered-through watermarks lie behind the moment of the write (one duration per direct
receiver, never a time of its clock: :mod:`agent.act.leadership` says why) into an annotation of the
Lease it renews anyway, and every read of the lease tells the ``Leadership`` who holds it, what that
holder wrote, the record's ``resourceVersion`` and when (on this replica's clock) the read started;
and every API call gets a timeout (the client has none by default, and a hung call must not outlive the
renew deadline). ``LeaderElection.run()`` returns once leadership is lost; the thread starts a new
election then, so the replica becomes a candidate again.
"""

from __future__ import annotations

import json
import logging
import threading
from typing import Any

import structlog
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes.leaderelection import electionconfig, leaderelection
from kubernetes.leaderelection.resourcelock.leaselock import LeaseLock

from agent.act.leadership import Leadership
from agent.config import HaConfig

__all__ = ["WATERMARK_ANNOTATION", "LeaseElector"]

log = structlog.get_logger(__name__)

#: The Lease annotation holding the leader's watermarks: a JSON object, direct queue -> milliseconds the
#: watermark lies behind the write. Not ``delivered-through-ms`` (Unix ms, an earlier release): a pair in
#: the middle of an upgrade ignores the other's annotation, so it settles nothing rather than misreads it.
WATERMARK_ANNOTATION = "sre-agent.io/delivered-behind-ms"
_LOG_EVERY = 30  # while the API stays unreachable, one error line per this many failed attempts


class _TimedLeases:
    """The three CoordinationV1Api calls LeaseLock makes, each with a request timeout."""

    def __init__(self, api: k8s.CoordinationV1Api, timeout_s: float) -> None:
        self._api = api
        self._timeout = timeout_s

    def read_namespaced_lease(self, name: str, namespace: str) -> Any:
        return self._api.read_namespaced_lease(name, namespace, _request_timeout=self._timeout)

    def create_namespaced_lease(self, namespace: str, body: Any) -> Any:
        return self._api.create_namespaced_lease(namespace, body, _request_timeout=self._timeout)

    def replace_namespaced_lease(self, name: str, namespace: str, body: Any) -> Any:
        return self._api.replace_namespaced_lease(name=name, namespace=namespace, body=body,
                                                  _request_timeout=self._timeout)


class _Stopped(Exception):
    """Raised inside the client's loops to end the elector thread once the agent stops."""


class _WatermarkLeaseLock(LeaseLock):
    """LeaseLock that reports reads and successful writes to :class:`Leadership` and carries the
    watermark annotation (module docstring)."""

    def __init__(self, name: str, namespace: str, leadership: Leadership, api: _TimedLeases,
                 stopping: threading.Event) -> None:
        super().__init__(name, namespace, leadership.identity)
        self.api_instance: Any = api
        self._leadership = leadership
        self._stopping = stopping

    def get(self, name: str, namespace: str) -> tuple[bool, Any]:
        if self._stopping.is_set():  # every round of the client's loops starts with a read
            raise _Stopped
        started_ms = self._leadership.now_ms()  # before the request: a newer record was written after this
        found, record = super().get(name, namespace)
        ref: Any = self.lease_reference
        if found and ref is not None:
            meta = ref.metadata
            annotations = (meta.annotations or {}) if meta is not None else {}
            raw = annotations.get(WATERMARK_ANNOTATION)
            version = meta.resource_version if meta is not None else None
            if not version:  # the API server always sets one; without it, the record itself tells versions apart
                version = repr((record.holder_identity, record.renew_time, raw))
            self._leadership.observed(record.holder_identity, _watermarks(raw), version=str(version),
                                      read_started_ms=started_ms)
        return found, record

    def create(self, name: str, namespace: str, election_record: Any) -> bool:
        ok = bool(super().create(name, namespace, election_record))
        if ok:
            self._leadership.acquired()
        return ok

    def update(self, name: str, namespace: str, updated_record: Any) -> bool:
        ref: Any = self.lease_reference
        watermarks = self._leadership.to_publish()
        if ref is not None and watermarks:
            if ref.metadata is None:
                ref.metadata = k8s.V1ObjectMeta()
            value = json.dumps(watermarks, sort_keys=True, separators=(",", ":"))
            ref.metadata.annotations = {**(ref.metadata.annotations or {}), WATERMARK_ANNOTATION: value}
        ok = bool(super().update(name, namespace, updated_record))
        if ok:
            self._leadership.acquired()
        return ok


def _watermarks(raw: object) -> dict[str, int] | None:
    """The annotation's JSON object of queue -> ms behind the write; None if absent or not that shape (another
    writer's annotation is ignored, never trusted in part)."""
    if not isinstance(raw, str):
        return None
    try:
        data = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(data, dict) or not all(isinstance(k, str) and type(v) is int for k, v in data.items()):
        return None
    return data


class LeaseElector:
    """Runs the election in a daemon thread; :meth:`start` returns at once."""

    def __init__(self, ha: HaConfig, leadership: Leadership) -> None:
        self._ha = ha
        self._leadership = leadership
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()

    def start(self) -> None:
        # The client logs every retry at INFO ("yet to finish lease_duration ..."), every 2 s;
        # transitions are logged by Leadership instead.
        logging.getLogger("leaderelection").setLevel(logging.WARNING)
        self._thread = threading.Thread(target=self._run, name="lease-elector", daemon=True)
        self._thread.start()
        lease = self._ha.lease
        log.info("leader election started", identity=self._leadership.identity, lease=lease.name,
                 namespace=lease.namespace, lease_duration_s=lease.lease_duration,
                 renew_deadline_s=lease.renew_deadline, retry_period_s=lease.retry_period)

    def stop(self) -> None:
        """Stop taking part: the flag clears now (nothing direct is sent after this) and the thread ends at
        its next read of the lease, within ``retry_period``. The lease is not released: it expires, and the
        other replica takes it ``lease_duration`` later (a restart under the same identity renews at once)."""
        self._stopping.set()
        self._leadership.lost()

    def _api(self) -> _TimedLeases:
        lease = self._ha.lease
        configuration = k8s.Configuration()
        if lease.kubeconfig is not None:
            k8s_config.load_kube_config(config_file=lease.kubeconfig, client_configuration=configuration)
        else:
            k8s_config.load_incluster_config(client_configuration=configuration)
        return _TimedLeases(k8s.CoordinationV1Api(k8s.ApiClient(configuration)), timeout_s=lease.retry_period)

    def _run(self) -> None:
        lease = self._ha.lease
        failures = 0
        while not self._stopping.is_set():
            try:
                lock = _WatermarkLeaseLock(lease.name, lease.namespace, self._leadership, self._api(), self._stopping)
                election = leaderelection.LeaderElection(electionconfig.Config(
                    lock, lease_duration=int(lease.lease_duration), renew_deadline=int(lease.renew_deadline),
                    retry_period=int(lease.retry_period), onstarted_leading=_nothing,
                    onstopped_leading=self._leadership.lost))
                election.run()  # returns when leadership is lost
            except _Stopped:
                return
            except Exception as exc:  # the API unreachable, a broken kubeconfig: follower until it works
                self._leadership.lost()
                failures += 1
                (log.error if failures % _LOG_EVERY == 1 else log.debug)(
                    "leader election failed; retrying as a follower (direct receivers held)", error=repr(exc),
                    failures=failures, retry_in_s=lease.retry_period)
                self._stopping.wait(lease.retry_period)
                continue
            failures = 0


def _nothing() -> None:
    """``onstarted_leading``: the work leadership guards runs on the event loop, gated by the flag."""
