"""What Go does that Python must match, byte for byte: one home for it.

Prometheus and Alertmanager are Go programs, and the agent must agree with them where a
user can see the difference: how a float prints (``fmt``: ``strconv.FormatFloat`` and
``fmt.Sprintf``), how arithmetic edge cases come out (``math``: division by zero,
``math.Mod``, ``math.Pow``, ``strconv.ParseFloat``), what a regex matches (``regex``) and
how YAML reads (``yamlv3``: Go's yaml.v3, no base-60 or yes/no booleans). Every module
here imports only :mod:`agent.errors`, so every layer may use it.
"""
