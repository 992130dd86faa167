"""``sre-agent triage`` in Prometheus mode against a source that answers malformed range results: the report is
still written (each plot says why it is empty), stderr names the problem, the exit code is 2, no traceback."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from agent.act.notification import fingerprint
from agent.act.state import StateDB
from agent.cli import main
from tests.receivers import RecordingServer, reply

T0 = 1_780_000_000_000


def _incident(path: Path) -> int:
    db = StateDB(path)
    try:
        labels = {"alertname": "VLLMKVCacheSaturated", "instance": "node-1:8000", "job": "vllm"}
        return db.incidents.open(fingerprint=fingerprint(labels), alertname="VLLMKVCacheSaturated", labels=labels,
                                 severity="warning", summary="kv", started_ms=T0)
    finally:
        db.close()


@pytest.mark.parametrize("answer", [
    {"status": "success"},
    [{"metric": {}, "values": []}],
    {"status": "success", "data": {"resultType": "matrix", "result": [{"metric": {"job": 1}, "values": []}]}},
    {"status": "success", "data": {"resultType": "matrix", "result": [{"metric": {}, "values": [[1e300, "1"]]}]}},
    {"status": "success", "data": {"resultType": "matrix", "result": [{"metric": {}, "values": [["NaN", None]]}]}},
])
async def test_a_malformed_range_answer_is_a_clear_error_and_exit_2(
        answer: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Every plot names the malformed answer; stderr says the source did not answer usably; exit 2."""
    iid = _incident(tmp_path / "state.db")
    async with RecordingServer(responder=reply(json_body=answer)) as srv:
        config = tmp_path / "agent.yaml"
        config.write_text(json.dumps({"state": {"path": str(tmp_path / "state.db")},
                                      "source": {"type": "prometheus", "url": srv.url(""), "timeout": "5s"}}))
        out = tmp_path / "report.json"
        code = await asyncio.to_thread(main, ["triage", str(iid), "--config", str(config), "--format", "json",
                                              "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "Traceback" not in err and "the source did not answer usably" in err and "range query" in err
    report = json.loads(out.read_text())
    assert report["plots"] and all(p["errors"] and not p["series"] for p in report["plots"])
