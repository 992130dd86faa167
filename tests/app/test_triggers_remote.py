"""Diagnostics in Prometheus mode: a GPUMemoryNearFull alert gets its GPU's memory history from
a real Prometheus 2.42 (range queries through agent.promql.history, in a worker thread), and the
same finding as from the embedded store; a source that answers malformed range results skips the diagnosis."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from aiohttp import web

from agent.act.notification import AlertSnapshot
from agent.app.triggers import Diagnostics
from agent.config import Config
from agent.config.source import SourceConfig
from agent.diagnose.findings import Finding
from agent.promql.history import RemoteHistory
from agent.store import SeriesMatcher, SeriesView, Store
from tests.alertmanager import eventually
from tests.prometheus import Prometheus
from tests.receivers import RecordingServer, reply

# GPU 1 of gpu-node-1 at 76,800 of 80,000 MiB (96 %), GPU 0 at 40 %; gpu-node-2's GPU 0 at 99 %.
DCGM = """# TYPE DCGM_FI_DEV_FB_USED gauge
DCGM_FI_DEV_FB_USED{gpu="0",UUID="GPU-a0",Hostname="gpu-node-1",modelName="NVIDIA A100-SXM4-80GB"} 32000
DCGM_FI_DEV_FB_USED{gpu="1",UUID="GPU-a1",Hostname="gpu-node-1",modelName="NVIDIA A100-SXM4-80GB"} 76800
DCGM_FI_DEV_FB_USED{gpu="0",UUID="GPU-b0",Hostname="gpu-node-2",modelName="NVIDIA A100-SXM4-80GB"} 79200
# TYPE DCGM_FI_DEV_FB_FREE gauge
DCGM_FI_DEV_FB_FREE{gpu="0",UUID="GPU-a0",Hostname="gpu-node-1",modelName="NVIDIA A100-SXM4-80GB"} 48000
DCGM_FI_DEV_FB_FREE{gpu="1",UUID="GPU-a1",Hostname="gpu-node-1",modelName="NVIDIA A100-SXM4-80GB"} 3200
DCGM_FI_DEV_FB_FREE{gpu="0",UUID="GPU-b0",Hostname="gpu-node-2",modelName="NVIDIA A100-SXM4-80GB"} 800
"""


async def _dcgm(request: web.Request, body: bytes) -> web.Response:
    return web.Response(text=DCGM, content_type="text/plain")


async def test_gpu_memory_alert_is_diagnosed_from_the_servers_history(tmp_path: Path) -> None:
    async with RecordingServer(responder=_dcgm) as exporter:
        host = exporter.url("").split("//")[1]
        scrape = [{"job_name": "dcgm-exporter", "scrape_interval": "1s", "static_configs": [{"targets": [host]}]}]
        async with Prometheus(tmp_path / "prom", [], scrape_configs=scrape) as prom:
            source = SourceConfig(type="prometheus", url=prom.url)
            history = RemoteHistory(source)

            used = SeriesMatcher("__name__", "=", "DCGM_FI_DEV_FB_USED")

            async def scraped() -> SeriesView | None:
                now = int(time.time() * 1000)
                store = history.fetch(['DCGM_FI_DEV_FB_USED{Hostname="gpu-node-1"}'], now - 60_000, now, step_s=1)
                found = store.select([used, SeriesMatcher("gpu", "=", "1")], now - 60_000, now)
                return found[0] if found and store.series_count == 2 else None

            gpu1 = await eventually(scraped, timeout=30, what="Prometheus to hold gpu-node-1's two GPUs")
            now = int(time.time() * 1000)
            assert set(gpu1.vals) == {76800.0}
            assert dict(gpu1.labels)["__name__"] == "DCGM_FI_DEV_FB_USED"

            posted: list[tuple[Finding, AlertSnapshot | None]] = []
            config = Config.model_validate({"source": {"type": "prometheus", "url": prom.url},
                                            "state": {"path": ":memory:"}})
            d = Diagnostics(config, Store(3_600_000), lambda f, a: posted.append((f, a)), history=history)
            try:
                alert = AlertSnapshot(labels={"alertname": "GPUMemoryNearFull", "severity": "warning",
                                              "Hostname": "gpu-node-1", "gpu": "1", "UUID": "GPU-a1"},
                                      annotations={}, status="firing", starts_at_ms=now)
                d.on_alert(alert)

                async def finding() -> Finding | None:
                    return posted[0][0] if posted else None

                f = await eventually(finding, timeout=30, what="the finding from the server's history")
            finally:
                await d.stop()
    assert (f.kind, f.severity, f.setting) == ("gpu-oom-runtime", "warning", "--gpu-memory-utilization")
    assert f.summary.startswith("GPU memory on gpu-node-1 reached 96%")
    assert posted[0][1] is alert


def test_an_unreachable_server_is_a_source_error() -> None:
    import pytest

    from agent.errors import SourceError
    from tests.receivers import free_port

    history = RemoteHistory(SourceConfig.model_validate({"type": "prometheus", "url": f"http://127.0.0.1:{free_port()}",
                                                         "timeout": "2s"}))
    with pytest.raises(SourceError, match="range query"):
        history.fetch(["up"], 0, 60_000)


@pytest.mark.parametrize("answer", [
    {"status": "success"},
    [{"metric": {}, "values": []}],
    {"status": "success", "data": {"resultType": "matrix", "result": [{"metric": {"Hostname": 1}, "values": []}]}},
    {"status": "success", "data": {"resultType": "matrix", "result": [
        {"metric": {"__name__": "DCGM_FI_DEV_FB_USED"}, "values": [[1e300, "1"], [1]]}]}},
])
@pytest.mark.parametrize("alertname", ["GPUMemoryNearFull", "VLLMKVCacheSaturated"])
async def test_a_malformed_range_answer_skips_the_diagnosis_without_an_exception(answer: object,
                                                                                 alertname: str) -> None:
    """The diagnosis asks the source, meets a malformed answer, and ends quietly: no finding, no exception."""
    async with RecordingServer(responder=reply(json_body=answer)) as srv:
        config = Config.model_validate({"source": {"type": "prometheus", "url": srv.url("")},
                                        "state": {"path": ":memory:"}})
        posted: list[Finding] = []
        d = Diagnostics(config, Store(3_600_000), lambda f, a: posted.append(f), history=RemoteHistory(config.source))
        try:
            d.on_alert(AlertSnapshot(labels={"alertname": alertname, "Hostname": "gpu-node-1", "gpu": "1",
                                             "instance": "node-1:8000"}, annotations={}, status="firing",
                                     starts_at_ms=int(time.time() * 1000)))
            tasks = list(d._history_tasks)  # the spawned diagnosis: its result is what this test checks
            assert tasks
            await asyncio.wait_for(asyncio.gather(*tasks), 20)  # raises if the diagnosis raised
        finally:
            await d.stop()
    assert srv.requests and not posted
