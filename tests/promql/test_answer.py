"""agent.promql.answer: the one validator of the query API's answers, instant and range; every malformed
range answer is a SourceError naming what was wrong, never another exception."""

from __future__ import annotations

import math
from typing import Any

import pytest

from agent.errors import SourceError
from agent.promql.answer import decode, parse_query_response, parse_range_response


def _matrix(*series: Any, kind: str = "matrix") -> dict[str, Any]:
    return {"status": "success", "data": {"resultType": kind, "result": list(series)}}


GOOD = {"metric": {"__name__": "up", "job": "vllm"}, "values": [[1767225600, "1"], [1767225615.5, "NaN"]]}


def test_a_matrix_becomes_labels_times_in_ms_and_floats() -> None:
    """Times in float seconds become integer ms; Go's NaN/Inf strings are floats."""
    (labels, ts, vs), = parse_range_response(_matrix(GOOD, {"metric": {}, "values": []}))[0][:1]
    assert labels == {"__name__": "up", "job": "vllm"}
    assert ts == [1_767_225_600_000, 1_767_225_615_500]
    assert vs[0] == 1.0 and math.isnan(vs[1])


@pytest.mark.parametrize(("body", "message"), [
    (_matrix({"metric": {}, "values": [[1, None]]}), r"result\[0\]\.values\[0\]: sample value is not a string"),
    (_matrix({"metric": {}, "values": [[1, "abc"]]}), r"values\[0\]: sample value is not a number"),
    (_matrix({"metric": {}, "values": [[1, 2.5]]}), "sample value is not a string"),
    (_matrix({"metric": {}, "values": [[1]]}), r"values\[0\]: not a \[time, value\] pair"),
    (_matrix({"metric": {}, "values": [[1, "1", 3]]}), r"not a \[time, value\] pair"),
    (_matrix({"metric": {}, "values": [[1e300, "1"]]}), "timestamp 1e\\+300 is not a time between 1970 and 9999"),
    (_matrix({"metric": {}, "values": [[10**400, "1"]]}), "is not a time between"),
    (_matrix({"metric": {}, "values": [[-5, "1"]]}), "is not a time between"),
    (_matrix({"metric": {}, "values": [[float("nan"), "1"]]}), "is not a time between"),
    (_matrix({"metric": {}, "values": [["NaN", "1"]]}), "timestamp is not a number: 'NaN'"),
    (_matrix({"metric": {}, "values": [["+Inf", "1"]]}), "timestamp is not a number"),
    (_matrix({"metric": {}, "values": [[True, "1"]]}), "timestamp is not a number"),
    (_matrix({"metric": {}, "values": {"t": 1}}), "'values' is missing or not a list"),
    (_matrix({"metric": {}}), "'values' is missing or not a list"),
    (_matrix([1, 2]), r"result\[0\]: not an object but list"),
    (_matrix({"metric": [["job", "a"]], "values": []}), r"result\[0\]: has no 'metric' object"),
    (_matrix({"metric": {"job": 5}, "values": []}), "label 'job' is not a string but int"),
    (_matrix({"metric": {"job": None}, "values": []}), "label 'job' is not a string but NoneType"),
    (_matrix({"metric": {}, "histograms": [[1, {}]]}), "native-histogram"),
    (_matrix(kind="vector"), "range result is not a matrix but a vector"),
    ({"status": "success", "data": {"resultType": "matrix", "result": {"a": 1}}}, "matrix result is not a list"),
    ({"status": "success", "data": {"resultType": "matrix"}}, "'data' has no 'result'"),
    ({"status": "success", "data": []}, "'data' is missing or not an object"),
    ({"status": "error", "errorType": "timeout", "error": "query timed out"}, r"query failed \(timeout\)"),
    ([GOOD], "not a JSON object"),
    ("matrix", "not a JSON object"),
])
def test_malformed_range_answers_say_what_was_wrong(body: Any, message: str) -> None:
    """Each malformed range answer is one SourceError whose message names the part that was wrong."""
    with pytest.raises(SourceError, match=message):
        parse_range_response(body)


@pytest.mark.parametrize("raw", [b"<html>502 Bad Gateway</html>", b'{"status": "succ', b"\xff\xfe\x00",
                                 b"[" * 100_000, b""])
def test_a_body_that_is_not_json_is_a_source_error_with_an_excerpt(raw: bytes) -> None:
    """HTML, a truncated body, bytes that are not UTF-8, nesting past the stack, nothing: all one error."""
    with pytest.raises(SourceError, match="not the query API's JSON"):
        decode(raw)


@pytest.mark.parametrize(("element", "message"), [
    ({"metric": {"job": ["a"]}, "value": [1, "1"]}, "label 'job' is not a string but list"),
    ({"metric": {}, "value": [1]}, r"result\[0\]: no \[time, value\] 'value'"),
    ({"metric": "job=a", "value": [1, "1"]}, "has no 'metric' object"),
])
def test_the_instant_path_shares_the_validator(element: Any, message: str) -> None:
    """An instant answer's element is checked by the same code, with the same messages."""
    with pytest.raises(SourceError, match=message):
        parse_query_response({"status": "success", "data": {"resultType": "vector", "result": [element]}})
