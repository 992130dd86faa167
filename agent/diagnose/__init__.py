"""Diagnostics: the GPU memory planner, OOM diagnosis and the nccl-tests check.

Each produces :class:`~agent.diagnose.findings.Finding` objects, the one shape the CLI
(``--json``), the incident log and the receivers (a Slack thread) all use.
"""
