"""The running agent: wiring, HTTP, self-metrics, logs and the demo.

``daemon`` builds every layer from one :class:`~agent.config.Config` and schedules the
jobs, ``server`` serves the HTTP API, ``telemetry`` the agent's own ``/metrics``,
``logs`` configures structlog, and ``demo`` runs the agent against the simulated fleet.
"""
