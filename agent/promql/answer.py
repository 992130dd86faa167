"""The query API's answers, checked once for both kinds of query (instant and range).

A Prometheus-compatible server answers ``{"status": "success", "data": {"resultType": ...,
"result": ...}, "warnings": [...]}``. Whatever the agent does with an answer (a rule's
instant result, a report's plot, a diagnosis' history) it first goes through this module,
so a server that answers something else (a proxy's HTML page, a truncated body, a value
that is not a number, a timestamp of 1e300, a label value that is a list) meets one
validator and one error: :class:`~agent.errors.SourceError`, whose message names the part
that was wrong (``result[3].values[7]: timestamp ...``). Nothing else escapes: no
``KeyError`` from a missing key, no ``OverflowError`` from a date, no ``TypeError`` from a
list where an object belongs (``tests/fuzz/test_fuzz_range_answer.py`` holds that for any
JSON).
"""

from __future__ import annotations

import json
from typing import Any

from agent.errors import SourceError
from agent.series import Labels, labels_from

__all__ = ["MAX_ANSWER_BYTES", "MAX_QUERY_S", "MAX_TIMESTAMP_S", "RangeSeries", "deadline_s", "decode",
           "parse_query_response", "parse_range_response"]

#: One range series: labels, times (Unix ms), values.
RangeSeries = tuple[dict[str, str], list[int], list[float]]
#: The last second of year 9999: later (or negative) times are not a sample's, and dates past it
#: overflow Python's ``datetime`` and matplotlib's date numbers.
MAX_TIMESTAMP_S = 253_402_300_799
#: The most an answer may hold: a rule's answer is a few KiB, a report's plot a few hundred; anything
#: near this is a runaway query, refused before it is parsed.
MAX_ANSWER_BYTES = 64 * 1024 * 1024
#: The longest any one query may take, start to last byte, whatever ``source.timeout`` says: a query
#: holds a worker (a report's, a diagnosis') or a rule's evaluation for that long.
MAX_QUERY_S = 120.0
_EXCERPT = 200


def deadline_s(timeout: float) -> float:
    """The total time one query may take: the source's ``timeout``, at most :data:`MAX_QUERY_S`."""
    return min(timeout, MAX_QUERY_S)


def decode(raw: bytes) -> Any:
    """``raw`` as JSON; :class:`SourceError` (with an excerpt) when it is not."""
    try:
        return json.loads(raw)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        excerpt = raw[:_EXCERPT].decode("utf-8", "replace")
        raise SourceError(f"not the query API's JSON: {excerpt!r}") from exc


def _float(text: Any, where: str) -> float:
    if not isinstance(text, str):
        raise SourceError(f"{where}: sample value is not a string: {_show(text)}")
    try:
        return float(text)  # Go writes "NaN", "+Inf", "-Inf": Python reads all three
    except ValueError as exc:
        raise SourceError(f"{where}: sample value is not a number: {_show(text)}") from exc


def _timestamp_ms(t: Any, where: str) -> int:
    """A sample's time (the API's float seconds) as Unix ms; a string, NaN, inf or a time past
    :data:`MAX_TIMESTAMP_S` is refused."""
    if isinstance(t, bool) or not isinstance(t, int | float):
        raise SourceError(f"{where}: timestamp is not a number: {_show(t)}")
    if not 0 <= t <= MAX_TIMESTAMP_S:  # also refuses NaN and inf; a huge int is compared, never converted
        raise SourceError(f"{where}: timestamp {_show(t)} is not a time between 1970 and 9999")
    return round(t * 1000)


def _show(value: Any) -> str:
    return f"{value!r:.{_EXCERPT}}"


def _metric(element: Any, where: str) -> dict[str, str]:
    if not isinstance(element, dict):
        raise SourceError(f"{where}: not an object but {type(element).__name__}")
    metric = element.get("metric")
    if not isinstance(metric, dict):
        raise SourceError(f"{where}: has no 'metric' object")
    for name, value in metric.items():
        if not isinstance(value, str):
            raise SourceError(f"{where}: label {_show(name)} is not a string but {type(value).__name__}")
    if "histogram" in element or "histograms" in element:
        raise SourceError(f"{where}: native-histogram samples are not supported (the rules use classic buckets)")
    return metric


def _envelope(body: Any) -> tuple[str, Any, list[str], bool]:
    """``(resultType, result, warnings, partial)`` of a success answer; :class:`SourceError` otherwise."""
    if not isinstance(body, dict):
        raise SourceError("the answer is not a JSON object")
    if body.get("status") != "success":
        kind = body.get("errorType") or "unknown"
        raise SourceError(f"query failed ({str(kind)[:_EXCERPT]}): "
                          f"{str(body.get('error', 'no error message'))[:_EXCERPT]}")
    warnings = body.get("warnings") or []
    if not isinstance(warnings, list):
        raise SourceError("'warnings' is not a list")
    partial = body.get("isPartial") is True  # VictoriaMetrics (cluster): some storage nodes did not answer
    data = body.get("data")
    if not isinstance(data, dict):
        raise SourceError("'data' is missing or not an object")
    if "result" not in data:
        raise SourceError("'data' has no 'result'")
    return str(data.get("resultType"))[:_EXCERPT], data["result"], [str(w) for w in warnings], partial


def parse_query_response(body: Any) -> tuple[list[tuple[Labels, float]], list[str], bool]:
    """``(result, warnings, partial)`` from a decoded ``/api/v1/query`` answer.

    ``result`` is what a rule consumes: ``(labels, value)`` per vector element, or one element
    with no labels for a scalar. A matrix or string result, an error status, native-histogram
    samples (``histogram`` instead of ``value``; the agent's rules use classic buckets) and any
    shape that is not the API's raise :class:`SourceError`.
    """
    kind, result, warnings, partial = _envelope(body)
    if kind == "scalar":
        if not isinstance(result, list) or len(result) != 2:
            raise SourceError("scalar result is not [time, value]")
        return [((), _float(result[1], "scalar"))], warnings, partial
    if kind != "vector":
        raise SourceError(f"rule result is not a vector or scalar but a {kind}")
    if not isinstance(result, list):
        raise SourceError("vector result is not a list")
    out: list[tuple[Labels, float]] = []
    for i, element in enumerate(result):
        where = f"result[{i}]"
        metric = _metric(element, where)
        value = element.get("value")
        if not isinstance(value, list) or len(value) != 2:
            raise SourceError(f"{where}: no [time, value] 'value'")
        out.append((labels_from(None, metric), _float(value[1], where)))
    return out, warnings, partial


def parse_range_response(body: Any) -> tuple[list[RangeSeries], list[str], bool]:
    """``(series, warnings, partial)`` from a decoded ``/api/v1/query_range`` answer: each series'
    labels, times (Unix ms) and values, in the server's order.

    The result must be a matrix; each series an object with a ``metric`` object of string labels
    and ``values``, a list of ``[seconds, "value"]`` pairs whose time is a number between 1970 and
    9999. Anything else raises :class:`SourceError` naming the series and point.
    """
    kind, result, warnings, partial = _envelope(body)
    if kind != "matrix":
        raise SourceError(f"range result is not a matrix but a {kind}")
    if not isinstance(result, list):
        raise SourceError("matrix result is not a list")
    out: list[RangeSeries] = []
    for i, element in enumerate(result):
        where = f"result[{i}]"
        metric = _metric(element, where)
        points = element.get("values")
        if not isinstance(points, list):
            raise SourceError(f"{where}: 'values' is missing or not a list")
        ts: list[int] = []
        vs: list[float] = []
        for j, point in enumerate(points):
            at = f"{where}.values[{j}]"
            if not isinstance(point, list) or len(point) != 2:
                raise SourceError(f"{at}: not a [time, value] pair: {_show(point)}")
            ts.append(_timestamp_ms(point[0], at))
            vs.append(_float(point[1], at))
        out.append((dict(metric), ts, vs))
    return out, warnings, partial
