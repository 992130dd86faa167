"""Every exception the agent raises on purpose, in one tree.

Callers catch the narrowest class that lets them go on: a scrape loop catches
:class:`ScrapeError` for one target and keeps serving the others; start-up catches
:class:`ConfigError` and exits 2. Third-party errors are translated at the boundary
with ``raise ... from exc`` so the cause is never lost.

::

    AgentError
    ├── ConfigError            bad configuration file or value (names the key path)
    ├── ExpositionError        malformed Prometheus text / OpenMetrics input (names the line)
    ├── ScrapeError            one target could not be scraped (down, timeout, too big, bad type)
    ├── NvmlError              the GPU source failed (library missing, GPU lost, ...)
    ├── RegexError             a pattern Go's RE2 refuses (also a ValueError; names the matcher)
    ├── StoreError             a store query or write was invalid
    ├── PromQLError            a PromQL expression failed to parse or evaluate
    │   ├── SourceError        a remote server did not answer a rule's query usably (names why)
    │   └── UnsupportedError   valid PromQL outside the engine's subset (names the construct)
    ├── TemplateError          an annotation/label template failed to parse or render
    ├── RuleError              a rule file or rule is invalid (names file, group, rule)
    ├── SimulatorError         the built-in fleet simulator was misused
    ├── StateError             the SQLite state database cannot be opened or written
    │   └── NotFoundError      no such record (an incident id the triage report was asked for)
    ├── DeliveryError          a receiver did not accept a notification (retry or give up)
    │   └── RenderError        a notification could not be rendered or encoded for its receiver (permanent)
    ├── DiagnosisError         a diagnosis could not run (bad evidence file, missing binary, ...)
    └── BusyError              optional work refused because its pool is full (HTTP 503 + Retry-After)
"""

from __future__ import annotations

__all__ = [
    "AgentError",
    "BusyError",
    "ConfigError",
    "DeliveryError",
    "DiagnosisError",
    "ExpositionError",
    "NotFoundError",
    "NvmlError",
    "PromQLError",
    "RegexError",
    "RenderError",
    "RuleError",
    "ScrapeError",
    "SimulatorError",
    "SourceError",
    "StateError",
    "StoreError",
    "TemplateError",
    "UnsupportedError",
]


class AgentError(Exception):
    """Base of every error the agent raises deliberately."""


class ConfigError(AgentError):
    """The configuration is invalid.

    ``errors`` holds one ``"key.path: message"`` line per problem so a user sees all
    of them at once instead of fixing one per restart.
    """

    def __init__(self, errors: list[str] | str) -> None:
        self.errors = [errors] if isinstance(errors, str) else list(errors)
        super().__init__("; ".join(self.errors))


class ExpositionError(AgentError):
    """Malformed exposition text. ``line`` is 1-based, 0 when not tied to a line."""

    def __init__(self, message: str, line: int = 0) -> None:
        self.message = message
        self.line = line
        super().__init__(f"line {line}: {message}" if line else message)


class ScrapeError(AgentError):
    """A scrape failed; the message is what ``/api/v1/targets`` shows as ``last_error``."""


class NvmlError(AgentError):
    """NVML failed as a whole (not a single unsupported field, which is skipped)."""


class RegexError(AgentError, ValueError):
    """A regular expression RE2 (Go's ``regexp``) refuses: back-references, look-around, a repeat
    count over 1000. The message names the matcher or function it came from. It is also a
    ``ValueError`` because matchers are config and API values: pydantic reports it under the
    key, the HTTP API answers 400 and the CLI exits 2, as for any other bad value."""


class StoreError(AgentError):
    """Invalid store operation, such as a bad label matcher."""


class PromQLError(AgentError):
    """A PromQL expression is invalid (syntax, types) or failed to evaluate."""


class SourceError(PromQLError):
    """A remote server (Prometheus, VictoriaMetrics, Thanos, Mimir) did not answer a query usably:
    unreachable, timed out, an HTTP error, ``status: error``, or a partial answer refused. A
    :class:`PromQLError`, so a rule that meets one fails the way a bad expression does: its
    alerts stay as they were."""


class UnsupportedError(PromQLError):
    """Valid PromQL that the agent's engine does not implement; ``construct`` names it
    (``"function holt_winters"``, ``"@ modifier"``) so a rule file can say which rule."""

    def __init__(self, construct: str, detail: str = "") -> None:
        self.construct = construct
        super().__init__(f"unsupported PromQL construct: {construct}" + (f" ({detail})" if detail else ""))


class TemplateError(AgentError):
    """An annotation or label template uses syntax or a function outside the supported
    Go-template subset, or failed to render."""


class RuleError(AgentError):
    """Rule files are invalid; ``errors`` holds one line per problem, each naming the file,
    group and rule the way promtool does."""

    def __init__(self, errors: list[str] | str) -> None:
        self.errors = [errors] if isinstance(errors, str) else list(errors)
        super().__init__("\n".join(self.errors))


class SimulatorError(AgentError):
    """The simulator was asked for something it cannot do."""


class StateError(AgentError):
    """The state database (outbox, alert state, silences, incidents) failed."""


class NotFoundError(StateError):
    """The state database has no such record (an incident id that was never recorded or was pruned)."""


class DeliveryError(AgentError):
    """A receiver did not acknowledge a notification.

    ``permanent`` means retrying cannot help (the receiver rejected the payload, e.g.
    HTTP 400 or Slack ``invalid_blocks``): the item leaves the outbox as failed and is
    recorded. Otherwise the dispatcher retries with backoff; ``retry_after_s`` is the
    receiver's own hint (HTTP ``Retry-After``) and overrides the backoff when longer.
    """

    def __init__(self, message: str, *, permanent: bool = False, retry_after_s: float | None = None) -> None:
        self.permanent = permanent
        self.retry_after_s = retry_after_s
        super().__init__(message)


class RenderError(DeliveryError):
    """A notification could not be rendered or encoded for its receiver (a time past year 9999, text no
    encoder takes): always permanent, since the same payload fails the same way every time, and a head of
    queue that cannot be sent must not hold back what is queued behind it."""

    def __init__(self, message: str) -> None:
        super().__init__(message, permanent=True)


class DiagnosisError(AgentError):
    """A diagnosis could not run: unreadable evidence, a missing binary, bad flags."""


class BusyError(AgentError):
    """Optional work (a triage report) refused because every slot of its pool is taken: the caller answers
    503 with ``Retry-After: retry_after_s`` instead of queueing without bound."""

    def __init__(self, message: str, *, retry_after_s: int) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s
