"""agent.promql.remote: instant queries against a Prometheus-compatible API, over a real local HTTP
server that answers what Prometheus, VictoriaMetrics and Thanos answer (and what a broken one does)."""

from __future__ import annotations

import asyncio
import json
from typing import Any
from urllib.parse import parse_qs

import pytest
from aiohttp import web

from agent.config import load_config
from agent.config.source import SourceConfig
from agent.errors import SourceError
from agent.promql.remote import RemoteSource, parse_query_response
from agent.series import labels_from
from tests.receivers import RecordingServer, free_port, reply

AT_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z


def _vector(*elements: tuple[dict[str, str], str], **extra: Any) -> dict[str, Any]:
    result = [{"metric": m, "value": [AT_MS / 1000, v]} for m, v in elements]
    return {"status": "success", "data": {"resultType": "vector", "result": result}, **extra}


def _source(url: str, **kw: Any) -> RemoteSource:
    return RemoteSource(SourceConfig(type="prometheus", url=url, **kw))


# -- parsing ------------------------------------------------------------------------------------------


def test_vector_elements_become_labels_and_floats_including_go_special_values() -> None:
    body = _vector(({"__name__": "up", "job": "vllm"}, "1"), ({"job": "b"}, "NaN"), ({"job": "c"}, "+Inf"))
    result, warnings, partial = parse_query_response(body)
    assert result[0] == (labels_from("up", {"job": "vllm"}), 1.0)
    assert result[1][1] != result[1][1]  # NaN
    assert result[2] == (labels_from(None, {"job": "c"}), float("inf"))
    assert (warnings, partial) == ([], False)


def test_a_scalar_is_one_element_without_labels() -> None:
    body = {"status": "success", "data": {"resultType": "scalar", "result": [AT_MS / 1000, "2.5"]}}
    assert parse_query_response(body)[0] == [((), 2.5)]


@pytest.mark.parametrize(("body", "message"), [
    ({"status": "error", "errorType": "bad_data", "error": "parse error at char 3"}, "bad_data"),
    ({"status": "success", "data": {"resultType": "matrix", "result": []}}, "not a vector or scalar but a matrix"),
    ({"status": "success", "data": {"resultType": "vector", "result": [{"metric": {}, "histogram": [1, {}]}]}},
     "native-histogram"),
    ({"status": "success", "data": {"resultType": "vector", "result": [{"metric": {}, "value": [1, 2]}]}},
     "not a string"),
    ({"status": "success", "data": {"resultType": "vector", "result": [{"metric": {}, "value": [1, "x"]}]}},
     "not a number"),
    ({"status": "success"}, "'data' is missing"),
    ([1, 2], "not a JSON object"),
])
def test_unusable_answers_say_why(body: Any, message: str) -> None:
    with pytest.raises(SourceError, match=message):
        parse_query_response(body)


def test_warnings_and_victoriametrics_is_partial_are_reported() -> None:
    _, warnings, partial = parse_query_response(_vector(warnings=["store gateway down"], isPartial=True))
    assert (warnings, partial) == (["store gateway down"], True)


# -- over HTTP ------------------------------------------------------------------------------------------


async def test_posts_the_query_at_evaluation_time_minus_query_offset_with_the_timeout() -> None:
    async with RecordingServer(responder=reply(json_body=_vector(({"job": "a"}, "3")))) as srv:
        source = _source(srv.url(""), query_offset="30s", timeout="5s")
        try:
            result = await source.instant('sum(up{job="a"})', AT_MS)
        finally:
            await source.close()
    assert result == [(labels_from(None, {"job": "a"}), 3.0)]
    (req,) = srv.posts("/api/v1/query")
    form = {k: v[0] for k, v in parse_qs(req.body.decode()).items()}
    assert form == {"query": 'sum(up{job="a"})', "time": f"{AT_MS / 1000 - 30:.3f}", "timeout": "5s"}
    assert req.headers["Content-Type"] == "application/x-www-form-urlencoded"
    assert source.up


async def test_bearer_token_from_a_file_and_tenant_header_are_sent_and_never_printed(tmp_path: Any) -> None:
    (tmp_path / "token").write_text("s3cret-token\n")
    (tmp_path / "agent.yaml").write_text(
        "source:\n  type: prometheus\n  url: URL\n  bearer_token_file: TOKEN\n  headers: {X-Scope-OrgID: team-a}\n"
    )
    async with RecordingServer(responder=reply(json_body=_vector())) as srv:
        text = (tmp_path / "agent.yaml").read_text()
        text = text.replace("URL", srv.url("")).replace("TOKEN", str(tmp_path / "token"))
        (tmp_path / "agent.yaml").write_text(text)
        config = load_config(tmp_path / "agent.yaml")
        source = RemoteSource(config.source)
        try:
            await source.instant("up", AT_MS)
        finally:
            await source.close()
    (req,) = srv.posts()
    assert req.headers["Authorization"] == "Bearer s3cret-token"
    assert req.headers["X-Scope-OrgID"] == "team-a"
    assert "s3cret" not in str(config.redacted())


async def test_basic_auth_password_from_env() -> None:
    import base64
    async with RecordingServer(responder=reply(json_body=_vector())) as srv:
        config = load_config(None, environ={"PW": "hunter2"})  # defaults, then the source section below
        source_cfg = SourceConfig.model_validate(
            {"type": "prometheus", "url": srv.url(""), "basic_auth": {"username": "agent", "password_env": "PW"}},
            context={"environ": {"PW": "hunter2"}})
        assert config.source.type == "embedded"
        source = RemoteSource(source_cfg)
        try:
            await source.instant("up", AT_MS)
        finally:
            await source.close()
    (req,) = srv.posts()
    assert req.headers["Authorization"] == "Basic " + base64.b64encode(b"agent:hunter2").decode()


@pytest.mark.parametrize(("status", "answer", "reason", "message"), [
    (500, "internal error\n", "http_500", "HTTP 500, not the query API's JSON"),
    (503, {"status": "error", "errorType": "timeout", "error": "query timed out"}, "http_503", "timeout"),
    (422, {"status": "error", "errorType": "execution", "error": "many-to-many matching"}, "http_422",
     "many-to-many"),
    (200, "<html>proxy login</html>", "bad_response", "not the query API's JSON"),
])
async def test_http_errors_fail_the_query_and_count_the_reason(status: int, answer: Any, reason: str,
                                                                message: str) -> None:
    responder = reply(status, json_body=answer) if isinstance(answer, dict) else reply(status, text=answer)
    async with RecordingServer(responder=responder) as srv:
        source = _source(srv.url(""))
        try:
            with pytest.raises(SourceError, match=message):
                await source.instant("up", AT_MS)
        finally:
            await source.close()
    assert source.failures == {reason: 1}
    assert not source.up


async def test_a_server_that_hangs_times_out_at_the_configured_timeout() -> None:
    release = asyncio.Event()

    async def hang(request: web.Request, body: bytes) -> web.StreamResponse:
        await release.wait()
        return web.Response(text="late")

    async with RecordingServer(responder=hang) as srv:
        source = _source(srv.url(""), timeout="300ms")
        try:
            with pytest.raises(SourceError, match=r"no answer within 0\.3s"):
                await source.instant("up", AT_MS)
        finally:
            release.set()
            await source.close()
    assert source.failures == {"timeout": 1}


async def test_a_server_that_is_down_is_unreachable() -> None:
    source = _source(f"http://127.0.0.1:{free_port()}")
    try:
        with pytest.raises(SourceError, match="ClientConnectorError"):
            await source.instant("up", AT_MS)
    finally:
        await source.close()
    assert source.failures == {"unreachable": 1}


async def test_a_partial_answer_aborts_by_default_and_is_used_and_counted_under_warn() -> None:
    body = _vector(({"job": "a"}, "1"), warnings=["store 10.0.0.3:10901 unavailable"])
    async with RecordingServer(responder=reply(json_body=body)) as srv:
        abort, warn = _source(srv.url("")), _source(srv.url(""), partial_response="warn")
        try:
            with pytest.raises(SourceError, match=r"partial answer refused.*10\.0\.0\.3"):
                await abort.instant("up", AT_MS)
            assert await warn.instant("up", AT_MS) == [(labels_from(None, {"job": "a"}), 1.0)]
        finally:
            await abort.close()
            await warn.close()
    assert abort.failures == {"partial": 1}
    assert (warn.partial_answers, dict(warn.failures)) == (1, {})


async def test_an_oversized_answer_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("agent.promql.remote.MAX_RESPONSE_BYTES", 1024)
    async with RecordingServer(responder=reply(text="x" * 4096)) as srv:
        source = _source(srv.url(""))
        try:
            with pytest.raises(SourceError, match="larger than"):
                await source.instant("up", AT_MS)
        finally:
            await source.close()
    assert source.failures == {"too_large": 1}


async def test_an_answer_streamed_in_many_chunks_is_read_whole() -> None:
    """A vector of a thousand series arrives in several TCP reads: the whole body is parsed, not the first chunk."""
    body = json.dumps(_vector(*(({"instance": f"10.0.{i // 256}.{i % 256}:8000", "job": "vllm"}, str(i))
                                for i in range(2000)))).encode()

    async def streamed(request: web.Request, _: bytes) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "application/json"})
        await resp.prepare(request)
        for start in range(0, len(body), 16 * 1024):
            await resp.write(body[start:start + 16 * 1024])
            await asyncio.sleep(0.005)  # the next chunk is not there yet when the client reads
        await resp.write_eof()
        return resp

    async with RecordingServer(responder=streamed) as srv:
        source = _source(srv.url(""))
        try:
            result = await source.instant("up", AT_MS)
        finally:
            await source.close()
    assert len(body) > 100_000 and len(result) == 2000 and result[-1][1] == 1999.0
