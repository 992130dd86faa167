"""agent.app.triage.service in Prometheus mode: a source answering malformed range results gives a report whose
plots say what was wrong (never an exception, so never a 500), in every format."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from agent.act.notification import fingerprint
from agent.act.state import StateDB
from agent.app.triage import Reports
from agent.config.source import SourceConfig
from agent.promql.history import RemoteHistory
from tests.receivers import RecordingServer, reply

T0 = 1_780_000_000_000


@pytest.mark.parametrize(("answer", "reason"), [
    ({"status": "success"}, "'data' is missing"),
    ({"status": "success", "data": {"resultType": "vector", "result": []}}, "not a matrix but a vector"),
    ({"status": "success", "data": {"resultType": "matrix", "result": [{"metric": [], "values": []}]}},
     "has no 'metric' object"),
    ({"status": "success", "data": {"resultType": "matrix", "result": [{"metric": {}, "values": [["inf", "1"]]}]}},
     "timestamp is not a number"),
    ({"status": "success", "data": {"resultType": "matrix", "result": [{"metric": {}, "values": [[1, "1"], [2]]}]}},
     r"values\[1\]: not a \[time, value\] pair"),
])
@pytest.mark.parametrize("fmt", ["json", "html"])
async def test_malformed_range_answers_make_a_report_whose_plots_say_why(answer: Any, reason: str, fmt: str,
                                                                         tmp_path: Path) -> None:
    """Every plot is empty with the validator's reason; the report itself is built."""
    db = StateDB(tmp_path / "state.db")
    labels = {"alertname": "Up", "instance": "node-1:8000", "job": "vllm"}
    iid = await db.run(db.incidents.open, fingerprint=fingerprint(labels), alertname="Up", labels=labels,
                       severity="warning", summary="up", started_ms=T0)
    async with RecordingServer(responder=reply(json_body=answer)) as srv:
        history = RemoteHistory(SourceConfig.model_validate({"type": "prometheus", "url": srv.url("")}))
        reports = Reports(db, lambda: [], history=history, clock=lambda: (T0 + 60_000) / 1000)
        try:
            text = await reports.render(iid, fmt)
        finally:
            reports.pool.close()
            await db.aclose()
    if fmt == "json":
        plots = json.loads(text)["plots"]
        assert plots and all(p["errors"] and not p["series"] for p in plots)
        assert all(any(re.search(reason, e) for e in p["errors"]) for p in plots)
    else:
        assert text.count("<img") == 5 and "range query" in text
