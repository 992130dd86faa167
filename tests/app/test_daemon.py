"""Tests for agent.app.daemon and agent.app.server: the wired agent against a simulated fleet and a fake NVML,
and its API's alert values against a real Prometheus serving the same rules."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from agent.app.daemon import Agent, keep_list
from agent.config import Config
from agent.simulate.server import Fleet, FleetConfig
from agent.store import SeriesMatcher
from tests.alertmanager import eventually
from tests.fake_pynvml import FakeGpu, FakeNvml
from tests.prometheus import Prometheus
from tests.yamlbombs import BILLION_LAUGHS


@pytest.fixture
async def fleet() -> AsyncIterator[Fleet]:
    f = Fleet(FleetConfig(replicas=2, lmdeploy_replicas=1, base_port=0, control_port=0, step_s=0.2, speed=5))
    await f.start()
    await asyncio.sleep(0.5)  # a few model steps so counters move
    yield f
    await f.stop()


def _config(fleet: Fleet, **extra: object) -> Config:
    targets = [{"url": u, "job": "lmdeploy" if i == 2 else "vllm"} for i, u in enumerate(fleet.targets)]
    return Config.model_validate({"targets": targets, "server": {"listen": "127.0.0.1:0"},
                                  "scrape": {"interval": "1s", "timeout": "1s"},
                                  "state": {"path": ":memory:"}, **extra})


async def test_collect_once_scrapes_fleet_and_gpus(fleet: Fleet) -> None:
    """One collection stores vLLM, LMDeploy and NVML series; the agent's /metrics re-exports GPUs."""
    agent = Agent(_config(fleet), nvml_module=FakeNvml([FakeGpu(), FakeGpu()]).module, hostname="node-1")
    await agent.collect_once()
    try:
        assert [t["health"] for t in agent.targets_json()] == ["up", "up", "up"]
        st = agent.store
        assert len(list(st.iter_series([SeriesMatcher("__name__", "=", "vllm:num_requests_running")]))) == 2
        assert list(st.iter_series([SeriesMatcher("__name__", "=", "lmdeploy:num_requests_waiting")]))
        fb = list(st.iter_series([SeriesMatcher("__name__", "=", "DCGM_FI_DEV_FB_USED")]))
        assert sorted(dict(s.labels)["gpu"] for s in fb) == ["0", "1"]
        assert {dict(s.labels)["Hostname"] for s in fb} == {"node-1"}
        assert not list(st.iter_series([SeriesMatcher("__name__", "=", "python_gc_objects_collected_total")]))
        from prometheus_client.exposition import generate_latest

        fams = {f.name: f for f in text_string_to_metric_families(generate_latest(agent.registry).decode())}
        assert {s.value for s in fams["sre_agent_target_up"].samples} == {1.0}
        assert len(fams["DCGM_FI_DEV_FB_USED"].samples) == 2
        assert agent.status_json()["nvml"]["available"] is True
    finally:
        await agent.stop()


async def test_missing_nvml_library_is_not_fatal(fleet: Fleet) -> None:
    """Without the NVML library the agent still scrapes and reports why GPUs are missing."""
    agent = Agent(_config(fleet), nvml_module=FakeNvml(library_missing=True).module, hostname="n")
    await agent.collect_once()
    try:
        assert all(t["health"] == "up" for t in agent.targets_json())
        nv = agent.status_json()["nvml"]
        assert nv["available"] is False and "not found" in nv["reason"].lower()
    finally:
        await agent.stop()


async def test_nvml_disabled_in_config(fleet: Fleet) -> None:
    """nvml.enabled: false never touches NVML."""
    fake = FakeNvml()
    agent = Agent(_config(fleet, nvml={"enabled": False}), nvml_module=fake.module)
    await agent.collect_once()
    await agent.stop()
    assert agent.nvml is None and fake.initialized == 0 and not fake.calls


async def test_http_endpoints(fleet: Fleet) -> None:
    """The running daemon serves /healthz, /readyz after the first cycle, /metrics and /api/v1/targets."""
    agent = Agent(_config(fleet), nvml_module=FakeNvml().module, hostname="n")
    await agent.start()
    base = f"http://127.0.0.1:{agent.port}"
    try:
        async with aiohttp.ClientSession() as http:
            async with http.get(f"{base}/healthz") as r:
                assert r.status == 200
            for _ in range(100):
                async with http.get(f"{base}/readyz") as r:
                    if r.status == 200:
                        break
                await asyncio.sleep(0.05)
            assert r.status == 200
            async with http.get(f"{base}/api/v1/targets") as r:
                body = await r.json()
            assert body["status"] == "success"
            targets = body["data"]["targets"]
            assert {t["url"] for t in targets} == set(fleet.targets)
            assert all(set(t) >= {"url", "job", "instance", "health", "last_error", "samples"} for t in targets)
            async with http.get(f"{base}/metrics") as r:
                assert r.headers["Content-Type"].startswith("text/plain")
                text = await r.text()
            assert "sre_agent_build_info" in text and "sre_agent_store_series" in text
            async with http.get(f"{base}/api/v1/status") as r:
                status = (await r.json())["data"]
            assert status["config"]["server"]["listen"] == "127.0.0.1:0"
    finally:
        await agent.stop()


async def test_scheduler_keeps_scraping_and_survives_a_dead_target(fleet: Fleet) -> None:
    """Scheduled cycles go on; a dead target is down while the others stay up."""
    cfg = _config(fleet)
    cfg = cfg.model_copy(update={"targets": [*cfg.targets, cfg.targets[0].model_copy(
        update={"url": "http://127.0.0.1:1/metrics"})]})
    agent = Agent(cfg, nvml_module=FakeNvml().module, hostname="n")
    await agent.start(serve_http=False)
    try:
        for _ in range(100):
            if agent.stats.scrape_cycles >= 2:
                break
            await asyncio.sleep(0.1)
        assert agent.stats.scrape_cycles >= 2
        health = {t["url"]: t["health"] for t in agent.targets_json()}
        assert health.pop("http://127.0.0.1:1/metrics") == "down"
        assert set(health.values()) == {"up"}
    finally:
        await agent.stop()


def test_keep_list_defaults_and_extras() -> None:
    """The default keep-list has the vLLM health families; store.keep adds; keep_all keeps all."""
    keep = keep_list(Config.model_validate({"store": {"keep": ["my_metric"]}}))
    assert "vllm:kv_cache_usage_perc" in keep and "vllm:gpu_cache_usage_perc" in keep
    assert "vllm:time_to_first_token_seconds_bucket" in keep and "DCGM_FI_DEV_FB_USED" in keep
    assert "my_metric" in keep and "python_info" not in keep
    assert keep_list(Config.model_validate({"store": {"keep_all": True}})).keeps_all


async def test_rules_evaluated_and_served(fleet: Fleet, tmp_path: Path) -> None:
    """Loaded rules are evaluated on schedule; /api/v1/alerts and /api/v1/rules show them; names are kept."""
    rules = tmp_path / "r.rules.yaml"
    rules.write_text(
        "groups:\n  - name: t\n    interval: 1s\n    rules:\n"
        "      - record: job:my_custom_metric:sum\n        expr: sum by (job) (my_custom_metric)\n"
        "      - alert: AlwaysOn\n        expr: vector(1)\n        labels: {severity: none}\n"
    )
    agent = Agent(_config(fleet, rules={"files": [str(rules)], "evaluation_interval": "1s"}),
                  nvml_module=FakeNvml().module, hostname="n")
    assert "my_custom_metric" in agent.store.keep  # names a rule selects are stored
    await agent.start()
    base = f"http://127.0.0.1:{agent.port}"
    try:
        for _ in range(100):
            if agent.rules.alerts():
                break
            await asyncio.sleep(0.05)
        async with aiohttp.ClientSession() as http:
            async with http.get(f"{base}/api/v1/alerts") as r:
                alerts = (await r.json())["data"]["alerts"]
            async with http.get(f"{base}/api/v1/rules") as r:
                groups = (await r.json())["data"]["groups"]
            async with http.get(f"{base}/metrics") as r:
                text = await r.text()
        assert [a["labels"]["alertname"] for a in alerts] == ["AlwaysOn"] and alerts[0]["state"] == "firing"
        assert [r["name"] for r in groups[0]["rules"]] == ["job:my_custom_metric:sum", "AlwaysOn"]
        assert 'sre_agent_alerts{severity="none",state="firing"} 1.0' in text
        assert 'sre_agent_alerts{severity="none",state="pending"} 0.0' in text
        assert [e.kind for e in agent.events][:1] == ["firing"]
    finally:
        await agent.stop()


async def test_jobs_run_on_the_event_loop_thread(fleet: Fleet, tmp_path: Path) -> None:
    """Scrapes, rule evaluation and retention all run on the loop's thread (the store is single-threaded)."""
    import threading

    rules = tmp_path / "r.rules.yaml"
    rules.write_text("groups:\n  - name: t\n    interval: 1s\n    rules:\n      - alert: A\n        expr: vector(1)\n")
    agent = Agent(_config(fleet, rules={"files": [str(rules)]}), nvml_module=FakeNvml().module, hostname="n")
    threads: set[int] = set()
    real_evaluate, real_gc = agent.evaluate, agent.gc

    async def evaluate(group: object, at_ms: int | None = None) -> None:
        threads.add(threading.get_ident())
        await real_evaluate(group, at_ms)  # type: ignore[arg-type]

    def gc() -> None:
        threads.add(threading.get_ident())
        real_gc()

    agent.evaluate, agent.gc = evaluate, gc  # type: ignore[method-assign]
    await agent.start(serve_http=False)
    try:
        await agent._gc_job()
        for _ in range(100):
            if agent.rules.alerts():
                break
            await asyncio.sleep(0.05)
        assert agent.rules.alerts()
        assert threads == {threading.get_ident()}
    finally:
        await agent.stop()


async def test_incidents_silences_and_act_metrics_are_served(fleet: Fleet, tmp_path: Path) -> None:
    """An alert becomes an incident with its console notification; silences can be added, listed and
    expired over the API; /metrics shows notifications sent, outbox depth and silences."""
    rules = tmp_path / "r.rules.yaml"
    rules.write_text("groups:\n  - name: t\n    interval: 1s\n    rules:\n"
                     "      - alert: AlwaysOn\n        expr: vector(1)\n        labels: {severity: info}\n"
                     "        annotations: {summary: always}\n")
    out = tmp_path / "console.txt"
    with out.open("w", encoding="utf-8") as stream:
        agent = Agent(_config(fleet, rules={"files": [str(rules)], "evaluation_interval": "1s"},
                              state={"path": str(tmp_path / "s.db")},
                              route={"receiver": "console", "group_wait": "1s", "group_interval": "1s"},
                              notify={"dispatch_interval": "100ms"}),
                      nvml_module=FakeNvml().module, hostname="n", notify_stream=stream)
        await agent.start()
        base = f"http://127.0.0.1:{agent.port}"
        try:
            async with aiohttp.ClientSession() as http:
                incidents: list[dict[str, object]] = []
                for _ in range(200):  # firing after the first evaluation, notified after group_wait
                    async with http.get(f"{base}/api/v1/incidents") as r:
                        incidents = (await r.json())["data"]["incidents"]
                    if incidents and any(e["kind"] == "notified" for e in incidents[0]["events"]):  # type: ignore[attr-defined]
                        break
                    await asyncio.sleep(0.05)
                async with http.post(f"{base}/api/v1/silences", json={"matchers": ['alertname="AlwaysOn"'],
                                                                      "duration": "1h", "comment": "test"}) as r:
                    assert r.status == 200
                    silence_id = (await r.json())["data"]["silenceID"]
                async with http.post(f"{base}/api/v1/silences", json={"matchers": ["nonsense"]}) as r:
                    bad = (r.status, (await r.json())["error"])
                async with http.post(f"{base}/api/v1/silences", json={"matchers": ['job=~"(a)\\\\1"']}) as r:
                    not_re2 = (r.status, (await r.json())["error"])  # a back-reference: RE2 refuses it
                async with http.get(f"{base}/api/v1/silences") as r:
                    listed = (await r.json())["data"]["silences"]
                async with http.get(f"{base}/metrics") as r:
                    metrics = await r.text()
                async with http.delete(f"{base}/api/v1/silences/{silence_id}") as r:
                    expired = r.status
                async with http.delete(f"{base}/api/v1/silences/{silence_id}") as r:
                    again = r.status
        finally:
            await agent.stop()
    assert incidents and incidents[0]["alertname"] == "AlwaysOn"
    kinds = [e["kind"] for e in incidents[0]["events"]]  # type: ignore[attr-defined]
    assert kinds[:2] == ["fired", "notified"]
    assert "[FIRING:1] AlwaysOn" in out.read_text(encoding="utf-8")
    assert bad[0] == 400 and "matcher" in bad[1]
    assert not_re2 == (400, "job=~: not a regular expression in RE2 syntax: '(a)\\\\1' (invalid escape sequence: \\1)")
    assert [s["id"] for s in listed] == [silence_id]
    assert 'sre_agent_notifications_sent_total{receiver="console"} 1.0' in metrics
    assert 'sre_agent_outbox_depth{receiver="console"} 0.0' in metrics
    assert "sre_agent_silences_active 1.0" in metrics
    assert "# TYPE sre_agent_scale_actions_total counter" in metrics  # no scaling services: no samples
    assert (expired, again) == (200, 404)


async def test_nccl_schedule_and_log_tailing_are_scheduled(fleet: Fleet, tmp_path: Path) -> None:
    """nccl.schedule becomes a cron job at that time; oom.log_files a polling job; neither without config."""
    log = tmp_path / "vllm.log"
    log.touch()
    agent = Agent(_config(fleet, diagnostics={"oom": {"log_files": [str(log)]},
                                              "nccl": {"enabled": True, "schedule": "30 3 * * 1"}}),
                  nvml_module=FakeNvml().module, hostname="n")
    plain = Agent(_config(fleet), nvml_module=FakeNvml().module, hostname="n")
    await agent.start(serve_http=False)
    await plain.start(serve_http=False)
    try:
        assert agent._scheduler is not None and plain._scheduler is not None
        job = agent._scheduler.get_job("nccl")
        fields = {f.name: str(f) for f in job.trigger.fields}
        assert (fields["minute"], fields["hour"], fields["day_of_week"]) == ("30", "3", "1")
        assert agent._scheduler.get_job("oom-logs") is not None
        assert plain._scheduler.get_job("nccl") is None and plain._scheduler.get_job("oom-logs") is None
    finally:
        await agent.stop()
        await plain.stop()


def test_bad_nccl_schedule_is_a_config_error() -> None:
    """A schedule that is not a 5-field cron expression fails validation, naming the key."""
    with pytest.raises(ValueError, match="not a cron expression"):
        Config.model_validate({"diagnostics": {"nccl": {"schedule": "every day"}}})


async def test_no_state_query_runs_on_the_event_loop(fleet: Fleet, tmp_path: Path) -> None:
    """Once started, every SQLite statement (each write, commit and read) runs on the state-writer thread:
    evaluations that notify, webhook and Slack deliveries (with Slack's message refs), findings, the
    silences and incidents API, /metrics."""
    import threading

    from agent.diagnose.findings import Finding
    from tests.fake_slack import running_fake_slack
    from tests.receivers import RecordingServer

    rules = tmp_path / "r.rules.yaml"
    rules.write_text("groups:\n  - name: t\n    interval: 1s\n    rules:\n      - alert: A\n        expr: vector(1)\n")
    token = tmp_path / "slack-token"
    async with RecordingServer() as hook, running_fake_slack() as slack:
        token.write_text(slack.token)
        config = _config(fleet, rules={"files": [str(rules)]}, state={"path": str(tmp_path / "s.db")},
                         receivers=[{"name": "hook", "webhook": {"url": hook.url()}},
                                    {"name": "slack", "slack": {"token_file": str(token), "channel": "#alerts",
                                                                "api_url": slack.api_url}}],
                         route={"receiver": "hook", "group_wait": "0s",
                                "routes": [{"receiver": "slack", "continue": True}, {"receiver": "hook"}]})
        agent = Agent(config, nvml_module=FakeNvml().module, hostname="n")
        statements: list[tuple[str, str]] = []

        def trace(sql: str) -> None:
            statements.append((threading.current_thread().name, sql.split(None, 1)[0].upper()))

        agent.act.db._conn._conn.set_trace_callback(trace)  # type: ignore[union-attr]  # the one SQLite handle
        loop_thread = threading.current_thread().name
        await agent.start()
        try:
            base = f"http://127.0.0.1:{agent.port}"
            async with aiohttp.ClientSession() as http:
                for _ in range(200):
                    if hook.requests and slack.messages:
                        break
                    await asyncio.sleep(0.05)
                assert hook.requests and slack.messages, "the firing alert never reached both receivers"
                async with http.post(f"{base}/api/v1/silences",
                                     json={"matchers": ['alertname="B"'], "duration": "1h"}) as r:
                    assert r.status == 200
                for path in ("/api/v1/silences", "/api/v1/incidents", "/metrics"):
                    async with http.get(base + path) as r:
                        assert r.status == 200, path
            agent.act.post_finding(Finding(kind="nccl-bandwidth-low", summary="slow", labels={"instance": "n"}), None)
        finally:
            await agent.stop()
    on_loop = [s for s in statements if s[0] == loop_thread]
    on_writer = {sql for name, sql in statements if name.startswith("state-writer")}
    assert on_loop == [], f"SQLite ran on the event loop thread: {on_loop[:10]}"
    assert {"INSERT", "COMMIT", "SELECT", "DELETE"} <= on_writer


# --- differential test against Prometheus ---------------------------------------------------------------------------

#: One pending alert per value (``for: 1h`` keeps them pending), each named after what it holds.
VALUE_ALERTS = {"Twenty": "20", "Half": "0.5", "Tiny": "1e-7", "Large": "123456789", "Huge": "1e21",
                "Negative": "-3.25", "Zero": "0", "NotANumber": "NaN", "Infinite": "+Inf", "MinusInfinite": "-Inf"}


def _alert_values(alerts: list[dict[str, Any]]) -> dict[str, str]:
    return {a["labels"]["alertname"]: a["value"] for a in alerts}


async def _all_values(get: Callable[[str], Awaitable[Any]]) -> tuple[dict[str, str], dict[str, str]] | None:
    """The alert values of /api/v1/alerts and of the alerts inside /api/v1/rules, once every alert shows in both."""
    served = _alert_values((await get("alerts"))["alerts"])
    in_rules = _alert_values([a for g in (await get("rules"))["groups"] for r in g["rules"] for a in r["alerts"]])
    return (served, in_rules) if set(served) == set(in_rules) == set(VALUE_ALERTS) else None


async def test_alert_values_are_written_as_prometheus_writes_them(tmp_path: Path) -> None:
    """/api/v1/alerts and /api/v1/rules write each alert's value as Prometheus 2.42 does for the same rule file."""
    rules = tmp_path / "values.rules.yaml"
    rules.write_text("groups:\n  - name: values\n    rules:\n" + "".join(
        f"      - alert: {name}\n        expr: vector({number})\n        for: 1h\n"
        for name, number in VALUE_ALERTS.items()))
    async with Prometheus(tmp_path / "prometheus", [rules]) as prom:
        want = await eventually(lambda: _all_values(prom.api), what="Prometheus' pending alerts")
    agent = Agent(Config.model_validate({  # no targets; rules first run one scrape interval after start
        "targets": [], "scrape": {"interval": "1s", "timeout": "1s"}, "server": {"listen": "127.0.0.1:0"},
        "state": {"path": ":memory:"}, "nvml": {"enabled": False},
        "rules": {"files": [str(rules)], "evaluation_interval": "1s"}}))
    await agent.start()
    try:
        async with aiohttp.ClientSession() as http:
            async def get(path: str) -> Any:
                async with http.get(f"http://127.0.0.1:{agent.port}/api/v1/{path}") as r:
                    return (await r.json())["data"]
            got = await eventually(lambda: _all_values(get), what="the agent's pending alerts")
    finally:
        await agent.stop()
    assert got == want
    assert want[0]["Twenty"] == "2e+01"  # the form this test is about, not the one Python or Go's %v writes


async def test_store_series_cap_counted_on_metrics_and_in_the_store(fleet: Fleet) -> None:
    """With store.max_series reached, new scraped series are refused, targets stay up, and the refusals
    are on the agent's /metrics and in its store for the SREAgentStoreSeriesLimitReached rule."""
    agent = Agent(_config(fleet, store={"max_series": 5}, nvml={"enabled": False}))
    await agent.collect_once()
    try:
        assert [t["health"] for t in agent.targets_json()] == ["up", "up", "up"]
        refused = agent.store.refused_series
        assert refused > 0 and agent.store.max_series == 5
        from prometheus_client.exposition import generate_latest

        fams = {f.name: f for f in text_string_to_metric_families(generate_latest(agent.registry).decode())}
        assert [s.value for s in fams["sre_agent_store_refused_series"].samples] == [refused]
        assert [s.value for s in fams["sre_agent_store_max_series"].samples] == [5.0]
        stored = list(agent.store.iter_series([SeriesMatcher("__name__", "=", "sre_agent_store_refused_series_total")]))
        assert [list(s.vals) for s in stored] == [[float(refused)]]
    finally:
        await agent.stop()


#: file_sd contents that once stopped every scrape cycle or made one take tens of seconds, and what the error says.
_BAD_FILE_SD = {
    "int-label-key": ("- targets: ['h9:1']\n  labels: {1: a}\n", "label names must be strings"),
    "aliased-million-targets": ("- targets: &t [" + ", ".join(f"'h{i}:1'" for i in range(10_000)) + "]\n"
                                + "- targets: *t\n" * 99, "more than 50,000 targets"),
    "bad-label-name": ("- targets: ['h9:1']\n  labels: {'a-b': x}\n", "not a valid label name"),
    "billion-laughs": (BILLION_LAUGHS, "excessive aliasing"),
}


@pytest.mark.parametrize("case", sorted(_BAD_FILE_SD))
async def test_bad_file_sd_is_refused_counted_and_scraping_goes_on(fleet: Fleet, tmp_path: Path, case: str) -> None:
    """A file_sd file turned bad inside the running daemon is refused: the error is on /api/v1/status and
    counted on /metrics, the API answers at once meanwhile, scrape cycles go on, its last targets stay, and
    a new target in the good file beside it is scraped."""
    content, message = _BAD_FILE_SD[case]
    host = [t.split("/")[2] for t in fleet.targets]
    bad, good = tmp_path / "bad.yaml", tmp_path / "good.yaml"
    bad.write_text(f"- targets: ['{host[0]}']\n  labels: {{job: discovered}}\n")
    good.write_text(f"- targets: ['{host[1]}']\n  labels: {{job: good}}\n")
    agent = Agent(_config(fleet, targets=[], file_sd=[{"files": [str(bad), str(good)], "refresh_interval": "1s"}]),
                  nvml_module=FakeNvml().module, hostname="n")
    await agent.start()
    base = f"http://127.0.0.1:{agent.port}"

    async def cycles_past(n: int) -> int | None:
        return agent.stats.scrape_cycles if agent.stats.scrape_cycles > n else None

    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2)) as http:
            async def sd_error() -> str | None:
                async with http.get(f"{base}/api/v1/status") as r:  # the 2 s client timeout bounds each answer
                    errors: dict[str, str] = (await r.json())["data"]["file_sd_errors"]
                return errors.get(str(bad))

            async def read_errors() -> float | None:
                async with http.get(f"{base}/metrics") as r:
                    text = await r.text()
                values = [s.value for f in text_string_to_metric_families(text) for s in f.samples
                          if s.name == "sre_agent_file_sd_read_errors_total"]
                return values[0] if values and values[0] >= 1 else None

            cycles = await eventually(lambda: cycles_past(0), what="a first scrape cycle")
            bad.write_text(content)
            good.write_text(f"- targets: ['{host[1]}', '{host[2]}']\n  labels: {{job: good}}\n")
            error = await eventually(sd_error, what="the file_sd error on /api/v1/status")
            assert message in error and len(error) < 600
            await eventually(read_errors, what="sre_agent_file_sd_read_errors_total on /metrics")
        await eventually(lambda: cycles_past(cycles + 2), what="more scrape cycles")

        async def all_scraped() -> list[tuple[str, str]] | None:
            got = sorted((t["job"], t["health"]) for t in agent.targets_json())
            return got if got == [("discovered", "up"), ("good", "up"), ("good", "up")] else None

        await eventually(all_scraped, what="the kept and the new targets scraped")
    finally:
        await agent.stop()


async def test_the_retention_job_prunes_the_state_database_hourly(tmp_path: Path) -> None:
    """Expired silences (like resolved incidents and given-up notifications) older than state.keep go
    at the first retention job and then once an hour; recent ones stay."""
    now = [1_800_000_000.0]
    agent = Agent(Config.model_validate({"targets": [], "nvml": {"enabled": False},
                                         "server": {"listen": "127.0.0.1:0"},
                                         "state": {"path": str(tmp_path / "state.db"), "keep": "7d"}}),
                  clock=lambda: now[0])
    db = agent.act.db
    minute_ms, day_ms, t0_ms = 60_000, 86_400_000, int(now[0] * 1000)
    try:
        await db.run(db.silences.add, ['a="old"'], starts_ms=0, ends_ms=t0_ms - 8 * day_ms, created_by="t",
                     comment="")
        await db.run(db.silences.add, ['a="edge"'], starts_ms=0, ends_ms=t0_ms - 7 * day_ms + 10 * minute_ms,
                     created_by="t", comment="")

        async def kept() -> list[list[str]]:
            return [s.matchers for s in await db.run(db.silences.list, now_ms=t0_ms, include_expired=True)]

        await agent._gc_job()  # the first: prunes what is older than 7 days
        assert await kept() == [['a="edge"']]
        now[0] += 30 * 60  # "edge" is now older than 7 days, but the last prune was 30 minutes ago
        await agent._gc_job()
        assert await kept() == [['a="edge"']]
        now[0] += 31 * 60  # an hour since the last prune
        await agent._gc_job()
        assert await kept() == []
    finally:
        await agent.stop()
