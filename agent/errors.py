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
    ├── StoreError             a store query or write was invalid
    └── SimulatorError         the built-in fleet simulator was misused
"""

from __future__ import annotations

__all__ = [
    "AgentError",
    "ConfigError",
    "ExpositionError",
    "NvmlError",
    "ScrapeError",
    "SimulatorError",
    "StoreError",
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


class StoreError(AgentError):
    """Invalid store operation, such as a bad label matcher."""


class SimulatorError(AgentError):
    """The simulator was asked for something it cannot do."""
