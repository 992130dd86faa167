"""The agent's PromQL engine: the Prometheus 2.42 subset its rule files use.

The agent evaluates its alerting and recording rules itself (DESIGN.md decisions 1-2),
and the same files must behave identically in a real Prometheus. So this package
implements PromQL with Prometheus 2.42's semantics, parsed by ``promql-parser``, checked
against Prometheus' own promqltest files (``tests/promql/test_conformance.py``), and
rejects at parse time, by name, anything it does not implement.

Supported: number and string literals, unary minus, parentheses; instant and range
selectors with all matcher kinds, ``offset`` (also negative), ``@`` (a timestamp,
``start()``, ``end()``); 5-minute lookback and staleness markers; subqueries
(``expr[5m:1m]``, step-aligned as in Prometheus; ``[5m:]`` uses the engine's default
step); arithmetic, comparison (with ``bool``), ``atan2`` and set operators with
``on``/``ignoring``/``group_left``/``group_right`` and Prometheus' matching errors;
aggregations ``sum avg min max count group stddev stdvar topk bottomk quantile
count_values`` with ``by``/``without``; functions ``rate increase delta irate idelta
resets changes deriv predict_linear``, ``{avg,sum,count,min,max,stddev,stdvar,quantile,
last,present,absent}_over_time``, ``histogram_quantile`` (classic buckets),
``absent clamp clamp_min clamp_max abs ceil floor round exp ln log2 log10 sqrt sgn``,
the trigonometric functions with ``deg rad pi``, ``time timestamp vector scalar
label_replace label_join sort sort_desc``, and ``year month day_of_month day_of_year
day_of_week days_in_month hour minute``.

Unsupported (:class:`~agent.errors.UnsupportedError` names the construct):
``holt_winters``; native-histogram functions (``histogram_count``, ``histogram_sum``,
``histogram_fraction``, ``histogram_stddev``, ``histogram_stdvar``, ``histogram_avg``);
everything newer than 2.42 that the parser knows (``or`` between label matchers,
``fill`` modifiers, ``limitk``/``limit_ratio``, ``sort_by_label``, ``info``,
``mad_over_time``, ``double_exponential_smoothing``, ``step()`` and other later
functions, durations used as numbers (``1h``), durations without a unit (``x[5]``,
``offset 5``), quoted label names); and an ``@`` with a negative timestamp, which the
parser cannot represent.

Native histogram samples do not exist in the store, so every series is a float series.
"""

from __future__ import annotations

from agent.promql.engine import Engine
from agent.promql.nodes import Expr
from agent.promql.syntax import metric_names, parse
from agent.promql.values import Matrix, MatrixSeries, Sample, Scalar, String, Value, Vector

__all__ = [
    "Engine",
    "Expr",
    "Matrix",
    "MatrixSeries",
    "Sample",
    "Scalar",
    "String",
    "Value",
    "Vector",
    "metric_names",
    "parse",
]
