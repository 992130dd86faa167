"""Rules: Prometheus rule files, evaluated with Prometheus' semantics.

``files`` loads and validates rule files (every problem named by file, group and rule),
``manager`` evaluates the groups over the PromQL engine and runs the alert state machine
(pending, firing, resolved, ``ALERTS``/``ALERTS_FOR_STATE``), ``template`` renders
annotations as Go's text/template does, and ``promtool_test`` runs promtool's unit-test
format on the agent's own engine.
"""
