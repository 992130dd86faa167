"""Grafana dashboards for the fleet, its GPUs and the agent, built as code.

``python -m dashboards.generate`` builds every dashboard with grafana-foundation-sdk (Grafana's
typed builders) and writes ``dashboards/<uid>.json``; a test regenerates them and fails on
any difference. One module per dashboard family (:mod:`dashboards.vllm`,
:mod:`dashboards.lmdeploy`, :mod:`dashboards.gpu`, :mod:`dashboards.agent`) over the
conventions in :mod:`dashboards.kit`; thresholds come from the rule files through
:mod:`dashboards.rules`, so a panel's line is the alert's number.
"""
